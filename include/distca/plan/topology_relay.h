// K/V relays: with a multi-host topology (Plan::hosts), a K/V row that several servers of one
// host need from a rank of another host crosses between the hosts once (docs/scheduler.md,
// "Topology-aware placement"; docs/runtime.md, "K/V relays").
//
// For every (document, host) the relay is the server of that host with the largest context
// end of the document (the largest q_end of its tasks there; ties: the lowest rank): its kKv
// receive layout already holds every row of the document that the host's servers need from
// other hosts. Every other server of the host gets those rows from the relay instead of from
// their holders, in a second exchange inside the host, into the same rows of its kKv receive
// buffer. The plan's exchanges stay what plan.h says (the rows each server needs from each
// holder); only the link they travel changes, so the runtime's inputs, and its numbers, are
// those of the plan without relays. Backward (dK/dV) travels as the plan says.
//
// Thread safety: pure functions of the plan.
#pragma once

#include <cstdint>
#include <vector>

#include "distca/plan/plan.h"

namespace distca {

// Rows [server_row, server_row + rows) of `server`'s kKv receive buffer, from `holder` on
// another host, which arrive from `relay` (a server of server's host, not server itself): its
// rows [relay_row, relay_row + rows) of its own kKv receive buffer.
struct RelayedBlock {
  int64_t holder = 0;
  int64_t server = 0;
  int64_t relay = 0;
  int64_t server_row = 0;
  int64_t relay_row = 0;
  int64_t rows = 0;
  bool operator==(const RelayedBlock&) const = default;
};

// The relayed blocks of `plan` under `hosts` ([ranks] host ids), ordered by (relay, server,
// server_row): the order of the second exchange's rows between one relay and one server. Empty
// when hosts is empty or names one host. Precondition: the plan's layouts are consistent
// (build_plan's).
std::vector<RelayedBlock> kv_relay(const Plan& plan, const std::vector<int64_t>& hosts);

// The same for another K/V layout than the plan's kKv: `kv` ([ranks]) is every rank's kKv
// exchange as it travels (the K/V wire of a nano-batch pair, plan/kv_once.h), `plan` gives the
// servers' tasks (the relay of a (document, host) is chosen by their context ends). Every
// server's block of a holder's piece must start where the relay's does and end no later than
// it (contexts [0, E) clipped to the pieces, as the plan's kKv and the wire lay them out).
std::vector<RelayedBlock> kv_relay(const Plan& plan, const std::vector<const Exchange*>& kv,
                                   const std::vector<int64_t>& hosts);

// The same relays on K/V messages by rank (traffic.h ContextMessage: compute_traffic's or the
// wire's, kv_once.h): a message from a holder on another host to a server that is not its
// (document, host)'s relay comes from the relay instead, inside the host (the bytes the relay
// forwards are the server's, as kv_relay's blocks say). `tasks` choose the relays as the
// plan's servers' tasks do in kv_relay (the nano plan's, or the full plan's for the wire).
// Unchanged when hosts is empty or names one host. Precondition: ranks < hosts.size().
void relay_context(const std::vector<TaskPlacement>& tasks, const std::vector<int64_t>& hosts,
                   std::vector<ContextMessage>& messages);

}  // namespace distca
