// Every scheduler (the baselines and the communication-aware ones) through run_scheduler and
// build_plan, checked by the validator on random batches of both layouts: the test layer's own
// small batches and the data layer's workload generator (contiguous and head-tail).
#include <gtest/gtest.h>

#include "distca/core/specs.h"
#include "distca/data/workload.h"
#include "distca/plan/plan.h"
#include "distca/plan/plan_json.h"
#include "distca/plan/validate.h"
#include "plan_test_util.h"

#include <nlohmann/json.hpp>

namespace distca {
namespace {

std::vector<SchedulerSpec> all_specs(int64_t ranks) {
  std::vector<SchedulerSpec> v{{SchedulerKind::kColocated, 1}, {SchedulerKind::kWlb, 1},
                               {SchedulerKind::kCad, 1}, {SchedulerKind::kCadSymmetric, 1}};
  for (int64_t c = 2; c <= ranks; ++c) if (ranks % c == 0) v.push_back({SchedulerKind::kPerCp, c});
  return v;
}

// Every (query, key) pair of every document computed exactly once, running the plan's fused
// calls symbolically.
void expect_pairs_once(const Plan& plan, const std::string& what) {
  auto counts = brute_force_pair_counts(plan);
  ASSERT_TRUE(counts.ok()) << what << ": " << counts.status().to_string();
  for (const auto& [doc, c] : *counts) {
    int64_t L = 0;
    while (L * L < static_cast<int64_t>(c.size())) ++L;
    for (int64_t q = 0; q < L; ++q)
      for (int64_t k = 0; k < L; ++k)
        ASSERT_EQ(c[static_cast<size_t>(q * L + k)], k <= q ? 1 : 0) << what << " doc " << doc;
  }
}

void check_all(const Batch& b, const std::string& what, double tolerance, bool brute_force = false) {
  ScheduleOptions o;
  o.model = test::test_model();
  o.tolerance = tolerance;
  for (const SchedulerSpec& spec : all_specs(b.ranks)) {
    auto plan = make_plan(b, spec, o);
    ASSERT_TRUE(plan.ok()) << what << " " << spec.name() << ": " << plan.status().to_string();
    const Status st = validate_plan(*plan, b, nullptr);
    ASSERT_TRUE(st.ok()) << what << " " << spec.name() << ": " << st.to_string();
    if (brute_force) expect_pairs_once(*plan, what + " " + spec.name());
  }
}

TEST(AllSchedulers, ValidOnSmallRandomBatches) {
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    const Batch b = test::random_batch(seed + 9000, seed % 2 ? test::TestLayout::kScattered
                                                             : test::TestLayout::kContiguous);
    check_all(b, "seed " + std::to_string(seed), seed % 3 == 0 ? 0.0 : 0.05 * static_cast<double>(seed % 4),
              seed % 8 == 0);
  }
}

TEST(AllSchedulers, ValidOnGeneratedWorkloads) {
  for (const char* dist : {"prolong", "pretrain", "uniform:16:3000"}) {
    for (Layout layout : {Layout::kContiguous, Layout::kHeadTail}) {
      WorkloadOptions w;
      w.dist = dist;
      w.ranks = 8;
      w.tokens_per_rank = 4096;
      w.layout = layout;
      w.batches = 6;
      w.seed = 11;
      auto batches = make_batches(w);
      ASSERT_TRUE(batches.ok()) << batches.status().to_string();
      for (size_t i = 0; i < batches->size(); ++i) {
        check_all((*batches)[i], std::string(dist) + (layout == Layout::kHeadTail ? " head-tail" : " contiguous") + " batch " + std::to_string(i), 0.05);
      }
    }
  }
}

TEST(AllSchedulers, SameBatchSameBytes) {
  WorkloadOptions w;
  w.ranks = 8;
  w.tokens_per_rank = 8192;
  w.layout = Layout::kHeadTail;
  auto batches = make_batches(w);
  ASSERT_TRUE(batches.ok());
  ScheduleOptions o;
  o.model = test::test_model();
  for (const SchedulerSpec& spec : all_specs(8)) {
    auto a = make_plan(batches->front(), spec, o);
    auto b = make_plan(batches->front(), spec, o);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(plan_to_json(*a).dump(), plan_to_json(*b).dump()) << spec.name();
  }
}

// make_plan_setup: the flags checked in the CLI's order (the first bad one named), and
// options.cost pointing into the setup (the pairs, or the loaded table).
TEST(PlanSetup, ChecksTheFlagsInTheCliOrder) {
  const ModelSpec model = *model_preset("llama-8b");
  auto message = [&](const PlanFlags& f) {
    PlanSetup s;
    const Status st = make_plan_setup(model, f, s);
    return st.ok() ? std::string("ok") : st.message();
  };
  PlanFlags f;
  {
    PlanSetup s;
    ASSERT_TRUE(make_plan_setup(model, f, s).ok());
    EXPECT_EQ(s.spec.kind, SchedulerKind::kCad);
    EXPECT_EQ(s.options.dtype_bytes, 2);
    EXPECT_EQ(s.options.tolerance, 0.05);
    EXPECT_EQ(s.options.cost, &s.pairs);
    EXPECT_EQ(s.options.model.name, "llama-8b");
  }
  f.scheduler = "percp:3";
  f.dtype = "fp32";
  f.tolerance = 0.5;
  f.wlb_mem_cap = 2;
  f.align_rows = 128;
  {
    PlanSetup s;
    ASSERT_TRUE(make_plan_setup(model, f, s).ok());  // the degree is checked against a batch later
    EXPECT_EQ(s.spec.kind, SchedulerKind::kPerCp);
    EXPECT_EQ(s.spec.cp_degree, 3);
    EXPECT_EQ(s.options.dtype_bytes, 4);
    EXPECT_EQ(s.options.tolerance, 0.5);
    EXPECT_EQ(s.options.wlb_mem_cap, 2);
    EXPECT_EQ(s.options.align_rows, 128);
  }
  f = PlanFlags{"nope", "fp16", 2, 0.5, 0, "/nonexistent/table.json"};
  EXPECT_NE(message(f).find("--scheduler"), std::string::npos) << message(f);
  f.scheduler = "wlb";
  EXPECT_NE(message(f).find("--dtype"), std::string::npos) << message(f);
  f.dtype = "bf16";
  EXPECT_NE(message(f).find("--cost-table"), std::string::npos) << message(f);
  f.cost_table.clear();
  EXPECT_NE(message(f).find("--tolerance"), std::string::npos) << message(f);
  f.tolerance = 0.1;
  EXPECT_NE(message(f).find("--wlb-mem-cap"), std::string::npos) << message(f);
  f.wlb_mem_cap = 1.2;
  EXPECT_NE(message(f).find("--align-rows"), std::string::npos) << message(f);
  f.align_rows = 1;
  EXPECT_EQ(message(f), "ok");
}

}  // namespace
}  // namespace distca
