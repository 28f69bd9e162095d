// The communication-aware schedulers (`cad`, `cad-symmetric`) with their planner statistics.
//
// schedule.h declares the plain entry points; the overloads here also report what the planner
// itself counted, so tests can check its incremental byte accounting against an independent
// recount (traffic.h) and benchmarks can report iterations. docs/scheduler.md describes the
// algorithms.
//
// `schedule_cad` tries a few greedy runs on the batch (planning bands from a fixed ladder up to
// the requested tolerance, each stopped at the requested band) and keeps the fewest bytes
// (priced by ScheduleOptions::topology when it names several hosts); so
// for the same batch a wider tolerance never moves more bytes than a tighter one whose plan is
// balanced (docs/scheduler.md, "cad: candidate plans, tolerance monotonicity and bytes").
//
// Thread safety: pure functions of their arguments. `schedule_cad` keeps its working arrays
// in a per-thread scratch object between calls (a few tens of bytes per piece of the largest
// batch planned on that thread, plus its moves), so planning batch after batch touches no
// fresh memory; results never depend on what was planned before.
#pragma once

#include <cstdint>

#include "distca/core/status.h"
#include "distca/data/batch.h"
#include "distca/plan/schedule.h"

namespace distca {

// The smallest chunk of query rows a scheduler moves, and the smallest remainder it leaves at
// home (the attention kernel's tile). A piece shorter than this moves only whole.
inline constexpr int64_t kMinChunkRows = 128;

// For `cad`, the figures of the greedy run whose plan is returned.
struct CadStats {
  int64_t moves = 0;              // chunks sent to another server
  int64_t iterations = 0;         // candidate searches (moves + searches that found nothing)
  int64_t runs = 1;               // candidates tried (cad: one per ladder band <= tolerance, and the tightening one)
  int64_t bytes_colocated = 0;    // forward bytes of the colocated start
  int64_t bytes_incremental = 0;  // forward bytes of the result, by the planner's own count
  int64_t cost_incremental = 0;   // the same bytes priced by ScheduleOptions::topology
  double mean = 0;                // mean load at the end
  double load_max = 0;            // largest / smallest server load at the end
  double load_min = 0;
  bool balanced = false;          // every load within tolerance * mean of the mean
};

// Same as the schedule.h functions; `stats` (may be null) receives the planner's figures.
Result<Schedule> schedule_cad(const Batch& batch, const ScheduleOptions& options, CadStats* stats);
Result<Schedule> schedule_cad_symmetric(const Batch& batch, const ScheduleOptions& options,
                                        CadStats* stats);

}  // namespace distca
