// One tick of CAD's pipelined schedule (plan/pipeline_schedule.h, one_f_one_b_ticks): the
// forwards of some stages' micro-batches and the backwards of others', each direction's core
// attention planned as ONE pooled plan over every rank (plan/pool.h), run in one pass whose
// layer steps interleave the two directions, so that every rank - computing a forward, a
// backward, or nothing (it then only serves) - makes the same sequence of dispatcher calls.
//
// Per layer step j (L steps; forward layer j, backward layer L-1-j), each direction as below
// for a single stream (with ping-pong, per nano-batch in turn):
//   forward ranks:  wait O(j-1); linear(., j, false); dispatch Q/KV(j)
//   backward ranks: wait dQ/dKV(L-j); linear(., L-j, true); dispatch dO|Q|O|LSE and K|V(L-1-j)
//   every rank:     serve the forward tasks of layer j, then the backward tasks of L-1-j
// then the last forward linear(., L, false) after O(L-1) and the last backward linear(., 0,
// true) after dQ/dKV(0). Inside each direction the nano-batches ping-pong as in
// PingPongRunner (OverlapMode::kPingPong; pingpong.h draws the schedule): forward ping then
// pong, backward pong then ping, each nano-batch's exchange running under the other's linear
// work and attention, dK/dV zeroed before pong's backward start and summed pong then ping.
// kSingleStream runs each direction's whole plan as one exchange (linear(0, .) and
// linear(1, .) around it, in PingPongRunner's single-stream order: the model's weight
// gradients accumulate as in every other mode); kSignal is kPingPong with 1-byte exchanges.
//
// Servers are stateless in both directions: a micro-batch's backward is pooled with other
// micro-batches than its forward, so the backward dispatcher first adopts the forward's
// outputs (CaDispatcher::adopt_forward; the LayerForward of every layer with its lse).
//
// Buffers: as PingPongRunner's (pingpong.h): fw[l] / bw[l] are this rank's layer buffers
// (any valid pointers on a rank without rows); q, k, v, o and lse of the adopted forward stay
// valid until run returns. Collective over `comm`. Thread safety: the rank's thread only.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/status.h"
#include "distca/core/trace.h"
#include "distca/plan/plan.h"
#include "distca/runtime/dispatcher.h"
#include "distca/runtime/pingpong.h"

namespace distca::runtime {

class TickRunner {
 public:
  // forward / backward: the nano plans of the tick's pooled directions (plan_nano_batches),
  // null when no stage runs that direction in this tick (the same on every rank). They and
  // comm outlive the runner.
  static Result<std::unique_ptr<TickRunner>> create(comm::Communicator& comm, const NanoPlans* forward,
                                                    const NanoPlans* backward, const AttentionDims& dims,
                                                    OverlapMode mode, TraceRecorder* trace);

  // L = fw.size() = bw.size() = adopt.size() layer steps. fw: the forward buffers (their lse
  // receives the forward's LSE); adopt: the finished forward of the micro-batch whose
  // backward runs here (with lse); bw: its gradient buffers. linear_f / linear_b: this rank's
  // linear work of each direction (empty: none).
  Status run(const std::vector<LayerForward>& fw, const LinearFn& linear_f, const std::vector<LayerForward>& adopt,
             const std::vector<LayerBackward>& bw, const LinearFn& linear_b);

  RunnerTimes times() const;
  int64_t last_bytes_sent() const;

 private:
  TickRunner() = default;
  void linear(const LinearFn& fn, int nano, int layer, bool backward, const char* name);
  comm::Communicator* comm_ = nullptr;
  TraceRecorder* trace_ = nullptr;
  OverlapMode mode_ = OverlapMode::kPingPong;
  // [direction][nano]: forward ping, pong; backward ping, pong. Single-stream: [d][0] only.
  std::array<std::array<std::unique_ptr<CaDispatcher>, 2>, 2> disp_;
  double linear_s_ = 0, total_s_ = 0;
};

}  // namespace distca::runtime
