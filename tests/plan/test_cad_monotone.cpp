// `cad`'s bytes never rise with the tolerance (docs/scheduler.md, "Tolerance monotonicity"):
// for the same batch, a plan at a wider tolerance moves at most the bytes of one at a tighter
// tolerance whenever that tighter plan is inside its band (it is then also a valid wider plan).
// Independent reference: compute_traffic's recount of each schedule, not the planner's figure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "distca/data/workload.h"
#include "distca/plan/cad.h"
#include "distca/plan/traffic.h"
#include "plan_test_util.h"

namespace distca {
namespace {

using test::TestLayout;

ScheduleOptions opts(double tol) {
  ScheduleOptions o;
  o.model = test::test_model();
  o.tolerance = tol;
  return o;
}

// Bytes by the shared rules, and whether the plan is inside its band.
struct Outcome {
  int64_t bytes = 0;
  bool balanced = false;
};

Outcome plan(const Batch& b, double tol) {
  CadStats st;
  auto s = schedule_cad(b, opts(tol), &st);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  if (!s.ok()) return {};
  const Traffic t = compute_traffic(DocumentIndex(b), s->tasks, row_bytes(opts(tol).model, 2));
  return {t.bytes.forward(), st.balanced};
}

// Mid-sized batches: every workload, both layouts, 2-24 ranks, 4K-32K tokens per rank.
std::vector<Batch> workload_batches(uint64_t seed, int64_t count) {
  static const char* kDists[] = {"pretrain", "prolong", "uniform:100:20000", "fixed:3000"};
  std::vector<Batch> out;
  Rng rng(seed);
  for (int64_t i = 0; i < count; ++i) {
    WorkloadOptions w;
    w.dist = kDists[rng.uniform_int(4)];
    w.ranks = 2 + static_cast<int64_t>(rng.uniform_int(23));
    w.tokens_per_rank = 4096 << rng.uniform_int(4);
    w.layout = rng.bernoulli(0.5) ? Layout::kHeadTail : Layout::kContiguous;
    w.seed = seed * 1000 + static_cast<uint64_t>(i);
    auto b = make_batches(w);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    if (b.ok()) out.push_back(b->front());
  }
  return out;
}

// A random tolerance: uniform in [0, 0.5], or exactly on / just around a planning tolerance of
// the planner's ladder (0, 0.05, 0.15, 0.4: where its candidate set grows) or a common value.
double random_tolerance(Rng& rng) {
  static const double kEdges[] = {0.0, 0.05, 0.15, 0.4, 0.1, 0.2};
  const uint64_t kind = rng.uniform_int(4);
  if (kind == 0) return kEdges[rng.uniform_int(6)];
  if (kind == 1) {
    const double e = kEdges[1 + rng.uniform_int(5)];
    return rng.bernoulli(0.5) ? e * (1 - 1e-9) : e * (1 + 1e-9);
  }
  return 0.5 * rng.uniform();
}

void expect_monotone(const Batch& b, double t1, double t2, const char* what, size_t i) {
  if (t1 > t2) std::swap(t1, t2);
  const Outcome tight = plan(b, t1);
  const Outcome wide = plan(b, t2);
  if (tight.balanced) {
    EXPECT_LE(wide.bytes, tight.bytes) << what << " batch " << i << " tolerances " << t1 << " < " << t2;
    EXPECT_TRUE(wide.balanced) << what << " batch " << i << " tolerance " << t2;
  }
}

TEST(CadMonotone, ThousandsOfTinyBatchesAndTolerancePairs) {
  Rng rng(2026, 15);
  int64_t checked = 0;
  for (uint64_t i = 0; i < 3000; ++i) {
    const Batch b = test::random_batch(i, i % 2 ? TestLayout::kScattered : TestLayout::kContiguous, 8, 2000);
    const double t1 = random_tolerance(rng), t2 = random_tolerance(rng);
    const Outcome tight = plan(b, std::min(t1, t2));
    if (tight.balanced) ++checked;
    expect_monotone(b, t1, t2, "tiny", i);
  }
  EXPECT_GE(checked, 1000);  // most tighter plans are balanced, so the property is exercised
}

TEST(CadMonotone, WorkloadBatchesAndTolerancePairs) {
  const auto batches = workload_batches(15, 300);
  Rng rng(2026, 16);
  for (size_t i = 0; i < batches.size(); ++i) {
    for (int k = 0; k < 3; ++k) expect_monotone(batches[i], random_tolerance(rng), random_tolerance(rng), "workload", i);
  }
}

// The case the issue reported: 0.10 against 0.05 on 8-server Pretrain-like batches.
TEST(CadMonotone, EightServerPretrainTenPercentAgainstFive) {
  WorkloadOptions w;
  w.dist = "pretrain";
  w.ranks = 8;
  w.tokens_per_rank = 32768;
  w.batches = 40;
  w.seed = 42;
  auto bs = make_batches(w);
  ASSERT_TRUE(bs.ok());
  for (size_t i = 0; i < bs->size(); ++i) expect_monotone((*bs)[i], 0.05, 0.10, "pretrain-8", i);
}

}  // namespace
}  // namespace distca
