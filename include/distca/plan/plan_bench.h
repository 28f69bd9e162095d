// The planner benchmark's measurements (`distca bench plan`; docs/benchmarks.md, "Planner"):
// every scheduler on the same batches, timed, with its balance and bytes, summarized per
// scheduler as the benchmark's JSON; and the tolerance sweep of cad and cad-symmetric.
//
// Schedulers by index: 0 cad, 1 cad-symmetric, 2 wlb, 3 percp (the best C: the smallest power
// of two whose analytic proxy balance is within the tolerance, confirmed by running it,
// doubling C at most twice when the real plan falls short). Plan times: the faster of two runs
// for cad, cad-symmetric and wlb, one run for percp; the complete plan (make_plan, with its
// PlanPhases) and the bytes at a wider tolerance for cad and cad-symmetric only.
//
// Thread safety: pure functions of their arguments (the timings read the monotonic clock).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/status.h"
#include "distca/data/batch.h"
#include "distca/plan/plan.h"
#include "distca/plan/schedule.h"

namespace distca {

inline constexpr const char* kBenchSchedulers[] = {"cad", "cad-symmetric", "wlb", "percp"};
inline constexpr int kNumBenchSchedulers = 4;
// percp is slow to plan and to count at hundreds of servers: it runs on the first batches only.
inline constexpr size_t kPercpBenchBatches = 5;
// PlanPhases' phases, then "rest": the complete time less their sum (mostly freeing the
// builder's scratch and the schedule when make_plan returns).
inline constexpr const char* kPlanPhaseNames[] = {"validate", "schedule", "index", "tasks",
                                                  "layouts",  "mirror",   "metrics", "rest"};
inline constexpr int kNumPlanPhases = 8;

// One scheduler on one batch.
struct PlanSample {
  double ms = 0, max_over_mean = 0;
  double bytes = 0, bytes_max_rank = 0;  // forward; percp: its K/V all-gather, as build_plan reports it
  int64_t cp = 0;                        // percp only
  double complete_ms = -1;               // make_plan, the faster of two runs (-1: not timed)
  PlanPhases phases;                     // of that run
  double wide_ratio = -1;                // bytes at the wide tolerance / bytes at o.tolerance (-1: not run)
};

// Every scheduler on `batches` (percp on the first kPercpBenchBatches): samples[k] per
// scheduler index, and per batch cad's bytes over cad-symmetric's. `what` names the flags
// for a memory refusal (percp's task count is checked with check_memory before it runs).
struct PlanBenchRow {
  std::vector<PlanSample> samples[kNumBenchSchedulers];
  std::vector<double> cad_over_symmetric;
};
Result<PlanBenchRow> bench_plan_row(const std::vector<Batch>& batches, const ScheduleOptions& o, double wide_tolerance,
                                    const std::string& what);

// Scheduler k's samples summarized (medians, worst balance, batches balanced within
// `tolerance`, the complete plan's phases and the wide-tolerance ratios when timed) as the
// benchmark's JSON object.
nlohmann::json plan_samples_json(const std::vector<PlanSample>& samples, int k, double tolerance);

// What a row holds at its peak (docs/scheduler.md, "Memory"): `batches` batches of `servers`
// ranks with `pieces` pieces in the largest, one schedule with its traffic count and one
// complete plan; measured figures rounded up.
double bench_row_bytes(int64_t batches, int64_t servers, double pieces);

// cad and cad-symmetric on `batches` at tolerance `tol` (CadStats): median bytes, cad's worst
// load max/mean and the batches balanced, as the sweep's JSON fields.
Result<nlohmann::json> tolerance_sweep_point(const std::vector<Batch>& batches, const ScheduleOptions& o, double tol);

}  // namespace distca
