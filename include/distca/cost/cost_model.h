// The attention cost model the planner balances.
//
// The planner asks one question: what does a CA-task with q_len query rows at the end of a
// kv_len-row context cost on a server? The analytic model answers in causal pairs (so totals
// are exactly conserved when a task is split); a profiled table (measured by `distca profile`)
// answers in seconds, and then splitting a task may change the total (short shards run below
// peak efficiency), which the planner must accept.
//
// Thread safety: implementations are immutable after construction; task_cost may be called
// from several threads at once.
#pragma once

#include <cstdint>
#include <string>

namespace distca {

class AttentionCostModel {
 public:
  virtual ~AttentionCostModel() = default;
  // Cost of one task; 0 for q_len == 0. Preconditions: 0 <= q_len <= kv_len.
  virtual double task_cost(int64_t q_len, int64_t kv_len) const = 0;
  // "pairs" or "seconds".
  virtual std::string unit() const = 0;
};

// Cost = causal pairs (forward and backward are both proportional to it).
class PairsCostModel final : public AttentionCostModel {
 public:
  double task_cost(int64_t q_len, int64_t kv_len) const override;
  std::string unit() const override { return "pairs"; }
};

}  // namespace distca
