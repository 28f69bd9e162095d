// Appendix B split (split.h) against brute force over every split position.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "distca/core/rng.h"
#include "distca/cost/analytic.h"
#include "distca/plan/split.h"

namespace distca {
namespace {

int64_t pick(Rng& rng, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(hi - lo + 1)));
}

bool legal(const SplitRequest& q, const SplitRange& r) {
  if (r.begin < q.a || r.end > q.b || r.begin >= r.end) return false;
  if (r.begin == q.a && r.end == q.b) return true;
  auto ok = [&](int64_t n) { return n == 0 || n >= q.min_rows; };
  return r.end - r.begin >= q.min_rows && ok(r.begin - q.a) && ok(q.b - r.end);
}

// The cheapest legal chunk with >= F pairs over ALL (x, y) (the whole range when it carries
// fewer than F).
int64_t brute_best_bytes(const SplitRequest& q, const SplitCosts& c) {
  if (causal_pairs(q.a, q.b) <= q.pairs) return split_bytes({q.a, q.b}, c, q.kv_present);
  int64_t best = std::numeric_limits<int64_t>::max();
  for (int64_t y = q.a + 1; y <= q.b; ++y) {
    for (int64_t x = q.a; x < y; ++x) {
      const SplitRange r{x, y};
      if (causal_pairs(x, y) < q.pairs || !legal(q, r)) continue;
      best = std::min(best, split_bytes(r, c, q.kv_present));
    }
  }
  return best;
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

TEST(Split, OptimalSplitNearBruteForce) {
  Rng rng(5);
  int exact = 0, total = 0;
  for (int it = 0; it < 400; ++it) {
    SplitRequest q;
    q.min_rows = pick(rng, 0, 3) == 0 ? 1 : pick(rng, 4, 40);
    q.a = pick(rng, 0, 150);
    q.b = q.a + pick(rng, 1, 220);
    q.pairs = pick(rng, 1, causal_pairs(q.a, q.b) + 10);
    q.kv_present = pick(rng, 0, 1) ? 0 : pick(rng, 0, q.b + 20);
    const SplitCosts c{pick(rng, 1, 40), pick(rng, 0, 40)};
    const SplitRange r = optimal_split(q, c);
    ASSERT_TRUE(legal(q, r)) << "a=" << q.a << " b=" << q.b << " [" << r.begin << "," << r.end << ")";
    const bool whole = r.begin == q.a && r.end == q.b;
    if (!whole) {
      ASSERT_GE(causal_pairs(r.begin, r.end), q.pairs);
    }
    const int64_t got = split_bytes(r, c, q.kv_present);
    const int64_t best = brute_best_bytes(q, c);
    ++total;
    if (got == best) ++exact;
    // The analytic choice only searches a few tops; allow 2% plus two rows of slack, which
    // the granularity rules can cost at a boundary.
    EXPECT_LE(static_cast<double>(got), 1.02 * static_cast<double>(best) + 2.0 * static_cast<double>(c.s_q + c.s_kv))
        << "a=" << q.a << " b=" << q.b << " F=" << q.pairs << " kv=" << q.kv_present
        << " min=" << q.min_rows << " s_q=" << c.s_q << " s_kv=" << c.s_kv;
  }
  // Most cases hit the exact optimum.
  EXPECT_GE(exact, total * 7 / 10);
}

TEST(Split, WholeRangeWhenItCarriesTooLittle) {
  SplitRequest q{100, 300, causal_pairs(100, 300), 0, 128};
  EXPECT_EQ(optimal_split(q, {10, 5}), (SplitRange{100, 300}));
  q.pairs = causal_pairs(100, 300) + 1;
  EXPECT_EQ(optimal_split(q, {10, 5}), (SplitRange{100, 300}));
}

TEST(Split, ChunkForTopRespectsGranularity) {
  const SplitRequest q{0, 1000, 5000, 0, 128};
  EXPECT_FALSE(chunk_for_top(q, 900).has_value());  // upper remainder of 100 rows
  EXPECT_FALSE(chunk_for_top(q, 0).has_value());
  const auto c = chunk_for_top(q, 1000);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->end - c->begin, 128);  // 5000 pairs need 6 rows at the top; 128 is the floor
  const auto low = chunk_for_top(q, 200);  // [72, 200) would leave 72 rows below: take [0, 200)
  ASSERT_TRUE(low.has_value());
  EXPECT_EQ(low->begin, 0);
}

}  // namespace
}  // namespace distca
