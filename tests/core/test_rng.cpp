#include "distca/core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace distca {
namespace {

TEST(Rng, SameSeedSameSequence) {
  Rng a(7), b(7);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a.next_u64(), b.next_u64());
}

TEST(Rng, StreamsAndSeedsDiffer) {
  Rng a(7, 0), b(7, 1), c(8, 0);
  int same_ab = 0, same_ac = 0;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = a.next_u64();
    same_ab += x == b.next_u64();
    same_ac += x == c.next_u64();
  }
  EXPECT_EQ(same_ab, 0);
  EXPECT_EQ(same_ac, 0);
}

// Golden values pin the generator: a change here changes every workload users have drawn.
TEST(Rng, PinnedOutput) {
  Rng r(42);
  const uint64_t first = r.next_u64();
  Rng again(42);
  EXPECT_EQ(first, again.next_u64());
  // xoshiro256** reference: state words from SplitMix64 of (42 ^ splitmix(0)); recomputed
  // independently below.
  uint64_t sm = 0;
  auto splitmix = [](uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  uint64_t x = 42 ^ splitmix(sm);
  uint64_t s1 = 0;
  for (int i = 0; i < 2; ++i) s1 = splitmix(x);
  const uint64_t expected = ((s1 * 5) << 7 | (s1 * 5) >> 57) * 9;
  EXPECT_EQ(first, expected);
}

TEST(Rng, UniformMoments) {
  Rng r(1);
  const int n = 200000;
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; ++i) {
    const double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum2 += u * u;
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.005);        // sd of the mean ~ 0.00065
  EXPECT_NEAR(var, 1.0 / 12.0, 0.002);
}

TEST(Rng, NormalMoments) {
  Rng r(2);
  const int n = 200000;
  double sum = 0, sum2 = 0, sum4 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = r.normal();
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum2 / n, 1.0, 0.02);
  EXPECT_NEAR(sum4 / n, 3.0, 0.1);  // kurtosis of a normal
}

TEST(Rng, UniformIntIsUnbiased) {
  Rng r(3);
  const int k = 7, n = 70000;
  std::vector<int> counts(k, 0);
  for (int i = 0; i < n; ++i) {
    const uint64_t v = r.uniform_int(k);
    ASSERT_LT(v, static_cast<uint64_t>(k));
    ++counts[v];
  }
  double chi2 = 0;
  const double expect = static_cast<double>(n) / k;
  for (int c : counts) chi2 += (c - expect) * (c - expect) / expect;
  EXPECT_LT(chi2, 22.5);  // chi-square, 6 degrees of freedom, p = 0.001
}

TEST(Rng, StateRoundTrip) {
  Rng a(9);
  for (int i = 0; i < 10; ++i) a.next_u64();
  Rng b(0);
  b.set_state(a.state());
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.next_u64(), b.next_u64());
}

}  // namespace
}  // namespace distca
