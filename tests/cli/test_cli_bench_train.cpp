// `distca bench train` on the local backend at a tiny size: it runs every mode, prints them,
// and its JSON carries every figure, with the workload's FLOP-ideal speedup equal to an
// independent count; bad flags are refused with one line and exit 2 before any work.
// No timing is asserted (times are the machine's), only that they exist and are positive.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cli_fixture.h"

namespace distca::testing {
namespace {

class CliBenchTrainTest : public CliFixture {
 protected:
  CliBenchTrainTest() : CliFixture("cli_bench_train", "bench train") {}
};

// Width 64 (1 head of 64, 1 K/V head, ffn 192, vocab 512), 1 layer, 256 tokens per rank:
// rank 0 one document of 256, rank 1 eight of 32; 1 round of 2 steps, the first discarded.
// The tiny run's flags with `over` replacing or adding some ("" value: the flag is dropped).
std::string tiny_with(const std::map<std::string, std::string>& over) {
  return flag_line({{"--backend", "local"}, {"--ranks", "2"}, {"--tokens-per-rank", "256"}, {"--width", "64"},
                    {"--layers", "1"}, {"--short-doc", "32"}, {"--rounds", "1"}, {"--steps", "2"}},
                   over);
}

TEST_F(CliBenchTrainTest, RunsEveryModeAndWritesEveryFigure) {
  const std::string json = (dir_ / "bench.json").string(), trace = (dir_ / "trace.json").string();
  const CliRun r = run(tiny_with({{"--warmup-steps", "1"}, {"--json", json}, {"--trace", trace}}), 600);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  for (const char* mode : {"colocated", "cad single-stream", "cad pingpong", "cad signal", "exposed:",
                           "ideal speedup", "local backend"}) {
    EXPECT_NE(r.out.find(mode), std::string::npos) << mode << "\n" << r.out;
  }
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j.at("ranks"), 2);
  EXPECT_EQ(j.at("backend"), "local");
  EXPECT_EQ(j.at("omp_threads"), 1);
  EXPECT_EQ(j.at("format"), "distca-bench-train");
  EXPECT_EQ(j.at("bench_flags").at("workload"), "skewed");
  EXPECT_EQ(j["bench_flags"].at("tokens_per_rank"), 256);
  EXPECT_EQ(j.at("model").at("ffn"), 192);
  EXPECT_EQ(j.at("model").at("n_heads"), 1);
  const std::vector<std::string> names{"colocated", "cad single-stream", "cad pingpong", "cad signal"};
  ASSERT_EQ(j.at("modes").size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const nlohmann::json& m = j["modes"][i];
    EXPECT_EQ(m.at("name"), names[i]);
    EXPECT_EQ(m.at("steps_s").size(), 1u) << names[i];  // 1 round x (2 steps - 1 warm-up)
    EXPECT_GT(m.at("median_s").get<double>(), 0) << names[i];
    EXPECT_GT(m.at("tokens_per_s").get<double>(), 0) << names[i];
    EXPECT_GT(m.at("mfu").get<double>(), 0) << names[i];
    for (const char* k : {"linear_s", "attention_s", "comm_s", "wait_s", "optimizer_s", "other_s"}) {
      EXPECT_GE(m.at(k).get<double>(), 0) << names[i] << " " << k;
    }
    EXPECT_EQ(m.at("buffer_bytes").size(), 2u) << names[i];
    if (j.at("memory_source") == "vmhwm") {
      EXPECT_GT(m.at("peak_bytes").at(0).get<int64_t>(), 0) << names[i];
    }
    // Every rank's idle (1 - busy / step) and exposed communication (comm / step), and their means.
    ASSERT_EQ(m.at("rank_idle").size(), 2u) << names[i];
    ASSERT_EQ(m.at("rank_exposed").size(), 2u) << names[i];
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_LE(m["rank_idle"][r].get<double>(), 1.0) << names[i];
      EXPECT_GE(m["rank_exposed"][r].get<double>(), 0.0) << names[i];
    }
    EXPECT_NEAR(m.at("mean_idle").get<double>(), (m["rank_idle"][0].get<double>() + m["rank_idle"][1].get<double>()) / 2, 1e-12);
    // Signal sends 1-byte exchanges and declares its outputs invalid; the others are valid.
    EXPECT_EQ(m.at("outputs_valid").get<bool>(), names[i] != "cad signal") << names[i];
  }
  for (const char* k : {"single-stream", "pingpong", "signal"}) {
    EXPECT_GT(j.at("speedup_paired").at(k).get<double>(), 0) << k;
  }
  for (const char* k : {"exposed", "exposed_paired", "pingpong_over_ideal", "single_stream_slowdown"}) {
    EXPECT_TRUE(std::isfinite(j.at(k).get<double>())) << k;
  }
  ASSERT_EQ(j.at("sgemm_flops").size(), 2u);
  EXPECT_GT(j["sgemm_flops"][0].get<double>(), 0);

