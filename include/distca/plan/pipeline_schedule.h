// Pipeline schedules as data: the op orders the trainer executes and the simulator replays
// (both call these functions), so the two cannot drift apart.
// docs/runtime.md "Pipeline schedules" draws both for P = 4, M = 8.
//
// Schedules
//   one_f_one_b(p, m)      standard 1F1B, per stage: min(p-1-s, m) warm-up forwards, then
//                          alternating (forward, backward), then the remaining backwards.
//                          Stages run asynchronously; a forward waits for the previous stage's
//                          forward of that micro-batch, a backward for the next stage's.
//                          Stage s never holds more than min(p-s, m) micro-batches.
//   one_f_one_b_ticks(p, m) 1F1B's unit-time slots as global ticks of mixed directions: what
//                          `distca train --mode cad --pp P` runs and the simulator replays
//                          (each tick's forwards and backwards pooled per direction;
//                          runtime/tick_runner.h). Memory as 1F1B's.
//
// Messages (point to point between neighbouring stages; op_input / op_output)
//   forward  of micro-batch j on stage s: receives j's activations from s-1 before it (s > 0),
//                                         sends its output activations to s+1 after it (s < p-1)
//   backward of micro-batch j on stage s: receives j's output gradient from s+1 before it
//                                         (s < p-1), sends its input gradient to s-1 after it (s > 0)
//   tag = p2p_tag(j, gradient) = 2j + (gradient ? 1 : 0). Between two stages activations flow
//   only down and gradients only up, and each (micro-batch, direction) crosses once per step,
//   so (sender, receiver, tag) names one message of a step; a trainer that lets messages of
//   consecutive steps meet relies on the communicator's in-order matching per (peer, tag).
//   The last stage's backward of j needs its own forward of j (the loss), no message.
//
// Execution model (what check_executable proves). Each stage runs its StageProgram in order:
// for each step it blocks until `recv` has arrived (blocking at need), runs the op, then posts
// `send` without waiting for it (non-blocking; the sender keeps the buffer until it completes).
// In one_f_one_b_ticks every message sent in tick t is received in a tick > t, so a runner
// that executes ticks in order, with per-tick collectives over all ranks (CAD's pooled
// attention plans), never waits on a message of its own tick.
//
// Thread safety: pure functions on values.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distca/core/status.h"

namespace distca {

struct PipeOp {
  int64_t stage = 0;
  int64_t microbatch = 0;
  bool backward = false;
  bool operator==(const PipeOp&) const = default;
};

// [stage][ops in execution order]. Preconditions: p >= 1, m >= 1.
std::vector<std::vector<PipeOp>> one_f_one_b(int64_t p, int64_t m);

// One direction of a tick: its ops of that direction.
struct Tick {
  bool backward = false;
  std::vector<PipeOp> ops;  // at most one per stage, ascending stage
};

// Largest number of micro-batches a stage holds at once (forwarded, not yet backwarded), for
// an op order of that stage.
int64_t peak_in_flight(const std::vector<PipeOp>& stage_ops);

// ---- Messages -------------------------------------------------------------------------

// The tag of micro-batch j's activations (gradient = false) or gradient (gradient = true).
constexpr int64_t p2p_tag(int64_t microbatch, bool gradient) { return 2 * microbatch + (gradient ? 1 : 0); }

struct P2pMessage {
  int64_t from = 0;        // sending stage
  int64_t to = 0;          // receiving stage (from + 1 for activations, from - 1 for gradients)
  int64_t microbatch = 0;
  bool gradient = false;   // false: activations, forward; true: a gradient, backward
  int64_t tag = 0;         // p2p_tag(microbatch, gradient)
  bool operator==(const P2pMessage&) const = default;
};

// What `op` receives before it runs and sends after it, in a pipeline of p stages (nullopt:
// nothing). Precondition: 0 <= op.stage < p.
std::optional<P2pMessage> op_input(const PipeOp& op, int64_t p);
std::optional<P2pMessage> op_output(const PipeOp& op, int64_t p);

struct StageStep {
  PipeOp op;
  std::optional<P2pMessage> recv;  // block for it before op
  std::optional<P2pMessage> send;  // post it (non-blocking) after op
  bool operator==(const StageStep&) const = default;
};
using StageProgram = std::vector<StageStep>;  // one stage's steps, in execution order

// Every op with its messages (op_input, op_output). Precondition: 0 <= op.stage < p.
StageProgram stage_program(const std::vector<PipeOp>& ops, int64_t p);
// [stage] the 1F1B program of every stage. Preconditions: p >= 1, m >= 1.
std::vector<StageProgram> one_f_one_b_programs(int64_t p, int64_t m);

// ---- Checks ---------------------------------------------------------------------------

struct Execution {
  // slot[s][i]: the unit-time slot step i of stage s runs in when every op takes one slot
  // and a message sent at the end of slot t can be received in slot t + 1.
  std::vector<std::vector<int64_t>> slot;
  int64_t makespan = 0;  // slots until the last stage finishes
};

// Runs the programs (programs.size() stages) under the execution model above. Errors
// (invalid_argument, one line): a step on the wrong stage or with a message not addressed
// to or from its stage, an op that appears twice, a backward before its stage's forward of
// the micro-batch, a message posted twice, a deadlock ("deadlock: stage 0 waits at step 3
// (B1) for the gradient of micro-batch 1 (tag 3) from stage 1; ..." naming every stage that
// cannot go on, the first stuck state), a message never received, or a stage that ends
// holding a micro-batch it forwarded and never backwarded.
Result<Execution> check_executable(const std::vector<StageProgram>& programs);

// ---- Mixed ticks ------------------------------------------------------------------------

// 1F1B's unit-time slots (check_executable on one_f_one_b_programs) as global ticks: tick t
// holds the op every stage runs in slot t, forwards of some stages and backwards of others
// (at most one op per stage, ascending stage). Every stage runs its 1F1B order, so it never
// holds more than min(p - s, m) micro-batches, and every message is sent in one tick and
// received in a later one. 2(m + p - 1) ticks. CAD's pipelines in `distca train` run these:
// each tick's forward members and backward members are pooled and planned apart and served
// in one interleaved pass (runtime/tick_runner.h). Preconditions: p >= 1, m >= 1.
std::vector<std::vector<PipeOp>> one_f_one_b_ticks(int64_t p, int64_t m);
// A tick of one_f_one_b_ticks split by direction: [0] its forwards, [1] its backwards (each
// Tick::backward set, ops in the tick's order). CAD pools and plans each direction apart.
std::array<Tick, 2> tick_directions(const std::vector<PipeOp>& tick);

// ---- Tables (docs/runtime.md is generated from these) --------------------------------------

// Markdown: header "slot", one row per stage, each step in its Execution slot.
std::string slot_table(const std::vector<StageProgram>& programs, const Execution& execution);

}  // namespace distca
