// The dispatcher (schedule.h). Kept apart from schedule.cpp so that code using only the names
// and option checks does not link every scheduler.
#include <chrono>
#include <utility>

#include "distca/plan/plan.h"
#include "distca/plan/schedule.h"

namespace distca {

namespace {

Result<Schedule> dispatch(const SchedulerSpec& spec, const Batch& batch, const ScheduleOptions& options) {
  switch (spec.kind) {
    case SchedulerKind::kColocated: return schedule_colocated(batch, options);
    case SchedulerKind::kWlb: return schedule_wlb(batch, options);
    case SchedulerKind::kPerCp: return schedule_percp(batch, spec.cp_degree, options);
    case SchedulerKind::kCad: return schedule_cad(batch, options);
    case SchedulerKind::kCadSymmetric: return schedule_cad_symmetric(batch, options);
  }
  return Status::internal("run_scheduler: unknown scheduler kind");
}

double seconds_since(std::chrono::steady_clock::time_point& t) {
  const auto now = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(now - t).count();
  t = now;
  return s;
}

}  // namespace

Result<Schedule> run_scheduler(const SchedulerSpec& spec, const Batch& batch,
                               const ScheduleOptions& options) {
  DISTCA_RETURN_IF_ERROR(options.validate(batch, spec));
  return dispatch(spec, batch, options);
}

Result<Plan> make_plan(const Batch& batch, const SchedulerSpec& spec, const ScheduleOptions& options,
                       PlanPhases* phases) {
  PlanPhases local;
  PlanPhases& ph = phases != nullptr ? *phases : local;
  auto t = std::chrono::steady_clock::now();
  DISTCA_RETURN_IF_ERROR(options.validate(batch, spec));
  ph.validate_s = seconds_since(t);
  DISTCA_ASSIGN_OR_RETURN(Schedule schedule, dispatch(spec, batch, options));
  ph.schedule_s = seconds_since(t);
  return detail::build_plan_from(std::move(schedule), batch, spec, options, &ph);
}

}  // namespace distca
