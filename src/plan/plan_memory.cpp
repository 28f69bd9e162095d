#include "distca/plan/plan_memory.h"

#include <utility>

#include "distca/core/clock.h"
#include "distca/core/memory.h"
#include "distca/plan/schedule.h"

namespace distca {
namespace {

constexpr double kPlanPerRank = 4096;    // measured ~3 KB: servers, ranks, six exchanges
constexpr double kPlanPerPiece = 640;    // the document index, the validator's maps
constexpr double kPlanPerTask = 256;     // task, q_offset, segments, schedule
constexpr double kPlanPerQBlock = 256;   // eight copies (q, o_lse, do, dq on both ends)
constexpr double kPlanPerKvBlock = 640;  // four copies (kv, dkv on both ends), position map

double pieces_of(const Batch& b) {
  double n = 0;
  for (const auto& rank : b.per_rank) n += static_cast<double>(rank.size());
  return n;
}

}  // namespace

double plan_bytes(double ranks, double pieces, double tasks, double q_blocks, double kv_blocks) {
  return kPlanPerRank * ranks + kPlanPerPiece * pieces + kPlanPerTask * tasks + kPlanPerQBlock * q_blocks +
         kPlanPerKvBlock * kv_blocks;
}

double plan_schedule_bytes(const Batch& b, const SchedulerSpec& spec) {
  const double pieces = pieces_of(b), ranks = static_cast<double>(b.ranks);
  if (spec.kind != SchedulerKind::kPerCp) return plan_bytes(ranks, pieces, pieces, 0, 0);
  // percp cuts every document into 2C chunks: far more tasks than pieces at large C. Nearly
  // every task is served away from home: a q block each.
  const double tasks = static_cast<double>(percp_task_count(b, spec.cp_degree));
  return plan_bytes(ranks, pieces, tasks, tasks, 0);
}

double plan_layout_bytes(const Batch& b, const PlanSize& z) {
  return plan_bytes(static_cast<double>(b.ranks), pieces_of(b), static_cast<double>(z.tasks),
                    static_cast<double>(z.q_blocks), static_cast<double>(z.kv_blocks));
}

Result<Plan> make_plan_within_memory(const Batch& batch, const SchedulerSpec& spec, const ScheduleOptions& options,
                                     double held, const std::string& what, double* seconds) {
  const double t0 = monotonic_seconds();
  DISTCA_ASSIGN_OR_RETURN(Schedule schedule, run_scheduler(spec, batch, options));
  const double t1 = monotonic_seconds();
  // The layouts' size depends on where the tasks went: checked before they are built.
  DISTCA_RETURN_IF_ERROR(check_memory(held + plan_layout_bytes(batch, plan_size(schedule)), what + " (the plan's layouts)"));
  const double t2 = monotonic_seconds();
  // The schedule's batch handed over and the input checked once, as make_plan builds it.
  Result<Plan> plan = detail::build_plan_from(std::move(schedule), batch, spec, options, nullptr);
  *seconds = (t1 - t0) + (monotonic_seconds() - t2);
  return plan;
}

double plan_json_bytes(double ranks) {
  constexpr double kPerRankPair = 6144;  // measured 3.8 KB: six exchanges' dense entries + text
  return kPerRankPair * ranks * ranks;
}

}  // namespace distca