  // The FLOP-ideal speedup, counted here from the model and the batch: matmul parameters per
  // layer 2 h q + 2 h kv + 3 h ffn = 53248, LM head h vocab = 32768, 6 FLOPs per parameter and
  // token (forward + backward); attention 3.5 x 4 x head_dim x heads per causal pair.
  const double linear = 6.0 * (53248.0 + 32768.0) * 256.0;
  const double pair_flops = 3.5 * 4.0 * 64.0;
  const double r0 = linear + pair_flops * (256.0 * 257.0 / 2.0);
  const double r1 = linear + pair_flops * 8.0 * (32.0 * 33.0 / 2.0);
  EXPECT_NEAR(j.at("ideal_speedup").get<double>(), r0 / ((r0 + r1) / 2.0), 1e-9);
  EXPECT_NEAR(j["flops_per_rank"]["attention"][1].get<double>(), r1 - linear, 1e-3);

  // --trace: cad pingpong's last step, both ranks, with the ping nano-batch's Q exchange.
  const nlohmann::json t = nlohmann::json::parse(slurp(trace));
  bool q[2] = {false, false};
  for (const nlohmann::json& e : t.at("traceEvents")) {
    if (e.value("name", "") == "ping q" && e.value("ph", "") == "X") q[e.at("tid").get<int>() == 0 ? 0 : 1] = true;
  }
  EXPECT_TRUE(q[0] && q[1]) << "no 'ping q' exchange on both ranks";
}

