// The monotonic clock every timing of the project reads (benchmarks, profiles, the trainer's
// step metrics): std::chrono::steady_clock (CLOCK_MONOTONIC, shared by every process of one
// machine). Thread safety: safe from any thread.
#pragma once

#include <chrono>

namespace distca {

// Seconds on the monotonic clock since an unspecified epoch (differences only).
inline double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace distca
