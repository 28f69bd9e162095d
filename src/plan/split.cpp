// Appendix B: where to cut a task so that F pairs move for the fewest bytes (split.h).
#include "distca/plan/split.h"

#include <algorithm>
#include <cmath>

#include "distca/core/check.h"
#include "distca/cost/analytic.h"

namespace distca {
namespace {

// P(x) = x(x+1)/2: pairs of query rows [0, x).
int64_t tri(int64_t x) { return x * (x + 1) / 2; }

// The largest x >= 0 with tri(x) <= t (t >= 0). The double estimate is corrected with exact
// integer steps, so the result does not depend on how the platform rounds sqrt.
int64_t tri_floor_inverse(int64_t t) {
  auto x = static_cast<int64_t>((std::sqrt(8.0 * static_cast<double>(t) + 1.0) - 1.0) / 2.0);
  x = std::max<int64_t>(x, 0);
  while (x > 0 && tri(x) > t) --x;
  while (tri(x + 1) <= t) ++x;
  return x;
}

}  // namespace

double appendix_b_rows(double pairs, const SplitCosts& costs) {
  DISTCA_CHECK(pairs > 0 && costs.s_q > 0 && costs.s_kv >= 0);
  const double s_q = static_cast<double>(costs.s_q);
  const double s_kv = static_cast<double>(costs.s_kv);
  return std::max(1.0, std::sqrt(2.0 * pairs * s_kv / (2.0 * s_q + s_kv)));
}

double appendix_b_top(double pairs, const SplitCosts& costs) {
  const double n = appendix_b_rows(pairs, costs);
  return pairs / n + (n - 1.0) / 2.0;
}

int64_t chunk_start_for_pairs(int64_t y, int64_t pairs) {
  DISTCA_CHECK(y >= 0 && pairs >= 0);
  const int64_t t = tri(y) - pairs;  // the chunk [x, y) carries tri(y) - tri(x) >= pairs
  if (t < 0) return -1;
  return std::min(tri_floor_inverse(t), y);
}

std::optional<SplitRange> chunk_for_top(const SplitRequest& req, int64_t y) {
  DISTCA_CHECK(0 <= req.a && req.a < req.b && req.min_rows > 0);
  if (y <= req.a || y > req.b) return std::nullopt;
  if (y < req.b && req.b - y < req.min_rows) return std::nullopt;
  int64_t x = chunk_start_for_pairs(y, req.pairs);
  if (x < req.a) x = req.a;
  if (y - x < req.min_rows) x = std::max(req.a, y - req.min_rows);
  if (x > req.a && x - req.a < req.min_rows) x = req.a;
  const bool whole = x == req.a && y == req.b;
  if (y - x < req.min_rows && !whole) return std::nullopt;
  return SplitRange{x, y};
}

int64_t split_bytes(const SplitRange& r, const SplitCosts& costs, int64_t kv_present) {
  return (r.end - r.begin) * costs.s_q + std::max<int64_t>(0, r.end - kv_present) * costs.s_kv;
}

SplitRange optimal_split(const SplitRequest& req, const SplitCosts& costs) {
  DISTCA_CHECK(0 <= req.a && req.a < req.b && req.pairs > 0 && req.min_rows > 0);
  if (causal_pairs(req.a, req.b) <= req.pairs) return {req.a, req.b};
  // The lowest top whose chunk [from, y) reaches F: tri(y) >= F + tri(from).
  auto lowest_top = [&](int64_t from) {
    int64_t y = tri_floor_inverse(req.pairs + tri(from));
    if (tri(y) - tri(from) < req.pairs) ++y;
    return y;
  };
  const int64_t y_min = lowest_top(req.a);
  // The lowest top that leaves exactly min_rows below (the lower remainder's boundary).
  const int64_t y_rem = lowest_top(req.a + req.min_rows);
  const double star = std::max(appendix_b_top(static_cast<double>(req.pairs), costs),
                               static_cast<double>(req.kv_present));
  const auto base = static_cast<int64_t>(std::floor(std::min(star, static_cast<double>(req.b))));
  int64_t tops[] = {base - 2, base - 1, base, base + 1, base + 2, req.b, req.b - req.min_rows,
                    req.kv_present, y_min, y_min + 1, req.a + req.min_rows, y_rem, y_rem + 1};
  std::optional<SplitRange> best;
  int64_t best_bytes = 0;
  for (int64_t y : tops) {
    y = std::clamp(y, req.a + 1, req.b);
    const auto c = chunk_for_top(req, y);
    if (!c || causal_pairs(c->begin, c->end) < req.pairs) continue;  // this top cannot carry F
    const int64_t bytes = split_bytes(*c, costs, req.kv_present);
    const int64_t rows = c->end - c->begin;
    const bool better = !best || bytes < best_bytes ||
                        (bytes == best_bytes && (rows < best->end - best->begin ||
                                                 (rows == best->end - best->begin && c->end > best->end)));
    if (better) {
      best = c;
      best_bytes = bytes;
    }
  }
  return best ? *best : SplitRange{req.a, req.b};
}

}  // namespace distca
