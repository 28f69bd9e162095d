// Nano-batch planning: the one function that turns a micro-batch (or a pooled tick direction,
// plan/pool.h) into ping's and pong's task lists, so the trainer runs and the simulator
// replays the same cut (docs/runtime.md, "Nano-batch split" and "Ping-pong").
//
// schedule_nano_batches splits the batch (split_nano_batches(batch, options.align_rows)), runs
// the scheduler ONCE on the split batch, and cuts every task [a, b) at its document's cut c
// into a ping task [a, min(b, c)) and a pong task [max(a, c), b) on the same server and home
// (empty parts dropped). wlb re-packs whole documents: its batch is split again (a cut
// document keeps its cut, a function of its length), and the tasks refer to that batch.
// plan_nano_batches builds the plans of those lists.
//
// Determinism: pure functions of their arguments. Thread safety: reentrant.
#pragma once

#include <array>
#include <vector>

#include "distca/core/status.h"
#include "distca/data/batch.h"
#include "distca/plan/nano_split.h"
#include "distca/plan/plan.h"
#include "distca/plan/schedule.h"

namespace distca {

struct NanoSchedule {
  NanoSplit split;  // the split; every task's home and document refer to split.batch
  Batch input;      // the scheduler's input (the first split's batch): build_plan's loads_before
  std::vector<TaskPlacement> scheduled;  // the scheduler's tasks, before the cut
  // Every task cut at its document's cut, in the scheduler's order, each task's ping part
  // before its pong part: the single-stream plan's tasks.
  std::vector<TaskPlacement> full;
  std::array<std::vector<TaskPlacement>, 2> nano;  // ping's and pong's tasks, same order
};

// cut_fraction: split_nano_batches' (0: the L / sqrt(2) rule).
// Errors: those of ScheduleOptions::validate, split_nano_batches and the scheduler.
Result<NanoSchedule> schedule_nano_batches(const Batch& batch, const SchedulerSpec& spec,
                                           const ScheduleOptions& options, double cut_fraction = 0);

struct NanoPlans {
  NanoSplit split;           // the split; every plan's batch is split.batch
  Plan full;                 // the whole micro-batch's plan (NanoSchedule::full)
  std::array<Plan, 2> nano;  // ping, pong (same batch and token buffers as full)
};

// schedule_nano_batches, then build_plan of the three task lists.
Result<NanoPlans> plan_nano_batches(const Batch& batch, const SchedulerSpec& spec,
                                    const ScheduleOptions& options, double cut_fraction = 0);

}  // namespace distca
