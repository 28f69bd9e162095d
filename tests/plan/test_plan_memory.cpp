// The plan memory estimates shared by `distca plan` and distca.plan (plan/plan_memory.h):
// each is the documented per-item cost times the counts of the plan it covers.
#include "distca/plan/plan_memory.h"

#include <gtest/gtest.h>

#include "distca/plan/schedule.h"
#include "plan_test_util.h"

namespace distca {
namespace {

// 4096 B per rank, 640 per piece, 256 per task, 256 per q block, 640 per kv block.
TEST(PlanMemory, PlanBytesIsTheDocumentedCosts) {
  EXPECT_EQ(plan_bytes(1, 0, 0, 0, 0), 4096);
  EXPECT_EQ(plan_bytes(0, 1, 0, 0, 0), 640);
  EXPECT_EQ(plan_bytes(0, 0, 1, 1, 1), 256 + 256 + 640);
  EXPECT_EQ(plan_json_bytes(8), 6144.0 * 64);  // quadratic in ranks
}

TEST(PlanMemory, ScheduleAndLayoutBytesCountTheBatchAndTheSchedule) {
  const Batch b = test::random_batch(3, test::TestLayout::kContiguous);
  double pieces = 0;
  for (const auto& rank : b.per_rank) pieces += static_cast<double>(rank.size());
  const auto R = static_cast<double>(b.ranks);
  // A task per piece before scheduling; percp's exact task count, a q block each.
  EXPECT_EQ(plan_schedule_bytes(b, {SchedulerKind::kCad, 1}), plan_bytes(R, pieces, pieces, 0, 0));
  const double percp = static_cast<double>(percp_task_count(b, 1));
  EXPECT_EQ(plan_schedule_bytes(b, {SchedulerKind::kPerCp, 1}), plan_bytes(R, pieces, percp, percp, 0));
  const PlanSize z{5, 7, 11};
  EXPECT_EQ(plan_layout_bytes(b, z), plan_bytes(R, pieces, 5, 7, 11));
}

}  // namespace
}  // namespace distca
