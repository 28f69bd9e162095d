// `distca bench train --compare` on the local backend at a tiny size: every mode entry runs on
// the same drawn steps (each mode's step checksums equal the data's own), and its JSON carries
// every figure of a row; bad combinations are refused with one line and exit 2 before any work.
// No timing is asserted (times are the machine's), only their order and that they exist.
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cli_fixture.h"

namespace distca::testing {
namespace {

class CliBenchCompareTest : public CliFixture {
 protected:
  CliBenchCompareTest() : CliFixture("cli_bench_compare", "bench train") {}
};

// Width 64 (1 head of 64), 1 layer, 256 tokens per rank of pretrain-like documents up to 256
// (seed 1: attention max/mean 1.04, 1.77, 1.63 over the steps);
// 2 rounds of 3 steps, the first discarded. `over` replaces or adds flags ("": dropped).
std::string tiny_with(const std::map<std::string, std::string>& over) {
  return flag_line({{"--compare", " "},        {"--backend", "local"}, {"--ranks", "2"},
                    {"--tokens-per-rank", "256"}, {"--width", "64"},     {"--layers", "1"},
                    {"--rounds", "2"},          {"--steps", "3"},       {"--workload", "pretrain"},
                    {"--seed", "1"}},
                   over);
}

TEST_F(CliBenchCompareTest, EveryModeOnTheSameStepsWithEveryFigure) {
  const std::string json = (dir_ / "compare.json").string();
  const CliRun r = run(tiny_with({{"--json", json}}), 600);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  for (const char* s : {"attention max/mean over the replicas before planning", "colocated", "cad single-stream",
                        "cad pingpong", "every mode's step checksums equal the data's own", "local backend"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  }
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j.at("format"), "distca-bench-train-compare");
  EXPECT_EQ(j.at("ranks"), 2);
  EXPECT_EQ(j.at("dp"), 2);
  EXPECT_EQ(j.at("workload").at("dist"), "pretrain");
  EXPECT_EQ(j["workload"].at("max_doc_len"), 256);
  EXPECT_EQ(j["workload"].at("seed"), 1);
  ASSERT_EQ(j.at("attention_imbalance").size(), 3u);
  for (const auto& x : j["attention_imbalance"]) EXPECT_GE(x.get<double>(), 1.0);
  EXPECT_GT(j["attention_imbalance"][1].get<double>(), 1.3);  // a skewed step: cad has work to move
  const std::vector<uint64_t> expected = j.at("data_checksums").get<std::vector<uint64_t>>();
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_NE(expected[0], expected[1]);  // the steps are different documents
  const std::vector<std::string> labels{"colocated", "wlb cp 1", "wlb cp 2", "percp cp 2", "cad single-stream", "cad pingpong"};
  int wlb_best = 0;
  ASSERT_EQ(j.at("modes").size(), labels.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    const nlohmann::json& m = j["modes"][i];
    EXPECT_EQ(m.at("label"), labels[i]);
    EXPECT_EQ(m.at("reference").get<bool>(), labels[i] == "cad pingpong");
    if (labels[i].rfind("wlb", 0) == 0) {
      wlb_best += m.at("best_of_group").get<bool>() ? 1 : 0;  // the group's fastest only
    } else {
      EXPECT_TRUE(m.at("best_of_group").get<bool>()) << labels[i];  // alone in its group
    }
    // The same documents, step by step, as the data's own checksum of them.
    EXPECT_EQ(m.at("step_checksums").get<std::vector<uint64_t>>(), expected) << labels[i];
    EXPECT_TRUE(m.at("same_documents").get<bool>()) << labels[i];
    EXPECT_EQ(m.at("steps_s").size(), 4u) << labels[i];  // 2 rounds x (3 steps - 1 warm-up)
    const double p10 = m.at("p10_s"), med = m.at("median_s"), p90 = m.at("p90_s");
    EXPECT_GT(p10, 0);
    EXPECT_LE(p10, med);
    EXPECT_LE(med, p90);
    EXPECT_NEAR(m.at("tokens_per_s").get<double>(), 2 * 256 / med, 1e-6 * 2 * 256 / med);
    EXPECT_GE(m.at("idle_max").get<double>(), m.at("idle_mean").get<double>());
    EXPECT_GE(m.at("exposed_max").get<double>(), m.at("exposed_mean").get<double>());
    EXPECT_GE(m.at("exposed_mean").get<double>(), 0.0);
    EXPECT_GE(m.at("attention_bytes_per_step").get<double>(), 0.0);
    ASSERT_EQ(m.at("accounted_peak_bytes").size(), 2u);
    EXPECT_GT(m.at("accounted_max_bytes").get<int64_t>(), 0);
    EXPECT_GE(m.at("accounted_max_over_mean").get<double>(), 1.0);
    EXPECT_TRUE(m.at("resident_peak_bytes").empty());  // ranks are threads: no per-rank VmHWM
    EXPECT_GT(m.at("reference_speedup").get<double>(), 0);
  }
  EXPECT_EQ(wlb_best, 1);
  EXPECT_EQ(j["modes"][5].at("reference_speedup").get<double>(), 1.0);
  // Colocated exchanges nothing between ranks; cad moves attention rows.
  EXPECT_EQ(j["modes"][0].at("attention_bytes_per_step").get<double>(), 0.0);
  EXPECT_GT(j["modes"][5].at("attention_bytes_per_step").get<double>(), 0.0);
}

// 4 ranks as 2 replicas x 2 stages of ProLong-like documents; the simulator beside each row
// with a hardware profile (2 ranks: DP 2).
TEST_F(CliBenchCompareTest, PipelinesAndTheSimulatorsPrediction) {
  const std::string json = (dir_ / "pp.json").string();
  CliRun r = run(tiny_with({{"--ranks", "4"}, {"--pp", "2"}, {"--layers", "2"}, {"--workload", "prolong"},
                            {"--rounds", "1"}, {"--json", json}}),
                 600);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j.at("pp"), 2);
  EXPECT_EQ(j.at("micro_batches"), 4);
  for (const nlohmann::json& m : j.at("modes")) {
    EXPECT_TRUE(m.at("same_documents").get<bool>()) << m.at("label");
    EXPECT_EQ(m.at("accounted_peak_bytes").size(), 4u);
  }
  const std::string profile = std::string(DISTCA_SOURCE_DIR) + "/tests/sim/data/hardware-profile-2rank.json";
  r = run(tiny_with({{"--hardware", profile}, {"--rounds", "1"}, {"--json", json}}), 600);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  j = nlohmann::json::parse(slurp(json));
  for (const nlohmann::json& m : j.at("modes")) {
    ASSERT_TRUE(m.at("sim").at("ok").get<bool>()) << m["sim"].dump();
    EXPECT_GT(m["sim"].at("step_s").get<double>(), 0);
  }
}

TEST_F(CliBenchCompareTest, BadCombinationsAreRefusedBeforeAnyWork) {
  const auto refused = [&](const std::map<std::string, std::string>& over, const std::string& flag) {
    expect_refused(tiny_with(over), flag);
  };
  refused({{"--workload", "skewed"}}, "--workload");                // --compare draws its documents
  refused({{"--compare", ""}}, "--workload pretrain");               // a drawn workload without --compare
  refused({{"--compare", ""}, {"--workload", ""}}, "--seed");        // --seed without --compare
  refused({{"--long-doc", "64"}}, "--long-doc");
  refused({{"--short-doc", "32"}}, "--short-doc");
  refused({{"--trace", (dir_ / "t.json").string()}}, "--trace");
  refused({{"--cost-table", (dir_ / "c.json").string()}}, "--cost-table");
  refused({{"--steps", "1"}}, "--warmup-steps");
  refused({{"--tokens-per-rank", "100"}}, "--tokens-per-rank");
  refused({{"--ranks", "4"}, {"--pp", "3"}, {"--layers", "3"}}, "--pp");
  refused({{"--ranks", "4"}, {"--pp", "2"}, {"--micro-batches", "1"}}, "--micro-batches");
  refused({{"--hardware", (dir_ / "missing.json").string()}}, "--hardware");
  refused({{"--max-memory", "1M"}}, "--max-memory");  // the memory estimate
}

}  // namespace
}  // namespace distca::testing
