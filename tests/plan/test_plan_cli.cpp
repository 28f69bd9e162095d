// `distca plan` end to end: bad input refused with one line naming the flag (exit 2, no
// output file), the JSON keys, --batch round trip with `workload --json --full`, several
// batches, and byte-identical output for the same input.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/cli_fixture.h"

namespace {

namespace fs = std::filesystem;

using distca::testing::CliRun;
using distca::testing::slurp;

class PlanCli : public distca::testing::CliFixture {
 protected:
  PlanCli() : CliFixture("plan_cli", "") {}
};

const std::string kSmall = "plan --dist prolong --ranks 4 --tokens-per-rank 4096 --seed 7";

TEST_F(PlanCli, RefusesBadInput) {
  expect_refused(kSmall + " --scheduler magic", "--scheduler");
  expect_refused(kSmall + " --scheduler percp:", "--scheduler");
  expect_refused(kSmall + " --scheduler percp:0", "--scheduler");
  expect_refused("plan --ranks 8 --tokens-per-rank 4096 --scheduler percp:3", "percp:3");
  expect_refused(kSmall + " --tolerance -0.1", "--tolerance");
  expect_refused(kSmall + " --tolerance 1.5", "--tolerance");
  expect_refused(kSmall + " --dtype fp16", "--dtype");
  expect_refused(kSmall + " --model huge", "--model");
  expect_refused(kSmall + " --wlb-mem-cap 0.5 --scheduler wlb", "--wlb-mem-cap");
  expect_refused(kSmall + " --ranks 0", "--ranks");
  expect_refused(kSmall + " --align-rows 0", "--align-rows");
  expect_refused(kSmall + " --align-rows x", "--align-rows");
  expect_refused("plan --batch " + (dir_ / "missing.json").string(), "--batch");
  const CliRun r = run(kSmall + " --full");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--full"), std::string::npos) << r.err;
}

// Topology and --tolerance auto: bad combinations refused before any work.
TEST_F(PlanCli, RefusesBadTopologyAndAutoTolerance) {
  const std::string hw = std::string(DISTCA_SOURCE_DIR) + "/configs/hardware/local-2rank.json";
  expect_refused(kSmall + " --ranks-per-host 3", "--ranks-per-host");
  expect_refused(kSmall + " --host-map 0,0,1", "--host-map");
  expect_refused(kSmall + " --host-map 0,x,1,1", "--host-map");
  expect_refused(kSmall + " --inter-host-price 4", "--inter-host-price");
  expect_refused(kSmall + " --ranks-per-host 2 --inter-host-price 0.5", "--inter-host-price");
  expect_refused(kSmall + " --tolerance abc", "--tolerance");
  expect_refused(kSmall + " --tolerance auto", "--hardware");
  expect_refused(kSmall + " --hardware " + hw, "--hardware");
  expect_refused(kSmall + " --tolerance auto --hardware " + hw + " --scheduler colocated", "--scheduler");
  expect_refused(kSmall + " --tolerance auto --hardware " + (dir_ / "missing.json").string(), "--hardware");
}

// --tolerance auto picks a ladder tolerance and reports every candidate's prediction; with a
// topology the JSON splits the bytes by link.
TEST_F(PlanCli, AutoToleranceAndBytesByLink) {
  const std::string hw = std::string(DISTCA_SOURCE_DIR) + "/configs/hardware/local-2rank.json";
  const CliRun r = run(kSmall + " --tolerance auto --hardware " + hw + " --ranks-per-host 2 --json -");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("tolerance_auto")) << r.out;
  const auto& cands = j["tolerance_auto"]["candidates"];
  EXPECT_NE(std::find(cands.begin(), cands.end(), j["tolerance"]), cands.end());
  EXPECT_EQ(j["tolerance_auto"]["predicted_seconds"].size(), cands.size());
  EXPECT_EQ(j["hosts"], nlohmann::json({0, 0, 1, 1}));
  EXPECT_EQ(j["inter_host_bytes"].get<int64_t>() + j["intra_host_bytes"].get<int64_t>(),
            j["comm_bytes_total"].get<int64_t>());
  const auto again = nlohmann::json::parse(run(kSmall + " --tolerance auto --hardware " + hw + " --ranks-per-host 2 --json -").out);
  EXPECT_EQ(again["tolerance_auto"], j["tolerance_auto"]);
  EXPECT_EQ(again["tolerance"], j["tolerance"]);
}

