// Where to cut a CA-task when only part of its work should move (the paper's Appendix B).
//
// Setting. A task's query rows [a, b) are still at home; its context is [0, b). We want to
// move a chunk of query rows [x, y) (a <= x < y <= b) carrying at least F causal pairs to a
// server that already has the context rows [0, kv_present) of the document. The chunk costs
//   bytes(x, y) = (y - x) * s_q + max(0, y - kv_present) * s_kv
// with s_q the bytes per moved query row (Q out, O and LSE back) and s_kv the bytes per
// context row (K and V). A chunk ending at y needs n rows with n*y - n(n-1)/2 >= F, so
// y = F/n + (n-1)/2; minimising n*s_q + y*s_kv over n gives
//   n* = sqrt(2 F s_kv / (2 s_q + s_kv)),  y* = F/n* + (n* - 1)/2,
// clamped to what is feasible, and never below kv_present (rows already there are free, so
// the chunk should climb at least to their end). docs/scheduler.md derives it.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

namespace distca {

struct SplitCosts {
  int64_t s_q = 0;   // bytes per moved query row (Q + O + LSE), > 0
  int64_t s_kv = 0;  // bytes per context row not yet at the destination (K + V), >= 0
};

// The continuous Appendix B optimum for F pairs: n* (query rows) and y* (top row).
// Preconditions: pairs > 0, s_q > 0, s_kv >= 0.
double appendix_b_rows(double pairs, const SplitCosts& costs);
double appendix_b_top(double pairs, const SplitCosts& costs);

// The largest x in [0, y] with causal_pairs(x, y) >= pairs (the shortest chunk ending at y
// that carries the pairs), or -1 when even [0, y) carries fewer. Exact integer result.
int64_t chunk_start_for_pairs(int64_t y, int64_t pairs);

}  // namespace distca
