// Byte and load accounting (the rules are in traffic.h).
#include "distca/plan/traffic.h"

#include <algorithm>
#include <map>
#include <utility>

#include "distca/core/check.h"

namespace distca {
namespace {

void add_message(std::vector<RankBytes>& per_rank, int64_t from, int64_t to, int64_t bytes,
                 bool forward) {
  if (from == to || bytes == 0) return;
  auto& s = per_rank[static_cast<size_t>(from)];
  auto& r = per_rank[static_cast<size_t>(to)];
  if (forward) {
    s.fwd_sent += bytes;
    r.fwd_recv += bytes;
  } else {
    s.bwd_sent += bytes;
    r.bwd_recv += bytes;
  }
}

}  // namespace

int64_t Traffic::forward_max_rank() const {
  int64_t m = 0;
  for (const auto& r : per_rank) m = std::max(m, r.fwd());
  return m;
}

int64_t Traffic::backward_max_rank() const {
  int64_t m = 0;
  for (const auto& r : per_rank) m = std::max(m, r.bwd());
  return m;
}

Traffic compute_traffic(const DocumentIndex& index, const std::vector<TaskPlacement>& tasks,
                        const RowBytes& rb, bool include_context) {
  const int64_t ranks = index.ranks();
  Traffic t;
  t.per_rank.assign(static_cast<size_t>(ranks), {});
  // (document slot, server) -> largest q_end: the context that server needs.
  std::map<std::pair<int64_t, int64_t>, int64_t> need;
  for (const TaskPlacement& task : tasks) {
    DISTCA_CHECK(task.home >= 0 && task.home < ranks && task.server >= 0 && task.server < ranks);
    DISTCA_CHECK(task.q_begin >= 0 && task.q_begin < task.q_end);
    const int64_t s = index.slot(task.doc);
    DISTCA_CHECK(s >= 0 && task.q_end <= index.doc_len(task.doc));
    auto [it, fresh] = need.emplace(std::make_pair(s, task.server), task.q_end);
    if (!fresh) it->second = std::max(it->second, task.q_end);
    if (task.home == task.server) continue;
    const int64_t n = task.q_end - task.q_begin;
    t.bytes.q += n * rb.q;
    t.bytes.o_lse += n * (rb.o + rb.lse);
    t.bytes.d_o += n * rb.o;
    t.bytes.dq += n * rb.q;
    add_message(t.per_rank, task.home, task.server, n * rb.q, true);
    add_message(t.per_rank, task.server, task.home, n * (rb.o + rb.lse), true);
    add_message(t.per_rank, task.home, task.server, n * rb.o, false);
    add_message(t.per_rank, task.server, task.home, n * rb.q, false);
  }
  if (!include_context) return t;
  for (const auto& [key, end] : need) {
    const auto [s, server] = key;
    const int64_t doc = index.doc_ids()[static_cast<size_t>(s)];
    for (const HeldRun& run : index.runs(doc)) {
      if (run.begin >= end) break;
      if (run.rank == server) continue;
      const int64_t bytes = (std::min(end, run.end) - run.begin) * rb.kv;
      t.bytes.kv += bytes;
      t.bytes.dkv += bytes;
      add_message(t.per_rank, run.rank, server, bytes, true);
      add_message(t.per_rank, server, run.rank, bytes, false);
    }
  }
  return t;
}

AllGatherTraffic compute_allgather(const DocumentIndex& index, int64_t cp_degree,
                                   const std::vector<std::vector<int64_t>>& groups_of_doc,
                                   const RowBytes& rb) {
  DISTCA_CHECK(cp_degree > 0 && index.ranks() % cp_degree == 0);
  DISTCA_CHECK(groups_of_doc.size() == index.doc_ids().size());
  AllGatherTraffic a;
  a.per_rank.assign(static_cast<size_t>(index.ranks()), {});
  for (size_t s = 0; s < groups_of_doc.size(); ++s) {
    for (const int64_t g : groups_of_doc[s]) {
      DISTCA_CHECK(g >= 0 && (g + 1) * cp_degree <= index.ranks());
      for (int64_t r = g * cp_degree; r < (g + 1) * cp_degree; ++r) {
        for (const HeldRun& run : index.runs(index.doc_ids()[s])) {
          if (run.rank == r) continue;
          const int64_t bytes = (run.end - run.begin) * rb.kv;
          a.bytes += bytes;
          add_message(a.per_rank, run.rank, r, bytes, true);
          add_message(a.per_rank, r, run.rank, bytes, false);  // reduce-scatter of dK/dV
        }
      }
    }
  }
  return a;
}

double task_cost(const AttentionCostModel* cost, int64_t q_len, int64_t kv_len) {
  if (cost != nullptr) return cost->task_cost(q_len, kv_len);
  return static_cast<double>(task_pairs(q_len, kv_len));
}

std::vector<double> server_loads(int64_t ranks, const std::vector<TaskPlacement>& tasks,
                                 const AttentionCostModel* cost) {
  std::vector<double> loads(static_cast<size_t>(ranks), 0.0);
  for (const TaskPlacement& t : tasks) {
    DISTCA_CHECK(t.server >= 0 && t.server < ranks);
    loads[static_cast<size_t>(t.server)] += task_cost(cost, t.q_end - t.q_begin, t.q_end);
  }
  return loads;
}

std::vector<double> colocated_loads(const Batch& batch, const AttentionCostModel* cost) {
  std::vector<double> loads(batch.per_rank.size(), 0.0);
  for (size_t r = 0; r < batch.per_rank.size(); ++r) {
    for (const Piece& p : batch.per_rank[r]) loads[r] += task_cost(cost, p.len, p.offset + p.len);
  }
  return loads;
}

double max_over_mean(const std::vector<double>& values) {
  if (values.empty()) return 1.0;
  double sum = 0, mx = 0;
  for (double v : values) {
    sum += v;
    mx = std::max(mx, v);
  }
  const double mean = sum / static_cast<double>(values.size());
  return mean > 0 ? mx / mean : 1.0;
}

}  // namespace distca