TEST_F(CliBenchTrainTest, BadFlagsAreRefusedBeforeAnyWork) {
  // Each refusal names its flag in a line that is not CLI11's complaint about a repeated flag.
  const auto refused = [&](const std::map<std::string, std::string>& over, const std::string& flag) {
    expect_refused(tiny_with(over), flag, {"--trace"});
    const CliRun r = run(tiny_with(over));
    EXPECT_EQ(r.err.find("At Most"), std::string::npos) << r.err;
  };
  refused({{"--rounds", "0"}}, "--rounds");
  refused({{"--steps", "2"}, {"--warmup-steps", "2"}}, "--steps");
  refused({{"--steps", "0"}}, "--steps");
  refused({{"--width", "100"}}, "--width");
  refused({{"--width", "0"}}, "--width");
  refused({{"--tokens-per-rank", "250"}}, "--tokens-per-rank");
  refused({{"--short-doc", "48"}}, "--short-doc");  // does not divide 256
  refused({{"--short-doc", "24"}}, "--short-doc");  // not a multiple of 16
  refused({{"--long-doc", "96"}}, "--long-doc");
  refused({{"--head-dim", "24"}}, "--head-dim");    // does not divide 64
  refused({{"--layers", "0"}}, "--layers");
  refused({{"--vocab", "1"}}, "--vocab");
  refused({{"--ranks", "1"}}, "--ranks");
  refused({{"--backend", "mpi"}}, "--ranks");        // mpi: the group's size is mpirun's
  refused({{"--backend", "ring"}}, "--backend");
  refused({{"--tolerance", "2"}}, "--tolerance");
  refused({{"--max-memory", "1M"}}, "--max-memory");
  refused({{"--workload", "even"}}, "--workload");  // the memory estimate does not fit
  // An unwritable --json or --trace: refused, and nothing written anywhere.
  for (const char* flag : {"--json", "--trace"}) {
    const CliRun r = run(tiny_with({}) + " " + flag + " " + (dir_ / "no_such_dir" / "out.json").string());
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// --pp 2 on 4 local ranks (2 replicas x 2 stages), 2 layers (one per stage), 4 micro-batches
// per replica: micro-batch 0 one document of 256 per replica, micro-batches 1-3 eight of 32.
TEST_F(CliBenchTrainTest, PipelineRunsBothSchedulesWithStageIdle) {
  const std::string json = (dir_ / "pp.json").string();
  const CliRun r = run(tiny_with({{"--ranks", "4"}, {"--pp", "2"}, {"--layers", "2"}, {"--json", json}}), 600);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  for (const char* text : {"colocated 1F1B", "cad pingpong", "cad single-stream", "idle per stage: s0 s1",
                           "2 replica(s) x 2 stages", "4 micro-batches", "FLOP-ideal", "idle over colocated's"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text << "\n" << r.out;
  }
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j.at("ranks"), 4);
  EXPECT_EQ(j.at("pp"), 2);
  EXPECT_EQ(j.at("dp"), 2);
  EXPECT_EQ(j.at("micro_batches"), 4);
  const std::vector<std::string> names{"colocated 1F1B", "cad pingpong", "cad single-stream"};
  ASSERT_EQ(j.at("modes").size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const nlohmann::json& m = j["modes"][i];
    EXPECT_EQ(m.at("name"), names[i]);
    EXPECT_EQ(m.at("steps_s").size(), 1u) << names[i];
    EXPECT_GT(m.at("median_s").get<double>(), 0) << names[i];
    EXPECT_GT(m.at("tokens_per_s").get<double>(), 0) << names[i];
    ASSERT_EQ(m.at("stage_idle").size(), 2u) << names[i];
    for (const nlohmann::json& x : m["stage_idle"]) EXPECT_LE(x.get<double>(), 1.0) << names[i];
    EXPECT_GT(m.at("busy_ideal_s").get<double>(), 0) << names[i];
    EXPECT_GT(m.at("flop_ideal_over_step").get<double>(), 0) << names[i];
    EXPECT_TRUE(m.at("sim").at("ok").get<bool>()) << m["sim"].dump();
    EXPECT_GT(m["sim"].at("step_s").get<double>(), 0) << names[i];
    EXPECT_EQ(m["sim"].at("stage_idle").size(), 2u) << names[i];
    EXPECT_EQ(m.at("rank_idle").size(), 4u) << names[i];
    EXPECT_EQ(m.at("rank_exposed").size(), 4u) << names[i];
    EXPECT_EQ(m["sim"].at("rank_idle").size(), 4u) << names[i];
  }
  EXPECT_TRUE(std::isfinite(j.at("cad_idle_over_colocated").get<double>()));
  EXPECT_GT(j.at("speedup_paired").at("pingpong").get<double>(), 0);
  // The step's FLOPs counted here: 4 micro-batches x 2 replicas x 256 tokens at 6 x (2 layers'
  // 53248 matmul parameters + the LM head's 32768) per token; attention 3.5 x 4 x 64 per causal
  // pair and layer, per replica one document of 256 and three micro-batches of eight of 32.
  const double linear = 6.0 * (2 * 53248.0 + 32768.0) * 4 * 2 * 256;
  const double attention = 2 * 3.5 * 4 * 64 * 2 * (256.0 * 257 / 2 + 3 * 8 * (32.0 * 33 / 2));
  EXPECT_NEAR(j.at("flops_per_step").at("linear").get<double>(), linear, 1e-6 * linear);
  EXPECT_NEAR(j.at("flops_per_step").at("attention").get<double>(), attention, 1e-6 * attention);
}

// --hardware: the simulator's prediction on a measured profile (the recorded 2-rank profile of
// tests/sim/data): named in the output and the JSON, and a prediction for every mode.
TEST_F(CliBenchTrainTest, PipelinePredictsFromAHardwareProfile) {
  const std::string json = (dir_ / "pph.json").string();
  const std::string profile = std::string(DISTCA_SOURCE_DIR) + "/tests/sim/data/hardware-profile-2rank.json";
  const CliRun r = run(tiny_with({{"--ranks", "2"}, {"--pp", "2"}, {"--layers", "2"}, {"--hardware", profile}, {"--json", json}}), 600);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("the hardware profile " + profile), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j.at("simulator").at("hardware"), "hardware profile " + profile);
  for (const nlohmann::json& m : j.at("modes")) {
    EXPECT_TRUE(m.at("sim").at("ok").get<bool>()) << m["sim"].dump();
    EXPECT_GT(m["sim"].at("step_s").get<double>(), 0);
  }
}

// Data parallel (--pp 1) with --hardware: the simulator's step time beside every mode's, and
// with --sim-trace its cad pingpong prediction as a Chrome trace.
TEST_F(CliBenchTrainTest, DataParallelPredictsFromAHardwareProfile) {
  const std::string json = (dir_ / "dph.json").string(), sim_trace = (dir_ / "sim-trace.json").string();
  const std::string profile = std::string(DISTCA_SOURCE_DIR) + "/tests/sim/data/hardware-profile-2rank.json";
  expect_refused(tiny_with({{"--sim-trace", sim_trace}}), "--sim-trace needs --hardware FILE");
  expect_refused(tiny_with({{"--sim-trace", sim_trace}, {"--hardware", profile}, {"--ranks", "4"}, {"--pp", "2"}, {"--layers", "2"}}),
                 "--sim-trace needs --hardware FILE and applies to --pp 1 without --compare");
  expect_refused(tiny_with({{"--sim-trace", (dir_ / "no_such_dir" / "t.json").string()}, {"--hardware", profile}}),
                 "--sim-trace");
  const std::string same = (dir_ / "same.json").string();
  expect_refused(tiny_with({{"--sim-trace", same}, {"--hardware", profile}, {"--trace", same}}), "--sim-trace");
  const CliRun r = run(tiny_with({{"--hardware", profile}, {"--json", json}, {"--sim-trace", sim_trace}}), 600);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("sim (hardware profile " + profile), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j.at("simulator").at("hardware"), "hardware profile " + profile);
  ASSERT_EQ(j.at("modes").size(), 4u);
  for (const nlohmann::json& m : j["modes"]) {
    EXPECT_TRUE(m.at("sim").at("ok").get<bool>()) << m["sim"].dump();
    EXPECT_GT(m["sim"].at("step_s").get<double>(), 0);
  }
  // The trace is pingpong's prediction: both ranks' attention, and its last span ends at the
  // predicted step (microseconds).
  const nlohmann::json t = nlohmann::json::parse(slurp(sim_trace));
  bool attention[2] = {false, false};
  double end_us = 0;
  for (const nlohmann::json& e : t.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    end_us = std::max(end_us, e.at("ts").get<double>() + e.at("dur").get<double>());
    const int pid = e.at("pid").get<int>();
    if (e.value("name", "").starts_with("fwd attention") && pid >= 0 && pid < 2) attention[pid] = true;
  }
  EXPECT_TRUE(attention[0] && attention[1]) << "no forward attention on both ranks";
  const double step = j["modes"][2]["sim"].at("step_s").get<double>();
  ASSERT_EQ(j["modes"][2].at("name"), "cad pingpong");
  EXPECT_NEAR(end_us, 1e6 * step, 1e-3 * 1e6 * step);
}

