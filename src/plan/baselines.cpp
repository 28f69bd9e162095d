// The baselines CAD must beat. Each is a pure function of (batch, options); ties are broken
// by the lowest rank and the lowest document id, so the output is the same on every platform.
//
// colocated   plain packing: one task per piece of the batch, served where it is held
//             (task = the piece's rows [offset, offset + len), context [0, offset + len)).
//             Its loads are the imbalance CAD removes; its only traffic is the K/V context of
//             a document's earlier pieces held on other ranks.
//
// wlb         WLB-LLM variable-length chunking, modelled as a data loader that re-packs whole
//             documents before the step (no communication is charged for the re-pack):
//               cap   = max(ceil(T / R), floor(wlb_mem_cap * T / R)) tokens per rank, with T
//                       the batch's tokens and R its ranks (so everything always fits);
//               order = documents by length, longest first (ties: lower id first);
//               place = each document on the rank with the least attention work (then the
//                       lowest rank) among those with room >= its length; work of a whole
//                       document of length L is task_cost(L, L);
//               split = if no rank has room, the document is cut front to back: the first
//                       piece [0, k) goes to the rank with the most room (ties: least work,
//                       then lowest rank), k = that room, and the rest continues the same way;
//                       pieces keep their positions, so piece [a, b) costs task_cost(b-a, b)
//                       and needs the K/V of [0, a) from the ranks holding it (counted).
//             The re-packed batch has tokens_per_rank = max(input's, cap) and each rank's
//             pieces in placement order; the schedule is colocated on it. Its memory cost is
//             the token imbalance (tokens_max_over_mean of the plan).
//
// percp:C     per-document context parallelism: ranks form groups of C consecutive ranks
//             (group g = ranks gC .. gC+C-1). A document is served by the group holding it;
//             packing can leave a document across a group boundary, and then it is served by
//             every group holding any of its rows (C' = C times that many groups; keeping it
//             in one group would idle the others for no reason a real CP run has, since a CP
//             loader never splits a document across DP groups). With S = the serving ranks in
//             ascending order and C' = |S|, the document is cut into 2C' chunks, chunk k =
//             [floor(kL/2C'), floor((k+1)L/2C')), and S[i] serves chunks i and 2C'-1-i
//             (head-tail: equal work for every i when 2C' divides L). A chunk crossing pieces
//             becomes one task per piece (a task's query rows lie in one piece of its home).
//             Empty chunks (L < 2C') give no task. Tasks are listed by document id, then
//             chunk, then position. Every serving rank also all-gathers the document's K/V
//             (traffic.h compute_allgather; it is what percp reports as its bytes: plan.h).
#include <algorithm>
#include <numeric>

#include "distca/plan/doc_index.h"
#include "distca/plan/plan.h"
#include "distca/plan/schedule.h"
#include "distca/plan/traffic.h"

