// Seeded, portable random numbers.
//
// Why our own: the distributions of <random> are implementation-defined, so the same seed
// would give different batches under libstdc++ and libc++. Rng is xoshiro256** seeded through
// SplitMix64, and every distribution below is written out here, so a seed means the same bits
// on every platform and compiler.
//
// Streams: Rng(seed, stream) gives statistically independent sequences for distinct stream
// ids under one seed (batch b of a workload uses stream b, for example), so drawing more
// batches never changes the earlier ones.
//
// Thread safety: an Rng is a small value; do not share one between threads without a lock.
#pragma once

#include <array>
#include <cstdint>

namespace distca {

class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0);

  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  // Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n), unbiased (Lemire's method). Precondition: n > 0.
  uint64_t uniform_int(uint64_t n);
  // Standard normal (Box-Muller; one fresh pair per call, no cached state).
  double normal();
  // Bernoulli(p).
  bool bernoulli(double p) { return uniform() < p; }

  // The full state (the seeding's reference test reads it).
  std::array<uint64_t, 4> state() const { return s_; }

 private:
  std::array<uint64_t, 4> s_;
};

}  // namespace distca