// --tolerance auto: the cad modes choose their band from --hardware's figures (the JSON says
// so); every bad combination is refused with one line and exit 2 before any work.
TEST_F(CliBenchTrainTest, ToleranceAutoRunsAndBadCombinationsAreRefused) {
  const std::string profile = std::string(DISTCA_SOURCE_DIR) + "/tests/sim/data/hardware-profile-2rank.json";
  // The same profile as one rank would measure it: no link figures.
  nlohmann::json one = nlohmann::json::parse(slurp(profile));
  one["machine"]["ranks"] = 1;
  one.erase("links");
  const std::string no_links = (dir_ / "one-rank.json").string();
  std::ofstream(no_links) << one.dump();
  const auto refused = [&](const std::map<std::string, std::string>& over, const std::string& says) {
    expect_refused(tiny_with(over), says);
  };
  refused({{"--tolerance", "auto"}}, "--tolerance auto needs --hardware");
  refused({{"--tolerance", "often"}}, "--tolerance must be auto or a number");
  refused({{"--tolerance", "auto"}, {"--hardware", no_links}}, "needs a profile with link figures");
  refused({{"--tolerance", "auto"}, {"--hardware", profile}, {"--ranks", "4"}, {"--pp", "2"}, {"--layers", "2"}},
          "--tolerance auto applies to --pp 1 without --compare");
  refused({{"--tolerance", "auto"}, {"--hardware", profile}, {"--compare", " "}},
          "--tolerance auto applies to --pp 1 without --compare");
  refused({{"--kv-once", "auto"}}, "--kv-once auto needs --hardware FILE");
  refused({{"--kv-once", "sometimes"}}, "--kv-once");
  refused({{"--tp-overlap", "sometimes"}}, "--tp-overlap");
  refused({{"--kv-once", "auto"}, {"--hardware", no_links}}, "needs a profile with link figures");
  const std::string json = (dir_ / "auto.json").string();
  const CliRun r = run(tiny_with({{"--tolerance", "auto"}, {"--kv-once", "auto"}, {"--hardware", profile}, {"--json", json}}), 600);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_TRUE(j.at("bench_flags").at("tolerance_auto").get<bool>()) << j["bench_flags"].dump();
  EXPECT_EQ(j.at("bench_flags").at("kv_once"), "auto") << j["bench_flags"].dump();
  ASSERT_EQ(j.at("modes").size(), 4u);
}

