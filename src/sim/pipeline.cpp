// Pipeline schedules (pipeline.h).
#include "distca/sim/pipeline.h"

#include <algorithm>

#include "distca/core/check.h"

namespace distca::sim {

std::vector<std::vector<PipeOp>> one_f_one_b(int64_t p, int64_t m) {
  DISTCA_CHECK(p >= 1 && m >= 1);
  std::vector<std::vector<PipeOp>> out(static_cast<size_t>(p));
  for (int64_t s = 0; s < p; ++s) {
    auto& ops = out[static_cast<size_t>(s)];
    const int64_t warm = std::min(p - 1 - s, m);
    int64_t f = 0, b = 0;
    for (; f < warm; ++f) ops.push_back({s, f, false});
    while (f < m) {
      ops.push_back({s, f++, false});
      ops.push_back({s, b++, true});
    }
    while (b < m) ops.push_back({s, b++, true});
  }
  return out;
}

std::vector<Tick> phase_aligned(int64_t p, int64_t m) {
  DISTCA_CHECK(p >= 1 && m >= 1);
  const auto P = static_cast<size_t>(p);
  // fwd_tick[s][j] / bwd_tick[s][j]: the tick that ran it, -1 while pending.
  std::vector<std::vector<int64_t>> fwd_tick(P, std::vector<int64_t>(static_cast<size_t>(m), -1));
  std::vector<std::vector<int64_t>> bwd_tick = fwd_tick;
  std::vector<int64_t> next_f(P, 0), next_b(P, 0);
  std::vector<Tick> ticks;
  int64_t remaining = 2 * p * m;
  for (int64_t t = 0; remaining > 0; ++t) {
    // Warm-up F ticks, then alternate starting with F, then B until everything drains.
    bool backward;
    if (t < p - 1) {
      backward = false;
    } else if (t < p - 1 + 2 * m) {
      backward = ((t - (p - 1)) % 2) == 1;
    } else {
      backward = true;
    }
    Tick tick;
    tick.backward = backward;
    for (int64_t s = 0; s < p; ++s) {
      const auto u = static_cast<size_t>(s);
      if (!backward) {
        const int64_t j = next_f[u];
        if (j >= m) continue;
        const bool ready = s == 0 || (fwd_tick[u - 1][static_cast<size_t>(j)] >= 0 &&
                                      fwd_tick[u - 1][static_cast<size_t>(j)] < t);
        if (!ready) continue;
        fwd_tick[u][static_cast<size_t>(j)] = t;
        ++next_f[u];
        tick.ops.push_back({s, j, false});
      } else {
        const int64_t j = next_b[u];
        if (j >= m) continue;
        const int64_t dep = s == p - 1 ? fwd_tick[u][static_cast<size_t>(j)] : bwd_tick[u + 1][static_cast<size_t>(j)];
        if (dep < 0 || dep >= t) continue;
        bwd_tick[u][static_cast<size_t>(j)] = t;
        ++next_b[u];
        tick.ops.push_back({s, j, true});
      }
      --remaining;
    }
    ticks.push_back(std::move(tick));
    DISTCA_CHECK_MSG(t < 8 * (p + m) + 8, "phase_aligned: the schedule does not drain");
  }
  return ticks;
}

int64_t peak_in_flight(const std::vector<PipeOp>& ops) {
  int64_t cur = 0, peak = 0;
  for (const PipeOp& op : ops) {
    cur += op.backward ? -1 : 1;
    peak = std::max(peak, cur);
  }
  return peak;
}

std::vector<PipeOp> stage_ops(const std::vector<Tick>& ticks, int64_t s) {
  std::vector<PipeOp> out;
  for (const Tick& t : ticks) {
    for (const PipeOp& op : t.ops) {
      if (op.stage == s) out.push_back(op);
    }
  }
  return out;
}

}  // namespace distca::sim
