// Ping-pong execution: a micro-batch split into two nano-batches of (about) equal attention
// work whose exchanges overlap each other's compute (docs/runtime.md draws the schedule as ticks).
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
// Planning: the scheduler runs ONCE on the split batch; every task [a, b) is cut at its
// document's c into a ping task [a, min(b, c)) and a pong task [max(a, c), b) on the same
// server and home (a no-op except for wlb, whose re-packed batch is split again: the cuts of
// cut documents depend only on their length); build_plan turns each task list into a plan.
// (Balance is the scheduler's over the whole step; each half inherits it approximately.)
// Because pong's contexts include ping rows, ping rows get dK/dV partials from both
// nano-batches: the runner sums them in a fixed order (ping, then pong) into zeroed buffers.
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
// Thread safety: a runner is used by its rank's thread only; calls are collective.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/trace.h"
#include "distca/core/status.h"
#include "distca/plan/nano_split.h"
#include "distca/plan/plan.h"
#include "distca/runtime/dispatcher.h"

namespace distca::runtime {

enum class OverlapMode { kPingPong, kSingleStream, kSignal };
// "pingpong" | "single-stream" | "signal"; the message names --mode.
Result<OverlapMode> parse_overlap_mode(const std::string& text);
const char* overlap_mode_name(OverlapMode mode);

struct NanoPlans {
  NanoSplit split;              // the split; every plan's batch is split.batch
  Plan full;                    // the whole micro-batch's plan (both task lists together)
  std::array<Plan, 2> nano;     // ping, pong (same batch and token buffers as full)
};

// Splits the batch (split_nano_batches(batch, options.align_rows)), runs the scheduler once on
// the split batch, builds the full plan and the two nano plans. Deterministic.
Result<NanoPlans> plan_nano_batches(const Batch& batch, const SchedulerSpec& spec,
                                    const ScheduleOptions& options);

// Linear work of nano-batch `nano` (0 ping, 1 pong) between two attentions: in forward the
// fused post-CA of layer l-1 and pre-CA of layer l (layer == n_layers: the last post-CA); in
// backward the mirror image. Called on the runner's thread.
using LinearFn = std::function<void(int nano, int layer, bool backward)>;

// Per-layer buffers, all (n_tokens, heads, head_dim) over the whole token buffer.
struct LayerForward {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  float* o = nullptr;
  float* lse = nullptr;  // optional: (n_tokens, n_heads)
};
struct LayerBackward {
  const float* d_o = nullptr;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

class PingPongRunner {
 public:
  // `plans` and `comm` must outlive the runner. Trace: dispatcher events labelled "ping" and
  // "pong", linear events "ping linear" / "pong linear". `stateless`: the dispatchers' servers
  // keep nothing between forward and backward (DispatcherOptions::stateless).
  static Result<std::unique_ptr<PingPongRunner>> create(comm::Communicator& comm, const NanoPlans& plans,
                                                        const AttentionDims& dims, OverlapMode mode,
                                                        TraceRecorder* trace = nullptr,
                                                        bool stateless = false);

  // Forward of layers 0..L-1 (L = layers.size()), with linear(nano, l, false) before each
  // layer's dispatch and linear(nano, L, false) at the end. Collective.
  Status forward(const std::vector<LayerForward>& layers, const LinearFn& linear);
  // Backward of layers L-1..0 (after forward of the same layers): linear(nano, l + 1, true)
  // before layer l's dispatch, linear(nano, 0, true) at the end. dk, dv are overwritten with
  // the sum over both nano-batches (single-stream: over the whole plan). Collective.
  Status backward(const std::vector<LayerBackward>& layers, const LinearFn& linear);

  bool outputs_valid() const { return mode_ != OverlapMode::kSignal; }
  OverlapMode mode() const { return mode_; }
  int64_t n_tokens() const { return (full_ ? full_ : disp_[0])->n_tokens(); }

 private:
  PingPongRunner() = default;
  void linear(const LinearFn& fn, int nano, int layer, bool backward) const;
  comm::Communicator* comm_ = nullptr;
  OverlapMode mode_ = OverlapMode::kPingPong;
  TraceRecorder* trace_ = nullptr;
  std::array<std::unique_ptr<CaDispatcher>, 2> disp_;  // ping, pong (pingpong and signal)
  std::unique_ptr<CaDispatcher> full_;                // the whole plan (single-stream)
};

// Gathers every rank's events to rank 0 (collective); `out` gets them on rank 0 only.
Status gather_trace(comm::Communicator& comm, const std::vector<TraceEvent>& mine,
                    std::vector<TraceEvent>* out);

}  // namespace distca::runtime
