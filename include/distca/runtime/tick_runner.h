// The runner: one pass of L layer steps of core attention with the model's linear work in
// between, for a forward, a backward, or both at once (a tick of a pipeline schedule,
// plan/pipeline_schedule.h). A micro-batch without pipelines is a forward-only pass and,
// later, a backward-only pass on the same dispatchers; CAD's pipeline tick runs the forwards
// of some stages and the backwards of others, each direction's attention planned as one pooled
// plan over every rank (plan/pool.h), so every rank - computing a forward, a backward, or
// nothing (it then only serves) - makes the same sequence of dispatcher calls.
// docs/runtime.md draws the schedule tick by tick.
//
// Per layer step j (forward layer j, backward layer L-1-j), each direction through its lanes
// (a lane: one dispatcher and the nano-batches whose linear work precedes its exchange):
//   forward:  per lane: finish O(j-1); linear(x, j, false) for its nano-batches; start Q/KV(j)
//   backward: per lane: finish dQ/dKV(L-j); linear(x, L-j, true) for its nano-batches;
//             start dO(L-1-j)
//   then serve the forward's lanes of layer j, then the backward's of layer L-1-j;
// after the last step, per lane: finish O(L-1), linear(x, L, false); finish dQ/dKV(0),
// linear(x, 0, true).
// Lanes. kPingPong and kSignal: forward (ping: nano 0), (pong: nano 1); backward pong FIRST,
// (pong: 1), (ping: 0): pong's dK/dV partials reach ping's rows (pong's queries read ping's
// K/V), so ping's pre-CA backward of a layer may run only after pong's exchange of that layer
// has finished. So while ping's Q/K/V travel, pong's linear work runs; pong's travel under
// ping's attention; ping's O returns under pong's attention and pong's under ping's next
// linear work. dk, dv are zeroed before pong's start and both nano-batches ADD into them
// (pong, then ping: a fixed order, so the bits do not depend on timing). kSingleStream: one
// lane per direction, the whole plan (NanoPlans::full): forward (full: 0, 1), backward (full:
// 1, 0), dk and dv overwritten: every nano-batch's linear work runs in the same order as with
// ping-pong, so the linear layers give the same bits in every mode and only attention's sums
// differ (docs/runtime.md, "Numerics"). kSignal: ping-pong with 1-byte exchanges (outputs
// invalid).
//
// LinearFn, the model's linear work of nano-batch `nano` (0 ping, 1 pong) between two
// attentions. Forward, linear(x, l, false): post-CA of layer l-1 (when l > 0) fused with
// pre-CA of layer l (when l < L); linear(x, L, false) is the last post-CA (and the model's
// head). Backward, the mirror: linear(x, l + 1, true) is the backward of pre-CA of layer l+1
// (the head's when l + 1 == L) and of post-CA of layer l; linear(x, 0, true) the backward of
// pre-CA of layer 0. Called on the runner's thread.
//
// Buffers in flight. linear(x, .) may write only nano-batch x's rows of the layer buffers;
// the other nano-batch's rows of q, k, v, o (forward) and d_o, dq (backward) and every row of
// dk, dv of a layer whose exchange is in flight belong to the runner until that exchange
// finishes. (Pong's rows of dk and dv are final once pong's exchange has finished: ping's adds
// exactly zero to them, its tasks read no pong row; ping's rows need both, and pong's exchange
// of a layer finishes before ping's linear work reads them.) Layer
// l's q, k, v, o stay valid until backward(l) is done (the dispatchers keep pointers); dk and
// dv of layers l and l - 1 must be different buffers (pong's start of layer l - 1 zeroes its
// dk, dv while ping's rows of layer l are still to be read).
//
// K/V once (kv_once, the default): the two nano-batches' dispatchers of a direction carry the
// pair's K/V wire (plan/kv_once.h): forward, ping's dispatch carries every ping row a server
// needs for either nano-batch and pong's only pong rows; stateless backward, pong's carries
// them all and ping's none. So a server receives each K/V row once per layer and direction,
// and keeps what the first received until the second has served. Off: each plan's kKv as it
// is. The bits are the same either way (docs/runtime.md, "K/V once per server").
//
// Servers. One micro-batch's runner (create) keeps its forward state on the servers unless
// `stateless` (DispatcherOptions::stateless); a tick's runner (create_tick) has stateless
// servers in both directions: a micro-batch's backward is pooled with other micro-batches than
// its forward, so the backward dispatchers first adopt the forward's outputs
// (CaDispatcher::adopt_forward; TickIo::adopt, every layer with its lse).
//
// Thread safety: a runner is used by its rank's thread only; calls are collective over comm.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/status.h"
#include "distca/core/trace.h"
#include "distca/plan/plan.h"
#include "distca/runtime/dispatcher.h"
#include "distca/runtime/pingpong.h"

