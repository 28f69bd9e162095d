// What the CLI does when its output cannot be delivered: a failed write to standard output
// (/dev/full, a closed stdout) or to an output file that is a device is an error (exit 1, one
// line), and a device node given as an output stays what it is. Also: the binary picks fast
// OpenBLAS kernels by itself, as scripts/blas-env.sh would.
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "distca/core/memory.h"

#include "support/cli_fixture.h"

namespace distca::testing {
namespace {

class CliOutputsTest : public CliFixture {
 protected:
  CliOutputsTest() : CliFixture("cli_outputs", "") {}

  // Runs `distca <args>` with the shell redirections `redirect` for stdout (stderr goes to a
  // file); returns the exit code (-1 when killed by a signal) and fills err_.
  int run_redirected(const std::string& args, const std::string& redirect) {
    const std::string cmd = std::string(DISTCA_CLI) + " " + args + " " + redirect + " 2>" + (dir_ / "err").string();
    const int st = std::system(cmd.c_str());
    err_ = slurp(dir_ / "err");
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  void expect_one_error_line(const std::string& part) const {
    EXPECT_EQ(std::count(err_.begin(), err_.end(), '\n'), 1) << err_;
    EXPECT_EQ(err_.rfind("distca: error: ", 0), 0u) << err_;
    EXPECT_NE(err_.find(part), std::string::npos) << err_;
  }
  static bool is_char_device(const char* path) {
    struct stat st {};
    return ::lstat(path, &st) == 0 && S_ISCHR(st.st_mode);
  }
  std::string err_;
};

constexpr const char* kSmallPlan = "plan --ranks 4 --tokens-per-rank 4096";

TEST_F(CliOutputsTest, StdoutToFullDeviceFails) {
  EXPECT_EQ(run_redirected("workload", ">/dev/full"), 1);
  expect_one_error_line("cannot write to standard output");
}

TEST_F(CliOutputsTest, ClosedStdoutFails) {
  EXPECT_EQ(run_redirected("workload", ">&-"), 1);
  expect_one_error_line("cannot write to standard output");
}

TEST_F(CliOutputsTest, StdoutToNullSucceeds) {
  EXPECT_EQ(run_redirected("workload", ">/dev/null"), 0) << err_;
  EXPECT_EQ(err_, "");
}

TEST_F(CliOutputsTest, JsonToStdoutOnFullDeviceFails) {
  EXPECT_EQ(run_redirected(std::string(kSmallPlan) + " --json -", ">/dev/full"), 1);
  expect_one_error_line("standard output");
}

TEST_F(CliOutputsTest, JsonFileOnFullDeviceFailsAndTheDeviceStays) {
  ASSERT_TRUE(is_char_device("/dev/full"));
  EXPECT_NE(run_redirected(std::string(kSmallPlan) + " --json /dev/full", ">/dev/null"), 0);
  expect_one_error_line("/dev/full");
  EXPECT_TRUE(is_char_device("/dev/full"));
}

TEST_F(CliOutputsTest, ClosedStdoutDoesNotLeakIntoAnOutputFile) {
  // With fd 1 closed, the next open() would return 1: the loss lines printed to "stdout" must
  // not end up in the metrics file that open() created.
  const std::string metrics = (dir_ / "metrics.jsonl").string();
  EXPECT_EQ(run_redirected("train --steps 2 --metrics " + metrics, ">&-"), 1);
  expect_one_error_line("cannot write to standard output");
  std::istringstream lines(slurp(metrics));
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) EXPECT_EQ(line.rfind("{\"", 0), 0u) << line;
  EXPECT_EQ(n, 2);
}

TEST_F(CliOutputsTest, PicksTheOpenBlasKernelsBlasEnvWouldPick) {
  // Reference: what scripts/blas-env.sh exports when nothing is set.
  const std::string ref_cmd = "env -u OPENBLAS_CORETYPE sh -c '. " + std::string(DISTCA_SOURCE_DIR) +
                              "/scripts/blas-env.sh; printf %s \"$OPENBLAS_CORETYPE\"' >" + (dir_ / "ref").string();
  ASSERT_EQ(std::system(ref_cmd.c_str()), 0);
  const std::string expected = slurp(dir_ / "ref");
  if (expected.empty()) GTEST_SKIP() << "blas-env.sh sets no core type on this CPU";
  const std::string bench = "bench attention --max-len 32 --context 256 --repeats 1 --head-dims 8 --sgemm-n 64";
  const std::string cmd = "env -u OPENBLAS_CORETYPE " + std::string(DISTCA_CLI) + " " + bench + " >" +
                          (dir_ / "out").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(dir_ / "out");
  const std::string out = slurp(dir_ / "out");
  EXPECT_NE(out.find("OpenBLAS (" + expected + " kernels)"), std::string::npos) << expected << "\n" << out;
}

TEST_F(CliOutputsTest, PutsTheHeapOnHugePagesUnlessTheUserChose) {
  // The CLI adds glibc.malloc.hugetlb=1 to GLIBC_TUNABLES and re-executes itself where THP can
  // be advised; a value the user gave stands. bench attention's header says which it ran with.
  const std::string bench = "bench attention --max-len 32 --context 256 --repeats 1 --head-dims 8 --sgemm-n 64";
  const auto header = [&](const std::string& env) {
    const std::string cmd = env + " " + std::string(DISTCA_CLI) + " " + bench + " >" + (dir_ / "out").string() + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(dir_ / "out");
    const std::string out = slurp(dir_ / "out");
    const size_t at = out.find("heap on ");
    return at == std::string::npos ? out : out.substr(at, out.find('\n', at) - at);
  };
  const std::string huge = transparent_huge_pages_available() ? "heap on 2 MiB pages" : "heap on 4 KiB pages";
  EXPECT_EQ(header("env -u GLIBC_TUNABLES"), huge);
  EXPECT_EQ(header("env GLIBC_TUNABLES=glibc.malloc.check=0"), huge);
  EXPECT_EQ(header("env GLIBC_TUNABLES=glibc.malloc.hugetlb=0"), "heap on 4 KiB pages");
}

}  // namespace
}  // namespace distca::testing