// --ranks-per-host N: the cad modes' topology (placement, K/V relays, and the timeline of
// --tolerance auto per host), recorded in bench_flags; refused where the trainer has none.
TEST_F(CliBenchTrainTest, RanksPerHostReachesTheCadModes) {
  const std::string profile = std::string(DISTCA_SOURCE_DIR) + "/tests/sim/data/hardware-profile-2rank.json";
  expect_refused(tiny_with({{"--ranks", "4"}, {"--ranks-per-host", "3"}}), "--ranks-per-host 3 must be >= 1 and divide");
  expect_refused(tiny_with({{"--ranks-per-host", "1"}, {"--compare", " "}}), "--ranks-per-host applies to bench train without --compare");
  expect_refused(tiny_with({{"--ranks", "4"}, {"--ranks-per-host", "2"}, {"--pp", "2"}, {"--layers", "2"}}),
                 "--ranks-per-host / --host-map");
  const std::string json = (dir_ / "hosts.json").string();
  const CliRun r = run(tiny_with({{"--ranks", "4"}, {"--ranks-per-host", "2"}, {"--tolerance", "auto"},
                                  {"--hardware", profile}, {"--json", json}}), 600);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j.at("bench_flags").at("ranks_per_host"), 2) << j["bench_flags"].dump();
  ASSERT_EQ(j.at("modes").size(), 4u);
}

// --workload uniform: every rank one document of 256, so the FLOP-ideal speedup is 1; the
// simulator's per-rank idle and exposed communication beside the measured ones, with the idle
// 1 - busy / step from its own busy seconds.
TEST_F(CliBenchTrainTest, UniformWorkloadAndTheSimulatorsPerRankFigures) {
  const std::string json = (dir_ / "uni.json").string();
  const std::string profile = std::string(DISTCA_SOURCE_DIR) + "/tests/sim/data/hardware-profile-2rank.json";
  const CliRun r = run(tiny_with({{"--workload", "uniform"}, {"--hardware", profile}, {"--json", json}}), 600);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("workload: uniform"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j.at("bench_flags").at("workload"), "uniform");
  const double pair_flops = 3.5 * 4.0 * 64.0;
  EXPECT_NEAR(j.at("flops_per_rank").at("attention")[0].get<double>(), pair_flops * 256.0 * 257.0 / 2.0, 1e-3);
  EXPECT_NEAR(j["flops_per_rank"]["attention"][1].get<double>(), pair_flops * 256.0 * 257.0 / 2.0, 1e-3);
  EXPECT_NEAR(j.at("ideal_speedup").get<double>(), 1.0, 1e-12);
  for (const nlohmann::json& m : j.at("modes")) {
    const nlohmann::json& sim = m.at("sim");
    ASSERT_TRUE(sim.at("ok").get<bool>()) << sim.dump();
    ASSERT_EQ(sim.at("rank_idle").size(), 2u);
    ASSERT_EQ(sim.at("rank_exposed").size(), 2u);
    ASSERT_EQ(sim.at("rank_busy_s").size(), 2u);
    const double t = sim.at("step_s").get<double>();
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_NEAR(sim["rank_idle"][k].get<double>(), 1.0 - sim["rank_busy_s"][k].get<double>() / t, 1e-12);
      EXPECT_GE(sim["rank_exposed"][k].get<double>(), 0.0);
      EXPECT_LE(sim["rank_exposed"][k].get<double>(), sim["rank_idle"][k].get<double>() + 1e-12);
    }
  }
}