namespace distca::runtime {

using LinearFn = std::function<void(int nano, int layer, bool backward)>;

// Per-layer buffers, all over the whole token buffer (the rank's rows, nano 0 then nano 1).
// `rows`: the rows every buffer of the layer holds (q, o, d_o, dq: rows * n_heads * head_dim
// floats; k, v, dk, dv: rows * n_kv_heads * head_dim; lse: rows * n_heads). The plan's rows
// of this rank (n_tokens, the same in every plan of a direction) must fit: run checks every
// layer's rows and pointers against every plan it runs before it touches a buffer, and refuses
// (invalid_argument naming the direction, the layer and both counts) a layer with fewer rows or
// a null buffer where rows are needed.
struct LayerForward {
  const float *q = nullptr, *k = nullptr, *v = nullptr;  // (rows, heads, head_dim)
  float* o = nullptr;                                    // (rows, n_heads, head_dim)
  float* lse = nullptr;  // optional: (rows, n_heads)
  int64_t rows = 0;
};
struct LayerBackward {
  const float* d_o = nullptr;                  // (rows, n_heads, head_dim)
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
  int64_t rows = 0;
};

// What one run does on this rank. A direction runs when its layers are given (L >= 1 each;
// both given: the same L). A rank without rows in a direction that the runner has gives
// rows = 0 (any pointers) and no linear work: it only serves. Whether a rank has rows is the
// plan's to say (NanoPlans::split.tokens; a scheduler that re-packs documents, wlb, can give
// rows to a rank that had none in the batch): a placeholder where the plan has rows is refused.
struct TickIo {
  std::vector<LayerForward> forward;   // forward buffers; their lse receives the forward's LSE
  LinearFn linear_forward;             // empty: none
  std::vector<LayerForward> adopt;     // create_tick's backward: the finished forward, with lse
  std::vector<LayerBackward> backward;  // gradient buffers
  LinearFn linear_backward;            // empty: none
};

// Time one rank spent in a runner's calls, split (seconds, summed over calls).
struct RunnerTimes {
  double linear = 0;  // inside LinearFn
  double waited = 0;  // blocked on exchanges (CaDispatcher::waited_seconds): exposed communication
  double attention = 0;  // the rest of its calls: packing rows, attention kernels, assembling contexts
};

class TickRunner {
 public:
  // One micro-batch: run its forward, later its backward, on the same dispatchers. `plans` and
  // `comm` must outlive the runner. Trace: dispatcher events labelled "ping" and "pong"
  // ("full" in single-stream), linear events "ping linear" / "pong linear" (" bwd" in
  // backward).
  static Result<std::unique_ptr<TickRunner>> create(comm::Communicator& comm, const NanoPlans& plans,
                                                    const AttentionDims& dims, OverlapMode mode,
                                                    TraceRecorder* trace = nullptr, bool stateless = false,
                                                    bool kv_once = true);
  // A tick: `forward` / `backward` the nano plans of the tick's pooled directions, null when no
  // stage runs that direction in this tick (the same on every rank); every run must give the
  // directions the runner has. They and comm outlive the runner. Dispatcher events labelled
  // "fwd ping" ... ("fwd" / "bwd" in single-stream).
  static Result<std::unique_ptr<TickRunner>> create_tick(comm::Communicator& comm, const NanoPlans* forward,
                                                         const NanoPlans* backward, const AttentionDims& dims,
                                                         OverlapMode mode, TraceRecorder* trace = nullptr,
                                                         bool kv_once = true);

  // The pass above over the given directions. Collective. invalid_argument (nothing run,
  // nothing written; the caller fails the group) when a buffer does not fit the plan (see
  // LayerForward).
  Status run(const TickIo& io);
  // run with the forward only: layers 0..L-1, ending with linear(., L, false).
  Status forward(const std::vector<LayerForward>& layers, const LinearFn& linear);
  // run with the backward only (after forward of the same layers on a create runner), starting
  // with linear(., L, true) and ending with linear(., 0, true). dk, dv are overwritten with the
  // sum over both nano-batches (single-stream: over the whole plan).
  Status backward(const std::vector<LayerBackward>& layers, const LinearFn& linear);

  bool outputs_valid() const { return mode_ != OverlapMode::kSignal; }
  OverlapMode mode() const { return mode_; }
  // This runner's time split so far.
  RunnerTimes times() const;
  // Bytes this rank sent in the last forward and backward of each layer, summed over the
  // dispatchers (payload; signal mode counts its bytes).
  int64_t last_bytes_sent() const;

 private:
  // A dispatcher and the nano-batches whose linear work runs before its start, in order.
  struct Lane {
    CaDispatcher* disp = nullptr;
    std::vector<int> nanos;
  };
  TickRunner() = default;
  // OK when every layer of `io` fits every plan of its direction (see LayerForward).
  Status check_buffers(const TickIo& io) const;
  Status add_direction(comm::Communicator& comm, const NanoPlans& plans, const AttentionDims& dims, int direction,
                       const DispatcherOptions& options, const char* prefix);
  Status forward_step(const TickIo& io, int j);
  Status backward_step(const TickIo& io, int j);
  Status finish_forward(const TickIo& io, int L);
  Status finish_backward(const TickIo& io);
  void linear(const LinearFn& fn, int nano, int layer, bool backward);

  comm::Communicator* comm_ = nullptr;
  bool kv_once_ = true;
  OverlapMode mode_ = OverlapMode::kPingPong;
  TraceRecorder* trace_ = nullptr;
  bool adopts_ = false;  // create_tick: the backward adopts the forward's outputs
  std::vector<std::unique_ptr<CaDispatcher>> owned_;
  std::array<std::vector<Lane>, 2> lanes_;  // [forward, backward], in start order
  double linear_s_ = 0, total_s_ = 0;
};

}  // namespace distca::runtime