// Sizes whose plan cannot fit any machine are refused from the flags, before a batch is drawn
// (no output file): the batches and plan of 2^24 ranks, and --full's dense [ranks] exchange
// arrays of 65536 ranks (quadratic in ranks: tens of TiB).
TEST_F(PlanCli, RefusesWhatCannotFitBeforeAnyWork) {
  expect_refused("plan --ranks 16777216 --tokens-per-rank 65536", "--ranks 16777216 --tokens-per-rank 65536");
  expect_refused("plan --ranks 65536 --tokens-per-rank 16 --full", "--full");
  const CliRun r = run("plan --ranks 16777216 --tokens-per-rank 65536 --json -");
  EXPECT_NE(r.err.find("needs about"), std::string::npos) << r.err;
}

// 8192 ranks of 16 tokens: quadratic (~34 GB) while every rank kept a dense [ranks] layout per
// exchange; with the sparse layout it is planned (about 0.6 GB), or, on a machine with less
// memory free, refused honestly with exit 2 and the estimate.
TEST_F(PlanCli, EightThousandRanksArePlannedOrRefusedHonestly) {
  const CliRun r = run("plan --ranks 8192 --tokens-per-rank 16 --scheduler colocated --json -");
  if (r.code == 2) {
    EXPECT_NE(r.err.find("needs about"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--ranks 8192"), std::string::npos) << r.err;
    GTEST_SKIP() << "refused for memory: " << r.err;
  }
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["servers"], 8192);
  EXPECT_EQ(j["per_rank"].size(), 8192u);
}

// An output that cannot be written is refused before the work: the message names --json even
// when the batch file is also bad (the work would have failed first on it), and no file is left.
TEST_F(PlanCli, UnwritableJsonIsRefusedFirst) {
  const fs::path bad_batch = dir_ / "bad.json";
  std::ofstream(bad_batch) << "{\"ranks\": 0}";
  fs::create_directories(dir_ / "a_dir");
  for (const std::string& target : {(dir_ / "a_dir").string(), (dir_ / "missing" / "x.json").string()}) {
    CliRun r = run("plan --batch " + bad_batch.string() + " --json " + target);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("--json"), std::string::npos) << r.err;
    r = run(kSmall + " --json " + target);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("--json"), std::string::npos) << r.err;
  }
  const CliRun b = run("bench plan --quick --servers 8 --tokens-k 128 --batches 1 --no-sweep --json " +
                       (dir_ / "a_dir").string());
  EXPECT_EQ(b.code, 2) << b.err;
  EXPECT_NE(b.err.find("--json"), std::string::npos) << b.err;
  EXPECT_EQ(b.out.find("cad"), std::string::npos) << "bench plan ran before refusing: " << b.out;
}

// bench plan's refusals name its own flags (--servers, --tokens-k), never the --ranks /
// --tokens-per-rank of the workload options it builds from them.
TEST_F(PlanCli, BenchPlanRefusalsNameItsFlags) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--servers 16777217", "--servers"},
      {"--tokens-k 1152921504606846976", "--tokens-k"},
      {"--servers 16777216 --tokens-k 1024", "--servers (16777216) times --tokens-k"},
      {"--tokens-k -1", "--tokens-k"},
      {"--batches 0", "--batches"},
      {"--batches 1000000 --servers 1024", "--batches 1000000 --servers 1024"},
      {"--wide-tolerance 0.01", "--wide-tolerance"},  // below --tolerance 0.05
      {"--wide-tolerance 1.5", "--wide-tolerance"},
  };
  for (const auto& [args, flag] : cases) {
    const CliRun r = run("bench plan " + args + " --json " + (dir_ / "bench.json").string());
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("--ranks"), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("--tokens-per-rank"), std::string::npos) << args << ": " << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "bench.json"));
  }
}

