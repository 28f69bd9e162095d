// K/V relays (plan/topology_relay.h).
#include "distca/plan/topology_relay.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "distca/core/check.h"

namespace distca {

namespace {

// (document, host) -> (largest context end, lowest rank with it): the relay of the document on
// the host. Fed every server's tasks in rank order, the first of equal ends is kept.
using Relays = std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>>;
void consider(Relays& relay, int64_t doc, int64_t host, int64_t q_end, int64_t server) {
  auto [it, fresh] = relay.emplace(std::make_pair(doc, host), std::make_pair(q_end, server));
  if (!fresh && q_end > it->second.first) it->second = {q_end, server};
}

// No relays: no topology, or every rank on one host.
bool one_host(const std::vector<int64_t>& hosts) {
  return hosts.empty() || std::all_of(hosts.begin(), hosts.end(), [&](int64_t h) { return h == hosts.front(); });
}

}  // namespace

std::vector<RelayedBlock> kv_relay(const Plan& plan, const std::vector<int64_t>& hosts) {
  std::vector<const Exchange*> kv;
  for (const RankPlan& r : plan.ranks) kv.push_back(&r.exchange(ExchangeKind::kKv));
  return kv_relay(plan, kv, hosts);
}

std::vector<RelayedBlock> kv_relay(const Plan& plan, const std::vector<const Exchange*>& kv_of,
                                   const std::vector<int64_t>& hosts) {
  std::vector<RelayedBlock> out;
  if (one_host(hosts)) return out;
  const auto host = [&](int64_t r) { return hosts[static_cast<size_t>(r)]; };
  Relays relay;
  for (size_t r = 0; r < plan.servers.size(); ++r) {
    const auto server = static_cast<int64_t>(r);
    for (const ServerTask& st : plan.servers[r].tasks) consider(relay, st.task.doc, host(server), st.task.q_end, server);
  }
  // Where each off-host block starts in its server's kKv receive buffer: (server, holder,
  // document, first row) -> row. A server's block of a holder's piece starts where the relay's
  // block of that piece does (both are the piece clipped to a context [0, E)).
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::pair<int64_t, int64_t>> at;
  for (size_t s = 0; s < kv_of.size(); ++s) {
    const Exchange& kv = *kv_of[s];
    for (const auto& [h, blocks] : kv.recv_blocks.entries()) {
      if (host(static_cast<int64_t>(h)) == host(static_cast<int64_t>(s))) continue;
      int64_t w = kv.recv_displs[h];
      for (const RowBlock& b : blocks) {
        at.emplace(std::make_tuple(static_cast<int64_t>(s), static_cast<int64_t>(h), b.doc, b.begin),
                   std::make_pair(w, b.end));
        w += b.rows();
      }
    }
  }
  for (const auto& [key, where] : at) {
    const auto [s, h, doc, begin] = key;
    const int64_t r = relay.at({doc, host(s)}).second;
    if (r == s) continue;
    const auto& from = at.find({r, h, doc, begin});
    DISTCA_CHECK_MSG(from != at.end() && from->second.second >= where.second, "kv_relay: the relay lacks a block");
    out.push_back({h, s, r, where.first, from->second.first, where.second - begin});
  }
  std::sort(out.begin(), out.end(), [](const RelayedBlock& a, const RelayedBlock& b) {
    return std::tie(a.relay, a.server, a.server_row) < std::tie(b.relay, b.server, b.server_row);
  });
  return out;
}

void relay_context(const std::vector<TaskPlacement>& tasks, const std::vector<int64_t>& hosts,
                   std::vector<ContextMessage>& messages) {
  if (one_host(hosts)) return;
  const auto host = [&](int64_t r) { return hosts[static_cast<size_t>(r)]; };
  // As kv_relay chooses: the servers' tasks in rank order.
  std::vector<const TaskPlacement*> by_server;
  for (const TaskPlacement& t : tasks) by_server.push_back(&t);
  std::stable_sort(by_server.begin(), by_server.end(),
                   [](const TaskPlacement* a, const TaskPlacement* b) { return a->server < b->server; });
  Relays relay;
  for (const TaskPlacement* t : by_server) consider(relay, t->doc, host(t->server), t->q_end, t->server);
  for (ContextMessage& m : messages) {
    if (host(m.holder) == host(m.server)) continue;
    const int64_t r = relay.at({m.doc, host(m.server)}).second;
    if (r != m.server) m.holder = r;
  }
}

}  // namespace distca
