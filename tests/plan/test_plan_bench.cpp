// plan/plan_bench.h and plan/batch_summary.h: the planner benchmark's statistics against
// figures computed here from the samples, its row against the schedulers and the traffic rules
// called directly, and the workload summary's aggregates.
#include <algorithm>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distca/cost/analytic.h"
#include "distca/data/workload.h"
#include "distca/plan/batch_summary.h"
#include "distca/plan/cad.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/plan_bench.h"
#include "distca/plan/traffic.h"

namespace distca {
namespace {

PlanSample sample(double ms, double mm, double bytes, double complete_ms, double wide) {
  PlanSample s;
  s.ms = ms;
  s.max_over_mean = mm;
  s.bytes = bytes;
  s.bytes_max_rank = bytes / 2;
  s.complete_ms = complete_ms;
  s.phases.schedule_s = complete_ms / 2e3;
  s.wide_ratio = wide;
  return s;
}

TEST(PlanBench, SummaryIsTheSamplesMediansWorstAndCounts) {
  const std::vector<PlanSample> samples = {sample(1, 1.02, 10, 4, 0.9), sample(3, 1.2, 30, 6, 1.1),
                                           sample(2, 1.04, 20, 2, 1.0)};
  const nlohmann::json j = plan_samples_json(samples, 0, 0.05);
  EXPECT_EQ(j["plan_ms_median"].get<double>(), 2);
  EXPECT_EQ(j["load_max_over_mean_median"].get<double>(), 1.04);
  EXPECT_EQ(j["load_max_over_mean_worst"].get<double>(), 1.2);
  EXPECT_EQ(j["comm_bytes_total_median"].get<double>(), 20);
  EXPECT_EQ(j["comm_bytes_max_rank_median"].get<double>(), 10);
  EXPECT_EQ(j["balanced_batches"].get<int64_t>(), 2);  // 1.02 and 1.04 within 1.05
  EXPECT_EQ(j["batches"].get<int64_t>(), 3);
  EXPECT_EQ(j["complete_plan_ms_median"].get<double>(), 4);
  EXPECT_DOUBLE_EQ(j["complete_plan_phases_ms_median"]["schedule"].get<double>(), 2);
  EXPECT_DOUBLE_EQ(j["complete_plan_phases_ms_median"]["rest"].get<double>(), 2);  // complete less the phases
  EXPECT_EQ(j["wide_over_tight_bytes_worst"].get<double>(), 1.1);
  EXPECT_EQ(j["wide_costs_more_batches"].get<int64_t>(), 1);
  EXPECT_FALSE(j.contains("cp_degree_median"));
  // Untimed figures (-1) stay out: wlb has neither the complete plan nor the wide tolerance.
  const nlohmann::json wlb = plan_samples_json({sample(1, 1, 1, -1, -1)}, 2, 0.05);
  EXPECT_FALSE(wlb.contains("complete_plan_ms_median"));
  EXPECT_FALSE(wlb.contains("wide_over_tight_bytes_worst"));
  EXPECT_TRUE(plan_samples_json({sample(1, 1, 1, -1, -1)}, 3, 0.05).contains("cp_degree_median"));
}

TEST(PlanBench, RowIsEverySchedulerOnTheBatches) {
  WorkloadOptions w;
  w.dist = "pretrain";
  w.ranks = 4;
  w.tokens_per_rank = 4096;
  w.batches = 6;
  const std::vector<Batch> batches = make_batches(w).value();
  ScheduleOptions o;
  o.model = model_preset("tiny").value();
  o.tolerance = 0.1;
  auto row = bench_plan_row(batches, o, 0.2, "test");
  ASSERT_TRUE(row.ok()) << row.status().message();
  for (int k = 0; k < 3; ++k) EXPECT_EQ(row->samples[k].size(), batches.size()) << k;
  EXPECT_EQ(row->samples[3].size(), kPercpBenchBatches);
  ASSERT_EQ(row->cad_over_symmetric.size(), batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    // cad's bytes by the traffic rules on its own schedule, and the ratio beside cad-symmetric's.
    const Schedule s = schedule_cad(batches[i], o).value();
    const Traffic t = compute_traffic(DocumentIndex(s.batch), s.tasks, row_bytes(o.model, o.dtype_bytes));
    EXPECT_EQ(row->samples[0][i].bytes, static_cast<double>(t.bytes.forward())) << i;
    EXPECT_EQ(row->cad_over_symmetric[i], row->samples[0][i].bytes / std::max(1.0, row->samples[1][i].bytes)) << i;
    EXPECT_GE(row->samples[0][i].complete_ms, 0) << i;
    EXPECT_LT(row->samples[2][i].complete_ms, 0) << i;  // wlb: not timed complete
  }
}

TEST(BatchSummary, SeveralBatchesAggregate) {
  const ModelSpec m = model_preset("tiny").value();
  const Batch a{2, 16, {{{0, 0, 16, 16}}, {{1, 0, 8, 8}, {2, 0, 8, 8}}}};
  const Batch b{2, 16, {{{0, 0, 16, 32}}, {{0, 16, 16, 32}}}};
  const nlohmann::json sa = batch_summary_json(a, m), sb = batch_summary_json(b, m);
  EXPECT_EQ(batches_summary_json({sa}), sa);
  const nlohmann::json both = batches_summary_json({sa, sb});
  EXPECT_EQ(both["documents"].get<int64_t>(), 3 + 1);
  const double ra = sa["attn_load_max_over_mean"].get<double>(), rb = sb["attn_load_max_over_mean"].get<double>();
  EXPECT_DOUBLE_EQ(both["attn_load_max_over_mean"].get<double>(), (ra + rb) / 2);
  EXPECT_EQ(both["attn_load_max_over_mean_max"].get<double>(), std::max(ra, rb));
  EXPECT_EQ(both["ranks"].get<int64_t>(), 2);
  EXPECT_EQ(both["batches"].size(), 2u);
  // Pairs by hand: a's rank 0 holds 16 x 17 / 2, rank 1 two documents of 8 x 9 / 2.
  EXPECT_EQ(sa["attn_pairs"].get<int64_t>(), 136 + 2 * 36);
  const Batch wide{4, 16, {{{0, 0, 16, 16}}, {{1, 0, 16, 16}}, {{2, 0, 16, 16}}, {{3, 0, 16, 16}}}};
  EXPECT_FALSE(batches_summary_json({sa, batch_summary_json(wide, m)}).contains("ranks"));
}

}  // namespace
}  // namespace distca
