// The dispatcher (schedule.h). Kept apart from schedule.cpp so that code using only the names
// and option checks does not link every scheduler.
#include "distca/plan/plan.h"
#include "distca/plan/schedule.h"

namespace distca {

Result<Schedule> run_scheduler(const SchedulerSpec& spec, const Batch& batch,
                               const ScheduleOptions& options) {
  DISTCA_RETURN_IF_ERROR(options.validate(batch, spec));
  switch (spec.kind) {
    case SchedulerKind::kColocated: return schedule_colocated(batch, options);
    case SchedulerKind::kWlb: return schedule_wlb(batch, options);
    case SchedulerKind::kPerCp: return schedule_percp(batch, spec.cp_degree, options);
    case SchedulerKind::kCad: return schedule_cad(batch, options);
    case SchedulerKind::kCadSymmetric: return schedule_cad_symmetric(batch, options);
  }
  return Status::internal("run_scheduler: unknown scheduler kind");
}

Result<Plan> make_plan(const Batch& batch, const SchedulerSpec& spec, const ScheduleOptions& options) {
  DISTCA_ASSIGN_OR_RETURN(Schedule schedule, run_scheduler(spec, batch, options));
  return build_plan(schedule, batch, spec, options);
}

}  // namespace distca
