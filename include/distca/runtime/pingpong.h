// Ping-pong execution: a micro-batch split into two nano-batches of (about) equal attention
// work whose exchanges overlap each other's compute (the runner, runtime/tick_runner.h, runs
// them; docs/runtime.md draws the schedule as ticks).
//
// Nano-batches (plan/nano_split.h, docs/runtime.md "Nano-batch split"). Every document is cut
// at a cut c (split_nano_batches: near L / sqrt(2) on the query-tile grid, so both halves hold
// about equal causal pairs; documents under two tiles go whole to one side): rows [0, c) are
// nano-batch 0 ("ping"), rows [c, L) nano-batch 1 ("pong"). The plans' batch is
// NanoSplit::batch: on every rank ping's rows come first, local rows [0, t0), then pong's,
// [t0, t0 + t1) (t = NanoSplit::tokens[rank]), so each nano-batch's linear work runs on one
// contiguous row range. Ping is self-contained: its contexts [0, q_end <= c) are ping rows.
// Pong's queries need ping's K/V too, which exist by then (ping's pre-CA runs first in every
// layer), so pong's plan simply reads them from the shared token buffer: the two plans share
// one token buffer (the whole micro-batch, Plan::batch) and each covers only its own query
// rows. The alternative (nano-batches of whole documents) cannot balance a rank that holds one
// long document, which is exactly the skewed case CAD is for.
//
// Planning: plan_nano_batches (plan/nano_plan.h), the function the simulator replays too.
// Because pong's contexts include ping rows, ping rows get dK/dV partials from both
// nano-batches: the runner sums them in a fixed order (pong, then ping) into zeroed buffers.
//
// Modes (OverlapMode): pingpong overlaps; single-stream is the no-overlap baseline: the whole
// micro-batch's plan (NanoPlans::full, balanced as a whole like the two halves together) as one
// exchange and one fused call per layer, each exchange waited for at once; signal is pingpong
// with 1-byte exchanges (outputs invalid). Single-stream's O and LSE are bitwise pingpong's
// (both are the whole-document call's); its dQ, dK, dV sum the same partials in another
// association (within rounding, docs/runtime.md "Numerics"). Running the two halves one after
// the other instead would also expose each half's own imbalance (the plan balances the step,
// not each half), which is not what overlap is measured against.
//
// Thread safety: pure functions on values; gather_trace is collective.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/trace.h"
#include "distca/core/status.h"
#include "distca/plan/nano_plan.h"
#include "distca/plan/plan.h"
#include "distca/runtime/dispatcher.h"
#include "distca/runtime/overlap_mode.h"

namespace distca::runtime {

// Gathers every rank's events to rank 0 (collective); `out` gets them on rank 0 only.
Status gather_trace(comm::Communicator& comm, const std::vector<TraceEvent>& mine,
                    std::vector<TraceEvent>* out);

}  // namespace distca::runtime
