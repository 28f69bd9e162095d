// train/bench.h: the comparison's pieces against independent references. The trainer's input
// checksums against the data's own documents, its memory accounting against the buffer
// estimate where the two must agree, the order-free checksum's invariants, quantiles, and the
// summary rows (paired speedups, groups, max/mean) of a hand-made result.
#include "distca/train/compare.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distca/comm/local.h"
#include "distca/kernels/blas.h"
#include "distca/train/trainer.h"
#include "train_test_util.h"

namespace distca::train {
namespace {

TEST(InputsChecksum, IsOrderFreeAndSeesEveryTokenAndPosition) {
  const std::vector<int32_t> tokens{5, 9, 9, 1, 0, 7}, positions{0, 1, 2, 3, 0, 1};
  const uint64_t whole = inputs_checksum(tokens, positions);
  // Any split into parts, in any order, sums to the whole (a document sharded over ranks).
  const uint64_t a = inputs_checksum(std::span(tokens).subspan(0, 2), std::span(positions).subspan(0, 2));
  const uint64_t b = inputs_checksum(std::span(tokens).subspan(2), std::span(positions).subspan(2));
  EXPECT_EQ(a + b, whole);
  std::vector<int32_t> t2{7, 0, 1, 9, 9, 5}, p2{1, 0, 3, 2, 1, 0};
  EXPECT_EQ(inputs_checksum(t2, p2), whole);
  t2[0] = 8;  // one token changed
  EXPECT_NE(inputs_checksum(t2, p2), whole);
  t2[0] = 7;
  std::swap(p2[0], p2[1]);  // two tokens at each other's positions
  EXPECT_NE(inputs_checksum(t2, p2), whole);
}

TEST(Quantile, InterpolatesBetweenOrderStatistics) {
  EXPECT_EQ(quantile({}, 0.5), 0);
  EXPECT_EQ(quantile({3, 1, 2}, 0.5), 2);
  EXPECT_EQ(quantile({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile({0, 10}, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(quantile({0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100}, 0.9), 90.0);
  EXPECT_EQ(quantile({7}, 0.9), 7);
}

// Each replica's causal pairs as packed, counted by hand: a document cut over two ranks gives
// its tail the pairs of its rows over the whole prefix.
TEST(AttentionImbalance, CountsEachRanksPairsAsPacked) {
  Batch whole;  // rank 0 one document of 128; rank 1 four of 32
  whole.ranks = 2;
  whole.tokens_per_rank = 128;
  whole.per_rank = {{{0, 0, 128, 128}}, {{1, 0, 32, 32}, {2, 0, 32, 32}, {3, 0, 32, 32}, {4, 0, 32, 32}}};
  Batch cut = whole;  // one document of 128 over both ranks, then one of 64 on rank 1
  cut.per_rank = {{{0, 0, 64, 128}, {1, 0, 64, 64}}, {{0, 64, 64, 128}, {2, 0, 64, 64}}};
  auto data = DataSource::fixed(std::vector<Batch>{whole, cut}, 8, 1);
  ASSERT_TRUE(data.ok()) << data.status().message();
  const std::vector<double> got = attention_imbalance(*data, 2, 1);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_DOUBLE_EQ(got[0], 8256.0 / ((8256.0 + 4 * 528.0) / 2));
  // rank 0: 64 * 65 / 2 + 64 * 65 / 2; rank 1: (128 * 129 - 64 * 65) / 2 + 64 * 65 / 2.
  EXPECT_DOUBLE_EQ(got[1], (6176.0 + 2080.0) / ((4160.0 + 8256.0) / 2));
  // Two micro-batches per step: one step of both batches, the loads summed per replica.
  const std::vector<double> pooled = attention_imbalance(*data, 1, 2);
  EXPECT_DOUBLE_EQ(pooled[0], (8256.0 + 4160.0) / ((8256.0 + 4160.0 + 2112.0 + 8256.0) / 2));
}

CompareOptions small_options(int64_t ranks, int64_t micro_batches) {
  CompareOptions o;
  o.base = testing::small_model_config(1);
  o.base.ranks = ranks;
  o.base.steps = 3;
  o.base.tokens_per_rank = 128;
  o.base.dist = "prolong";
  o.base.max_doc_len = 128;
  o.base.micro_batches = micro_batches;
  o.base.seed = 7;
  o.modes = compare_modes(ranks);
  o.rounds = 2;
  o.warmup_steps = 1;
  return o;
}

Result<CompareResult> run_local_compare(const CompareOptions& o, const DataSource& data) {
  const kernels::ScopedBlasThreads one_blas_thread(1);
  CompareResult res;
  Status st = comm::run_local(static_cast<int>(o.base.ranks), [&](comm::Communicator& c) {
    const kernels::ScopedComputeThreads one(1);
    return run_compare(c, o, data, &res);
  });
  if (!st.ok()) return st;
  return res;
}

// Every mode trains the data's documents, step by step, in every round; the accounting of a
// run without pipelines (one slot of tokens_per_rank tokens) equals the buffer estimate's sum.
TEST(RunCompare, EveryModeTrainsTheDataDocumentsAndAccountsItsBuffers) {
  for (int64_t micro : {1, 2}) {
    const CompareOptions o = small_options(2, micro);
    ASSERT_TRUE(o.validate().ok()) << o.validate().message();
    auto data = DataSource::create(o.base, 64);
    ASSERT_TRUE(data.ok()) << data.status().message();
    auto res = run_local_compare(o, *data);
    ASSERT_TRUE(res.ok()) << res.status().message();
    const std::vector<uint64_t> expected = data_checksums(*data, o.base.steps, micro);
    ASSERT_EQ(expected.size(), 3u);
    EXPECT_NE(expected[0], expected[1]);  // the steps draw different documents
    ASSERT_EQ(res->runs.size(), o.modes.size());
    for (const CompareRun& run : res->runs) {
      EXPECT_EQ(run.checksums, expected);
      EXPECT_TRUE(run.same_over_rounds);
      EXPECT_EQ(run.step_s.size(), 4u);  // 2 rounds x (3 steps - 1 warm-up)
      EXPECT_EQ(run.round_median_s.size(), 2u);
      EXPECT_EQ(run.tokens_per_step, 2 * 128 * micro);
      ASSERT_EQ(run.accounted_peak.size(), 2u);
      EXPECT_TRUE(run.resident_peak.empty());
      ASSERT_EQ(run.rank_idle.size(), 2u);
      EXPECT_EQ(run.rank_idle[1].size(), 4u);
    }
    // Exposed communication: attention's share (the runners' waits: the CP collectives in wlb
    // and percp, whose trace wait spans add up to it) is part of every rank's exposed figure.
    for (size_t e = 0; e < o.modes.size(); ++e) {
      const CompareRun& run = res->runs[e];
      ASSERT_EQ(run.rank_attention_exposed.size(), 2u);
      double attention = 0;
      for (size_t k = 0; k < 2; ++k) {
        ASSERT_EQ(run.rank_attention_exposed[k].size(), run.rank_exposed[k].size());
        for (size_t i = 0; i < run.rank_exposed[k].size(); ++i) {
          EXPECT_LE(run.rank_attention_exposed[k][i], run.rank_exposed[k][i]) << o.modes[e].label;
          attention += run.rank_attention_exposed[k][i];
        }
      }
      if (o.modes[e].mode == TrainMode::kPerCp) {
        EXPECT_GT(attention, 0) << o.modes[e].label;
      }
    }
    // Each rank's own time split is kept per timed step (not rank 0's copied to every rank):
    // its busy time is what its idle figure was computed from, its exposed communication is its
    // comm_s, and the JSON carries the same numbers per rank and step.
    const std::vector<CompareRow> rows = summarize_compare(o, *res);
    const nlohmann::json j = compare_json(o, *res, rows, expected, std::vector<double>(3, 1.0));
    for (size_t e = 0; e < o.modes.size(); ++e) {
      const CompareRun& run = res->runs[e];
      ASSERT_EQ(run.rank_metrics.size(), 2u) << o.modes[e].label;
      const nlohmann::json& split = j["modes"][e]["rank_time_split"];
      ASSERT_EQ(split.size(), 2u);
      for (size_t k = 0; k < 2; ++k) {
        ASSERT_EQ(run.rank_metrics[k].size(), run.rank_idle[k].size());
        ASSERT_EQ(split[k].size(), run.rank_idle[k].size());
        for (size_t i = 0; i < run.rank_idle[k].size(); ++i) {
          const StepMetrics& m = run.rank_metrics[k][i];
          const double step = run.step_s[static_cast<size_t>(i)];
          EXPECT_GT(m.busy_s(), 0) << o.modes[e].label;
          EXPECT_NEAR(run.rank_idle[k][i], 1.0 - m.busy_s() / step, 1e-12) << o.modes[e].label;
          EXPECT_NEAR(run.rank_exposed[k][i], m.comm_s / step, 1e-12) << o.modes[e].label;
          EXPECT_DOUBLE_EQ(split[k][i]["linear_s"].get<double>(), m.linear_s);
          EXPECT_DOUBLE_EQ(split[k][i]["attention_s"].get<double>(), m.attention_s);
          EXPECT_DOUBLE_EQ(split[k][i]["comm_s"].get<double>(), m.comm_s);
          EXPECT_DOUBLE_EQ(split[k][i]["plan_wait_s"].get<double>(), m.plan_wait_s);
          EXPECT_DOUBLE_EQ(split[k][i]["step_s"].get<double>(), m.seconds);
        }
      }
      // The ranks' linear work differs (rank 1 holds other tokens than rank 0), so a split
      // copied from rank 0 to every rank would show here.
      EXPECT_NE(run.rank_metrics[0][0].linear_s, run.rank_metrics[1][0].linear_s) << o.modes[e].label;
    }
    // The same config alone: its buffer estimate is params x 4 + one slot's activations + the
    // dispatcher's peak, which is what the accounting sums when one micro-batch is live at once.
    for (size_t e = 0; e < o.modes.size(); ++e) {
      auto cfg = compare_config(o.base, o.modes[e]);
      ASSERT_TRUE(cfg.ok());
      TrainHooks hooks;
      hooks.data = &*data;
      TrainResult r;
      ASSERT_TRUE(run_training_local(*cfg, hooks, &r).ok());
      EXPECT_EQ(r.accounted_peak_bytes, r.buffer_bytes) << o.modes[e].label << " micro-batches " << micro;
    }
  }
}

TEST(RunCompare, RefusesBadEntriesBeforeAnyWork) {
  CompareOptions o = small_options(2, 1);
  o.modes[0].cp = 2;
  EXPECT_NE(o.validate().message().find("CP degree 2"), std::string::npos);
  o = small_options(2, 1);
  o.modes[1].reference = true;  // two references
  EXPECT_NE(o.validate().message().find("exactly one reference"), std::string::npos);
  o = small_options(2, 1);
  o.modes[1].label = o.modes[0].label;
  EXPECT_NE(o.validate().message().find("twice"), std::string::npos);
  o = small_options(2, 1);
  o.warmup_steps = 3;
  EXPECT_NE(o.validate().message().find("--warmup-steps"), std::string::npos);
}

// A hand-made result: rows' quantiles, paired speedups against the reference, the group's best,
// and max/mean of the per-rank peaks.
TEST(SummarizeCompare, PairsRoundsAndPicksEachGroupsBest) {
  CompareOptions o;
  o.modes = {{"a", "a", TrainMode::kColocated, std::nullopt, 1, false},
             {"b2", "b", TrainMode::kColocated, std::nullopt, 1, false},
             {"b4", "b", TrainMode::kColocated, std::nullopt, 1, false},
             {"ref", "ref", TrainMode::kCad, runtime::OverlapMode::kPingPong, 1, true}};
  CompareResult res;
  res.runs.resize(4);
  res.runs[0].step_s = {2, 4};
  res.runs[0].round_median_s = {2, 4};  // rounds where the reference took 1 and 2: ratio 2 both
  res.runs[1].step_s = {3, 3};
  res.runs[1].round_median_s = {3, 3};
  res.runs[2].step_s = {1.5, 1.5};
  res.runs[2].round_median_s = {1.5, 1.5};
  res.runs[3].step_s = {1, 2};
  res.runs[3].round_median_s = {1, 2};
  res.runs[3].tokens_per_step = 300;
  res.runs[0].accounted_peak = {100, 300};
  res.runs[0].rank_idle = {{0.1, 0.3}, {0.5, 0.5}};
  const std::vector<CompareRow> rows = summarize_compare(o, res);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_DOUBLE_EQ(rows[0].reference_speedup, 2.0);
  EXPECT_DOUBLE_EQ(rows[1].reference_speedup, 2.25);  // median of 3/1 and 3/2
  EXPECT_DOUBLE_EQ(rows[3].reference_speedup, 1.0);
  EXPECT_FALSE(rows[1].best_of_group);
  EXPECT_TRUE(rows[2].best_of_group);
  EXPECT_TRUE(rows[0].best_of_group);
  EXPECT_EQ(rows[0].accounted_max, 300);
  EXPECT_DOUBLE_EQ(rows[0].accounted_max_over_mean, 1.5);
  EXPECT_DOUBLE_EQ(rows[0].idle_max, 0.5);
  EXPECT_DOUBLE_EQ(rows[0].idle_mean, 0.35);
  EXPECT_DOUBLE_EQ(rows[3].tokens_per_s, 200.0);
  EXPECT_DOUBLE_EQ(rows[3].median_s, 1.5);
  EXPECT_DOUBLE_EQ(rows[0].accounted_replicas_max_over_mean, 1.5);  // one stage: the whole job's
  EXPECT_TRUE(rows[0].resident_replicas_by_stage.empty());
}

// Peak memory max/mean within each stage (and TP index) across its replicas, by hand: world
// rank = (stage * dp + replica) * tp + t.
TEST(SummarizeCompare, PeakMemoryWithinEachStageAcrossItsReplicas) {
  CompareOptions o;
  o.modes = {{"ref", "ref", TrainMode::kCad, runtime::OverlapMode::kPingPong, 1, true}};
  o.base.ranks = 4;
  o.base.pp = 2;  // dp 2: ranks 0, 1 are stage 0's replicas, 2, 3 stage 1's
  CompareResult res;
  res.runs.resize(1);
  res.runs[0].accounted_peak = {100, 300, 50, 70};
  res.runs[0].resident_peak = {400, 400, 90, 110};
  std::vector<CompareRow> rows = summarize_compare(o, res);
  EXPECT_DOUBLE_EQ(rows[0].accounted_max_over_mean, 300.0 / 130.0);  // the whole job
  ASSERT_EQ(rows[0].accounted_replicas_by_stage.size(), 2u);
  EXPECT_DOUBLE_EQ(rows[0].accounted_replicas_by_stage[0], 300.0 / 200.0);
  EXPECT_DOUBLE_EQ(rows[0].accounted_replicas_by_stage[1], 70.0 / 60.0);
  EXPECT_DOUBLE_EQ(rows[0].accounted_replicas_max_over_mean, 1.5);
  ASSERT_EQ(rows[0].resident_replicas_by_stage.size(), 2u);
  EXPECT_DOUBLE_EQ(rows[0].resident_replicas_by_stage[0], 1.0);
  EXPECT_DOUBLE_EQ(rows[0].resident_replicas_max_over_mean, 110.0 / 100.0);

  o.base.ranks = 8;
  o.base.tp = 2;  // dp 2; groups (stage, t): {0, 2}, {1, 3}, {4, 6}, {5, 7}
  res.runs[0].accounted_peak = {10, 20, 30, 40, 50, 60, 70, 80};
  res.runs[0].resident_peak.clear();
  rows = summarize_compare(o, res);
  ASSERT_EQ(rows[0].accounted_replicas_by_stage.size(), 4u);
  EXPECT_DOUBLE_EQ(rows[0].accounted_replicas_by_stage[0], 30.0 / 20.0);
  EXPECT_DOUBLE_EQ(rows[0].accounted_replicas_by_stage[1], 40.0 / 30.0);
  EXPECT_DOUBLE_EQ(rows[0].accounted_replicas_by_stage[2], 70.0 / 60.0);
  EXPECT_DOUBLE_EQ(rows[0].accounted_replicas_by_stage[3], 80.0 / 70.0);
  EXPECT_DOUBLE_EQ(rows[0].accounted_replicas_max_over_mean, 1.5);
  EXPECT_DOUBLE_EQ(rows[0].resident_replicas_max_over_mean, 0.0);
}

}  // namespace
}  // namespace distca::train
