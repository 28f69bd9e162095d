// The Appendix B optimum and the chunk start (split.h) against scans over every candidate.
#include <gtest/gtest.h>

#include <cmath>

#include "distca/core/rng.h"
#include "distca/cost/analytic.h"
#include "distca/plan/split.h"

namespace distca {
namespace {

int64_t pick(Rng& rng, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(hi - lo + 1)));
}

TEST(Split, ChunkStartMatchesScan) {
  Rng rng(11);
  for (int it = 0; it < 3000; ++it) {
    const int64_t y = pick(rng, 0, 2000);
    const int64_t f = pick(rng, 0, causal_pairs(0, y) + 50);
    int64_t want = -1;
    for (int64_t x = y; x >= 0; --x) {
      if (causal_pairs(x, y) >= f) {
        want = x;
        break;
      }
    }
    ASSERT_EQ(chunk_start_for_pairs(y, f), want) << "y=" << y << " f=" << f;
  }
  // Large values: exact integer result near 2^40 pairs.
  const int64_t y = 3'000'000;
  const int64_t f = 123'456'789'012;
  const int64_t x = chunk_start_for_pairs(y, f);
  EXPECT_GE(causal_pairs(x, y), f);
  EXPECT_LT(causal_pairs(x + 1, y), f);
}

TEST(Split, ContinuousOptimumMinimisesBytes) {
  // n* minimises n s_q + (F/n + (n-1)/2) s_kv: compare with a fine scan.
  const SplitCosts c{16512, 4096};
  for (double f : {1e4, 1e6, 3e8, 5e10}) {
    const double n_star = appendix_b_rows(f, c);
    auto bytes = [&](double n) { return n * 16512.0 + (f / n + (n - 1) / 2) * 4096.0; };
    double best = bytes(n_star);
    for (double n = 1; n < 4 * n_star + 10; n += std::max(1.0, n_star / 1000)) {
      EXPECT_GE(bytes(n) * (1 + 1e-9), best) << "f=" << f << " n=" << n;
    }
    EXPECT_NEAR(appendix_b_top(f, c), f / n_star + (n_star - 1) / 2, 1e-6 * f);
  }
}

}  // namespace
}  // namespace distca
