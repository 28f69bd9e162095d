// `distca attention` end to end: .npy files written here, the CLI run as a process, its
// outputs compared with the fp64 reference; bad inputs exit 2 with one line naming the input.
// Also `distca profile` on a tiny grid (the table must load back through the cost layer).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distca/core/io.h"
#include "distca/core/npy.h"
#include "distca/cost/options.h"
#include "distca/cost/profiled.h"
#include "distca/kernels/profiler.h"
#include "distca/kernels/reference.h"

namespace distca {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int code;
  std::string err;
};

RunResult run_cli(const std::string& args, const std::string& dir) {
  const std::string err_path = dir + "/stderr.txt";
  const std::string cmd = std::string(DISTCA_CLI) + " " + args + " 2>" + err_path + " >/dev/null";
  const int st = std::system(cmd.c_str());
  RunResult r{WIFEXITED(st) ? WEXITSTATUS(st) : -1, ""};
  auto e = read_file(err_path);
  if (e.ok()) r.err = *e;
  return r;
}

class CliAttention : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/cli_attention_" + std::to_string(::getpid()) + "_" +
           testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes q, k, v, cu_q, cu_k, do for the given tasks and heads.
  kernels::AttentionProblem write_inputs(const std::vector<std::pair<int64_t, int64_t>>& tasks, int h, int hkv,
                                         int d) {
    kernels::AttentionProblem pr = kernels::make_problem(tasks, h, hkv, d, 99);
    const int64_t tq = pr.cu_q.back(), tk = pr.cu_k.back();
    EXPECT_TRUE(write_npy(dir_ + "/q.npy", pr.q.data(), {tq, h, d}).ok());
    EXPECT_TRUE(write_npy(dir_ + "/k.npy", pr.k.data(), {tk, hkv, d}).ok());
    EXPECT_TRUE(write_npy(dir_ + "/v.npy", pr.v.data(), {tk, hkv, d}).ok());
    EXPECT_TRUE(write_npy(dir_ + "/do.npy", pr.d_o.data(), {tq, h, d}).ok());
    EXPECT_TRUE(write_npy(dir_ + "/cq.npy", pr.cu_q.data(), {static_cast<int64_t>(pr.cu_q.size())}).ok());
    EXPECT_TRUE(write_npy(dir_ + "/ck.npy", pr.cu_k.data(), {static_cast<int64_t>(pr.cu_k.size())}).ok());
    return pr;
  }
  std::string args(const std::string& extra = "") const {
    return "attention --q " + dir_ + "/q.npy --k " + dir_ + "/k.npy --v " + dir_ + "/v.npy --cu-seqlens-q " + dir_ +
           "/cq.npy --cu-seqlens-k " + dir_ + "/ck.npy --out-dir " + dir_ + "/out " + extra;
  }
  std::vector<float> read(const std::string& name, const std::vector<int64_t>& shape) {
    auto a = read_npy(dir_ + "/out/" + name);
    EXPECT_TRUE(a.ok()) << name;
    if (!a.ok()) return {};
    EXPECT_EQ(a->shape, shape) << name;
    return a->f32;
  }
  std::string dir_;
};

double max_err(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double e = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) e = std::max(e, std::abs(a[i] - b[i]));
  return e;
}

