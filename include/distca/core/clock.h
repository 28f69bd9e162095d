// The monotonic clock every timing of the project reads (benchmarks, profiles, the trainer's
// step metrics): std::chrono::steady_clock (CLOCK_MONOTONIC, shared by every process of one
// machine). Thread safety: safe from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

namespace distca {

// Seconds on the monotonic clock since an unspecified epoch (differences only).
inline double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A timed measurement of a profile: `call` run back to back, at least once, until
// `min_seconds` have passed on `now` since `start` (a reading of `now` the caller just took).
// Under a CPU cap (a CFS quota of Q per period P) a call shorter than a period runs at the
// whole core's speed or waits out the rest of the period, depending on when it starts, while
// training's phases, many periods long, run at the share Q / P: timed over many periods, the
// figure per call is the share's (docs/netlab.md, "Emulating devices with CPU caps").
struct CallTiming {
  double per_call = 0;  // (end - start) / calls
  double end = 0;       // the last reading of `now`
  int64_t calls = 0;
};
inline CallTiming time_calls(const std::function<void()>& call, double min_seconds, const std::function<double()>& now,
                             double start) {
  CallTiming t;
  do {
    call();
    ++t.calls;
    t.end = now();
  } while (t.end - start < min_seconds);
  t.per_call = (t.end - start) / static_cast<double>(t.calls);
  return t;
}

}  // namespace distca