namespace distca {
namespace {

std::vector<TaskPlacement> colocated_tasks(const Batch& batch) {
  std::vector<TaskPlacement> tasks;
  for (int64_t r = 0; r < batch.ranks; ++r) {
    for (const Piece& p : batch.per_rank[static_cast<size_t>(r)]) {
      tasks.push_back({p.doc, p.offset, p.offset + p.len, r, r});
    }
  }
  return tasks;
}

}  // namespace

Result<Schedule> schedule_colocated(const Batch& batch, const ScheduleOptions& options) {
  (void)options;
  DISTCA_RETURN_IF_ERROR(batch.validate());
  return Schedule{colocated_tasks(batch), batch};
}

Result<Schedule> schedule_wlb(const Batch& batch, const ScheduleOptions& options) {
  DISTCA_RETURN_IF_ERROR(batch.validate());
  const DocumentIndex index(batch);
  const int64_t R = batch.ranks;
  int64_t total = 0;
  std::vector<std::pair<int64_t, int64_t>> docs;  // (length, id)
  for (int64_t id : index.doc_ids()) {
    docs.emplace_back(index.doc_len(id), id);
    total += index.doc_len(id);
  }
  std::sort(docs.begin(), docs.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  const int64_t cap = std::max((total + R - 1) / R,
                               static_cast<int64_t>(options.wlb_mem_cap * static_cast<double>(total) /
                                                    static_cast<double>(R)));
  std::vector<int64_t> used(static_cast<size_t>(R), 0);
  std::vector<double> work(static_cast<size_t>(R), 0.0);
  Batch out;
  out.ranks = R;
  out.tokens_per_rank = std::max(batch.tokens_per_rank, cap);
  out.per_rank.assign(static_cast<size_t>(R), {});
  auto place = [&](int64_t r, int64_t id, int64_t begin, int64_t end, int64_t len) {
    const auto u = static_cast<size_t>(r);
    out.per_rank[u].push_back({id, begin, end - begin, len});
    used[u] += end - begin;
    work[u] += task_cost(options.cost, end - begin, end);
  };
  for (const auto& [len, id] : docs) {
    int64_t best = -1;
    for (int64_t r = 0; r < R; ++r) {
      const auto u = static_cast<size_t>(r);
      if (cap - used[u] < len) continue;
      if (best < 0 || work[u] < work[static_cast<size_t>(best)]) best = r;
    }
    if (best >= 0) {
      place(best, id, 0, len, len);
      continue;
    }
    int64_t pos = 0;
    while (pos < len) {
      int64_t r_best = -1;
      for (int64_t r = 0; r < R; ++r) {
        const auto u = static_cast<size_t>(r);
        const int64_t room = cap - used[u];
        if (room <= 0) continue;
        if (r_best < 0) {
          r_best = r;
          continue;
        }
        const auto b = static_cast<size_t>(r_best);
        const int64_t best_room = cap - used[b];
        if (room > best_room || (room == best_room && work[u] < work[b])) r_best = r;
      }
      DISTCA_CHECK_MSG(r_best >= 0, "wlb: the token cap leaves no room (cap below the mean)");
      const int64_t take = std::min(len - pos, cap - used[static_cast<size_t>(r_best)]);
      place(r_best, id, pos, pos + take, len);
      pos += take;
    }
  }
  DISTCA_RETURN_IF_ERROR(out.validate().with_context("wlb re-pack"));
  return Schedule{colocated_tasks(out), out};
}

int64_t percp_task_count(const Batch& batch, int64_t cp_degree) {
  const DocumentIndex index(batch);
  const auto groups = percp_groups(index, cp_degree);
  int64_t tasks = 0;
  for (size_t slot = 0; slot < groups.size(); ++slot) {
    const int64_t id = index.doc_ids()[slot];
    const int64_t L = index.doc_len(id);
    const auto C = static_cast<int64_t>(groups[slot].size()) * cp_degree;
    // schedule_percp's tasks are the pieces of the common refinement of the 2C chunks and the
    // held runs: one per distinct boundary inside (0, L), plus one.
    const auto& runs = index.runs(id);
    size_t j = 1;  // next run boundary: runs[j].begin
    int64_t k = 1;  // next chunk boundary: k * L / (2C)
    int64_t pieces = 1;
    while (j < runs.size() || k < 2 * C) {
      const int64_t chunk = k < 2 * C ? k * L / (2 * C) : L;
      const int64_t run = j < runs.size() ? runs[j].begin : L;
      const int64_t at = std::min(chunk, run);
      if (at > 0 && at < L) ++pieces;
      if (chunk == at) ++k;
      if (run == at) ++j;
      // Equal chunk boundaries (L < 2C) collapse into one.
      while (k < 2 * C && k * L / (2 * C) == at) ++k;
    }
    tasks += pieces;
  }
  return tasks;
}

Result<Schedule> schedule_percp(const Batch& batch, int64_t cp_degree, const ScheduleOptions& options) {
  (void)options;
  DISTCA_RETURN_IF_ERROR(batch.validate());
  if (cp_degree < 1 || batch.ranks % cp_degree != 0) {
    return Status::invalid_argument("--scheduler percp:" + std::to_string(cp_degree) +
                                    ": CP degree does not divide the " + std::to_string(batch.ranks) +
                                    " ranks");
  }
  const DocumentIndex index(batch);
  const auto groups = percp_groups(index, cp_degree);
  Schedule out;
  out.batch = batch;
  // Reserved exactly: at large degrees the tasks dominate memory, and growth by doubling
  // would hold up to three times their size at a reallocation (memory estimates count 40 B).
  out.tasks.reserve(static_cast<size_t>(percp_task_count(batch, cp_degree)));
  for (size_t slot = 0; slot < groups.size(); ++slot) {
    const int64_t id = index.doc_ids()[slot];
    const int64_t L = index.doc_len(id);
    std::vector<int64_t> servers;  // the ranks of the serving groups, ascending
    for (int64_t g : groups[slot]) for (int64_t r = g * cp_degree; r < (g + 1) * cp_degree; ++r) servers.push_back(r);
    const auto C = static_cast<int64_t>(servers.size());
    for (int64_t k = 0; k < 2 * C; ++k) {
      const int64_t lo = k * L / (2 * C);
      const int64_t hi = (k + 1) * L / (2 * C);
      const int64_t server = servers[static_cast<size_t>(k < C ? k : 2 * C - 1 - k)];
      for (const HeldRun& run : index.runs(id)) {
        const int64_t a = std::max(lo, run.begin);
        const int64_t b = std::min(hi, run.end);
        if (a < b) out.tasks.push_back({id, a, b, run.rank, server});
      }
    }
  }
  return out;
}

}  // namespace distca
