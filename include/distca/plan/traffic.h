// Byte and load accounting of a schedule: THE definition every scheduler, the plan builder,
// the validator, the simulator and the benchmarks share (docs/plan-format.md repeats it).
//
// Byte rules, one transformer layer, activations of `dtype_bytes` per element (row sizes from
// row_bytes() in cost/analytic.h; LSE is fp32, n_heads values per query row). A message
// counts only when it goes between two DIFFERENT ranks.
//   Forward, for every task with home h != server s:
//     Q     q_len * q            h -> s
//     O+LSE q_len * (o + lse)    s -> h
//   Forward K/V context, for every (document, server) pair: the server needs context rows
//     [0, E) with E = the largest q_end of that document's tasks on that server; every such
//     row held by a rank other than the server is sent ONCE (dedup across the document's
//     tasks on that server) from the rank that holds it: kv bytes per row (K and V together).
//   Backward (servers keep their forward inputs and outputs, as in-place servers do, so
//   nothing of the forward is re-sent):
//     dO    q_len * o            h -> s
//     dQ    q_len * q            s -> h
//     dK/dV kv per context row the server received in the forward, s -> the row's holder
//           (which sums the partials of all servers in a fixed order).
//   forward total  = sum of all forward messages; backward total likewise.
//   max rank       = max over ranks of (bytes sent + bytes received), forward (backward).
// Per-document CP (percp:C) all-gathers K/V inside each group (compute_allgather below); its
// summary reports that instead of the exchanges (plan.h, PlanMetrics).
//
// Loads: a server's load is the sum over its tasks of cost->task_cost(q_len, kv_len), or of
// causal pairs when cost is nullptr. Loads are summed in task order, so they are bitwise
// reproducible.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "distca/cost/analytic.h"
#include "distca/cost/cost_model.h"
#include "distca/data/batch.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/schedule.h"

namespace distca {

// Bytes one rank sends and receives, per direction of the step.
struct RankBytes {
  int64_t fwd_sent = 0;
  int64_t fwd_recv = 0;
  int64_t bwd_sent = 0;
  int64_t bwd_recv = 0;
  int64_t fwd() const { return fwd_sent + fwd_recv; }
  int64_t bwd() const { return bwd_sent + bwd_recv; }
  bool operator==(const RankBytes&) const = default;
};

// Bytes by tensor, summed over all ranks (each message counted once).
struct TrafficBreakdown {
  int64_t q = 0, kv = 0, o_lse = 0;  // forward
  int64_t d_o = 0, dq = 0, dkv = 0;  // backward
  int64_t forward() const { return q + kv + o_lse; }
  int64_t backward() const { return d_o + dq + dkv; }
  bool operator==(const TrafficBreakdown&) const = default;
};

struct Traffic {
  TrafficBreakdown bytes;
  std::vector<RankBytes> per_rank;  // [ranks]
  int64_t forward_max_rank() const;
  bool operator==(const Traffic&) const = default;
};

// Traffic of `tasks` over the batch `index` was built from, by the rules above; with
// include_context == false only the query-side tensors (Q, O+LSE, dO, dQ) are counted.
// Preconditions: every task names a document of the index, 0 <= q_begin < q_end <= doc_len,
// 0 <= home, server < index.ranks(). (The validator checks the rest.)
// `context` (optional): receives the forward K/V messages, one per (server, document, held
// run) that moves bytes, in the order counted (dK/dV go back the same pairs reversed).
struct ContextMessage {
  int64_t holder = 0, server = 0, bytes = 0;
  int64_t doc = 0;  // the document whose rows move
  bool operator==(const ContextMessage&) const = default;
};
Traffic compute_traffic(const DocumentIndex& index, const std::vector<TaskPlacement>& tasks,
                        const RowBytes& rb, bool include_context = true,
                        std::vector<ContextMessage>* context = nullptr);

// Per-document CP all-gather. Groups are `cp_degree` consecutive ranks (group g = ranks
// [g*C, (g+1)*C)); `groups_of_doc[slot]` lists, ascending, the groups serving document
// index.doc_ids()[slot] (percp_groups in plan.h: the groups holding any of its rows). Every
// rank of those groups receives every row of the document it does not hold itself, from the
// row's holder. Backward moves the same bytes the other way (reduce-scatter of dK/dV).
struct AllGatherTraffic {
  int64_t bytes = 0;                // forward total (== backward total)
  std::vector<RankBytes> per_rank;  // [ranks]; bwd_* mirror fwd_*
  bool operator==(const AllGatherTraffic&) const = default;
};
AllGatherTraffic compute_allgather(const DocumentIndex& index, int64_t cp_degree,
                                   const std::vector<std::vector<int64_t>>& groups_of_doc,
                                   const RowBytes& rb);

// Cost of one task under `cost` (causal pairs when nullptr).
double task_cost(const AttentionCostModel* cost, int64_t q_len, int64_t kv_len);

// task_cost for loops over every task or piece: the causal-pairs count inline when `cost` is
// nullptr or a PairsCostModel (the same doubles, without a virtual call each), `cost`
// otherwise. Precondition of operator(): 0 <= q_len <= kv_len.
class TaskCost {
 public:
  explicit TaskCost(const AttentionCostModel* cost)
      : cost_(cost), pairs_(cost == nullptr || dynamic_cast<const PairsCostModel*>(cost) != nullptr) {}
  double operator()(int64_t q_len, int64_t kv_len) const {
    if (!pairs_) return cost_->task_cost(q_len, kv_len);
    const int64_t a = kv_len - q_len;  // causal_pairs(kv_len - q_len, kv_len)
    return static_cast<double>((kv_len * (kv_len + 1) - a * (a + 1)) / 2);
  }

 private:
  const AttentionCostModel* cost_;
  bool pairs_;
};
// Load of every server (tasks' costs summed in task order). [ranks]
std::vector<double> server_loads(int64_t ranks, const std::vector<TaskPlacement>& tasks,
                                 const AttentionCostModel* cost);
// Load of every rank when each piece's attention runs where it is held (the colocated
// baseline): piece [offset, offset + len) costs task_cost(len, offset + len). [ranks]
std::vector<double> colocated_loads(const Batch& batch, const AttentionCostModel* cost);
// max / mean of values (1 when the mean is 0).
double max_over_mean(const std::vector<double>& values);

}  // namespace distca
