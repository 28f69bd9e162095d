// `distca bench simulate --validate --quick --ranks 1` live (CTest label `slow`): one profile
// and one bench train run under mpirun -np 1, then the table. Checks what the run leaves (the
// profile, the run's JSON, the logs, no temporary file) and that the table's rows are that
// run's modes, re-predictable with --replay to the same numbers. No timing is asserted.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cli_fixture.h"

namespace distca::testing {
namespace {

class CliBenchValidateLiveTest : public CliFixture {
 protected:
  CliBenchValidateLiveTest() : CliFixture("cli_bench_validate_live", "bench simulate --validate") {}
};

TEST_F(CliBenchValidateLiveTest, QuickOneRankRunsAndReplaysToTheSameTable) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun on PATH";
  const fs::path out = dir_ / "run";
  const std::string live = (dir_ / "live.json").string(), replay = (dir_ / "replay.json").string();
  const CliRun r = run("--quick --ranks 1 --timeout 300 --out " + out.string() + " --json " + live, 600);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  for (const char* f : {"hw-1.json", "hw-1.log", "dp1-skewed.json", "dp1-skewed.log"}) {
    EXPECT_TRUE(fs::is_regular_file(out / f)) << f;
  }
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string ext = e.path().extension().string();  // no .tmp left behind
    EXPECT_TRUE(ext == ".log" || ext == ".json") << e.path();
  }
  const nlohmann::json t = nlohmann::json::parse(slurp(live));
  ASSERT_EQ(t.at("rows").size(), 4u);  // colocated, cad single-stream, pingpong, signal
  for (const nlohmann::json& row : t["rows"]) {
    EXPECT_EQ(row.at("config"), "dp1-skewed");
    EXPECT_GT(row.at("measured_s").get<double>(), 0);
    EXPECT_GT(row.at("predicted_s").get<double>(), 0);
  }
  const CliRun again = run("--replay " + out.string() + " --json " + replay, 120);
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(slurp(replay)), t);
}

}  // namespace
}  // namespace distca::testing