TEST_F(CliAttention, ForwardAndBackwardMatchTheReference) {
  for (bool causal : {true, false}) {
    auto pr = write_inputs({{3, 10}, {0, 4}, {17, 17}}, 4, 2, 32);
    pr.causal = causal;
    const std::string extra = std::string("--do ") + dir_ + "/do.npy --scale 0.2" + (causal ? "" : " --no-causal");
    const RunResult r = run_cli(args(extra), dir_);
    ASSERT_EQ(r.code, 0) << r.err;
    kernels::AttentionParams p = kernels::params_for(pr);
    p.softmax_scale = 0.2f;
    std::vector<double> q(pr.q.begin(), pr.q.end()), k(pr.k.begin(), pr.k.end()), v(pr.v.begin(), pr.v.end()),
        dO(pr.d_o.begin(), pr.d_o.end());
    std::vector<double> o(q.size()), lse(pr.lse.size()), dq(q.size()), dk(k.size()), dv(v.size());
    kernels::reference_forward<double>(p, q.data(), k.data(), v.data(), o.data(), lse.data());
    kernels::reference_backward<double>(p, q.data(), k.data(), v.data(), dO.data(), dq.data(), dk.data(), dv.data());
    EXPECT_LT(max_err(read("o.npy", {20, 4, 32}), o), 1e-5);
    EXPECT_LT(max_err(read("lse.npy", {4, 20}), lse), 1e-5);
    EXPECT_LT(max_err(read("dq.npy", {20, 4, 32}), dq), 1e-5);
    EXPECT_LT(max_err(read("dk.npy", {31, 2, 32}), dk), 1e-5);
    EXPECT_LT(max_err(read("dv.npy", {31, 2, 32}), dv), 1e-5);
  }
}

TEST_F(CliAttention, ForwardOnlyWritesNoGradients) {
  write_inputs({{5, 9}}, 2, 1, 16);
  const RunResult r = run_cli(args(), dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ + "/out/o.npy"));
  EXPECT_TRUE(fs::exists(dir_ + "/out/lse.npy"));
  EXPECT_FALSE(fs::exists(dir_ + "/out/dq.npy"));
}

TEST_F(CliAttention, BadInputsAreRefusedWithOneLine) {
  auto pr = write_inputs({{3, 10}, {4, 4}}, 4, 2, 8);
  const std::string d = dir_;
  const int32_t dec[] = {0, 9, 7};
  const int32_t wrong_last[] = {0, 3, 6};
  const int32_t too_long[] = {0, 2, 7};  // task 1: q_len 5 > kv_len 4
  const int32_t small_cu[] = {0, 7};
  const std::vector<float> f8(4 * 2 * 8, 0.0f);
  struct Bad {
    std::string setup_file;  // file to overwrite before the run ("" = none)
    std::string content;
    std::string extra;
    std::string needle;
  };
  const std::vector<Bad> cases = {
      {d + "/cq.npy", npy_bytes(dec, {3}), "", "--cu-seqlens-q"},
      {d + "/cq.npy", npy_bytes(wrong_last, {3}), "", "--cu-seqlens-q"},
      {d + "/cq.npy", npy_bytes(too_long, {3}), "", "q_len"},
      {d + "/ck.npy", npy_bytes(small_cu, {2}), "", "--cu-seqlens-k"},
      {d + "/cq.npy", npy_bytes(f8.data(), {3}), "", "--cu-seqlens-q"},          // float cu_seqlens
      {d + "/v.npy", npy_bytes(f8.data(), {4, 2, 8}), "", "--v"},                // shape differs from k
      {d + "/k.npy", npy_bytes(f8.data(), {2, 4, 4}), "", "--k"},                // head_dim differs
      {d + "/do.npy", npy_bytes(f8.data(), {4, 2, 8}), "--do " + d + "/do.npy", "--do"},
      {d + "/q.npy", "garbage", "", "--q"},
      {"", "", "--do " + d + "/missing.npy", "missing.npy"},
  };
  for (const auto& c : cases) {
    write_inputs({{3, 10}, {4, 4}}, 4, 2, 8);  // restore the good files
    if (!c.setup_file.empty()) {
      ASSERT_TRUE(write_file_atomic(c.setup_file, c.content).ok());
    }
    const RunResult r = run_cli(args(c.extra), dir_);
    EXPECT_EQ(r.code, 2) << c.needle << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(d + "/out/o.npy")) << c.needle;  // refused before any output
  }
  (void)pr;
}

