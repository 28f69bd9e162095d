// A timeline of one training step's attention layers under ping-pong, from the nano-batch
// plans, the cost model and the measured link: what `--tolerance auto` predicts when the
// model knows the linear work (docs/scheduler.md, "Choosing the tolerance"; the runner's
// order is docs/runtime.md, "Ping-pong").
//
// Why a timeline and not max(compute, bytes / rate): a nano-batch's exchange hides only
// behind the compute its ranks run between posting it and waiting for it, which the runner's
// tick order fixes. E.g. pong's dispatch hides behind the receiver's ping attention alone, so
// work moved in pong on a slow link is exposed even when the rank's whole compute exceeds
// its bytes' transfer.
//
// The model (per rank r, nano-batch x in {ping, pong}, L layers):
//   linear(x)  = rows of x on r times the linear seconds per row (forward or backward);
//   attend(x)  = the forward (or backward) seconds of r's server tasks of nano plan x: the
//                cost model's forward+backward seconds times (1 - backward_share) (or
//                backward_share);
//   exchange E posted by every rank: every pair (s, p) of ranks exchanges one message (empty
//                or not, as the runtime does), carried by s's outgoing and p's incoming
//                direction of their link class (between hosts, or inside a host when the plan
//                has hosts; between hosts the directions are the HOST's, shared by its ranks as
//                one NIC is, inside a host each rank's), one message at a time per direction in
//                the order posted. It starts
//                at max(post_s, post_p, both directions free) (rendezvous: MPI moves a large
//                message once the receive is posted) and ends model.message_seconds + its bytes
//                / the class's rate later, holding the directions for its bytes only (an
//                empty message holds neither; plan/link_model.h, shared with the simulator); E completes on a rank when every message it sends
//                or receives has. So an exchange waits for its slowest peer, and an exchange
//                posted while another is on the link queues behind it. Bytes are the plan's
//                exchanges with K/V relays applied (plan/topology_relay.h: a block a host's
//                servers need crosses once, to the relay, and goes on from it inside the host
//                within the same dispatch), the dispatch being q + K/V:
//                with model.kv_once the nano-batch's part of the pair's K/V wire
//                (plan/kv_once.h: ping carries every ping row a server needs for either
//                nano-batch, pong only pong rows), else its own plan's kKv; the forward return
//                o_lse, the backward dispatch do and return dq + dkv (servers keep their
//                forward state). The signal step moves no bytes and keeps the messages.
// Forward, layer l = 0 .. L-1, each rank in order: [l > 0: wait ping O(l-1)] linear(ping);
// post ping dispatch; [l > 0: wait pong O(l-1)] linear(pong); post pong dispatch; wait ping's;
// attend(ping); post ping O; wait pong's; attend(pong); post pong O. Then wait ping O,
// linear(ping), wait pong O, linear(pong). Backward, l = L-1 .. 0, pong first: [l < L-1: wait
// pong dQ/dKV(l+1)] linear(pong); post pong dO; [wait ping dQ/dKV(l+1)] linear(ping); post ping
// dO; wait pong dO; attend(pong); post pong dQ/dKV; wait ping dO; attend(ping); post ping
// dQ/dKV. Then wait pong's, linear(pong), wait ping's, linear(ping). Every rank starts the
// forward at 0 and the backward where its forward ended.
//
// Determinism: pure function. Thread safety: pure (the cost model's task_cost is const).
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "distca/plan/auto_tolerance.h"
#include "distca/plan/link_model.h"
#include "distca/plan/nano_plan.h"

namespace distca {

struct PingPongPrediction {
  double seconds = 0;         // the step's end: max over ranks
  double signal_seconds = 0;  // the same timeline with every transfer free (signal mode)
  double exposed() const { return seconds - signal_seconds; }
};

// The four exchanges of nano-batch x (0 ping, 1 pong) the timeline posts, as messages by rank
// for the link model (plan/link_model.h): [0] the dispatch (q + K/V, the wire's part with
// kv_once, relayed by the plan's hosts), [1] the forward return (o_lse), [2] the backward
// dispatch (do), [3] the backward return (dq + dkv). Precondition: x < 2.
std::array<std::vector<PairMessage>, 4> pingpong_exchanges(const NanoPlans& plans, bool kv_once, size_t x);

// Preconditions: model.validate() and model.pingpong() hold, layers >= 1; plans from
// plan_nano_batches.
PingPongPrediction predict_pingpong(const NanoPlans& plans, const AutoToleranceModel& model, int64_t layers);

}  // namespace distca
