// Appendix B: where to cut a task so that F pairs move for the fewest bytes (split.h).
#include "distca/plan/split.h"

#include <algorithm>
#include <cmath>

#include "distca/core/check.h"

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

}  // namespace distca