// Every task with q_len 0 is a valid call (attention.h): outputs of zero rows, zero key
// gradients.
TEST_F(CliAttention, EveryTaskWithoutQueriesGivesEmptyOutputs) {
  for (bool causal : {true, false}) {
    write_inputs({{0, 5}, {0, 3}}, 4, 2, 8);
    const RunResult r = run_cli(args("--do " + dir_ + "/do.npy" + (causal ? "" : " --no-causal")), dir_);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(read("o.npy", {0, 4, 8}).empty());
    EXPECT_TRUE(read("lse.npy", {4, 0}).empty());
    EXPECT_TRUE(read("dq.npy", {0, 4, 8}).empty());
    EXPECT_EQ(read("dk.npy", {8, 2, 8}), std::vector<float>(8 * 2 * 8, 0.0f));
    EXPECT_EQ(read("dv.npy", {8, 2, 8}), std::vector<float>(8 * 2 * 8, 0.0f));
  }
  // No keys at all either (non-causal): still valid.
  write_inputs({{0, 0}}, 2, 1, 4);
  const RunResult r = run_cli(args("--no-causal"), dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(read("o.npy", {0, 2, 4}).empty());
}

TEST_F(CliAttention, ScaleMustBeFiniteAndPositive) {
  write_inputs({{3, 10}}, 2, 1, 8);
  for (const char* bad : {"nan", "inf", "-inf", "-1", "0", "1e-50", "1e300"}) {
    const RunResult r = run_cli(args(std::string("--scale ") + bad), dir_);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.err;
    EXPECT_NE(r.err.find("--scale"), std::string::npos) << bad << ": " << r.err;
    EXPECT_EQ(r.err.find("--cu-seqlens"), std::string::npos) << bad << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(dir_ + "/out/o.npy")) << bad;
  }
  EXPECT_EQ(run_cli(args("--scale 0.25"), dir_).code, 0);
}

// An output that cannot be written is found before the work, and no other output is written
// (before: o.npy and lse.npy were left behind when dq.npy failed).
TEST_F(CliAttention, AnUnwritableOutputLeavesNoOtherOutput) {
  write_inputs({{3, 10}}, 2, 1, 8);
  fs::create_directories(dir_ + "/out/dq.npy");  // a directory where the third output goes
  const RunResult r = run_cli(args("--do " + dir_ + "/do.npy"), dir_);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--out-dir"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("dq.npy"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  for (const char* f : {"o.npy", "lse.npy", "dk.npy", "dv.npy"}) EXPECT_FALSE(fs::exists(dir_ + "/out/" + f)) << f;
  // --out-dir naming a file is refused the same way.
  ASSERT_TRUE(write_file_atomic(dir_ + "/plain", "x").ok());
  const RunResult f = run_cli("attention --q " + dir_ + "/q.npy --k " + dir_ + "/k.npy --v " + dir_ + "/v.npy --cu-seqlens-q " +
                                  dir_ + "/cq.npy --cu-seqlens-k " + dir_ + "/ck.npy --out-dir " + dir_ + "/plain",
                              dir_);
  EXPECT_EQ(f.code, 2) << f.err;
  EXPECT_NE(f.err.find("--out-dir"), std::string::npos) << f.err;
}

// A FIFO without a writer as an input must not block: refused at once (exit 2). `timeout`
// turns a regression into a failure here; the CTest TIMEOUT (cli_timeouts.cmake) backs it up.
TEST_F(CliAttention, AFifoAsInputIsRefusedWithoutBlocking) {
  write_inputs({{3, 10}}, 2, 1, 8);
  for (const std::string name : {"q", "cq"}) {
    const std::string fifo = dir_ + "/" + name + ".npy";
    fs::remove(fifo);
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    const std::string cmd = "timeout -k 2 20 " + std::string(DISTCA_CLI) + " " + args() + " 2>" + dir_ + "/err.txt";
    const int st = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(st));
    EXPECT_EQ(WEXITSTATUS(st), 2) << name << " (124: it blocked)";
    auto err = read_file(dir_ + "/err.txt");
    ASSERT_TRUE(err.ok());
    EXPECT_NE(err->find(name == "q" ? "--q" : "--cu-seqlens-q"), std::string::npos) << *err;
    EXPECT_NE(err->find("FIFO"), std::string::npos) << *err;
    fs::remove(fifo);
    write_inputs({{3, 10}}, 2, 1, 8);
  }
}

