// The pipeline schedules the simulator replays are the runtime's (runtime/pipeline_schedule.h:
// 1F1B per stage for the baselines and its unit-time slots as mixed ticks for CAD, with their
// messages and checks); this header only re-exports the names the simulator uses, so there is
// one definition of each order.
//
// Thread safety: pure functions (see runtime/pipeline_schedule.h).
#pragma once

#include "distca/runtime/pipeline_schedule.h"

namespace distca::sim {

using runtime::one_f_one_b;
using runtime::one_f_one_b_ticks;
using runtime::peak_in_flight;
using runtime::phase_aligned;
using runtime::PipeOp;
using runtime::stage_ops;
using runtime::Tick;

}  // namespace distca::sim
