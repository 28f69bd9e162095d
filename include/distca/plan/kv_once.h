// K/V sent once per layer per server across the two nano-batches of a ping-pong step
// (docs/runtime.md, "K/V once per server").
//
// Ping's and pong's plans each lay out the K/V a server needs for their own tasks, so a
// server holding both halves of a cut task would receive the document's ping rows twice: pong's
// contexts [0, E) start at 0. The K/V WIRE of a nano-batch pair is what each nano-batch's
// dispatch carries instead. It is the whole micro-batch's kKv exchange (NanoPlans::full: per
// (document, server) the rows [0, E_all) held by other ranks, E_all the largest q_end of the
// document's tasks there in either nano-batch), split between the two dispatches:
//   forward   ping carries the full layout's rows before the document's cut (ping rows, whose
//             K/V exist at ping's dispatch), pong the rows from the cut on (computed by
//             pong's linear work after ping's dispatch);
//   backward  (stateless servers resend K/V) pong, which runs first, carries the full
//             layout; ping carries nothing.
// A server keeps the rows the first dispatch of a direction received (the GIVER: ping
// forward, pong backward) until the other nano-batch (the TAKER) has read the rows it needs
// from them. Both dispatchers then hold their kKv receive buffers as their plans lay them out,
// so the kernels, the dK/dV partials (which go back per nano-batch, as the plans say) and every
// number are those without the wire. Blocks keep the full layout's order; a block lies
// inside one piece and pieces end at the cuts (NanoSplit::batch), so a block is wholly before or
// from the cut.
//
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "distca/plan/doc_index.h"
#include "distca/plan/nano_plan.h"
#include "distca/plan/plan.h"
#include "distca/plan/traffic.h"

namespace distca {

// [nano][rank]: the kKv exchange each nano-batch's dispatch carries (rows; row_bytes of the
// plans'), forward or backward. Precondition: plans from plan_nano_batches.
std::array<std::vector<Exchange>, 2> nano_kv_wire(const NanoPlans& plans, bool backward);

// The nano-batch that gives (keeps its received rows for the other): ping forward, pong
// backward.
inline int kv_wire_giver(bool backward) { return backward ? 1 : 0; }

// The forward wire's K/V bytes per rank and nano-batch, counted from task lists (the
// simulator's form, no plan built): the same figures as nano_kv_wire(plans, false)'s rows
// times rb.kv. `index` is over split.batch; `full` the single-stream task list (every task cut
// at its document's cut). The backward wire's are pong: the sum of both, ping: zero.
struct KvWireBytes {
  std::array<std::vector<int64_t>, 2> sent, recv;  // [nano][rank]
  std::array<int64_t, 2> total{0, 0};              // [nano] over all ranks
  // [nano] the (holder, server) rank pairs that move bytes, sorted, each once.
  std::array<std::vector<std::pair<int64_t, int64_t>>, 2> pairs;
  // [nano] the messages: (holder, server, bytes) per (server, document, held run) moving bytes.
  std::array<std::vector<ContextMessage>, 2> messages;
};
KvWireBytes kv_wire_bytes(const DocumentIndex& index, const std::vector<TaskPlacement>& full, const NanoSplit& split,
                          const RowBytes& rb);

}  // namespace distca