// profile estimates its largest problem from the flags and refuses it before allocating.
TEST_F(CliAttention, ProfileRefusesProblemsThatDoNotFitInMemory) {
  const std::string out = dir_ + "/table.json";
  for (const std::string flags : {"--heads 100000 --head-dim 4096", "--heads 65536 --kv-heads 65536 --head-dim 65536",
                                  "--heads 8 --head-dim 1000000 --max-len 16777216"}) {
    const RunResult r = run_cli("profile --out " + out + " " + flags, dir_);
    EXPECT_EQ(r.code, 2) << flags << ": " << r.err;
    EXPECT_NE(r.err.find("--heads"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--head-dim"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("needs about"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
  const RunResult b = run_cli("bench attention --heads 4096 --max-len 1048576", dir_);
  EXPECT_EQ(b.code, 2) << b.err;
  EXPECT_NE(b.err.find("--heads 4096"), std::string::npos) << b.err;
}

// Settings and outputs are checked before the (default: minutes long) grid runs.
TEST_F(CliAttention, ProfileChecksItsSettingsAndOutputFirst) {
  struct Case {
    std::string flags, needle;
  };
  const std::vector<Case> cases = {
      {"--min-seconds nan", "--min-seconds"},
      {"--min-seconds inf", "--min-seconds"},
      {"--min-call-seconds nan", "--min-call-seconds"},
      {"--min-call-seconds -1", "--min-call-seconds"},
      {"--min-call-seconds 11", "--min-call-seconds"},
      {"--out " + dir_ + "/missing/table.json", "--out"},
      {"--out " + dir_, "--out"},  // a directory
  };
  for (const Case& c : cases) {
    const RunResult r = run_cli("profile " + c.flags, dir_);
    EXPECT_EQ(r.code, 2) << c.flags << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// A write to stdout that cannot complete is an error (exit 1), not a silent success.
TEST_F(CliAttention, ProfileAndBenchToAFullStdoutFail) {
  for (const std::string args : {"profile --min-len 16 --max-len 16 --head-dim 8 --repeats 1 --min-seconds 0",
                                 "bench attention --max-len 32 --context 256 --repeats 1 --sgemm-n 64 --head-dims 8",
                                 "bench attention --max-len 32 --context 256 --repeats 1 --sgemm-n 64 --head-dims 8 --json"}) {
    const std::string cmd = std::string(DISTCA_CLI) + " " + args + " >/dev/full 2>" + dir_ + "/err.txt";
    const int st = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(st));
    EXPECT_EQ(WEXITSTATUS(st), 1) << args;
    auto err = read_file(dir_ + "/err.txt");
    ASSERT_TRUE(err.ok());
    EXPECT_NE(err->find("standard output"), std::string::npos) << args << ": " << *err;
  }
}

TEST_F(CliAttention, ProfileWritesALoadableTable) {
  const std::string out = dir_ + "/table.json";
  const RunResult r = run_cli("profile --out " + out + " --min-len 16 --max-len 64 --heads 2 --head-dim 16 --repeats 1 "
                              "--min-seconds 0",
                              dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  auto model = load_cost_table_option(out);
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ((*model)->unit(), "seconds");
  EXPECT_GT((*model)->task_cost(32, 64), 0.0);
  auto j = read_json_file(out);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["q_lens"], nlohmann::json({16, 32, 64}));
  EXPECT_TRUE((*j)["hardware"].contains("threads"));
}

}  // namespace
}  // namespace distca
