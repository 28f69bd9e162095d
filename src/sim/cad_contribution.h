// CAD's per-(stage, micro-batch) bookkeeping (src/sim/cad.cpp runs it): what one op's plan
// puts on the cluster in one layer (bytes, message pairs, attention served, buffers held),
// filled from a plan's task list by traffic.h's byte rules, and freed field by field once no
// later tick reads it (contrib_ holds pp x microbatches of them for the whole run). Internal
// to the simulator; docs/simulation-model.md, "CAD" and "Communication".
// Thread safety: plain values and free functions on them.
#pragma once

#include <cstdint>
#include <vector>

#include "distca/plan/doc_index.h"
#include "distca/plan/kv_once.h"
#include "distca/plan/link_model.h"
#include "distca/plan/pool.h"
#include "distca/plan/schedule.h"
#include "engine.h"
#include "network.h"

namespace distca::sim::detail {

// One (stage, micro-batch) op's share of one layer, per nano-batch x (0 ping, 1 pong), per
// unit ([units] each). Bytes are what the unit sends / receives in that exchange.
struct Contribution {
  using Vec = std::vector<double>;
  Vec tokens[2];              // home rows of nano-batch x (units of the stage)
  Vec attention_seconds[2];   // forward + backward seconds served (servers)
  Vec attention_pairs[2];     // causal pairs served (servers)
  Vec fwd_dispatch_sent[2], fwd_dispatch_recv[2];  // forward dispatch (Q, K/V)
  Vec fwd_return_sent[2], fwd_return_recv[2];      // forward return (O + LSE)
  Vec bwd_dispatch_sent[2], bwd_dispatch_recv[2];  // backward dispatch (dO)
  Vec bwd_return_sent[2], bwd_return_recv[2];      // backward return (dQ, dK/dV)
  Vec kept_bytes;  // per layer: server inputs + outputs kept for the backward
  Vec kept_kv;     // per layer: the K/V context rows among them
  // Per layer, both nano-batches: what a server holds for the layer in flight beyond what it
  // keeps (forward: inputs and outputs of stateless servers; backward: dO (with the inputs
  // again when stateless) and the dQ, dK/dV partials it sends back), and the K/V part of it.
  Vec fwd_transient, fwd_transient_kv, bwd_transient, bwd_transient_kv;
  // The messages of the four exchanges by unit (plan/link_model.h: entries of one pair add up),
  // per nano-batch; their sums per unit are the *_sent / *_recv figures above.
  using Messages = std::vector<PairMessage>;
  Messages fwd_dispatch_msgs[2], fwd_return_msgs[2], bwd_dispatch_msgs[2], bwd_return_msgs[2];

  // Every field zero (no messages) over `units` units.
  void init(size_t units);
  // Frees the forward-only fields (forward exchanges, pairs, transients, attention pairs)
  // once the op's forward tick ran; the backward's stay.
  void release_forward();
  // Frees everything but tokens, kept_bytes and kept_kv (what the PP transfers and the memory
  // account read afterwards): once no later tick runs this contribution's layers (after its
  // backward tick; with pp > 1 after its forward tick, its backward being planned anew).
  void release_exchanges();
};

// Fills nano-batch x of `c` (an op on the stage whose task list is `list`, planned on
// `pooled`, `index` its split batch): attention served, the bytes and messages of every
// exchange per unit, and the buffers servers keep or hold. fresh_backward: a backward planned
// anew (its servers did not run the forward: pipelines), so the inputs travel again with dO.
// Plan figures go to `ps`: a forward plan counts its forward bytes and (pp = 1, where the
// backward reuses its servers) its backward's; a fresh backward plan counts its backward
// bytes with the inputs resent. `wire` (ping-pong; null: single-stream) is the K/V wire of
// the stage's nano-batch pair (plan/kv_once.h), its messages relayed (plan/topology_relay.h
// relay_context, by the stage's full task list): K/V travels by it instead of by `list`'s own
// contexts (forward: ping's rows before the cut, pong's after; resent in backward: all with
// pong); dK/dV go back per nano-batch, as `list` says. Precondition: c.init(R.units) ran.
void fill_nano_contribution(const Rates& R, const PooledBatch& pooled, const DocumentIndex& index,
                            const std::vector<TaskPlacement>& list, int x, bool fresh_backward, Contribution& c,
                            PlanStats& ps, const KvWireBytes* wire = nullptr);

// [pooled rank] the host of each pooled rank (Rates::unit_hosts by pooled.unit_of); empty
// without a topology.
std::vector<int64_t> pooled_hosts(const Rates& R, const PooledBatch& pooled);

// The K/V wire of a stage's nano-batch pair (plan/kv_once.h kv_wire_bytes of its whole task
// list `full` over `index`, split by `split`), its messages relayed inside hosts as the
// runtime relays them (plan/topology_relay.h relay_context, the relays chosen by `full`).
KvWireBytes relayed_kv_wire(const Rates& R, const PooledBatch& pooled, const DocumentIndex& index,
                            const std::vector<TaskPlacement>& full, const NanoSplit& split);

// The buffers of the layer step in flight in one tick (its forward ops' `fwd` and its
// backward ops' `bwd`, both at once), per unit: transient / transient_kv ([units]) become
// the max of themselves and this tick's.
void note_transients(const std::vector<Contribution*>& fwd, const std::vector<Contribution*>& bwd,
                     std::vector<double>& transient, std::vector<double>& transient_kv);

}  // namespace distca::sim::detail
