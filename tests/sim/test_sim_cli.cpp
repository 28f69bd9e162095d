// `distca simulate` end to end: bad flags refused with exit 2 and one line naming the flag
// (and no output file), the JSON keys, --json FILE written, --trace a valid Chrome trace
// with one process per unit, and the same output for the same seed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/cli_fixture.h"

namespace {

namespace fs = std::filesystem;

using distca::testing::CliRun;
using distca::testing::slurp;

class SimCli : public distca::testing::CliFixture {
 protected:
  SimCli() : CliFixture("sim_cli", "simulate") {}
  void expect_refused(const std::string& args, const std::string& flag) const {
    CliFixture::expect_refused(args, flag, {"--trace"});
  }
};

const char* kSmall = "--gpus 32 --tokens-per-rank 16384 --dist prolong --seed 3";

TEST_F(SimCli, RefusesBadFlagsWithOneLine) {
  expect_refused("--gpus 30 --tokens-per-rank 16384", "--gpus");
  expect_refused("--tokens-per-rank 16384", "--gpus");
  expect_refused("--gpus 32 --pp 3 --tokens-per-rank 16384", "--pp");
  expect_refused("--gpus 512 --pp 64 --tokens-per-rank 16384", "--pp");
  expect_refused("--gpus 32 --strategy fast --tokens-per-rank 16384", "--strategy");
  expect_refused("--gpus 32 --strategy percp:3 --tokens-per-rank 16384", "--strategy");
  expect_refused("--gpus 32 --model huge --tokens-per-rank 16384", "--model");
  expect_refused("--gpus 32 --mfu 0 --tokens-per-rank 16384", "--mfu");
  expect_refused("--gpus 32 --tolerance -1 --tokens-per-rank 16384", "--tolerance");
  expect_refused("--gpus 32 --ranks 8 --tokens-per-rank 16384", "--ranks");
  expect_refused("--gpus 32 --tokens-per-rank 1000", "--tokens-per-rank");
  expect_refused("--gpus 32 --dist nope --tokens-per-rank 16384", "--dist");
  expect_refused("--gpus 32 --microbatches 0 --tokens-per-rank 16384", "--microbatches");
  expect_refused("--gpus 32 --batch " + (dir_ / "missing.json").string(), "--batch");
  expect_refused(std::string(kSmall) + " --out " + dir_.string(), "--out");
  expect_refused(std::string(kSmall) + " --inter-node-bw 0", "--inter-node-bw");
  expect_refused("--sweep fig9 --gpus 32 --out " + (dir_ / "sweep").string(), "--gpus");
  expect_refused("--sweep fig9", "--out");
}

TEST_F(SimCli, JsonHasTheDocumentedKeys) {
  const CliRun r = run(std::string(kSmall) + " --strategy wlb --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"strategy", "model", "hardware", "gpus", "gpus_per_node", "units", "pp", "microbatches", "dp",
                          "cp_degree", "tokens", "iteration_seconds", "pipeline_seconds", "grad_sync_seconds",
                          "tokens_per_second", "oom", "oom_unit", "oom_reason", "peak_memory_bytes", "idle_fraction",
                          "exposed_comm_fraction", "bytes_total", "busy_max_over_mean", "plan", "cp_candidates",
                          "pp_ticks", "per_unit", "dist", "seed"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  for (const char* key : {"plans", "tasks", "load_max_over_mean", "load_before_max_over_mean", "comm_bytes_forward",
                          "comm_bytes_backward", "plan_seconds"}) {
    EXPECT_TRUE(j["plan"].contains(key)) << key;
  }
  ASSERT_EQ(j["per_unit"].size(), 4u);
  for (const char* key : {"unit", "stage", "tokens", "busy", "linear", "attention", "comm", "exposed_comm", "idle",
                          "bytes_sent", "bytes_received", "memory"}) {
    EXPECT_TRUE(j["per_unit"][0].contains(key)) << key;
  }
  EXPECT_EQ(j["strategy"], "wlb");
  EXPECT_EQ(j["cp_candidates"].size(), 3u);  // 1, 2, 4
  EXPECT_GT(j["iteration_seconds"].get<double>(), 0);
  // busy + exposed + idle = iteration on every unit.
  for (const auto& u : j["per_unit"]) {
    EXPECT_NEAR(u["busy"].get<double>() + u["exposed_comm"].get<double>() + u["idle"].get<double>(),
                j["iteration_seconds"].get<double>(), 1e-9);
  }
}

TEST_F(SimCli, SameSeedSameOutputAndJsonFile) {
  const fs::path a = dir_ / "a.json", b = dir_ / "b.json";
  ASSERT_EQ(run(std::string(kSmall) + " --pp 2 --strategy cad --json " + a.string()).code, 0);
  ASSERT_EQ(run(std::string(kSmall) + " --pp 2 --strategy cad --json " + b.string()).code, 0);
  auto ja = nlohmann::json::parse(slurp(a)), jb = nlohmann::json::parse(slurp(b));
  ja["plan"].erase("plan_seconds");
  jb["plan"].erase("plan_seconds");
  EXPECT_EQ(ja, jb);
  EXPECT_EQ(ja["pp"], 2);
  EXPECT_EQ(ja["microbatches"], 4);  // default 2 x PP
}

TEST_F(SimCli, BatchFileGivesOneMicrobatchPerBatch) {
  const fs::path batches = dir_ / "batches.json";
  const std::string cmd = std::string(DISTCA_CLI) + " workload --ranks 4 --tokens-per-rank 16384 --batches 3 --seed 3 " +
                          "--json --full >" + batches.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const CliRun r = run("--gpus 32 --strategy colocated --batch " + batches.string() + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["microbatches"], 3);
  EXPECT_EQ(j["tokens"], 3 * 4 * 16384);
  // The same batches drawn by simulate itself give the same result.
  const CliRun g = run("--gpus 32 --strategy colocated --tokens-per-rank 16384 --microbatches 3 --seed 3 --json");
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(nlohmann::json::parse(g.out)["iteration_seconds"], j["iteration_seconds"]);
  // A batch file for another cluster size is refused.
  expect_refused("--gpus 64 --batch " + batches.string(), "--batch");
}

TEST_F(SimCli, TraceIsChromeJsonWithOneProcessPerUnit) {
  for (const char* strategy : {"cad", "colocated", "percp:2"}) {
    const fs::path trace = dir_ / "trace.json";
    const CliRun r = run(std::string(kSmall) + " --pp 2 --strategy " + strategy + " --trace " + trace.string());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("iteration"), std::string::npos);
    const auto j = nlohmann::json::parse(slurp(trace));
    ASSERT_TRUE(j.contains("traceEvents"));
    std::set<int64_t> pids, named;
    double end = 0;
    for (const auto& e : j["traceEvents"]) {
      if (e["ph"] == "M" && e["name"] == "process_name") named.insert(e["pid"].get<int64_t>());
      if (e["ph"] != "X") continue;
      pids.insert(e["pid"].get<int64_t>());
      EXPECT_GE(e["dur"].get<double>(), 0);
      EXPECT_GE(e["ts"].get<double>(), 0);
      end = std::max(end, e["ts"].get<double>() + e["dur"].get<double>());
    }
    EXPECT_EQ(pids.size(), 4u) << strategy;
    EXPECT_EQ(named, pids) << strategy;
    const double iteration = j["otherData"]["iteration_seconds"].get<double>();
    EXPECT_LE(end, iteration * 1e6 * (1 + 1e-9)) << strategy;
    fs::remove(trace);
  }
}

// Settings once found only inside the work (issue 12, classes 4 and 7): each is refused with
// exit 2 and one line naming the flag the user typed, before anything is simulated.
TEST_F(SimCli, FlagsDerivedFromTheClusterNameTheClusterFlag) {
  // 2^31 GPUs make 2^28 nodes: too many ranks for the workload, but the user typed --gpus.
  const CliRun r = run("--gpus 2147483648 --tokens-per-rank 16384");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--gpus"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--ranks"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  expect_refused("--gpus 2147483648 --tokens-per-rank 16384", "--gpus");
  // 2^20 nodes of 2^21 tokens: over 2^40 tokens per micro-batch.
  const CliRun t = run("--gpus 8388608 --tokens-per-rank 2097152");
  EXPECT_EQ(t.code, 2) << t.err;
  EXPECT_NE(t.err.find("--gpus"), std::string::npos) << t.err;
  EXPECT_EQ(t.err.find("--ranks"), std::string::npos) << t.err;
}

TEST_F(SimCli, SweepBatchesAreNamedAsTyped) {
  const std::string out = " --out " + (dir_ / "sweep").string();
  CliRun r = run("--sweep fig4b --sweep-batches 0" + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--sweep-batches"), std::string::npos) << r.err;
  r = run("--sweep fig4b --batches 0" + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--batches"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--sweep-batches"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "sweep"));
}

TEST_F(SimCli, UnwritableOutputsAreRefusedBeforeTheWork) {
  const fs::path dir = dir_ / "a_directory";
  fs::create_directory(dir);
  const fs::path dangling = dir_ / "dangling";
  fs::create_symlink(dir_ / "missing" / "target", dangling);
  struct Case {
    std::string args, flag;
  };
  const std::vector<Case> cases = {
      {std::string(kSmall) + " --json " + dir.string(), "--json"},
      {std::string(kSmall) + " --trace " + dir.string(), "--trace"},
      {std::string(kSmall) + " --trace " + dangling.string() + " --json", "--trace"},
      {std::string(kSmall) + " --json " + (dir_ / "missing" / "x.json").string(), "--json"},
  };
  for (const Case& c : cases) {
    const CliRun r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.flag), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.out, "") << c.args;  // nothing simulated, nothing printed
  }
  // A sweep's output file that cannot be written (here a directory where fig4b.csv goes).
  const fs::path sweep = dir_ / "sweep";
  fs::create_directories(sweep / "fig4b.csv");
  const CliRun s = run("--sweep fig4b --sweep-batches 2 --no-plot --out " + sweep.string());
  EXPECT_EQ(s.code, 2) << s.err;
  EXPECT_NE(s.err.find("--out"), std::string::npos) << s.err;
  EXPECT_EQ(s.out, "");
  EXPECT_FALSE(fs::exists(sweep / "fig4b.gp"));  // neither file of the pair
  // bench simulate --json: refused before the table is printed.
  const std::string bench = std::string(DISTCA_CLI) + " bench simulate --gpus 64 --tokens-k 16 --repeats 1 " +
                            "--strategies colocated --json " + dir.string() + " >" + (dir_ / "b.out").string() +
                            " 2>" + (dir_ / "b.err").string();
  const int st = std::system(bench.c_str());
  EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 2);
  EXPECT_NE(slurp(dir_ / "b.err").find("--json"), std::string::npos) << slurp(dir_ / "b.err");
  EXPECT_EQ(slurp(dir_ / "b.out"), "");
}

// A run whose estimate exceeds any machine (2.7e12 tokens drawn at once) is refused from the
// flags, exit 2, before anything is drawn.
TEST_F(SimCli, RunsThatCannotFitAreRefusedFromTheirFlags) {
  const CliRun r = run("--gpus 4096 --tokens-per-rank 524288 --microbatches 10000");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--microbatches 10000"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("needs about"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  const std::string bench = std::string(DISTCA_CLI) + " bench simulate --gpus 4096 --tokens-k 512 --microbatches 10000" +
                            " >" + (dir_ / "b.out").string() + " 2>" + (dir_ / "b.err").string();
  const int st = std::system(bench.c_str());
  EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 2);
  EXPECT_NE(slurp(dir_ / "b.err").find("needs about"), std::string::npos) << slurp(dir_ / "b.err");
}

}  // namespace

