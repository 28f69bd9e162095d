// The pipeline schedules (plan/pipeline_schedule.h) against references written here:
// 1F1B against a closed-form enumeration of each stage's op at each position; 1F1B and its
// schedules against the dependency rules (every op once, forward before backward, forwards
// down the stages, backwards up) and the message rule; the executability check against an
// independent depth-first evaluation of the same unit-time execution, and against hand-made
// orders that deadlock or break a rule; the docs' slot tables against the printer.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "distca/plan/pipeline_schedule.h"

namespace distca {
namespace {

constexpr int64_t kMaxStages = 8;

// Every (p, m) the tests cover: p in 1..8, m in 1..4p (m < p included: both schedules allow it).
std::vector<std::pair<int64_t, int64_t>> shapes() {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t p = 1; p <= kMaxStages; ++p) {
    for (int64_t m = 1; m <= 4 * p; ++m) out.emplace_back(p, m);
  }
  return out;
}

// Standard 1F1B, the op at position k of stage s, in closed form: w = min(p-1-s, m) warm-up
// forwards, then 2(m-w) positions alternating forward (even offset) and backward, then w
// cool-down backwards.
PipeOp reference_1f1b_op(int64_t p, int64_t m, int64_t s, int64_t k) {
  const int64_t w = std::min(p - 1 - s, m);
  if (k < w) return {s, k, false};
  if (k < 2 * m - w) {
    const int64_t i = k - w;
    return i % 2 == 0 ? PipeOp{s, w + i / 2, false} : PipeOp{s, i / 2, true};
  }
  return {s, m - w + (k - (2 * m - w)), true};
}

using OpKey = std::tuple<int64_t, int64_t, bool>;  // (stage, micro-batch, backward)

// The op whose output `op` consumes (what it waits for), or nullopt for stage 0's forwards.
std::optional<OpKey> producer(const PipeOp& op, int64_t p) {
  if (!op.backward) {
    if (op.stage == 0) return std::nullopt;
    return OpKey{op.stage - 1, op.microbatch, false};
  }
  if (op.stage == p - 1) return OpKey{op.stage, op.microbatch, false};  // the loss
  return OpKey{op.stage + 1, op.microbatch, true};
}

// Every (stage, micro-batch) forward exactly once and backward exactly once, each on its own
// stage, forward before backward in the stage's order. Returns the position of every op.
std::map<OpKey, int64_t> check_every_op_once(const std::vector<std::vector<PipeOp>>& per_stage, int64_t p, int64_t m) {
  std::map<OpKey, int64_t> pos;
  EXPECT_EQ(static_cast<int64_t>(per_stage.size()), p);
  for (int64_t s = 0; s < static_cast<int64_t>(per_stage.size()); ++s) {
    const auto& ops = per_stage[static_cast<size_t>(s)];
    EXPECT_EQ(static_cast<int64_t>(ops.size()), 2 * m) << "stage " << s;
    for (size_t i = 0; i < ops.size(); ++i) {
      EXPECT_EQ(ops[i].stage, s);
      EXPECT_TRUE(ops[i].microbatch >= 0 && ops[i].microbatch < m);
      EXPECT_TRUE(pos.emplace(OpKey{s, ops[i].microbatch, ops[i].backward}, static_cast<int64_t>(i)).second)
          << "stage " << s << " runs (" << ops[i].microbatch << ", " << ops[i].backward << ") twice";
    }
  }
  EXPECT_EQ(static_cast<int64_t>(pos.size()), 2 * p * m);
  for (int64_t s = 0; s < p; ++s) {
    for (int64_t j = 0; j < m; ++j) {
      const auto f = pos.find({s, j, false}), b = pos.find({s, j, true});
      if (f != pos.end() && b != pos.end()) {
        EXPECT_LT(f->second, b->second) << "stage " << s << " micro-batch " << j;
      }
    }
  }
  return pos;
}

// Unit-time execution of per-stage orders, evaluated depth first (a different algorithm from
// check_executable's passes): slot(op) = max(slot(previous op of the stage), slot(producer))
// + 1. A cycle in that recursion is a deadlock; then the map is empty.
std::map<OpKey, int64_t> dfs_slots(const std::vector<std::vector<PipeOp>>& per_stage, int64_t p) {
  std::map<OpKey, std::pair<int64_t, int64_t>> where;  // op -> (stage, position)
  for (size_t s = 0; s < per_stage.size(); ++s) {
    for (size_t i = 0; i < per_stage[s].size(); ++i) {
      const PipeOp& op = per_stage[s][i];
      where[{op.stage, op.microbatch, op.backward}] = {static_cast<int64_t>(s), static_cast<int64_t>(i)};
    }
  }
  std::map<OpKey, int64_t> slot;
  std::set<OpKey> active;
  bool cycle = false;
  std::function<int64_t(const OpKey&)> eval = [&](const OpKey& key) -> int64_t {
    if (const auto it = slot.find(key); it != slot.end()) return it->second;
    if (!active.insert(key).second) {
      cycle = true;
      return 0;
    }
    const auto [s, i] = where.at(key);
    int64_t start = 0;
    if (i > 0) {
      const PipeOp& prev = per_stage[static_cast<size_t>(s)][static_cast<size_t>(i - 1)];
      start = eval({prev.stage, prev.microbatch, prev.backward}) + 1;
    }
    if (const auto dep = producer({std::get<0>(key), std::get<1>(key), std::get<2>(key)}, p)) {
      start = std::max(start, eval(*dep) + 1);
    }
    active.erase(key);
    slot[key] = start;
    return start;
  };
  for (const auto& [key, unused] : where) eval(key);
  if (cycle) slot.clear();
  return slot;
}

std::vector<std::vector<PipeOp>> ops_of(const std::vector<StageProgram>& programs) {
  std::vector<std::vector<PipeOp>> out;
  for (const StageProgram& prog : programs) {
    out.emplace_back();
    for (const StageStep& step : prog) out.back().push_back(step.op);
  }
  return out;
}

// The message rule, restated: activations down, gradients up, tag 2j + direction.
void check_messages(const StageStep& step, int64_t p) {
  const int64_t s = step.op.stage, j = step.op.microbatch;
  const bool b = step.op.backward;
  const bool has_recv = b ? s < p - 1 : s > 0;
  const bool has_send = b ? s > 0 : s < p - 1;
  ASSERT_EQ(step.recv.has_value(), has_recv) << "stage " << s << " op " << j << (b ? "B" : "F");
  ASSERT_EQ(step.send.has_value(), has_send) << "stage " << s << " op " << j << (b ? "B" : "F");
  if (has_recv) {
    EXPECT_EQ(*step.recv, (P2pMessage{b ? s + 1 : s - 1, s, j, b, 2 * j + (b ? 1 : 0)}));
  }
  if (has_send) {
    EXPECT_EQ(*step.send, (P2pMessage{s, b ? s - 1 : s + 1, j, b, 2 * j + (b ? 1 : 0)}));
  }
}

TEST(OneFOneB, MatchesTheClosedFormEnumeration) {
  for (const auto& [p, m] : shapes()) {
    const auto got = one_f_one_b(p, m);
    ASSERT_EQ(static_cast<int64_t>(got.size()), p);
    for (int64_t s = 0; s < p; ++s) {
      const auto& ops = got[static_cast<size_t>(s)];
      ASSERT_EQ(static_cast<int64_t>(ops.size()), 2 * m) << "p=" << p << " m=" << m << " s=" << s;
      for (int64_t k = 0; k < 2 * m; ++k) {
        EXPECT_EQ(ops[static_cast<size_t>(k)], reference_1f1b_op(p, m, s, k)) << "p=" << p << " m=" << m << " s=" << s << " k=" << k;
      }
    }
  }
}

TEST(OneFOneB, EveryOpOnceWithinTheMemoryCapAndExecutable) {
  for (const auto& [p, m] : shapes()) {
    SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
    const auto ops = one_f_one_b(p, m);
    check_every_op_once(ops, p, m);
    for (int64_t s = 0; s < p; ++s) {
      int64_t held = 0, peak = 0;
      for (const PipeOp& op : ops[static_cast<size_t>(s)]) {
        held += op.backward ? -1 : 1;
        peak = std::max(peak, held);
      }
      EXPECT_EQ(peak, std::min(p - s, m)) << "stage " << s;  // never more than p - s
      EXPECT_EQ(peak_in_flight(ops[static_cast<size_t>(s)]), peak);
    }
    // Forwards down, backwards up: the stages' orders admit an execution (no cycle), whose
    // unit-time slots the checker reproduces; the makespan is 1F1B's 2(m + p - 1).
    const auto slots = dfs_slots(ops, p);
    ASSERT_EQ(static_cast<int64_t>(slots.size()), 2 * p * m) << "the orders deadlock";
    const auto programs = one_f_one_b_programs(p, m);
    ASSERT_EQ(ops_of(programs), ops);
    for (const StageProgram& prog : programs) {
      for (const StageStep& step : prog) check_messages(step, p);
    }
    auto ex = check_executable(programs);
    ASSERT_TRUE(ex.ok()) << ex.status().to_string();
    int64_t makespan = 0;
    for (int64_t s = 0; s < p; ++s) {
      for (size_t i = 0; i < ops[static_cast<size_t>(s)].size(); ++i) {
        const PipeOp& op = ops[static_cast<size_t>(s)][i];
        const int64_t want = slots.at({op.stage, op.microbatch, op.backward});
        EXPECT_EQ(ex->slot[static_cast<size_t>(s)][i], want);
        makespan = std::max(makespan, want + 1);
      }
    }
    EXPECT_EQ(ex->makespan, makespan);
    EXPECT_EQ(ex->makespan, 2 * (m + p - 1));
  }
}

// Stage 0 runs B0 right after F0, while stage 1 forwards micro-batch 1 before its B0: stage 0
// waits for stage 1's gradient, stage 1 for stage 0's activations, round the ring.
// The mixed ticks CAD's pipelines run: 1F1B's slots as global ticks. Checked against the
// 1F1B order itself (each stage's ops in tick order are its one_f_one_b list), the tick count,
// at most one op per stage per tick, and every message (op_output) consumed (op_input) in a
// strictly later tick.
TEST(OneFOneBTicks, EachStageRunsItsOneFOneBOrderAndMessagesCrossTicks) {
  for (int64_t p = 1; p <= 8; ++p) {
    for (int64_t m = 1; m <= 4 * p; ++m) {
      const auto ticks = one_f_one_b_ticks(p, m);
      EXPECT_EQ(static_cast<int64_t>(ticks.size()), 2 * (m + p - 1)) << "p " << p << " m " << m;
      std::vector<std::vector<PipeOp>> per_stage(static_cast<size_t>(p));
      std::map<std::tuple<int64_t, int64_t, bool>, int64_t> sent;  // (to, micro-batch, gradient) -> tick
      for (size_t t = 0; t < ticks.size(); ++t) {
        std::set<int64_t> stages;
        for (const PipeOp& op : ticks[t]) {
          EXPECT_TRUE(stages.insert(op.stage).second) << "two ops of stage " << op.stage << " in tick " << t;
          per_stage[static_cast<size_t>(op.stage)].push_back(op);
          if (const auto in = op_input(op, p)) {
            const auto it = sent.find({in->to, in->microbatch, in->gradient});
            ASSERT_NE(it, sent.end()) << "p " << p << " m " << m << " tick " << t << ": input not sent yet";
            EXPECT_LT(it->second, static_cast<int64_t>(t)) << "p " << p << " m " << m << " tick " << t;
          }
        }
        for (const PipeOp& op : ticks[t]) {
          if (const auto out = op_output(op, p)) sent[{out->to, out->microbatch, out->gradient}] = static_cast<int64_t>(t);
        }
      }
      // tick_directions keeps every op, in the tick's order, under its own direction.
      for (const std::vector<PipeOp>& tick : ticks) {
        const auto dirs = tick_directions(tick);
        EXPECT_FALSE(dirs[0].backward);
        EXPECT_TRUE(dirs[1].backward);
        std::vector<PipeOp> fwd, bwd;
        for (const PipeOp& op : tick) (op.backward ? bwd : fwd).push_back(op);
        EXPECT_EQ(dirs[0].ops, fwd);
        EXPECT_EQ(dirs[1].ops, bwd);
      }
      const auto want = one_f_one_b(p, m);
      for (int64_t s = 0; s < p; ++s) {
        EXPECT_EQ(per_stage[static_cast<size_t>(s)], want[static_cast<size_t>(s)]) << "p " << p << " m " << m << " stage " << s;
        EXPECT_LE(peak_in_flight(per_stage[static_cast<size_t>(s)]), std::min(p - s, m));
      }
    }
  }
}

TEST(CheckExecutable, RejectsACycleThroughTheRingNamingTheStuckState) {
  for (int64_t p = 2; p <= kMaxStages; ++p) {
    for (int64_t m : {int64_t{2}, p, 4 * p}) {
      auto ops = one_f_one_b(p, m);
      auto& s0 = ops[0];
      s0.erase(std::find(s0.begin(), s0.end(), PipeOp{0, 0, true}));
      s0.insert(s0.begin() + 1, PipeOp{0, 0, true});
      auto& s1 = ops[1];
      const auto b0 = std::find(s1.begin(), s1.end(), PipeOp{1, 0, true});
      const auto f1 = std::find(s1.begin(), s1.end(), PipeOp{1, 1, false});
      if (b0 < f1) std::iter_swap(b0, f1);
      std::vector<StageProgram> programs;
      for (const auto& list : ops) programs.push_back(stage_program(list, p));
      EXPECT_TRUE(dfs_slots(ops, p).empty()) << "the reference finds no cycle";
      auto ex = check_executable(programs);
      ASSERT_FALSE(ex.ok()) << "p=" << p << " m=" << m;
      const std::string& msg = ex.status().message();
      const std::string s1_wait = "stage 1 waits at step " +
                                  std::to_string(std::find(s1.begin(), s1.end(), PipeOp{1, 1, false}) - s1.begin()) +
                                  " (F1) for the activations of micro-batch 1 (tag 2) from stage 0";
      EXPECT_EQ(msg.rfind("deadlock: stage 0 waits at step 1 (B0) for the gradient of micro-batch 0 (tag 1) from stage 1; " + s1_wait, 0), 0u)
          << msg;
    }
  }
}

TEST(CheckExecutable, RejectsBrokenPrograms) {
  const int64_t p = 3, m = 4;
  {  // a send left out: the receiver waits for ever
    auto programs = one_f_one_b_programs(p, m);
    programs[0][0].send.reset();
    auto ex = check_executable(programs);
    ASSERT_FALSE(ex.ok());
    EXPECT_EQ(ex.status().message(),
              "deadlock: stage 0 waits at step 3 (B0) for the gradient of micro-batch 0 (tag 1) from stage 1; "
              "stage 1 waits at step 0 (F0) for the activations of micro-batch 0 (tag 0) from stage 0; "
              "stage 2 waits at step 0 (F0) for the activations of micro-batch 0 (tag 0) from stage 1");
  }
  {  // a receive left out: the message is never consumed
    auto programs = one_f_one_b_programs(p, m);
    programs[2][0].recv.reset();
    auto ex = check_executable(programs);
    ASSERT_FALSE(ex.ok());
    EXPECT_EQ(ex.status().message(), "stage 1 sends the activations of micro-batch 0 (tag 0) to stage 2, which never receives it");
  }
  {  // the last stage's backward before its forward (no message would catch it)
    auto programs = one_f_one_b_programs(p, m);
    std::swap(programs[2][0], programs[2][1]);
    auto ex = check_executable(programs);
    ASSERT_FALSE(ex.ok());
    EXPECT_EQ(ex.status().message(), "stage 2 step 0 (B0): a backward before the stage's forward of micro-batch 0");
  }
  {  // an op twice, a forward never backwarded, a wrong tag, an op on the wrong stage
    auto programs = one_f_one_b_programs(p, m);
    programs[1].push_back(programs[1][0]);
    EXPECT_NE(check_executable(programs).status().message().find("appears twice"), std::string::npos);
    programs = one_f_one_b_programs(p, m);
    programs[0].pop_back();
    EXPECT_EQ(check_executable(programs).status().message(),
              "stage 0 ends holding micro-batch 3 (forwarded, never backwarded)");
    programs = one_f_one_b_programs(p, m);
    programs[1][0].recv->tag = 1;
    EXPECT_NE(check_executable(programs).status().message().find("not addressed to it"), std::string::npos);
    programs = one_f_one_b_programs(p, m);
    programs[1][0].op.stage = 0;
    EXPECT_NE(check_executable(programs).status().message().find("the op is on stage 0"), std::string::npos);
  }
}

std::string read_doc(const std::string& rel) {
  std::ifstream in(std::string(DISTCA_SOURCE_DIR) + "/" + rel);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// docs/runtime.md's tables are this printer's output (and docs/simulation-model.md's, drawn
// earlier by hand, agree with it).
TEST(Tables, TheDocsDrawTheseSchedules) {
  const std::string runtime_doc = read_doc("docs/runtime.md"), sim_doc = read_doc("docs/simulation-model.md");
  ASSERT_FALSE(runtime_doc.empty());
  const auto one_f_one_b_table = [](int64_t p, int64_t m) {
    const auto programs = one_f_one_b_programs(p, m);
    return slot_table(programs, check_executable(programs).value());
  };
  const std::string f48 = one_f_one_b_table(4, 8), f44 = one_f_one_b_table(4, 4);
  EXPECT_NE(runtime_doc.find(f48), std::string::npos) << "docs/runtime.md lacks\n" << f48;
  EXPECT_NE(sim_doc.find(f44), std::string::npos) << "docs/simulation-model.md lacks\n" << f44;
}

}  // namespace
}  // namespace distca
