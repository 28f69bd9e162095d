// Independent references for the simulator's tests: 1F1B written out from its textbook
// definition and timed event by event, and the cost of a Llama layer from the model's
// dimensions. Nothing here calls the plan or cost code the simulator runs on (pipeline_schedule,
// analytic.h), so a bug there shows up as a disagreement.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "distca/core/specs.h"

namespace distca::sim::testing {

// One op of the reference: stage s, micro-batch j, forward or backward.
struct RefOp {
  int64_t stage = 0;
  int64_t microbatch = 0;
  bool backward = false;
};

// 1F1B on stage s of p with m micro-batches: p - 1 - s warm-up forwards (at most m), then
// alternately one forward and one backward, then the remaining backwards.
inline std::vector<RefOp> reference_1f1b(int64_t p, int64_t m, int64_t s) {
  std::vector<RefOp> out;
  int64_t next_f = 0, next_b = 0;
  while (next_f < m && next_f < p - 1 - s) out.push_back({s, next_f++, false});
  while (next_f < m || next_b < m) {
    if (next_f < m) out.push_back({s, next_f++, false});
    if (next_b < next_f) out.push_back({s, next_b++, true});
  }
  return out;
}

// Event-by-event timing of 1F1B: an op starts when its stage has finished the op before it
// and its input has arrived (a forward's from the stage before, after `transfer(j)` seconds;
// a backward's from the stage after, or from its own forward on the last stage). Returns the
// end of every op, keyed (stage, micro-batch, backward). Each end is computed from the ends
// it depends on by recursion, so the order ops are visited in does not matter.
using RefEnds = std::map<std::tuple<int64_t, int64_t, bool>, double>;
inline RefEnds time_1f1b(int64_t p, int64_t m, const std::function<double(const RefOp&)>& duration,
                         const std::function<double(int64_t)>& transfer) {
  std::vector<std::vector<RefOp>> order;
  for (int64_t s = 0; s < p; ++s) order.push_back(reference_1f1b(p, m, s));
  // position[(s, j, b)]: index of the op in its stage's order.
  std::map<std::tuple<int64_t, int64_t, bool>, size_t> position;
  for (int64_t s = 0; s < p; ++s) {
    for (size_t i = 0; i < order[static_cast<size_t>(s)].size(); ++i) {
      const RefOp& op = order[static_cast<size_t>(s)][i];
      position[{s, op.microbatch, op.backward}] = i;
    }
  }
  RefEnds ends;
  std::function<double(int64_t, int64_t, bool)> end_of = [&](int64_t s, int64_t j, bool bwd) -> double {
    const auto key = std::make_tuple(s, j, bwd);
    if (auto it = ends.find(key); it != ends.end()) return it->second;
    const size_t i = position.at(key);
    double start = 0;
    if (i > 0) {
      const RefOp& prev = order[static_cast<size_t>(s)][i - 1];
      start = end_of(s, prev.microbatch, prev.backward);
    }
    if (!bwd && s > 0) start = std::max(start, end_of(s - 1, j, false) + transfer(j));
    if (bwd && s == p - 1) start = std::max(start, end_of(s, j, false));
    if (bwd && s < p - 1) start = std::max(start, end_of(s + 1, j, true) + transfer(j));
    const double end = start + duration({s, j, bwd});
    ends[key] = end;
    return end;
  };
  for (int64_t s = 0; s < p; ++s) {
    for (int64_t j = 0; j < m; ++j) {
      end_of(s, j, false);
      end_of(s, j, true);
    }
  }
  return ends;
}

// The lockstep ticks of 1F1B: every op takes one unit of time and transfers none, so an op's
// tick is its start slot in time_1f1b. [tick][ops, ascending by stage].
inline std::vector<std::vector<RefOp>> reference_ticks(int64_t p, int64_t m) {
  const RefEnds ends = time_1f1b(p, m, [](const RefOp&) { return 1.0; }, [](int64_t) { return 0.0; });
  std::vector<std::vector<RefOp>> ticks;
  for (int64_t s = 0; s < p; ++s) {
    for (const RefOp& op : reference_1f1b(p, m, s)) {
      const auto slot = static_cast<size_t>(ends.at({s, op.microbatch, op.backward}) - 1.0);
      if (ticks.size() <= slot) ticks.resize(slot + 1);
      ticks[slot].push_back(op);
    }
  }
  return ticks;
}

// Llama layer costs from the model's dimensions. Weights per layer that multiply every token:
// Wq (h x q), Wk and Wv (h x kv each), Wo (q x h), the SwiGLU's gate, up and down (h x ffn
// each); a multiply-add is 2 FLOPs.
inline double layer_matmul_flops_per_token(const ModelSpec& m) {
  const double h = static_cast<double>(m.hidden);
  const double q = static_cast<double>(m.n_heads * m.head_dim);
  const double kv = static_cast<double>(m.n_kv_heads * m.head_dim);
  const double ffn = static_cast<double>(m.ffn);
  return 2.0 * (h * q + 2.0 * h * kv + q * h + 3.0 * h * ffn);
}

// Bytes of one row's K and V: n_kv_heads x head_dim each, `dtype_bytes` per element.
inline double kv_row_bytes(const ModelSpec& m, int64_t dtype_bytes) {
  return 2.0 * static_cast<double>(m.n_kv_heads * m.head_dim * dtype_bytes);
}

// Attention forward FLOPs of `pairs` causal pairs: QK^T and PV, a multiply-add each per
// (pair, head, head dimension).
inline double attention_forward_flops_of(const ModelSpec& m, double pairs) {
  return 4.0 * static_cast<double>(m.n_heads * m.head_dim) * pairs;
}

// Causal pairs of rows [begin, end) of a document: row x attends to x + 1 keys.
inline double causal_pairs(int64_t begin, int64_t end) {
  double pairs = 0;
  for (int64_t x = begin; x < end; ++x) pairs += static_cast<double>(x + 1);
  return pairs;
}

}  // namespace distca::sim::testing
