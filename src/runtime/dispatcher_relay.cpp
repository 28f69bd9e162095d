// The dispatcher's K/V relay layouts (dispatcher_relay.h).
#include "dispatcher_relay.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "distca/plan/topology_relay.h"

namespace distca::runtime::detail {
namespace {

using Skips = std::vector<std::pair<int64_t, int64_t>>;  // (first row, rows) left out

// The rows of [begin, begin + count) not in `skips`, as copies between that range (`plan`
// side) and a compact buffer from row *w on; returns how many rows were kept.
int64_t keep_rows(int64_t begin, int64_t count, Skips skips, bool plan_is_source, int64_t* w,
                  std::vector<RowCopy>* copies) {
  std::sort(skips.begin(), skips.end());
  const int64_t start = *w;
  int64_t cur = begin;
  auto keep = [&](int64_t to_row) {
    if (to_row <= cur) return;
    copies->push_back(plan_is_source ? RowCopy{cur, *w, to_row - cur} : RowCopy{*w, cur, to_row - cur});
    *w += to_row - cur;
  };
  for (const auto& [at, rows] : skips) {
    keep(at);
    cur = at + rows;
  }
  keep(begin + count);
  return *w - start;
}

void set_peer(Exchange* ex, bool send, size_t peer, int64_t rows, int64_t displ) {
  if (rows == 0) return;
  (send ? ex->send_counts : ex->recv_counts).mut(peer) = rows;
  (send ? ex->send_displs : ex->recv_displs).mut(peer) = displ;
}

}  // namespace

KvRelayLayout make_kv_relay_layout(const Plan& plan, int rank) {
  std::vector<const Exchange*> kv;
  for (const RankPlan& r : plan.ranks) kv.push_back(&r.exchange(ExchangeKind::kKv));
  return make_kv_relay_layout(plan, kv, rank);
}

KvRelayLayout make_kv_relay_layout(const Plan& plan, const std::vector<const Exchange*>& kv_of, int rank) {
  KvRelayLayout out;
  const std::vector<RelayedBlock> relayed = kv_relay(plan, kv_of, plan.hosts);
  if (relayed.empty()) return out;
  out.on = true;
  const size_t n = kv_of.size();
  const auto me = static_cast<int64_t>(rank);
  const Exchange& kv = *kv_of[static_cast<size_t>(rank)];
  for (Exchange* ex : {&out.first, &out.second}) {
    ex->row_bytes = kv.row_bytes;
    ex->send_counts = ex->send_displs = ex->recv_counts = ex->recv_displs = PeerVector<int64_t>(n);
    ex->send_blocks = ex->recv_blocks = PeerVector<std::vector<RowBlock>>(n);
  }
  // The first exchange: the plan's kKv without the relayed rows, on both ends.
  std::vector<Skips> skip_send(n), skip_recv(n);
  for (const RelayedBlock& b : relayed) {
    if (b.holder == me) {
      const Exchange& skv = *kv_of[static_cast<size_t>(b.server)];
      const int64_t at = kv.send_displs[static_cast<size_t>(b.server)] + (b.server_row - skv.recv_displs[static_cast<size_t>(me)]);
      skip_send[static_cast<size_t>(b.server)].emplace_back(at, b.rows);
    }
    if (b.server == me) skip_recv[static_cast<size_t>(b.holder)].emplace_back(b.server_row, b.rows);
  }
  int64_t w = 0;
  for (const auto& [p, count] : kv.send_counts.entries()) {
    const int64_t start = w;
    set_peer(&out.first, true, p, keep_rows(kv.send_displs[p], count, skip_send[p], true, &w, &out.pack_first), start);
  }
  w = 0;
  for (const auto& [p, count] : kv.recv_counts.entries()) {
    const int64_t start = w;
    set_peer(&out.first, false, p, keep_rows(kv.recv_displs[p], count, skip_recv[p], false, &w, &out.unpack_first), start);
  }
  // The second: relayed rows from each relay to the servers of its host, in (server, row)
  // order on both ends (kv_relay's order).
  int64_t ws = 0, wr = 0;
  for (const RelayedBlock& b : relayed) {
    if (b.relay == me) {
      const auto s = static_cast<size_t>(b.server);
      if (out.second.send_counts[s] == 0) out.second.send_displs.mut(s) = ws;
      out.second.send_counts.mut(s) += b.rows;
      out.pack_second.push_back({b.relay_row, ws, b.rows});
      ws += b.rows;
    }
    if (b.server == me) {
      const auto r = static_cast<size_t>(b.relay);
      if (out.second.recv_counts[r] == 0) out.second.recv_displs.mut(r) = wr;
      out.second.recv_counts.mut(r) += b.rows;
      out.unpack_second.push_back({wr, b.server_row, b.rows});
      wr += b.rows;
    }
  }
  return out;
}

void copy_rows(const std::vector<RowCopy>& copies, const float* from, float* to, int64_t row_floats) {
  for (const RowCopy& c : copies) {
    std::memcpy(to + c.to * row_floats, from + c.from * row_floats,
                static_cast<size_t>(c.rows * row_floats) * sizeof(float));
  }
}

}  // namespace distca::runtime::detail
