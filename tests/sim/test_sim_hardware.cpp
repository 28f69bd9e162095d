// The simulator on a measured hardware profile (SimOptions::hardware_profile): each term the
// profile drives - linear layers at the measured GEMM rates (concurrent with several units,
// alone with one), attention from its table, the all-to-all link in the gradient all-reduce,
// the p2p link between stages - against closed forms on hand-built two-unit cases; the
// prediction path on a profile recorded on this project's machine (tests/sim/data), against
// figures computed from the file's own numbers; and `distca simulate --hardware FILE`.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "distca/core/specs.h"
#include "distca/cost/analytic.h"
#include "distca/cost/hardware_profile.h"
#include "distca/sim/simulator.h"
#include "support/cli_fixture.h"
#include "support/hardware_profile_fixture.h"

namespace distca::sim {
namespace {

constexpr double kAlone = testing::kProfileAloneFlops, kConcurrent = testing::kProfileConcurrentFlops;

ModelSpec small_model(int64_t layers) { return testing::profile_test_model(layers); }

// support/hardware_profile_fixture.h's profile: a task on a grid point costs the point's seconds.
std::shared_ptr<const HardwareProfile> make_profile(int64_t ranks) {
  HardwareProfile p = testing::test_hardware_profile(ranks);
  EXPECT_TRUE(p.validate("test").ok()) << p.validate("test").message();
  return std::make_shared<const HardwareProfile>(std::move(p));
}

SimOptions options(int64_t gpus, int64_t pp, int64_t layers) {
  SimOptions o;
  o.model = small_model(layers);
  o.cluster.hw = hardware_preset("local-cpu").value();
  o.cluster.gpus = gpus;
  o.cluster.gpus_per_node = 1;
  o.cluster.pp = pp;
  o.strategy.kind = StrategyKind::kColocated;
  o.grad_sync = false;
  o.hardware_profile = make_profile(2);
  return o;
}

// Forward FLOPs per token of one layer's seven products and of the LM head, counted here.
constexpr double kLayerFlops = 2.0 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128);
constexpr double kHeadFlops = 2.0 * 64 * 100;

Batch two_units() {
  // Unit 0: one document of 32 tokens (task (32, 32)); unit 1: two of 16 (two (16, 16)).
  return Batch{2, 32, {{{0, 0, 32, 32}}, {{1, 0, 16, 16}, {2, 0, 16, 16}}}};
}

TEST(SimHardware, LinearAndAttentionFollowTheProfileOnTwoUnits) {
  const SimOptions o = options(2, 1, 2);
  auto r = simulate(o, {two_units()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  // Two units compute at once: the concurrent rates. Per token and layer: forward, then the
  // backward's two products per layer plus the recomputed forward (checkpointing); the LM head
  // forward and its two backward products.
  const double lin = 2 * 32 * (kLayerFlops + 3 * kLayerFlops) / kConcurrent + 32 * 3 * kHeadFlops / kConcurrent;
  const double att0 = 2 * 4e-5 * 3.5, att1 = 2 * 2 * 1e-5 * 3.5;
  ASSERT_EQ(r->per_unit.size(), 2u);
  EXPECT_NEAR(r->per_unit[0].linear, lin, 1e-12 * lin);
  EXPECT_NEAR(r->per_unit[1].linear, lin, 1e-12 * lin);
  EXPECT_NEAR(r->per_unit[0].attention, att0, 1e-9 * att0);
  EXPECT_NEAR(r->per_unit[1].attention, att1, 1e-9 * att1);
  EXPECT_NEAR(r->iteration_seconds, lin + att0, 1e-9 * (lin + att0));
}

TEST(SimHardware, OneUnitRunsAtTheAloneRates) {
  SimOptions o = options(1, 1, 2);
  o.lm_head = false;
  o.activation_checkpointing = false;
  auto r = simulate(o, {Batch{1, 32, {{{0, 0, 32, 32}}}}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const double lin = 2 * 32 * 3 * kLayerFlops / kAlone;  // forward + two backward products
  EXPECT_NEAR(r->per_unit[0].linear, lin, 1e-12 * lin);
}

// make_profile(2) with element-wise figures: per token of a layer forward 1e-6 (alone) / 2e-6
// (concurrent), backward 3e-6 / 4e-6, the loss forward 5e-7 / 6e-7, backward 7e-7 / 8e-7, the
// optimizer 1e-9 / 3e-9 per parameter.
std::shared_ptr<const HardwareProfile> with_elementwise(const HardwareProfile& base) {
  HardwareProfile p = base;
  ElementwiseProfile e;
  e.layer_forward = {1e-6, 2e-6};
  e.layer_backward = {3e-6, 4e-6};
  e.loss_forward = {5e-7, 6e-7};
  e.loss_backward = {7e-7, 8e-7};
  e.optimizer = {1e-9, 3e-9};
  p.elementwise = e;
  EXPECT_TRUE(p.validate("test").ok()) << p.validate("test").message();
  return std::make_shared<const HardwareProfile>(std::move(p));
}

// Parameters of small_model(2): per layer Q, K, V, O, SwiGLU and two norms; embedding, LM
// head, final norm.
constexpr double kParams2 = 2 * (64.0 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64 * 100 + 64 * 100 + 64;

TEST(SimHardware, ElementwiseWorkGivesTheClosedFormStepOnOneUnit) {
  SimOptions o = options(1, 1, 2);
  o.hardware_profile = with_elementwise(*make_profile(2));
  auto r = simulate(o, {Batch{1, 32, {{{0, 0, 32, 32}}}}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  // One unit: the alone figures. Per token and layer: the forward's GEMMs and element-wise
  // work; the backward's two products and element-wise work plus the recomputed forward
  // (checkpointing, GEMMs and element-wise). The LM head's three products plus the loss
  // forward and backward. Then the optimizer over every parameter (no gradient all-reduce).
  const double layers = 2 * 32 * (4 * kLayerFlops / kAlone + 2 * 1e-6 + 3e-6);
  const double head = 32 * (3 * kHeadFlops / kAlone + 5e-7 + 7e-7);
  const double opt = kParams2 * 1e-9;
  const double att = 2 * 4e-5 * 3.5;  // two layers of the (32, 32) task
  EXPECT_NEAR(r->per_unit[0].linear, layers + head + opt, 1e-12 * (layers + head + opt));
  EXPECT_NEAR(r->per_unit[0].busy, layers + head + opt + att, 1e-9 * (layers + head + opt + att));
  EXPECT_NEAR(r->iteration_seconds, layers + head + opt + att, 1e-9 * (layers + head + opt + att));
}

TEST(SimHardware, OptimizerStepFollowsTheAllReduceShardedAsTheState) {
  SimOptions o = options(2, 1, 2);
  o.grad_sync = true;
  auto plain = simulate(o, {two_units()});
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  // Only the optimizer figure: the step ends later by exactly the slower unit's optimizer,
  // at the concurrent rate (two units), over the unit's shard of the parameters.
  HardwareProfile hp = *make_profile(2);
  hp.elementwise = ElementwiseProfile{};
  hp.elementwise->optimizer = {1e-9, 3e-9};
  o.hardware_profile = std::make_shared<const HardwareProfile>(hp);
  for (bool shard : {true, false}) {
    o.shard_optimizer = shard;
    auto r = simulate(o, {two_units()});
    ASSERT_TRUE(r.ok()) << r.status().message();
    const double opt = kParams2 * 3e-9 / (shard ? 2.0 : 1.0);
    EXPECT_NEAR(r->iteration_seconds, plain->iteration_seconds + opt, 1e-9 * r->iteration_seconds) << shard;
    EXPECT_NEAR(r->per_unit[1].linear, plain->per_unit[1].linear + opt, 1e-12 * r->per_unit[1].linear) << shard;
    EXPECT_EQ(r->grad_sync_seconds, plain->grad_sync_seconds);
  }
}

TEST(SimHardware, ZeroElementwiseFiguresChangeNoBit) {
  // A profile without the object and one whose figures are all 0 give the same bits, on a
  // pipeline with the gradient all-reduce and on cad: absent means "adds nothing".
  for (StrategyKind kind : {StrategyKind::kColocated, StrategyKind::kCad}) {
    SimOptions o = options(4, 2, 4);
    o.grad_sync = true;
    o.strategy.kind = kind;
    const Batch b = two_units();
    auto without = simulate(o, {b, b});
    ASSERT_TRUE(without.ok()) << without.status().message();
    HardwareProfile hp = *make_profile(2);
    hp.elementwise = ElementwiseProfile{};
    o.hardware_profile = std::make_shared<const HardwareProfile>(hp);
    auto zero = simulate(o, {b, b});
    ASSERT_TRUE(zero.ok()) << zero.status().message();
    nlohmann::json ja = to_json(*zero), jb = to_json(*without);
    ja["plan"].erase("plan_seconds");  // the planner's wall clock, not a prediction
    jb["plan"].erase("plan_seconds");
    EXPECT_EQ(ja.dump(), jb.dump());
  }
}

TEST(SimHardware, GradientAllReduceUsesTheAllToAllLink) {
  SimOptions o = options(2, 1, 2);
  o.grad_sync = true;
  auto r = simulate(o, {two_units()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  // Parameters: per layer Q, K, V, O, SwiGLU and two norms; embedding, LM head, final norm.
  const double params = 2 * (64.0 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64 * 100 + 64 * 100 + 64;
  // Ring over n = 2 units: 2 (n - 1) / n of the fp32 gradients at 1e9 B/s, 2 (n - 1) steps of
  // 1e-4 s.
  const double gs = params * 4 / 1e9 + 2 * 1e-4;
  EXPECT_NEAR(r->grad_sync_seconds, gs, 1e-12 * gs);
  // A profile measured on 4 ranks: its all-to-all had 3 messages per rank, so each message
  // costs 1e-4 / 3 (network.h; the measured exchange is 3 of them).
  o.hardware_profile = make_profile(4);
  auto r4 = simulate(o, {two_units()});
  ASSERT_TRUE(r4.ok()) << r4.status().message();
  const double gs4 = params * 4 / 1e9 + 2 * 1e-4 / 3;
  EXPECT_NEAR(r4->grad_sync_seconds, gs4, 1e-12 * gs4);
}

TEST(SimHardware, ContextFetchPaysTheAllToAllFitPerMessage) {
  // Colocated, one document of 96 tokens over three units: unit 2 fetches 32 rows from each of
  // units 0 and 1 (2 messages), unit 1 32 rows from unit 0 and sends its own to unit 2 (1 each
  // way). A profile of 4 ranks: each message costs its all-to-all intercept / 3.
  SimOptions o = options(3, 1, 2);
  o.hardware_profile = make_profile(4);
  o.record_events = true;
  const Batch b{3, 32, {{{0, 0, 32, 96}}, {{0, 32, 32, 96}}, {{0, 64, 32, 96}}}};
  auto r = simulate(o, {b});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const double rows = 32.0 * static_cast<double>(row_bytes(o.model, o.dtype_bytes).kv), lat = 1e-4 / 3;
  const double want[3] = {2 * lat + 2 * rows / 1e9, lat + rows / 1e9, 2 * lat + 2 * rows / 1e9};
  int spans = 0;
  for (const TraceEvent& e : r->events) {
    if (e.name != "K/V fetch") continue;
    ++spans;
    const double s = (e.end_us - e.start_us) * 1e-6, w = want[static_cast<size_t>(e.pid)];
    EXPECT_NEAR(s, w, 1e-9 * w) << e.pid;
  }
  EXPECT_EQ(spans, 3 * 2);  // per unit and layer
}

TEST(SimHardware, StageTransfersUseTheP2pLink) {
  // Two stages of one layer, one micro-batch of 32 tokens: stage 0 forward, the activations to
  // stage 1 (32 x 64 x 2 bytes at the p2p link), stage 1 forward and backward with the LM
  // head, the gradient back, stage 0 backward.
  SimOptions o = options(2, 2, 2);
  auto r = simulate(o, {Batch{1, 32, {{{0, 0, 32, 32}}}}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const double x = 3e-4 + 32.0 * 64 * 2 / 2e8;
  const double fwd = 32 * kLayerFlops / kConcurrent + 4e-5;  // linear + attention forward
  const double bwd = 32 * 3 * kLayerFlops / kConcurrent + 4e-5 * 2.5;
  const double head = 32 * 3 * kHeadFlops / kConcurrent;
  const double expect = fwd + x + fwd + head + bwd + x + bwd;
  EXPECT_NEAR(r->iteration_seconds, expect, 1e-9 * expect);
}

TEST(SimHardware, ValidateNamesTheHardwareFlag) {
  SimOptions o = options(2, 1, 2);
  auto broken = std::make_shared<HardwareProfile>(*o.hardware_profile);
  broken->gemms.pop_back();
  o.hardware_profile = broken;
  const Status st = o.validate();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("--hardware: ", 0), 0u) << st.message();
}

// ---- the recorded profile -------------------------------------------------------------------

const std::string kRecorded = std::string(DISTCA_SOURCE_DIR) + "/tests/sim/data/hardware-profile-2rank.json";

TEST(SimHardware, RecordedProfilePredictsFromItsOwnFigures) {
  auto hp = load_hardware_profile(kRecorded);
  ASSERT_TRUE(hp.ok()) << hp.status().message();
  // The same file read without the profile reader.
  nlohmann::json j;
  std::ifstream(kRecorded) >> j;
  const auto& mj = j["model"];
  const double tokens = mj["tokens"].get<double>();
  // Seconds per token of every product: the measured seconds over the rows it was timed on
  // (a product's FLOPs per token are its FLOPs / tokens, for every pass).
  double layer = 0, head = 0, fwd = 0;
  for (const auto& g : j["gemm"]) {
    const double s = g["seconds_concurrent"].get<double>() / tokens;
    const bool is_fwd = g["pass"] == "forward";
    (g["layer"] == "lm_head" ? head : layer) += s;
    if (is_fwd && g["layer"] != "lm_head") fwd += s;
  }
  layer += fwd;  // checkpointing recomputes the forward in backward
  SimOptions o;
  o.model.name = "recorded";
  o.model.n_layers = 2;
  o.model.hidden = mj["hidden"];
  o.model.n_heads = mj["n_heads"];
  o.model.n_kv_heads = mj["n_kv_heads"];
  o.model.head_dim = mj["head_dim"];
  o.model.ffn = mj["ffn"];
  o.model.vocab = mj["vocab"];
  o.cluster.hw = hardware_preset("local-cpu").value();
  o.cluster.gpus = 2;
  o.cluster.gpus_per_node = 1;
  o.strategy.kind = StrategyKind::kColocated;
  o.grad_sync = false;
  o.hardware_profile = std::make_shared<const HardwareProfile>(std::move(hp).value());
  const Batch b{2, 1024, {{{0, 0, 1024, 1024}}, {{1, 0, 512, 512}, {2, 0, 512, 512}}}};
  auto r = simulate(o, {b});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const double lin = 2 * 1024 * layer + 1024 * head;
  EXPECT_NEAR(r->per_unit[0].linear, lin, 1e-9 * lin);
  EXPECT_NEAR(r->per_unit[1].linear, lin, 1e-9 * lin);
  // Attention: the file's forward + backward grid as a cost table (the interpolation itself is
  // ProfiledCostModel's, tested in tests/kernels).
  CostTable t;
  t.n_heads = j["attention"]["n_heads"];
  t.n_kv_heads = j["attention"]["n_kv_heads"];
  t.head_dim = j["attention"]["head_dim"];
  t.q_lens = j["attention"]["q_lens"].get<std::vector<int64_t>>();
  t.kv_lens = t.q_lens;
  for (size_t i = 0; i < t.q_lens.size(); ++i) {
    std::vector<double> row;
    for (size_t k = 0; k < t.kv_lens.size(); ++k) {
      const auto& f = j["attention"]["forward_seconds"][i][k];
      row.push_back(f.is_null() ? 0.0 : f.get<double>() + j["attention"]["backward_seconds"][i][k].get<double>());
    }
    t.seconds.push_back(row);
  }
  const ProfiledCostModel table(t);
  EXPECT_NEAR(r->per_unit[0].attention, 2 * table.task_cost(1024, 1024), 1e-9 * r->per_unit[0].attention);
  EXPECT_NEAR(r->per_unit[1].attention, 4 * table.task_cost(512, 512), 1e-9 * r->per_unit[1].attention);
  // Its links were measured under mpirun -np 2.
  EXPECT_EQ(j["machine"]["ranks"], 2);
  EXPECT_TRUE(j.contains("links"));
}

// ---- the CLI ---------------------------------------------------------------------------------

class SimHardwareCli : public distca::testing::CliFixture {
 protected:
  SimHardwareCli() : CliFixture("sim_hw", "simulate") {}
  std::string write(const std::string& name, const nlohmann::json& j) const {
    const std::string p = (dir_ / name).string();
    std::ofstream(p) << j.dump();
    return p;
  }
};

TEST_F(SimHardwareCli, RunsOnTheRecordedProfile) {
  const auto r = run("--hardware " + kRecorded + " --model tiny --gpus 2 --tokens-per-rank 1024 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["hardware"], "profile " + kRecorded);
  EXPECT_GT(j["iteration_seconds"].get<double>(), 0);
}

TEST_F(SimHardwareCli, RefusesBadProfilesNamingFileAndField) {
  nlohmann::json good;
  std::ifstream(kRecorded) >> good;
  nlohmann::json v2 = good;
  v2["version"] = 2;
  const std::string pv = write("v2.json", v2);
  expect_refused("--hardware " + pv + " --gpus 2", pv + ": version must be 1");
  nlohmann::json neg = good;
  neg["links"]["all_to_all"]["bytes_per_second"] = -5;
  const std::string pn = write("neg.json", neg);
  expect_refused("--hardware " + pn + " --gpus 2", pn + ": links.all_to_all.bytes_per_second must be in [1, 1e15]");
  nlohmann::json typed = good;
  typed["gemm"][0]["seconds_alone"] = "fast";
  const std::string pt = write("typed.json", typed);
  expect_refused("--hardware " + pt + " --gpus 2", pt + ": gemm[0].seconds_alone must be a number");
  expect_refused("--hardware " + (dir_ / "missing.json").string() + " --gpus 2", "is neither a preset");
  expect_refused("--hardware " + kRecorded + " --gpus 2 --mfu 0.4", "--mfu cannot be combined with a hardware profile");
}

}  // namespace
}  // namespace distca::sim

namespace distca::sim {
namespace {

// `distca profile --hardware-out`: bad flags refused before any work, and a minimal real run
// whose file the reader accepts with the shapes asked for (no figure is checked: timing).
class ProfileCli : public distca::testing::CliFixture {
 protected:
  ProfileCli() : CliFixture("profile_hw", "profile") {}
  void expect_bad(const std::string& args, const std::string& says) const {
    const auto r = run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("distca: error: "), std::string::npos) << args << ": " << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_ / "hw.json")) << args;
  }
};

TEST_F(ProfileCli, RefusesBadFlagsUpFront) {
  const std::string out = " --hardware-out " + (dir_ / "hw.json").string();
  expect_bad("--width 256", "--width needs --hardware-out");
  expect_bad("--tokens 64 --out " + (dir_ / "t.json").string(), "--tokens needs --hardware-out");
  expect_bad("--hardware-out " + (dir_ / "no" / "hw.json").string(), "--hardware-out");
  expect_bad(out + " --width 100", "--head-dim 64 must divide --width");
  expect_bad(out + " --model tiny --width 128", "--width cannot be combined with --model");
  expect_bad(out + " --tokens 0", "--tokens must be in 1..1048576");
  expect_bad(out + " --vocab 1", "--vocab must be in 2..16777216");
  expect_bad(out + " --width 64 --kv-heads 3", "--kv-heads must divide --heads");
  expect_bad(out + " --min-len 64 --max-len 32", "--max-len must be >= --min-len");
  expect_bad(out + " --mpi-timeout -1", "--mpi-timeout: must be in (0, 1e6] seconds (got -1)");
  expect_bad(out + " --mpi-timeout 0", "--mpi-timeout: must be in (0, 1e6] seconds (got 0)");
  expect_bad(out + " --gemm-repeats 0", "--gemm-repeats");
}

TEST_F(ProfileCli, WritesAProfileTheReaderAccepts) {
  const std::string path = (dir_ / "hw.json").string();
  const auto r = run("--hardware-out " + path + " --width 32 --head-dim 16 --ffn 64 --vocab 16 --tokens 32 " +
                     "--min-len 16 --max-len 32 --repeats 1 --min-seconds 0 --gemm-repeats 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");  // no cost table on stdout without --out
  auto hp = load_hardware_profile(path);
  ASSERT_TRUE(hp.ok()) << hp.status().message();
  EXPECT_EQ(hp->ranks, 1);
  EXPECT_FALSE(hp->all_to_all.has_value());
  EXPECT_EQ(hp->shape.hidden, 32);
  EXPECT_EQ(hp->shape.n_heads, 2);
  EXPECT_EQ(hp->shape.n_kv_heads, 1);
  EXPECT_EQ(hp->shape.ffn, 64);
  EXPECT_EQ(hp->shape.tokens, 32);
  EXPECT_EQ(hp->attention_forward.q_lens, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(hp->gemm("w2", GemmPass::kBackwardWeight).k, 32);
  // The element-wise work was timed (one rank: its alone and concurrent figures are one run).
  ASSERT_TRUE(hp->elementwise.has_value());
  EXPECT_GT(hp->elementwise->layer_forward.alone, 0);
  EXPECT_GT(hp->elementwise->optimizer.alone, 0);
  EXPECT_EQ(hp->elementwise->loss_backward.alone, hp->elementwise->loss_backward.concurrent);
}

}  // namespace
}  // namespace distca::sim