// bench plan's complete-plan and monotonicity figures: present for cad and cad-symmetric, the
// phases adding up to the complete time (the "rest" closes the sum by definition, so it must
// not be negative beyond rounding), the monotonicity counts consistent with the worst ratio.
TEST_F(PlanCli, BenchPlanReportsCompletePlanPhasesAndMonotonicity) {
  const fs::path out = dir_ / "bench.json";
  const CliRun r = run("bench plan --dist pretrain --tokens-k 128 --servers 8 --batches 1 --no-sweep --json " +
                       out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(slurp(out));
  EXPECT_EQ(j["wide_tolerance"].get<double>(), 0.10);
  ASSERT_EQ(j["configs"].size(), 1u);
  for (const char* name : {"cad", "cad-symmetric"}) {
    const nlohmann::json& s = j["configs"][0]["schedulers"][name];
    ASSERT_TRUE(s.contains("complete_plan_ms_median")) << name;
    const double complete = s["complete_plan_ms_median"].get<double>();
    EXPECT_GT(complete, 0) << name;
    double sum = 0;
    for (const char* phase : {"validate", "schedule", "index", "tasks", "layouts", "mirror", "metrics", "rest"}) {
      ASSERT_TRUE(s["complete_plan_phases_ms_median"].contains(phase)) << name << " " << phase;
      const double ms = s["complete_plan_phases_ms_median"][phase].get<double>();
      if (std::string(phase) != "rest") {
        EXPECT_GE(ms, 0) << name << " " << phase;
      }
      sum += ms;
    }
    EXPECT_NEAR(sum, complete, 1e-6 * complete + 1e-9) << name;  // one batch: medians are its values
    const double worst = s["wide_over_tight_bytes_worst"].get<double>();
    EXPECT_GT(worst, 0) << name;
    EXPECT_LE(s["wide_over_tight_bytes_median"].get<double>(), worst) << name;
    EXPECT_EQ(s["wide_costs_more_batches"].get<int64_t>(), worst > 1 ? 1 : 0) << name;
  }
  EXPECT_FALSE(j["configs"][0]["schedulers"]["wlb"].contains("complete_plan_ms_median"));
}

// Inputs that are not regular files: a FIFO without a writer (would block forever), /dev/zero
// (would be read without end) and a directory (must say so, not "not valid JSON"). `timeout`
// turns a hang into exit 124, which fails the test instead of stalling the suite.
TEST_F(PlanCli, NonRegularBatchFilesAreRefused) {
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo.string(), std::string("/dev/zero"), dir_.string()}) {
    const CliRun r = run("plan --batch " + path, 60);
    EXPECT_EQ(r.code, 2) << path << ": " << r.err;
    EXPECT_NE(r.err.find("--batch"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("not valid JSON"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_NE(run("plan --batch " + dir_.string(), 60).err.find("directory"), std::string::npos);
}

// Numbers a batch file cannot hold: out of double range, beyond int64, not integers, negative.
// Each is one line naming the file and the field.
TEST_F(PlanCli, BatchFileNumbersAreChecked) {
  const std::string head = R"({"ranks": 1, "tokens_per_rank": 16, "per_rank": [[{"doc": 0, "offset": 0, "len": )";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"1e999", "per_rank[0][0].len"},
      {"9223372036854775808", "'len' is beyond int64"},
      {"2.5", "'len' must be an integer"},
      {"-16", "'len' must be positive"},
  };
  for (const auto& [value, expect] : cases) {
    const fs::path f = dir_ / "batch.json";
    std::ofstream(f) << head << value << R"(, "doc_len": 16}]]})";
    const CliRun r = run("plan --batch " + f.string());
    EXPECT_EQ(r.code, 2) << value << ": " << r.err;
    EXPECT_NE(r.err.find(f.string()), std::string::npos) << value << ": " << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << value << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST_F(PlanCli, PerCpDegreeMustDivideTheBatchFileRanks) {
  const fs::path batch = dir_ / "batch.json";
  ASSERT_EQ(run("workload --dist prolong --ranks 4 --tokens-per-rank 1024 --json --full").code, 0);
  std::ofstream(batch) << slurp(dir_ / "stdout");
  expect_refused("plan --batch " + batch.string() + " --scheduler percp:3", "percp:3");
}

TEST_F(PlanCli, JsonHasTheRequiredKeys) {
  for (const std::string sched : {"colocated", "wlb", "percp:2", "cad", "cad-symmetric"}) {
    const CliRun r = run(kSmall + " --scheduler " + sched + " --json -");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    for (const char* key : {"servers", "tasks", "scheduler", "tolerance", "align_rows", "load_max_over_mean",
                            "comm_bytes_total", "comm_bytes_backward", "comm_bytes_max_rank",
                            "allgather_bytes", "tokens_max_over_mean", "plan_seconds", "per_rank"}) {
      EXPECT_TRUE(j.contains(key)) << sched << " lacks " << key;
    }
    EXPECT_EQ(j["scheduler"], sched);
    EXPECT_EQ(j["servers"], 4);
    EXPECT_FALSE(j.contains("plan"));
    // The per-rank bytes add up to the totals.
    int64_t out = 0, in = 0, mx = 0;
    for (const auto& row : j["per_rank"]) {
      out += row["bytes_out"].get<int64_t>();
      in += row["bytes_in"].get<int64_t>();
      mx = std::max(mx, row["bytes_out"].get<int64_t>() + row["bytes_in"].get<int64_t>());
    }
    EXPECT_EQ(out, j["comm_bytes_total"].get<int64_t>()) << sched;
    EXPECT_EQ(in, out);
    EXPECT_EQ(mx, j["comm_bytes_max_rank"].get<int64_t>());
  }
}

// --align-rows: the plan records it, and every task boundary is a multiple of it or the end
// of a piece (a document's end, or where packing cut it between ranks).
TEST_F(PlanCli, AlignRowsPutsEveryCutOnTheGrid) {
  const std::string cmd = "plan --dist prolong --ranks 4 --tokens-per-rank 16384 --seed 3 --align-rows 256 --json - --full";
  const CliRun r = run(cmd);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["align_rows"], 256);
  EXPECT_EQ(j["plan"]["align_rows"], 256);
  std::set<std::pair<int64_t, int64_t>> ends;
  for (const auto& rank : j["plan"]["batch"]["per_rank"]) {
    for (const auto& p : rank) {
      ends.emplace(p["doc"].get<int64_t>(), p["offset"].get<int64_t>());
      ends.emplace(p["doc"].get<int64_t>(), p["offset"].get<int64_t>() + p["len"].get<int64_t>());
    }
  }
  int64_t moved = 0;
  for (const auto& server : j["plan"]["servers"]) {
    for (const auto& t : server["tasks"]) {
      if (t["home"] != server["rank"]) ++moved;
      for (const char* key : {"q_begin", "q_end"}) {
        const int64_t row = t[key].get<int64_t>();
        if (!ends.count({t["doc"].get<int64_t>(), row})) {
          EXPECT_EQ(row % 256, 0) << key << " " << row;
        }
      }
    }
  }
  EXPECT_GT(moved, 0);  // the planner did cut something
}

TEST_F(PlanCli, FullJsonToFileAndFp32Doubles) {
  const fs::path f = dir_ / "plan.json";
  ASSERT_EQ(run(kSmall + " --scheduler cad --json " + f.string() + " --full").code, 0);
  const auto j = nlohmann::json::parse(slurp(f));
  ASSERT_TRUE(j.contains("plan"));
  EXPECT_EQ(j["plan"]["servers"].size(), 4u);
  EXPECT_EQ(j["plan"]["ranks"].size(), 4u);
  EXPECT_TRUE(j["plan"]["ranks"][0]["exchanges"].contains("dkv"));
  const CliRun bf = run(kSmall + " --scheduler colocated --json -");
  const CliRun fp = run(kSmall + " --scheduler colocated --dtype fp32 --json -");
  ASSERT_EQ(bf.code, 0);
  ASSERT_EQ(fp.code, 0);
  // Colocated moves only K/V (all activations): fp32 doubles every byte.
  EXPECT_EQ(2 * nlohmann::json::parse(bf.out)["comm_bytes_total"].get<int64_t>(),
            nlohmann::json::parse(fp.out)["comm_bytes_total"].get<int64_t>());
}

TEST_F(PlanCli, BatchFileRoundTrip) {
  const std::string wl = "--dist prolong --ranks 4 --tokens-per-rank 4096 --layout head-tail --seed 3";
  ASSERT_EQ(run("workload " + wl + " --json --full").code, 0);
  const fs::path batch = dir_ / "batch.json";
  std::ofstream(batch) << slurp(dir_ / "stdout");
  for (const std::string sched : {"colocated", "cad"}) {
    const CliRun a = run("plan " + wl + " --scheduler " + sched + " --json - --full");
    const CliRun b = run("plan --batch " + batch.string() + " --scheduler " + sched + " --json - --full");
    ASSERT_EQ(a.code, 0) << a.err;
    ASSERT_EQ(b.code, 0) << b.err;
    EXPECT_EQ(nlohmann::json::parse(a.out)["plan"], nlohmann::json::parse(b.out)["plan"]) << sched;
  }
}

TEST_F(PlanCli, SeveralBatches) {
  const CliRun r = run(kSmall + " --batches 3 --scheduler cad --json -");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["per_batch"].size(), 3u);
  std::vector<double> bytes;
  double worst = 0;
  for (const auto& b : j["per_batch"]) {
    bytes.push_back(b["comm_bytes_total"].get<double>());
    worst = std::max(worst, b["load_max_over_mean"].get<double>());
  }
  std::sort(bytes.begin(), bytes.end());
  EXPECT_EQ(j["comm_bytes_total"].get<double>(), bytes[1]);
  EXPECT_EQ(j["load_max_over_mean"].get<double>(), worst);
  const CliRun table = run(kSmall + " --batches 3 --scheduler cad");
  ASSERT_EQ(table.code, 0);
  EXPECT_NE(table.out.find("3 batches"), std::string::npos) << table.out;
}

TEST_F(PlanCli, SameInputSameBytes) {
  for (const std::string sched : {"wlb", "percp:4", "cad", "cad-symmetric"}) {
    const CliRun a = run(kSmall + " --scheduler " + sched + " --json - --full");
    const CliRun b = run(kSmall + " --scheduler " + sched + " --json - --full");
    ASSERT_EQ(a.code, 0);
    auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
    ja.erase("plan_seconds");
    jb.erase("plan_seconds");
    EXPECT_EQ(ja.dump(), jb.dump()) << sched;
  }
}

TEST_F(PlanCli, HumanTable) {
  const CliRun r = run(kSmall + " --scheduler cad");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s : {"load max/mean", "work before", "work after", "bytes out", "bytes in"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  }
}

}  // namespace

namespace {

// --cost-table: a profiled table (measured here on a small grid) replaces pairs as the work
// measure; the plan still validates (the CLI validates every plan) and balances seconds.
TEST_F(PlanCli, CostTableBalancesPredictedSeconds) {
  const fs::path table = dir_ / "table.json";
  ASSERT_EQ(run("profile --min-len 128 --max-len 512 --repeats 1 --out " + table.string()).code, 0);
  const CliRun r = run(kSmall + " --cost-table " + table.string() + " --json -");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["cost_unit"], "seconds");
  EXPECT_LE(j["load_max_over_mean"].get<double>(), 1.0 + 0.05 + 1e-9);

  std::ofstream(dir_ / "broken.json") << "{\"format\": \"distca-cost-table\"}";
  expect_refused(kSmall + " --cost-table " + (dir_ / "broken.json").string(), "--cost-table");
  expect_refused(kSmall + " --cost-table " + (dir_ / "none.json").string(), "--cost-table");
}

}  // namespace
