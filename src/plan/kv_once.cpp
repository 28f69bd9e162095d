// K/V once per server across a nano-batch pair (include/distca/plan/kv_once.h).
#include "distca/plan/kv_once.h"

#include <algorithm>

#include "distca/core/check.h"

namespace distca {
namespace {

// The blocks of `from` (one side of an exchange) that `keep` accepts, in order, with their
// counts and displacements (rows; displacements are the prefix sums over peers with rows).
template <class Keep>
void filter_side(const PeerVector<std::vector<RowBlock>>& from, Keep keep, PeerVector<int64_t>& counts,
                 PeerVector<int64_t>& displs, PeerVector<std::vector<RowBlock>>& blocks) {
  int64_t w = 0;
  for (const auto& [p, list] : from.entries()) {
    std::vector<RowBlock> kept;
    int64_t rows = 0;
    for (const RowBlock& b : list) {
      if (!keep(b)) continue;
      kept.push_back(b);
      rows += b.rows();
    }
    if (rows == 0) continue;
    counts.mut(p) = rows;
    displs.mut(p) = w;
    blocks.mut(p) = std::move(kept);
    w += rows;
  }
}

template <class Keep>
Exchange filter(const Exchange& full, size_t n, Keep keep) {
  Exchange e;
  e.row_bytes = full.row_bytes;
  e.send_counts = e.send_displs = e.recv_counts = e.recv_displs = PeerVector<int64_t>(n);
  e.send_blocks = e.recv_blocks = PeerVector<std::vector<RowBlock>>(n);
  filter_side(full.send_blocks, keep, e.send_counts, e.send_displs, e.send_blocks);
  filter_side(full.recv_blocks, keep, e.recv_counts, e.recv_displs, e.recv_blocks);
  return e;
}

}  // namespace

std::array<std::vector<Exchange>, 2> nano_kv_wire(const NanoPlans& plans, bool backward) {
  const size_t n = plans.full.ranks.size();
  std::array<std::vector<Exchange>, 2> out;
  for (size_t r = 0; r < n; ++r) {
    const Exchange& full = plans.full.ranks[r].exchange(ExchangeKind::kKv);
    if (backward) {
      out[0].push_back(filter(full, n, [](const RowBlock&) { return false; }));
      out[1].push_back(full);
      continue;
    }
    for (size_t x = 0; x < 2; ++x) {
      out[x].push_back(filter(full, n, [&](const RowBlock& b) {
        const int64_t c = plans.split.cut_of(b.doc);
        DISTCA_CHECK_MSG(b.end <= c || b.begin >= c, "kv wire: a block straddles its document's cut");
        return (b.begin < c) == (x == 0);
      }));
    }
  }
  return out;
}

KvWireBytes kv_wire_bytes(const DocumentIndex& index, const std::vector<TaskPlacement>& full, const NanoSplit& split,
                          const RowBytes& rb) {
  const auto R = static_cast<size_t>(index.ranks());
  KvWireBytes out;
  for (size_t x = 0; x < 2; ++x) out.sent[x].assign(R, 0), out.recv[x].assign(R, 0);
  // Per server, per document slot: the largest q_end of its tasks (E_all).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ends(R);  // [server] (slot, E)
  for (const TaskPlacement& t : full) ends[static_cast<size_t>(t.server)].emplace_back(index.slot(t.doc), t.q_end);
  for (size_t s = 0; s < R; ++s) {
    auto& e = ends[s];
    std::sort(e.begin(), e.end());
    for (size_t i = 0; i < e.size(); ++i) {
      if (i + 1 < e.size() && e[i + 1].first == e[i].first) continue;  // the slot's largest end is last
      const int64_t slot = e[i].first, end = e[i].second;
      const int64_t cut = split.cut_of(index.doc_ids()[static_cast<size_t>(slot)]);
      for (const HeldRun& run : index.slot_runs(slot)) {
        if (run.begin >= end) break;
        if (run.rank == static_cast<int64_t>(s)) continue;
        const size_t x = run.begin < cut ? 0 : 1;
        const int64_t bytes = (std::min(end, run.end) - run.begin) * rb.kv;
        out.sent[x][static_cast<size_t>(run.rank)] += bytes;
        out.recv[x][s] += bytes;
        out.total[x] += bytes;
        out.pairs[x].emplace_back(run.rank, static_cast<int64_t>(s));
        if (bytes > 0) out.messages[x].push_back({run.rank, static_cast<int64_t>(s), bytes, index.doc_ids()[static_cast<size_t>(slot)]});
      }
    }
  }
  for (auto& p : out.pairs) {
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
  }
  return out;
}

}  // namespace distca
