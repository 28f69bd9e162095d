// Memory estimates of a plan (docs/scheduler.md, "Memory"), for refusing a plan before the
// allocation each covers (core/memory.h check_memory). Shared by `distca plan` and
// distca.plan, so both refuse the same inputs. The constants are measured costs rounded up.
//
// Thread safety: plain functions of their arguments.
#pragma once

#include <string>

#include "distca/core/status.h"
#include "distca/data/batch.h"
#include "distca/plan/plan.h"

namespace distca {

// A plan of `ranks` ranks over `pieces` pieces with `tasks` tasks and the row blocks given
// (the plan, its document index and the validator's maps).
double plan_bytes(double ranks, double pieces, double tasks, double q_blocks, double kv_blocks);

// Before any scheduling: a task per piece, no row blocks; for percp:C its exact task count
// (percp_task_count), each with a q block. Precondition: the batch is valid (and for percp,
// C divides its ranks).
double plan_schedule_bytes(const Batch& batch, const SchedulerSpec& spec);

// Once the schedule is known, before build_plan allocates: its tasks and row blocks.
double plan_layout_bytes(const Batch& batch, const PlanSize& size);

// make_plan as `distca plan` and distca.plan run it, the layouts' memory checked between its two
// phases: the schedule (run_scheduler), then check_memory(held + plan_layout_bytes, what +
// " (the plan's layouts)") before build_plan allocates, then the plan. `*seconds`: the two
// phases' wall time, less the check (what a training step pays for the plan). Errors:
// run_scheduler's, the check's (out_of_memory), build_plan's.
Result<Plan> make_plan_within_memory(const Batch& batch, const SchedulerSpec& spec, const ScheduleOptions& options,
                                     double held, const std::string& what, double* seconds);

// The plan as JSON (plan_to_json, `--json --full`, distca's Plan.to_dict): the exchange
// arrays are dense [ranks] per rank, so it is quadratic in ranks (6 KB per pair of ranks,
// entries and text).
double plan_json_bytes(double ranks);

}  // namespace distca
