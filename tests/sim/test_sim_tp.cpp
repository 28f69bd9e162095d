// The simulator's tensor-parallel term (docs/simulation-model.md, "Tensor parallelism") against
// a hand count on a one-unit TP 2 case with the hand-made hardware profile: each rank's FLOPs
// (half the unit's, at the profile's concurrent rates: the unit's two ranks compute at once)
// and the TP collectives' bytes and seconds (per layer and direction two all-gathers and two
// reduce-scatters of the rows, the embedding's and the final norm's, the cross-entropy's two
// all-gathers of per-row figures), which are exposed communication. The trainer sends the same
// bytes (tests/train/train_tp_test.cpp, TpCollectivesSendTheLayerMathsBytes).
#include <gtest/gtest.h>

#include <memory>

#include "distca/core/specs.h"
#include "distca/sim/simulator.h"
#include "support/hardware_profile_fixture.h"

namespace distca::sim {
namespace {

constexpr double kConcurrent = testing::kProfileConcurrentFlops;

// Forward FLOPs per token of one layer's seven products and of the LM head of
// profile_test_model (hidden 64, Q 64, K/V 32 each, ffn 128, vocab 100), counted here.
constexpr double kLayerFlops = 2.0 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128);
constexpr double kHeadFlops = 2.0 * 64 * 100;

SimOptions tp_options(int64_t gpus_per_node) {
  SimOptions o;
  o.model = testing::profile_test_model(2);
  o.cluster.hw = hardware_preset("local-cpu").value();
  o.cluster.gpus = gpus_per_node;
  o.cluster.gpus_per_node = gpus_per_node;
  o.strategy.kind = StrategyKind::kColocated;
  o.grad_sync = false;
  o.activation_checkpointing = false;
  o.dtype_bytes = 4;
  HardwareProfile p = testing::test_hardware_profile(2);
  o.hardware_profile = std::make_shared<const HardwareProfile>(std::move(p));
  return o;
}

// One unit, one document of 32 tokens (task (32, 32)).
Batch one_document() { return Batch{1, 32, {{{0, 0, 32, 32}}}}; }

TEST(SimTensorParallel, RanksComputeHalfTheFlopsAtTheConcurrentRates) {
  const SimOptions o = tp_options(2);
  auto r = simulate(o, {one_document()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  // Per rank: half of every product (forward and its two backward products), two layers, and
  // half the LM head's three, at the rate the profile measured with both ranks computing.
  const double per_rank_flops = (2 * 32 * 3 * kLayerFlops + 32 * 3 * kHeadFlops) / 2;
  const double lin = per_rank_flops / kConcurrent;
  // Attention: the (32, 32) grid point's 4e-5 s forward x 3.5 (backward 2.5x), per layer, for
  // half the heads.
  const double att = 2 * 4e-5 * 3.5 / 2;
  ASSERT_EQ(r->per_unit.size(), 1u);
  EXPECT_NEAR(r->per_unit[0].linear, lin, 1e-12 * lin);
  EXPECT_NEAR(r->per_unit[0].attention, att, 1e-9 * att);
}

TEST(SimTensorParallel, CollectivesAreTheLayerMathsBytesOnTheRankLink) {
  const SimOptions o = tp_options(2);
  auto r = simulate(o, {one_document()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const UnitStats& u = r->per_unit[0];
  // Rows collectives: per direction 4 per layer x 2 layers, the embedding's and the final
  // norm's: 20. Each moves the 32 rows of 64 floats (256 bytes) from one rank to the other: 32
  // x 256 bytes over the pair, the slower rank's side 16 rows, one message each way at the
  // profile's all-to-all latency 1e-4 s (2 ranks: one message per rank) and 1e9 B/s.
  const double rows_bytes = 20.0 * 32 * 256;
  const double rows_seconds = 20.0 * (1e-4 + 16 * 256 / 1e9);
  // The cross-entropy's per-row maximum (8 bytes) and sum with the target logit (16 bytes) of
  // the 32 rows, from each rank to the other.
  const double ce_bytes = 2.0 * (8 * 32 + 16 * 32);
  const double ce_seconds = (1e-4 + 8 * 32 / 1e9) + (1e-4 + 16 * 32 / 1e9);
  EXPECT_DOUBLE_EQ(u.tp_bytes, rows_bytes + ce_bytes);
  const double tp = rows_seconds + ce_seconds;
  EXPECT_NEAR(u.comm, tp, 1e-12);
  EXPECT_NEAR(u.exposed_comm, tp, 1e-12);  // synchronous: the unit waits for every one
  EXPECT_NEAR(u.comm_blocked, tp, 1e-12);
  EXPECT_EQ(u.bytes_sent, 0);  // nothing crosses units
  EXPECT_NEAR(r->iteration_seconds, u.busy + tp, 1e-12);
}

TEST(SimTensorParallel, NoTpNoCollectives) {
  auto r = simulate(tp_options(1), {one_document()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->per_unit[0].tp_bytes, 0);
  EXPECT_EQ(r->per_unit[0].comm, 0);
}

TEST(SimTensorParallel, PresetRatesFoldTheCollectivesIntoMfu) {
  SimOptions o = tp_options(2);
  o.hardware_profile = nullptr;
  auto folded = simulate(o, {one_document()});
  ASSERT_TRUE(folded.ok()) << folded.status().message();
  EXPECT_EQ(folded->per_unit[0].tp_bytes, 0);
  EXPECT_EQ(folded->per_unit[0].comm, 0);
  // Kernel rates (a training run's request): the collectives on the preset's intra-node link.
  o.tp_collectives = true;
  auto charged = simulate(o, {one_document()});
  ASSERT_TRUE(charged.ok()) << charged.status().message();
  const double lat = o.cluster.hw.intra_node_latency, bw = o.cluster.hw.intra_node_bw;
  const double tp = 20 * (lat + 16 * 256 / bw) + (lat + 8 * 32 / bw) + (lat + 16 * 32 / bw);
  EXPECT_NEAR(charged->per_unit[0].comm, tp, 1e-12);
  EXPECT_NEAR(charged->iteration_seconds, folded->iteration_seconds + tp, 1e-12);
}

// With the profile's measured TP collective fit (links.tp_collective: the trainer's group
// communicator), every TP collective is priced on it - latency + the slower side's bytes /
// rate - instead of the all-to-all fit. Hand count as above: the 20 rows collectives and the
// cross-entropy's two of the one-unit TP 2 case, at 6e-4 s + bytes / 3e9 B/s. The count (22
// per step) is the model's own, counted at its communicator in
// tests/model/test_tensor_parallel_model.cpp (CollectivesPerStepFollowTheLayerStructure).
TEST(SimTensorParallel, MeasuredCollectiveFitPricesEveryCollective) {
  SimOptions o = tp_options(2);
  HardwareProfile p = *o.hardware_profile;
  p.tp_collective = LinkProfile{6e-4, 3e9, {{1024, 6e-4 + 1024 / 3e9}, {1 << 20, 6e-4 + (1 << 20) / 3e9}}};
  ASSERT_TRUE(p.validate("p").ok()) << p.validate("p").message();
  o.hardware_profile = std::make_shared<const HardwareProfile>(std::move(p));
  auto r = simulate(o, {one_document()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const UnitStats& u = r->per_unit[0];
  const double lat = 6e-4, bw = 3e9;
  const double tp = 20.0 * (lat + 16 * 256 / bw) + (lat + 8 * 32 / bw) + (lat + 16 * 32 / bw);
  EXPECT_NEAR(u.comm, tp, 1e-12);
  EXPECT_NEAR(u.comm_blocked, tp, 1e-12);
  EXPECT_DOUBLE_EQ(u.tp_bytes, 20.0 * 32 * 256 + 2.0 * (8 * 32 + 16 * 32));  // bytes unchanged
  // 22 collectives: with a large rate the latency alone, 22 times.
  SimOptions fast = o;
  HardwareProfile q = *o.hardware_profile;
  q.tp_collective->bytes_per_second = 1e15;
  fast.hardware_profile = std::make_shared<const HardwareProfile>(std::move(q));
  auto f = simulate(fast, {one_document()});
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_NEAR(f->per_unit[0].comm / lat, 22.0, 1e-6);
}

// The trainer runs a micro-batch's layer phases as two nano-batches in every mode, colocated
// too (train/step.cpp: the runner's ping and pong linear; split_nano_batches at the attention
// tile), so its TP collectives are per nano-batch: a step of one micro-batch whose document is
// cut issues 2 (2 (4 L + 1) + 1) rows collectives (each nano-batch's layers, final norm and
// embedding backward), the embedding's forward reduce-scatter once per side of the cut, and
// each nano-batch's two cross-entropy all-gathers: 44 at L = 2. Without pipeline stages each
// TP rank holds an even share of each nano-batch's rows (the sequence cut,
// model::tp_sp_pieces). Hand count on one 64-token document cut at 48 (nano_cut_long(64, 16)):
// ping rows [0, 48), 24 on each TP rank, pong [48, 64), 8 on each.
TEST(SimTensorParallel, ColocatedChargesEveryNanoBatchsCollectives) {
  SimOptions o = tp_options(2);
  o.attention_tile = 16;
  HardwareProfile p = *o.hardware_profile;
  p.tp_collective = LinkProfile{6e-4, 3e9, {{1024, 6e-4 + 1024 / 3e9}, {1 << 20, 6e-4 + (1 << 20) / 3e9}}};
  o.hardware_profile = std::make_shared<const HardwareProfile>(std::move(p));
  auto r = simulate(o, {Batch{1, 64, {{{0, 0, 64, 64}}}}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const UnitStats& u = r->per_unit[0];
  const double lat = 6e-4, bw = 3e9, row = 256;
  // The slower side of a collective: max over ranks of max(own rows, the range's others).
  const double ping = lat + 24 * row / bw, pong = lat + 8 * row / bw;
  const double ce = (lat + 8 * 48 / bw) + (lat + 16 * 48 / bw) + (lat + 8 * 16 / bw) + (lat + 16 * 16 / bw);
  EXPECT_NEAR(u.comm, 20 * ping + 20 * pong + ce, 1e-12);
  // Bytes as the unsplit step's: every row crosses once per collective.
  EXPECT_DOUBLE_EQ(u.tp_bytes, 20.0 * 64 * 256 + 2.0 * (8 * 64 + 16 * 64));
  // 44 collectives: with a large rate the latency alone, 44 times.
  HardwareProfile q = *o.hardware_profile;
  q.tp_collective->bytes_per_second = 1e15;
  o.hardware_profile = std::make_shared<const HardwareProfile>(std::move(q));
  auto f = simulate(o, {Batch{1, 64, {{{0, 0, 64, 64}}}}});
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_NEAR(f->per_unit[0].comm / lat, 44.0, 1e-6);
}

// The TP peers' wait (links.tp_wait, fit b seconds per second of compute): every charge of TP
// collectives also carries b x the unit's compute since its previous charge. Every compute
// interval of this step precedes some collective (the forward's LM head the backward's first,
// and the backward ends with the embedding's all-gather; the fixture has no optimizer
// figure), so the step's TP time grows by exactly b x (linear + attention), and the step by
// the same: the collectives are synchronous. With the wait 0 the step is the one without the
// field (old profiles), bit for bit.
TEST(SimTensorParallel, MeasuredWaitChargesTheComputeSinceThePreviousCollective) {
  for (StrategyKind kind : {StrategyKind::kColocated, StrategyKind::kCad}) {
    SimOptions o = tp_options(2);
    o.strategy.kind = kind;
    HardwareProfile p = *o.hardware_profile;
    p.tp_collective = LinkProfile{6e-4, 3e9, {{1024, 6e-4 + 1024 / 3e9}, {1 << 20, 6e-4 + (1 << 20) / 3e9}}};
    o.hardware_profile = std::make_shared<const HardwareProfile>(p);
    auto base = simulate(o, {one_document()});
    ASSERT_TRUE(base.ok()) << base.status().message();
    const double b = 0.05;
    for (double slope : {0.0, b}) {
      HardwareProfile q = p;
      q.tp_wait = TpWaitProfile{slope, {{1e-3, 1e-4}, {4e-3, 1e-4 + 3e-3 * slope}}};
      ASSERT_TRUE(q.validate("q").ok()) << q.validate("q").message();
      SimOptions w = o;
      w.hardware_profile = std::make_shared<const HardwareProfile>(std::move(q));
      auto r = simulate(w, {one_document()});
      ASSERT_TRUE(r.ok()) << r.status().message();
      const UnitStats& u0 = base->per_unit[0];
      const UnitStats& u = r->per_unit[0];
      EXPECT_EQ(u.linear, u0.linear);  // the wait is no compute
      EXPECT_EQ(u.attention, u0.attention);
      const double wait = slope * (u0.linear + u0.attention);
      if (slope == 0) {
        EXPECT_EQ(u.comm, u0.comm);
        EXPECT_EQ(r->iteration_seconds, base->iteration_seconds);
        continue;
      }
      ASSERT_GT(wait, 0);
      EXPECT_NEAR(u.comm, u0.comm + wait, 1e-12) << static_cast<int>(kind);
      EXPECT_NEAR(u.comm_blocked, u0.comm_blocked + wait, 1e-12);
      EXPECT_NEAR(r->iteration_seconds, base->iteration_seconds + wait, 1e-12);
      EXPECT_DOUBLE_EQ(u.tp_bytes, u0.tp_bytes);
    }
  }
}

// Under processor sharing (two TP 2 units on a host of 2 cores: 4 ranks, one core each
// shared by two) the wait is not charged: a waiting rank yields its core, which the fluid
// model already gives to the computing units. The same options on a host of 4 cores charge it.
TEST(SimTensorParallel, MeasuredWaitIsNotChargedUnderProcessorSharing) {
  SimOptions o = tp_options(2);
  o.cluster.gpus = 4;
  HardwareProfile p = *o.hardware_profile;
  p.tp_collective = LinkProfile{6e-4, 3e9, {{1024, 6e-4 + 1024 / 3e9}, {1 << 20, 6e-4 + (1 << 20) / 3e9}}};
  o.hardware_profile = std::make_shared<const HardwareProfile>(p);
  const Batch two{2, 32, {{{0, 0, 32, 32}}, {{1, 0, 32, 32}}}};
  o.host_ranks = 4;
  for (const int64_t cores : {int64_t{2}, int64_t{4}}) {
    o.host_cores = cores;
    SimOptions w = o;
    HardwareProfile q = p;
    q.tp_wait = TpWaitProfile{0.05, {{1e-3, 5e-5}, {4e-3, 2e-4}}};
    w.hardware_profile = std::make_shared<const HardwareProfile>(std::move(q));
    auto base = simulate(o, {two});
    auto r = simulate(w, {two});
    ASSERT_TRUE(base.ok() && r.ok()) << base.status().message() << r.status().message();
    if (cores == 2) {
      EXPECT_EQ(r->iteration_seconds, base->iteration_seconds);
      EXPECT_EQ(r->per_unit[0].comm, base->per_unit[0].comm);
    } else {
      EXPECT_GT(r->per_unit[0].comm, base->per_unit[0].comm);
      EXPECT_GT(r->iteration_seconds, base->iteration_seconds);
    }
  }
}

}  // namespace
}  // namespace distca::sim
