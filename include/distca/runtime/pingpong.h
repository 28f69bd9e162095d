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
// Planning: plan_nano_batches (plan/nano_plan.h), the function the simulator replays too.
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
#include "distca/plan/nano_plan.h"
#include "distca/plan/plan.h"
#include "distca/runtime/overlap_mode.h"
#include "distca/runtime/dispatcher.h"

namespace distca::runtime {


// Linear work of nano-batch `nano` (0 ping, 1 pong) between two attentions. Forward,
// linear(x, l, false): post-CA of layer l-1 (when l > 0) fused with pre-CA of layer l (when
// l < L); linear(x, L, false) is the last post-CA (and the model's head). Backward, the mirror:
// linear(x, l + 1, true) is the backward of pre-CA of layer l+1 (the head's when l + 1 == L)
// and of post-CA of layer l; linear(x, 0, true) the backward of pre-CA of layer 0. Called on
// the runner's thread.
using LinearFn = std::function<void(int nano, int layer, bool backward)>;

// Per-layer buffers, all over the whole token buffer (the rank's rows, nano 0 then nano 1).
struct LayerForward {
  const float *q = nullptr, *k = nullptr, *v = nullptr;  // (n_tokens, heads, head_dim)
  float* o = nullptr;                                    // (n_tokens, n_heads, head_dim)
  float* lse = nullptr;  // optional: (n_tokens, n_heads)
};
struct LayerBackward {
  const float* d_o = nullptr;                  // (n_tokens, n_heads, head_dim)
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

// Time one rank spent in a runner's calls, split (seconds, summed over calls).
struct RunnerTimes {
  double linear = 0;  // inside LinearFn
  double waited = 0;  // blocked on exchanges (CaDispatcher::waited_seconds): exposed communication
  double attention = 0;  // the rest of its calls: packing rows, attention kernels, assembling contexts
};

// The schedule (docs/runtime.md, "Ping-pong", draws it tick by tick). Contract with the caller:
//
//   Forward, pingpong and signal, per layer l:  linear(0, l); start ping(l); linear(1, l);
//   start pong(l); serve ping(l); serve pong(l); then finish ping(l) before linear(0, l + 1)
//   and finish pong(l) before linear(1, l + 1). So while ping's Q/K/V travel, pong's linear
//   work runs; pong's travel under ping's attention; ping's O returns under pong's attention
//   and pong's under ping's next linear work. Backward mirrors it with pong FIRST: pong's dK/dV
//   partials reach ping's rows (pong's queries read ping's K/V), so ping's pre-CA backward of a
//   layer may run only after pong's exchange of that layer has finished; linear(1, l + 1, true)
//   then start pong(l); linear(0, l + 1, true); start ping(l); serve pong(l); serve ping(l).
//   dk, dv are zeroed before pong's start and both nano-batches ADD into them (pong, then
//   ping: a fixed order, so the bits do not depend on timing).
//
//   Buffers in flight. linear(x, .) may write only nano-batch x's rows of the layer buffers;
//   the other nano-batch's rows of q, k, v, o (forward) and d_o, dq (backward) and every row of
//   dk, dv of a layer whose exchange is in flight belong to the runner until that exchange
//   finishes. Layer l's q, k, v, o stay valid until backward(l) is done (the dispatchers keep
//   pointers); dk and dv of layers l and l - 1 must be different buffers (pong's start of
//   layer l - 1 zeroes its dk, dv while ping's rows of layer l are still to be read).
//
//   Single-stream runs linear(0, l), linear(1, l), then the whole plan's exchange of layer l,
//   waited for at once (backward: linear(1, .) before linear(0, .), as pingpong): every
//   nano-batch's linear work runs in the same order as pingpong, so the linear layers give the
//   same bits in every mode and only attention's sums may differ (docs/runtime.md, "Numerics").
class PingPongRunner {
 public:
  // `plans` and `comm` must outlive the runner. Trace: dispatcher events labelled "ping" and
  // "pong", linear events "ping linear" / "pong linear" (" bwd" in backward). `stateless`: the
  // dispatchers' servers keep nothing between forward and backward (DispatcherOptions::stateless).
  static Result<std::unique_ptr<PingPongRunner>> create(comm::Communicator& comm, const NanoPlans& plans,
                                                        const AttentionDims& dims, OverlapMode mode,
                                                        TraceRecorder* trace = nullptr,
                                                        bool stateless = false);

  // Forward of layers 0..L-1 (L = layers.size()) in the schedule above, ending with
  // linear(., L, false). Collective.
  Status forward(const std::vector<LayerForward>& layers, const LinearFn& linear);
  // Backward of layers L-1..0 (after forward of the same layers), starting with
  // linear(., L, true) and ending with linear(., 0, true). dk, dv are overwritten with the sum
  // over both nano-batches (single-stream: over the whole plan). Collective.
  Status backward(const std::vector<LayerBackward>& layers, const LinearFn& linear);

  bool outputs_valid() const { return mode_ != OverlapMode::kSignal; }
  OverlapMode mode() const { return mode_; }
  int64_t n_tokens() const { return (full_ ? full_ : disp_[0])->n_tokens(); }
  // This runner's time split so far.
  RunnerTimes times() const;
  // Bytes this rank sent in the last forward / backward of each layer, summed over the
  // dispatchers (payload; signal mode counts its bytes).
  int64_t last_bytes_sent() const;

 private:
  PingPongRunner() = default;
  void linear(const LinearFn& fn, int nano, int layer, bool backward);
  comm::Communicator* comm_ = nullptr;
  OverlapMode mode_ = OverlapMode::kPingPong;
  TraceRecorder* trace_ = nullptr;
  std::array<std::unique_ptr<CaDispatcher>, 2> disp_;  // ping, pong (pingpong and signal)
  std::unique_ptr<CaDispatcher> full_;                // the whole plan (single-stream)
  double linear_s_ = 0, total_s_ = 0;
};

// Gathers every rank's events to rank 0 (collective); `out` gets them on rank 0 only.
Status gather_trace(comm::Communicator& comm, const std::vector<TraceEvent>& mine,
                    std::vector<TraceEvent>* out);

}  // namespace distca::runtime
