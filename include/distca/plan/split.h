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
// Granularity. A moved chunk and each remainder left at home ([a, x) and [y, b)) is either
// empty or at least `min_rows` rows (128: the attention kernel's tile), except that the whole
// range [a, b) may always move (it is shorter than min_rows only when the piece is).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>

namespace distca {

struct SplitCosts {
  int64_t s_q = 0;   // bytes per moved query row (Q + O + LSE), > 0
  int64_t s_kv = 0;  // bytes per context row not yet at the destination (K + V), >= 0
};

struct SplitRange {
  int64_t begin = 0;  // x
  int64_t end = 0;    // y
  bool operator==(const SplitRange&) const = default;
};

struct SplitRequest {
  int64_t a = 0;           // the task's first query row still at home
  int64_t b = 0;           // one past its last; context [0, b). 0 <= a < b
  int64_t pairs = 0;       // F, the pairs to move (> 0)
  int64_t kv_present = 0;  // context rows [0, kv_present) already at the destination (>= 0)
  int64_t min_rows = 128;  // granularity (> 0)
};

// The continuous Appendix B optimum for F pairs: n* (query rows) and y* (top row).
// Preconditions: pairs > 0, s_q > 0, s_kv >= 0.
double appendix_b_rows(double pairs, const SplitCosts& costs);
double appendix_b_top(double pairs, const SplitCosts& costs);

// The largest x in [0, y] with causal_pairs(x, y) >= pairs (the shortest chunk ending at y
// that carries the pairs), or -1 when even [0, y) carries fewer. Exact integer result.
int64_t chunk_start_for_pairs(int64_t y, int64_t pairs);

// The chunk [x, y) ending at top y that carries at least `pairs` pairs with as few rows as
// the granularity rules allow (x snapped to a when the lower remainder would be too short,
// or when [a, y) carries fewer than `pairs`). nullopt when top y is illegal (upper remainder
// [y, b) shorter than min_rows, or y <= a).
std::optional<SplitRange> chunk_for_top(const SplitRequest& request, int64_t y);

// bytes(x, y) of the header comment.
int64_t split_bytes(const SplitRange& range, const SplitCosts& costs, int64_t kv_present);

// The Appendix B choice: the whole range if it carries <= F pairs; otherwise the legal chunk
// with at least F pairs whose bytes are smallest among a few integer tops: around the
// continuous optimum, and at the boundaries where the granularity rules bend the cost (b,
// b - min_rows, kv_present, a + min_rows, the lowest top that reaches F from a and from
// a + min_rows). Ties: fewer rows, then the higher top. Always returns a legal chunk (the
// whole range at worst). O(1).
SplitRange optimal_split(const SplitRequest& request, const SplitCosts& costs);

}  // namespace distca
