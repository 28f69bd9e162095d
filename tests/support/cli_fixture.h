// Test support: a temporary directory, and a GoogleTest fixture for tests that run the `distca`
// binary (DISTCA_CLI, defined by
// distca_test in tests/CMakeLists.txt): each test gets a fresh temporary directory, removed
// afterwards; run() captures exit code, stdout and stderr; expect_refused() checks the CLI's
// bad-input contract (exit 2, one stderr line naming the flag, no output file left behind).
//
// Thread safety: one fixture per test, as GoogleTest runs them.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace distca::testing {

namespace fs = std::filesystem;

struct CliRun {
  int code = -1;
  std::string out, err;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A fresh empty directory under the system temp dir (`name` and a counter in its name),
// removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("distca_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// A command line of `base` with `over` replacing or adding flags: " FLAG VALUE" each, in flag
// order; a VALUE of "" drops the flag, " " gives it alone (a switch).
inline std::string flag_line(std::map<std::string, std::string> base, const std::map<std::string, std::string>& over) {
  for (const auto& [k, v] : over) base[k] = v;
  std::string out;
  for (const auto& [k, v] : base) {
    if (!v.empty()) out += " " + k + (v == " " ? "" : " " + v);
  }
  return out;
}

class CliFixture : public ::testing::Test {
 protected:
  // `name`: the directory's prefix; `command`: what run() puts before its arguments (a
  // subcommand such as "simulate", or "" to pass the whole command line).
  CliFixture(std::string name, std::string command) : name_(std::move(name)), command_(std::move(command)) {}

  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("distca_" + name_ + "_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `timeout_s` > 0 runs it under `timeout`: a blocked read ends with exit 124 instead of
  // hanging the suite.
  CliRun run(const std::string& args, int timeout_s = 0) const {
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    const std::string prefix = timeout_s > 0 ? "timeout " + std::to_string(timeout_s) + " " : "";
    const std::string cmd = prefix + std::string(DISTCA_CLI) + " " + command_ + " " + args + " >" + out.string() +
                            " 2>" + err.string();
    const int st = std::system(cmd.c_str());
    CliRun r;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  // `args` plus `--json DIR/out.json` (and each of `output_flags` with a file in DIR) is
  // refused with exit 2 and one stderr line naming `flag`, and no output file exists after.
  void expect_refused(const std::string& args, const std::string& flag,
                      const std::vector<std::string>& output_flags = {}) const {
    std::vector<fs::path> files = {dir_ / "out.json"};
    std::string extra = " --json " + files[0].string();
    for (size_t i = 0; i < output_flags.size(); ++i) {
      files.push_back(dir_ / ("out" + std::to_string(i) + ".file"));
      extra += " " + output_flags[i] + " " + files.back().string();
    }
    const CliRun r = run(args + extra);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    for (const fs::path& f : files) EXPECT_FALSE(fs::exists(f)) << args << ": " << f;
  }

  std::string name_, command_;
  fs::path dir_;
};

}  // namespace distca::testing
