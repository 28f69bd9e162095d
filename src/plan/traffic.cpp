// Byte and load accounting (the rules are in traffic.h).
#include "distca/plan/traffic.h"

#include <algorithm>
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

Traffic compute_traffic(const DocumentIndex& index, const std::vector<TaskPlacement>& tasks,
                        const RowBytes& rb, bool include_context, std::vector<ContextMessage>* context) {
  const int64_t ranks = index.ranks();
  const auto R = static_cast<size_t>(ranks);
  Traffic t;
  t.per_rank.assign(R, {});
  // Tasks grouped by server (a counting sort), so each server's contexts are found with a
  // [documents] scratch array instead of a map over (document, server) pairs: O(tasks +
  // ranks + documents). Every sum is of integers, so the grouping cannot change a figure.
  std::vector<size_t> start(R + 1, 0);
  for (const TaskPlacement& task : tasks) {
    DISTCA_CHECK(task.home >= 0 && task.home < ranks && task.server >= 0 && task.server < ranks);
    DISTCA_CHECK(task.q_begin >= 0 && task.q_begin < task.q_end);
    ++start[static_cast<size_t>(task.server) + 1];
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
  std::vector<int64_t> slot_of(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    const int64_t s = index.slot(tasks[i].doc);
    DISTCA_CHECK(s >= 0 && tasks[i].q_end <= index.slot_len(s));
    slot_of[i] = s;
  }
  if (!include_context) return t;
  for (size_t r = 0; r < R; ++r) start[r + 1] += start[r];
  std::vector<size_t> by_server(tasks.size());
  {
    std::vector<size_t> cursor(start.begin(), start.end() - 1);
    for (size_t i = 0; i < tasks.size(); ++i) by_server[cursor[static_cast<size_t>(tasks[i].server)]++] = i;
  }
  std::vector<int64_t> need(index.doc_ids().size(), 0);  // slot -> largest q_end (0: none)
  std::vector<int64_t> touched;
  for (size_t server = 0; server < R; ++server) {
    for (size_t k = start[server]; k < start[server + 1]; ++k) {
      const size_t i = by_server[k];
      int64_t& e = need[static_cast<size_t>(slot_of[i])];
      if (e == 0) touched.push_back(slot_of[i]);
      e = std::max(e, tasks[i].q_end);
    }
    for (const int64_t s : touched) {
      const int64_t end = need[static_cast<size_t>(s)];
      need[static_cast<size_t>(s)] = 0;
      for (const HeldRun& run : index.slot_runs(s)) {
        if (run.begin >= end) break;
        if (run.rank == static_cast<int64_t>(server)) continue;
        const int64_t bytes = (std::min(end, run.end) - run.begin) * rb.kv;
        t.bytes.kv += bytes;
        t.bytes.dkv += bytes;
        add_message(t.per_rank, run.rank, static_cast<int64_t>(server), bytes, true);
        add_message(t.per_rank, static_cast<int64_t>(server), run.rank, bytes, false);
        if (context != nullptr && bytes > 0) context->push_back({run.rank, static_cast<int64_t>(server), bytes, index.doc_ids()[static_cast<size_t>(s)]});
      }
    }
    touched.clear();
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
  const TaskCost task(cost);
  for (const TaskPlacement& t : tasks) {
    DISTCA_CHECK(t.server >= 0 && t.server < ranks);
    DISTCA_CHECK(t.q_end - t.q_begin >= 0 && t.q_begin >= 0);  // task_pairs' precondition
    loads[static_cast<size_t>(t.server)] += task(t.q_end - t.q_begin, t.q_end);
  }
  return loads;
}

std::vector<double> colocated_loads(const Batch& batch, const AttentionCostModel* cost) {
  std::vector<double> loads(batch.per_rank.size(), 0.0);
  const TaskCost task(cost);
  for (size_t r = 0; r < batch.per_rank.size(); ++r) {
    for (const Piece& p : batch.per_rank[r]) {
      DISTCA_CHECK(p.len >= 0 && p.offset >= 0);
      loads[r] += task(p.len, p.offset + p.len);
    }
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
