// sim/request.h: the one mapping from a request (the CLI's flags, Python's keywords) or a
// measured training run to SimOptions. The training mapping against options written out here
// by hand from its documented rules (the same iteration, bit for bit) and, for the re-packing
// baselines, against the trainer's own chunking options; the request's refusals with the
// CLI's messages.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distca/kernels/attention_traits.h"
#include "distca/plan/chunking.h"
#include "distca/sim/request.h"
#include "distca/sim/simulator.h"
#include "distca/train/compare.h"
#include "distca/train/config.h"
#include "distca/train/data.h"
#include "distca/train/trainer.h"
#include "support/hardware_profile_fixture.h"

namespace distca::sim {
namespace {

// Two ranks, one skewed batch: rank 0 one 256-token document, rank 1 four of 64.
std::vector<Batch> skewed_batch() {
  Batch b;
  b.ranks = 2;
  b.tokens_per_rank = 256;
  b.per_rank = {{{0, 0, 256, 256}}, {{1, 0, 64, 64}, {2, 0, 64, 64}, {3, 0, 64, 64}, {4, 0, 64, 64}}};
  return {b};
}

TrainingRun two_rank_run(const std::string& mode, const std::string& overlap) {
  TrainingRun run;
  run.model = testing::profile_test_model(2);
  run.ranks = 2;
  run.pp = 1;
  run.mode = mode;
  run.overlap = overlap;
  run.tolerance = 0.05;
  run.sgemm_flops = 3e10;
  return run;
}

// The documented mapping (request.h, TrainingRun): one unit per rank, local-cpu's links and
// memory with the sgemm rate as the peak at mfu 1, fp32, no checkpointing, no optimizer
// sharding, keeping cad servers at pp 1; everything else the simulator's defaults.
SimOptions by_hand(const TrainingRun& run, const Strategy& strategy) {
  SimOptions so;
  so.model = run.model;
  so.cluster.gpus = run.ranks;
  so.cluster.gpus_per_node = 1;
  so.cluster.pp = run.pp;
  so.cluster.hw = hardware_preset("local-cpu").value();
  so.cluster.hw.peak_flops = run.sgemm_flops;
  so.mfu = 1.0;
  so.tolerance = run.tolerance;
  so.dtype_bytes = 4;
  so.shard_optimizer = false;
  so.activation_checkpointing = false;
  so.cad_stateless = run.pp > 1;
  so.hardware_profile = run.hardware_profile;
  so.framework = FrameworkMemory{};  // a CPU run
  so.strategy = strategy;
  return so;
}

void expect_same_iteration(const TrainingRun& run, const Strategy& strategy) {
  const std::vector<Batch> batches = skewed_batch();
  auto predicted = predict_training(run, batches);
  ASSERT_TRUE(predicted.ok()) << predicted.status().message();
  auto direct = simulate(by_hand(run, strategy), batches);
  ASSERT_TRUE(direct.ok()) << direct.status().message();
  EXPECT_EQ(predicted->step_s, direct->iteration_seconds);
  ASSERT_EQ(predicted->rank_busy_s.size(), direct->per_unit.size());
  for (size_t u = 0; u < direct->per_unit.size(); ++u) {
    const UnitStats& s = direct->per_unit[u];
    const double t = direct->iteration_seconds;
    EXPECT_EQ(predicted->rank_busy_s[u], s.busy) << u;
    EXPECT_EQ(predicted->rank_idle[u], 1.0 - s.busy / t) << u;
    EXPECT_EQ(predicted->rank_exposed[u], s.exposed_comm / t) << u;
    EXPECT_EQ(predicted->rank_blocked[u], s.comm_blocked / t) << u;
  }
  ASSERT_EQ(predicted->stage_idle.size(), 1u);
  EXPECT_DOUBLE_EQ(predicted->stage_idle[0], 0.5 * (predicted->rank_idle[0] + predicted->rank_idle[1]));
}

TEST(SimRequest, TrainingRunIsTheDocumentedMapping) {
  expect_same_iteration(two_rank_run("colocated", ""), Strategy{StrategyKind::kColocated, 0, CadMode::kPingPong});
  expect_same_iteration(two_rank_run("cad", "pingpong"), Strategy{StrategyKind::kCad, 0, CadMode::kPingPong});
  expect_same_iteration(two_rank_run("cad", "signal"), Strategy{StrategyKind::kCad, 0, CadMode::kSignal});
  TrainingRun profiled = two_rank_run("cad", "single-stream");
  profiled.hardware_profile = std::make_shared<const HardwareProfile>(testing::test_hardware_profile(2));
  expect_same_iteration(profiled, Strategy{StrategyKind::kCad, 0, CadMode::kSingleStream});
}

// A baseline mode is the simulator strategy of its name with its CP degree; a mode the
// simulator lacks is refused, never simulated as colocated.
TEST(SimRequest, BaselineModesMapToTheirStrategies) {
  TrainingRun wlb = two_rank_run("wlb", "");
  wlb.cp = 2;
  EXPECT_EQ(training_request(wlb).strategy, "wlb:2");
  expect_same_iteration(wlb, Strategy{StrategyKind::kWlb, 2, CadMode::kPingPong});
  TrainingRun percp = two_rank_run("percp", "");
  percp.cp = 2;
  EXPECT_EQ(training_request(percp).strategy, "percp:2");
  expect_same_iteration(percp, Strategy{StrategyKind::kPerCp, 2, CadMode::kPingPong});
  // Without a CP degree the run is wlb at CP 1, not WLB-ideal's search over degrees.
  EXPECT_EQ(training_request(two_rank_run("wlb", "")).strategy, "wlb:1");
  expect_same_iteration(two_rank_run("wlb", ""), Strategy{StrategyKind::kWlb, 1, CadMode::kPingPong});
  auto unknown = predict_training(two_rank_run("frob", ""), skewed_batch());
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown strategy 'frob'"), std::string::npos) << unknown.status().message();
}

// The wlb and percp rows of `bench train --compare` are predicted through the chunking the
// trainer runs: for every entry of a comparison at DP 2 and 4 (and with the chunking flags
// set), the simulator's re-pack options (the strategy's CP degree, wlb_chunking) equal
// train::chunking_options of that entry's config with the kernel's query tile, field by field.
TEST(SimRequest, CompareRowsUseTheTrainersChunking) {
  ModelSpec spec = testing::profile_test_model(2);
  spec.n_heads = 8;  // bench train's GQA group of 2 (TrainingRun::tile_rows' default)
  spec.n_kv_heads = 4;
  const int64_t tile = kernels::AttentionTraits::query_tile_rows(spec.n_heads / spec.n_kv_heads);
  for (const int64_t dp : {2, 4}) {
    for (const bool flags : {false, true}) {
      train::TrainConfig base;
      base.ranks = dp;
      for (const train::CompareMode& m : train::compare_modes(dp)) {
        if (m.mode != train::TrainMode::kWlb && m.mode != train::TrainMode::kPerCp) continue;
        auto config = train::compare_config(base, m);
        ASSERT_TRUE(config.ok()) << config.status().message();
        TrainingRun run = two_rank_run(train::train_mode_name(m.mode), "");
        run.model = spec;
        run.ranks = dp;
        run.cp = m.cp > 1 ? m.cp : 0;  // as bench train's compare fills it
        if (flags && m.mode == train::TrainMode::kWlb) {
          config->wlb_cap = run.wlb_cap = 1.5;
          if (m.cp > 1) config->cp_threshold = run.cp_threshold = 300;
        }
        const ChunkingOptions want = train::chunking_options(*config, spec, tile);
        auto setup = make_sim_options(training_request(run));
        ASSERT_TRUE(setup.ok()) << setup.status().message();
        const SimOptions& so = setup->options;
        EXPECT_EQ(so.strategy.cp_degree, m.cp) << m.label;
        const ChunkingOptions got = wlb_chunking(so, so.strategy.cp_degree);
        EXPECT_EQ(got.cp, want.cp) << m.label;
        EXPECT_EQ(got.tile_rows, want.tile_rows) << m.label;
        EXPECT_EQ(got.linear_per_token, want.linear_per_token) << m.label;
        EXPECT_EQ(got.cost, want.cost) << m.label;
        if (m.mode == train::TrainMode::kWlb) {  // percp's re-pack takes the CP degree alone
          EXPECT_EQ(got.cap, want.cap) << m.label;
          EXPECT_EQ(got.cp_threshold, want.cp_threshold) << m.label;
        }
      }
    }
  }
}

// A two-step run of `ranks` ranks on `dist` documents (the byte tests below).
train::TrainConfig bytes_config(int64_t ranks, int64_t tokens_per_rank, int64_t max_doc_len, const std::string& dist) {
  train::TrainConfig base;
  base.ranks = ranks;
  base.tokens_per_rank = tokens_per_rank;
  base.max_doc_len = max_doc_len;
  base.dist = dist;
  base.steps = 2;
  base.warmup = 1;
  base.seed = 7;
  return base;
}

// Trains `config` on `data` with the local backend, then for every step: every rank's
// bytes_sent (one layer's forward + backward per micro-batch) times the layers, summed over
// the ranks as bench train --compare sums them, equals simulate()'s plan.comm_bytes_forward +
// comm_bytes_backward (per layer) times the layers of `run` on the step's batch, exactly; and
// predict_training's attention_bytes is that figure.
void expect_trainer_bytes(const train::TrainConfig& config, const TrainingRun& run, train::DataSource& data,
                          const std::string& what) {
  train::TrainHooks hooks;
  hooks.data = &data;
  train::TrainResult trained;
  const Status st = train::run_training_local(config, hooks, &trained);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(trained.rank_steps.size(), static_cast<size_t>(config.ranks));
  const double layers = static_cast<double>(run.model.n_layers);
  for (int64_t s = 0; s < config.steps; ++s) {
    double measured = 0;
    for (const auto& rank : trained.rank_steps) measured += static_cast<double>(rank[static_cast<size_t>(s)].bytes_sent) * layers;
    const std::vector<Batch> batches = {data.batch(s)};
    auto setup = make_sim_options(training_request(run));
    ASSERT_TRUE(setup.ok()) << setup.status().message();
    auto simulated = simulate(setup->options, batches);
    ASSERT_TRUE(simulated.ok()) << simulated.status().message();
    const double predicted = (simulated->plan.comm_bytes_forward + simulated->plan.comm_bytes_backward) * layers;
    EXPECT_GT(measured, 0) << what << " step " << s;
    EXPECT_EQ(predicted, measured) << what << " step " << s;
    const Result<TrainingPrediction> p = predict_training(run, batches);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->attention_bytes, predicted) << what << " step " << s;
  }
}

// The bytes the trainer counts are the bytes the simulator predicts (expect_trainer_bytes):
// small wlb and percp runs (every compare entry with a CP degree at 2 and 4 ranks; 384-token
// documents over 512 tokens per rank, so documents are sharded over CP groups and, at 4 ranks
// with CP 2, some cut by the loader across groups: both the group and the data-parallel
// collectives), through make_sim_options (training_request): the same layout from the same
// re-pack, fp32 rows, no checkpointing.
TEST(SimRequest, TrainerBytesMatchTheSimulatorsForTheBaselines) {
  int checked = 0;
  for (const int64_t ranks : {2, 4}) {
    const train::TrainConfig base = bytes_config(ranks, 512, 512, "fixed:384");
    const ModelSpec spec = base.model_spec().value();
    auto data = train::DataSource::create(base, spec.vocab);
    ASSERT_TRUE(data.ok()) << data.status().message();
    for (const train::CompareMode& m : train::compare_modes(ranks)) {
      if ((m.mode != train::TrainMode::kWlb && m.mode != train::TrainMode::kPerCp) || m.cp < 2) continue;
      auto config = train::compare_config(base, m);
      ASSERT_TRUE(config.ok()) << config.status().message();
      TrainingRun run = two_rank_run(train::train_mode_name(m.mode), "");
      run.model = spec;
      run.ranks = ranks;
      run.cp = m.cp;
      run.tile_rows = kernels::AttentionTraits::query_tile_rows(spec.n_heads / spec.n_kv_heads);
      if (m.mode == train::TrainMode::kWlb) config->cp_threshold = run.cp_threshold = 128;  // shard every document
      expect_trainer_bytes(*config, run, *data, m.label + " at " + std::to_string(ranks) + " ranks");
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6);  // 2 ranks: wlb cp 2, percp cp 2; 4 ranks: both at cp 2 and 4
}

// CAD's bytes too: cad pingpong (whose K/V travels once per server across the nano-batch
// pair, plan/kv_once.h) and single-stream at 2 and 4 ranks on documents of 1024-4096 tokens
// (cut into ping and pong, split over ranks).
TEST(SimRequest, TrainerBytesMatchTheSimulatorsForCad) {
  int checked = 0;
  for (const int64_t ranks : {2, 4}) {
    const train::TrainConfig base = bytes_config(ranks, 2048, 4096, "uniform:1024:4096");
    const ModelSpec spec = base.model_spec().value();
    auto data = train::DataSource::create(base, spec.vocab);
    ASSERT_TRUE(data.ok()) << data.status().message();
    for (const train::CompareMode& m : train::compare_modes(ranks)) {
      if (m.mode != train::TrainMode::kCad || !m.overlap || *m.overlap == runtime::OverlapMode::kSignal) continue;
      auto config = train::compare_config(base, m);
      ASSERT_TRUE(config.ok()) << config.status().message();
      TrainingRun run = two_rank_run("cad", runtime::overlap_mode_name(*m.overlap));
      run.model = spec;
      run.ranks = ranks;
      run.tile_rows = kernels::AttentionTraits::query_tile_rows(spec.n_heads / spec.n_kv_heads);
      run.tolerance = config->tolerance;
      expect_trainer_bytes(*config, run, *data, m.label + " at " + std::to_string(ranks) + " ranks");
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4);  // pingpong and single-stream at 2 and 4 ranks
}

// A CPU run (the local-cpu preset, a hardware profile) has no CUDA context, NCCL buffers or
// caching allocator: no framework memory; a GPU preset has the GPU figures.
TEST(SimRequest, FrameworkMemoryOnlyOnGpus) {
  auto cpu = make_sim_options(training_request(two_rank_run("colocated", "")));
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  EXPECT_EQ(cpu->options.framework.context_bytes, 0);
  EXPECT_EQ(cpu->options.framework.comm_buffer_bytes, 0);
  EXPECT_EQ(cpu->options.framework.fragmentation, 0);
  SimRequest gpu;
  gpu.gpus = 64;
  auto h200 = make_sim_options(gpu);
  ASSERT_TRUE(h200.ok()) << h200.status().message();
  EXPECT_EQ(h200->options.framework.context_bytes, FrameworkMemory::gpu().context_bytes);
  EXPECT_EQ(h200->options.framework.fragmentation, FrameworkMemory::gpu().fragmentation);
}

// The outcome is predict_training's figures, or its refusal as text; its JSON derives the
// means and the ratio to the measured step from those figures.
TEST(SimRequest, OutcomeKeepsTheRefusalAndTheFigures) {
  auto refused = predict_outcome(two_rank_run("frob", ""), skewed_batch());
  EXPECT_FALSE(refused.ok);
  EXPECT_NE(refused.error.find("unknown strategy 'frob'"), std::string::npos) << refused.error;
  EXPECT_EQ(to_json(refused, 1.0)["ok"], false);

  const TrainingRun run = two_rank_run("cad", "pingpong");
  auto predicted = predict_training(run, skewed_batch());
  ASSERT_TRUE(predicted.ok()) << predicted.status().message();
  const TrainingOutcome outcome = predict_outcome(run, skewed_batch());
  ASSERT_TRUE(outcome.ok);
  EXPECT_TRUE(outcome.error.empty());
  EXPECT_EQ(outcome.step_s, predicted->step_s);
  EXPECT_EQ(outcome.rank_idle, predicted->rank_idle);
  const nlohmann::json j = to_json(outcome, 2 * outcome.step_s);
  EXPECT_DOUBLE_EQ(j["over_measured"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["mean_idle"].get<double>(), 0.5 * (outcome.rank_idle[0] + outcome.rank_idle[1]));
  EXPECT_EQ(to_json(outcome, 0)["over_measured"].get<double>(), 0.0);
}

// A request without overrides is the simulator's defaults on the preset.
TEST(SimRequest, DefaultsAreTheSimulatorsOnThePreset) {
  SimRequest r;
  r.gpus = 64;
  auto setup = make_sim_options(r);
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  const SimOptions& so = setup->options;
  const SimOptions defaults;
  EXPECT_EQ(so.model.name, "llama-8b");
  EXPECT_EQ(so.cluster.hw.name, hardware_preset("h200").value().name);
  EXPECT_EQ(so.cluster.gpus_per_node, hardware_preset("h200").value().gpus_per_node);
  EXPECT_EQ(so.mfu, defaults.mfu);
  EXPECT_EQ(so.attention_efficiency, defaults.attention_efficiency);
  EXPECT_EQ(so.dtype_bytes, 2);
  EXPECT_FALSE(so.cad_stateless);
  EXPECT_EQ(so.attention_table, nullptr);
  EXPECT_EQ(setup->table, nullptr);
}

void expect_refused(const SimRequest& r, const std::string& flag) {
  auto setup = make_sim_options(r);
  ASSERT_FALSE(setup.ok()) << flag;
  // Bad input either way (the CLI's exit 2): an unknown preset is not_found.
  EXPECT_TRUE(setup.status().code() == StatusCode::kInvalidArgument || setup.status().code() == StatusCode::kNotFound)
      << setup.status().message();
  EXPECT_NE(setup.status().message().find(flag), std::string::npos) << setup.status().message();
}

TEST(SimRequest, RefusalsNameTheFlag) {
  const std::vector<std::pair<std::function<void(SimRequest&)>, std::string>> cases = {
      {[](SimRequest& r) { r.gpus = 0; }, "--gpus"},
      {[](SimRequest& r) { r.model = "no-such-model"; }, "--model"},
      {[](SimRequest& r) { r.dtype = "fp16"; }, "--dtype: expected bf16 or fp32, got 'fp16'"},
      {[](SimRequest& r) { r.cad_servers = "sometimes"; }, "--cad-servers"},
      {[](SimRequest& r) { r.strategy = "cad:nope"; }, "--strategy"},
      {[](SimRequest& r) { r.inter_node_gbps = 0.0; }, "--inter-node-bw"},
      {[](SimRequest& r) { r.inter_node_latency_us = -1.0; }, "--inter-node-latency"},
      {[](SimRequest& r) { r.memory_gb = -2.0; }, "--memory-gb"},
      {[](SimRequest& r) { r.gpus_per_node = 0; }, "--gpus-per-node"},
      {[](SimRequest& r) { r.mfu = 1.5; }, "--mfu"},
  };
  for (const auto& [change, flag] : cases) {
    SimRequest r;
    r.gpus = 64;
    change(r);
    expect_refused(r, flag);
  }
}

// A profile named by --hardware measured the rates and links itself: the overrides of those are
// refused (from the CLI and Python alike); the memory override is not one of them.
TEST(SimRequest, AHardwareProfileFileRefusesTheOverridesItMeasured) {
  SimRequest r;
  r.model = "tiny";
  r.gpus = 2;
  r.hardware = std::string(DISTCA_SOURCE_DIR) + "/tests/sim/data/hardware-profile-2rank.json";
  auto plain = make_sim_options(r);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_NE(plain->options.hardware_profile, nullptr);
  SimRequest mem = r;
  mem.memory_gb = 8.0;
  EXPECT_TRUE(make_sim_options(mem).ok());
  for (const char* flag : {"--mfu", "--attention-efficiency", "--inter-node-bw", "--inter-node-latency"}) {
    SimRequest x = r;
    if (std::string(flag) == "--mfu") x.mfu = 0.5;
    if (std::string(flag) == "--attention-efficiency") x.attention_efficiency = 0.5;
    if (std::string(flag) == "--inter-node-bw") x.inter_node_gbps = 10.0;
    if (std::string(flag) == "--inter-node-latency") x.inter_node_latency_us = 1.0;
    expect_refused(x, std::string(flag) + " cannot be combined with a hardware profile");
  }
}

// --ranks-per-host and --tolerance auto reach the simulator: the hosts of the units (the
// planner's topology and the links' hosts) and the band chosen per plan, for cad only; auto
// without a profile (no link or linear rates) is refused naming the flag.
TEST(SimRequest, TopologyAndAutoToleranceMapToTheOptions) {
  TrainingRun run = two_rank_run("cad", "pingpong");
  run.ranks = 4;
  run.ranks_per_host = 2;
  run.tolerance_auto = true;
  run.hardware_profile = std::make_shared<const HardwareProfile>(testing::test_hardware_profile(2));
  auto setup = make_sim_options(training_request(run));
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  EXPECT_EQ(setup->options.topology.host, (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_TRUE(setup->options.tolerance_auto);
  TrainingRun colocated = run;
  colocated.mode = "colocated";
  colocated.overlap = "";
  auto c = make_sim_options(training_request(colocated));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->options.tolerance_auto);
  TrainingRun bare = run;
  bare.hardware_profile = nullptr;
  auto refused = make_sim_options(training_request(bare));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--tolerance auto"), std::string::npos) << refused.status().message();
  TrainingRun odd = run;
  odd.ranks_per_host = 3;
  EXPECT_FALSE(make_sim_options(training_request(odd)).ok());
}

}  // namespace
}  // namespace distca::sim
