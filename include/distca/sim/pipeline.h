// Pipeline schedules the simulator runs (docs/simulation-model.md draws them as tick tables).
//
//   one_f_one_b(p, m)      standard 1F1B, per stage: min(p-1-s, m) warm-up forwards, then
//                          alternating (forward, backward), then the remaining backwards.
//                          Stages run asynchronously; a forward waits for the previous stage's
//                          forward of that micro-batch, a backward for the next stage's.
//   phase_aligned(p, m)    CAD's 1F1B: global ticks in which every active stage runs a forward
//                          (an F tick) or every active stage a backward (a B tick). Tick types:
//                          p-1 warm-up F ticks, then F and B alternating for 2m ticks, then
//                          p-1 drain B ticks: 2(m+p-1) ticks, as many as 1F1B's slots. In each
//                          tick every stage runs the next op of the tick's type whose input is
//                          ready (produced in an EARLIER tick). No in-flight cap: a stage may
//                          hold more micro-batches than 1F1B's p-s (the paper's deferred
//                          backwards); peak_in_flight reports it (memory counts it).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace distca::sim {

struct PipeOp {
  int64_t stage = 0;
  int64_t microbatch = 0;
  bool backward = false;
  bool operator==(const PipeOp&) const = default;
};

// [stage][ops in execution order]. Preconditions: p >= 1, m >= 1.
std::vector<std::vector<PipeOp>> one_f_one_b(int64_t p, int64_t m);

struct Tick {
  bool backward = false;
  std::vector<PipeOp> ops;  // at most one per stage, ascending stage
};
// Preconditions: p >= 1, m >= 1. Every (stage, micro-batch) appears once forward and once
// backward, each forward after the previous stage's forward of that micro-batch and each
// backward after the next stage's backward (and the stage's own forward).
std::vector<Tick> phase_aligned(int64_t p, int64_t m);

// Largest number of micro-batches stage `s` holds at once (forwarded, not yet backwarded),
// for an op order of that stage.
int64_t peak_in_flight(const std::vector<PipeOp>& stage_ops);
// The ops of stage s in tick order.
std::vector<PipeOp> stage_ops(const std::vector<Tick>& ticks, int64_t s);

}  // namespace distca::sim