// --tp 2 on 2 ranks (width 128: 4 heads of 32, 2 K/V): one replica of one rank's tokens, every
// mode run and predicted by the simulator with 2 ranks per unit; bad --tp combinations refused.
TEST_F(CliBenchTrainTest, TensorParallelRunsAndPredictsEveryMode) {
  const std::string json = (dir_ / "tp.json").string();
  const std::string profile = std::string(DISTCA_SOURCE_DIR) + "/tests/sim/data/hardware-profile-2rank.json";
  const std::map<std::string, std::string> tp{{"--width", "128"}, {"--head-dim", "32"}, {"--tp", "2"}};
  auto with = [&](std::map<std::string, std::string> over) {
    over.insert(tp.begin(), tp.end());
    return tiny_with(over);
  };
  const CliRun r = run(with({{"--hardware", profile}, {"--json", json}}), 600);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j.at("bench_flags").at("tp"), 2);
  EXPECT_EQ(j.at("flops_per_rank").at("linear").size(), 1u);  // one replica
  ASSERT_EQ(j.at("modes").size(), 4u);
  for (const nlohmann::json& m : j["modes"]) {
    EXPECT_TRUE(m.at("sim").at("ok").get<bool>()) << m["sim"].dump();
    EXPECT_EQ(m.at("rank_idle").size(), 2u);
  }
  expect_refused(with({{"--ranks", "4"}, {"--pp", "2"}, {"--layers", "2"}}), "--tp");
  expect_refused(with({{"--ranks", "3"}}), "--tp 2 must divide the ranks");
  expect_refused(tiny_with({{"--tp", "2"}}), "--tp 2 must divide the model's heads");  // 1 head of 64
}

TEST_F(CliBenchTrainTest, PipelineBadCombinationsAreRefused) {
  const auto refused = [&](const std::map<std::string, std::string>& over, const std::string& flag) {
    expect_refused(tiny_with(over), flag);
  };
  refused({{"--ranks", "4"}, {"--pp", "3"}, {"--layers", "3"}}, "--pp");          // 3 does not divide 4 ranks
  refused({{"--ranks", "4"}, {"--pp", "2"}, {"--micro-batches", "1"}}, "--micro-batches");  // M < P
  refused({{"--ranks", "4"}, {"--pp", "2"}, {"--layers", "3"}}, "--pp");          // cad: P must divide layers
  refused({{"--ranks", "4"}, {"--pp", "2"}, {"--trace", (dir_ / "t.json").string()}}, "--trace");
  refused({{"--ranks", "4"}, {"--pp", "2"}, {"--cost-table", (dir_ / "missing.json").string()}}, "--cost-table");
  refused({{"--micro-batches", "2"}}, "--micro-batches");                        // without --pp
  refused({{"--cost-table", (dir_ / "missing.json").string()}}, "--cost-table");  // without --pp
  refused({{"--ranks", "4"}, {"--pp", "2"}, {"--layers", "2"}, {"--hardware", (dir_ / "missing.json").string()}}, "--hardware");
  refused({{"--hardware", (dir_ / "missing.json").string()}}, "--hardware");  // data parallel too
  {
    // A file that is not a hardware profile (a JSON object of another kind).
    const std::string other = (dir_ / "other.json").string();
    std::ofstream(other) << "{\"format\": \"something-else\"}";
    refused({{"--ranks", "4"}, {"--pp", "2"}, {"--layers", "2"}, {"--hardware", other}}, "--hardware");
  }
}

}  // namespace
}  // namespace distca::testing
