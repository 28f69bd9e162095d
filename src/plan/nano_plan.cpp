// Nano-batch planning (include/distca/plan/nano_plan.h).
#include "distca/plan/nano_plan.h"

#include <algorithm>
#include <utility>

namespace distca {

Result<NanoSchedule> schedule_nano_batches(const Batch& batch, const SchedulerSpec& spec,
                                           const ScheduleOptions& options, double cut_fraction) {
  DISTCA_RETURN_IF_ERROR(options.validate(batch, spec));
  NanoSchedule out;
  DISTCA_ASSIGN_OR_RETURN(out.split, split_nano_batches(batch, options.align_rows, cut_fraction));
  out.input = out.split.batch;
  DISTCA_ASSIGN_OR_RETURN(Schedule sched, run_scheduler(spec, out.input, options));
  if (!(sched.batch == out.input)) {
    DISTCA_ASSIGN_OR_RETURN(out.split, split_nano_batches(sched.batch, options.align_rows, cut_fraction));
  }
  for (const TaskPlacement& t : sched.tasks) {
    const int64_t c = out.split.cut_of(t.doc);
    TaskPlacement a = t, b = t;
    a.q_end = std::min(t.q_end, c);
    b.q_begin = std::max(t.q_begin, c);
    if (a.q_end > a.q_begin) {
      out.nano[0].push_back(a);
      out.full.push_back(a);
    }
    if (b.q_end > b.q_begin) {
      out.nano[1].push_back(b);
      out.full.push_back(b);
    }
  }
  out.scheduled = std::move(sched.tasks);
  return out;
}

Result<NanoPlans> plan_nano_batches(const Batch& batch, const SchedulerSpec& spec,
                                    const ScheduleOptions& options, double cut_fraction) {
  DISTCA_ASSIGN_OR_RETURN(NanoSchedule ns, schedule_nano_batches(batch, spec, options, cut_fraction));
  NanoPlans out;
  out.split = std::move(ns.split);
  auto plan = [&](std::vector<TaskPlacement>&& tasks) {
    Schedule s;
    s.batch = out.split.batch;
    s.tasks = std::move(tasks);
    return build_plan(s, ns.input, spec, options);
  };
  DISTCA_ASSIGN_OR_RETURN(out.full, plan(std::move(ns.full)));
  for (size_t x = 0; x < 2; ++x) {
    DISTCA_ASSIGN_OR_RETURN(out.nano[x], plan(std::move(ns.nano[x])));
  }
  return out;
}

}  // namespace distca
