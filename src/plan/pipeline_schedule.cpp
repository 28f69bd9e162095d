// Pipeline schedules, their messages and the executability checks (pipeline_schedule.h).
#include "distca/plan/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "distca/core/check.h"

namespace distca {

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

int64_t peak_in_flight(const std::vector<PipeOp>& ops) {
  int64_t cur = 0, peak = 0;
  for (const PipeOp& op : ops) {
    cur += op.backward ? -1 : 1;
    peak = std::max(peak, cur);
  }
  return peak;
}

// ---- Messages -------------------------------------------------------------------------

std::optional<P2pMessage> op_input(const PipeOp& op, int64_t p) {
  DISTCA_CHECK(op.stage >= 0 && op.stage < p);
  const int64_t s = op.stage, j = op.microbatch;
  if (!op.backward) {
    if (s == 0) return std::nullopt;
    return P2pMessage{s - 1, s, j, false, p2p_tag(j, false)};
  }
  if (s == p - 1) return std::nullopt;  // the loss is local
  return P2pMessage{s + 1, s, j, true, p2p_tag(j, true)};
}

std::optional<P2pMessage> op_output(const PipeOp& op, int64_t p) {
  DISTCA_CHECK(op.stage >= 0 && op.stage < p);
  const int64_t s = op.stage, j = op.microbatch;
  if (!op.backward) {
    if (s == p - 1) return std::nullopt;
    return P2pMessage{s, s + 1, j, false, p2p_tag(j, false)};
  }
  if (s == 0) return std::nullopt;
  return P2pMessage{s, s - 1, j, true, p2p_tag(j, true)};
}

StageProgram stage_program(const std::vector<PipeOp>& ops, int64_t p) {
  StageProgram out;
  out.reserve(ops.size());
  for (const PipeOp& op : ops) out.push_back({op, op_input(op, p), op_output(op, p)});
  return out;
}

std::vector<StageProgram> one_f_one_b_programs(int64_t p, int64_t m) {
  std::vector<StageProgram> out;
  for (const auto& ops : one_f_one_b(p, m)) out.push_back(stage_program(ops, p));
  return out;
}

std::vector<std::vector<PipeOp>> one_f_one_b_ticks(int64_t p, int64_t m) {
  const std::vector<StageProgram> programs = one_f_one_b_programs(p, m);
  auto ex = check_executable(programs);
  DISTCA_CHECK_MSG(ex.ok(), "1F1B is not executable: " + ex.status().message());
  std::vector<std::vector<PipeOp>> ticks(static_cast<size_t>(ex->makespan));
  // Stages in ascending order, so every tick's ops ascend by stage.
  for (size_t s = 0; s < programs.size(); ++s) {
    for (size_t i = 0; i < programs[s].size(); ++i) {
      ticks[static_cast<size_t>(ex->slot[s][i])].push_back(programs[s][i].op);
    }
  }
  return ticks;
}

std::array<Tick, 2> tick_directions(const std::vector<PipeOp>& tick) {
  std::array<Tick, 2> out;
  out[1].backward = true;
  for (const PipeOp& op : tick) out[op.backward ? 1 : 0].ops.push_back(op);
  return out;
}

// ---- Checks ---------------------------------------------------------------------------

namespace {

using MessageKey = std::tuple<int64_t, int64_t, int64_t>;  // (from, to, tag)
MessageKey key_of(const P2pMessage& msg) { return {msg.from, msg.to, msg.tag}; }

std::string op_name(const PipeOp& op) {
  std::string out(1, op.backward ? 'B' : 'F');
  out += std::to_string(op.microbatch);
  return out;
}

// "the gradient of micro-batch 1 (tag 3)"
std::string what(const P2pMessage& msg) {
  return std::string(msg.gradient ? "the gradient" : "the activations") + " of micro-batch " +
         std::to_string(msg.microbatch) + " (tag " + std::to_string(msg.tag) + ")";
}

// A message the execution model can carry: between neighbours in its direction, tagged by
// the rule, on stages that exist.
bool well_formed(const P2pMessage& msg, int64_t p) {
  return msg.from >= 0 && msg.from < p && msg.to >= 0 && msg.to < p && msg.microbatch >= 0 &&
         msg.to == msg.from + (msg.gradient ? -1 : 1) && msg.tag == p2p_tag(msg.microbatch, msg.gradient);
}

// The per-step rules that need no execution: stages, addressing, each op once, the stash.
Status check_steps(const std::vector<StageProgram>& programs) {
  const auto p = static_cast<int64_t>(programs.size());
  std::set<MessageKey> sends;
  for (int64_t s = 0; s < p; ++s) {
    const StageProgram& prog = programs[static_cast<size_t>(s)];
    std::set<std::pair<int64_t, bool>> seen;
    std::set<int64_t> held;  // forwarded, not yet backwarded
    for (size_t i = 0; i < prog.size(); ++i) {
      const StageStep& step = prog[i];
      const std::string at = "stage " + std::to_string(s) + " step " + std::to_string(i) + " (" + op_name(step.op) + ")";
      if (step.op.stage != s) return Status::invalid_argument(at + ": the op is on stage " + std::to_string(step.op.stage));
      if (step.op.microbatch < 0) return Status::invalid_argument(at + ": negative micro-batch");
      if (step.recv && (!well_formed(*step.recv, p) || step.recv->to != s)) {
        return Status::invalid_argument(at + ": receives " + what(*step.recv) + " not addressed to it by a neighbour");
      }
      if (step.send && (!well_formed(*step.send, p) || step.send->from != s)) {
        return Status::invalid_argument(at + ": sends " + what(*step.send) + " that is not its own to a neighbour");
      }
      if (!seen.insert({step.op.microbatch, step.op.backward}).second) {
        return Status::invalid_argument(at + ": the op appears twice");
      }
      if (!step.op.backward) {
        held.insert(step.op.microbatch);
      } else if (held.erase(step.op.microbatch) == 0) {
        return Status::invalid_argument(at + ": a backward before the stage's forward of micro-batch " +
                                        std::to_string(step.op.microbatch));
      }
      if (step.send && !sends.insert(key_of(*step.send)).second) {
        return Status::invalid_argument(at + ": posts " + what(*step.send) + " to stage " +
                                        std::to_string(step.send->to) + " a second time");
      }
    }
    if (!held.empty()) {
      return Status::invalid_argument("stage " + std::to_string(s) + " ends holding micro-batch " +
                                      std::to_string(*held.begin()) + " (forwarded, never backwarded)");
    }
  }
  return Status::ok_status();
}

}  // namespace

Result<Execution> check_executable(const std::vector<StageProgram>& programs) {
  DISTCA_RETURN_IF_ERROR(check_steps(programs));
  const size_t P = programs.size();
  Execution ex;
  ex.slot.resize(P);
  std::vector<size_t> next(P, 0);
  std::vector<int64_t> free_at(P, 0);
  std::map<MessageKey, int64_t> posted;  // message -> the slot whose end posts it
  std::set<MessageKey> consumed;
  // Each pass advances every stage as far as its receives allow; a slot depends only on the
  // stage's previous slot and the sender's slot, so the visiting order changes nothing.
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t s = 0; s < P; ++s) {
      const StageProgram& prog = programs[s];
      while (next[s] < prog.size()) {
        const StageStep& step = prog[next[s]];
        int64_t start = free_at[s];
        if (step.recv) {
          const auto it = posted.find(key_of(*step.recv));
          if (it == posted.end()) break;  // blocks: the sender has not got there yet
          if (!consumed.insert(it->first).second) {
            return Status::invalid_argument("stage " + std::to_string(s) + " step " + std::to_string(next[s]) + " (" +
                                            op_name(step.op) + "): receives " + what(*step.recv) + " a second time");
          }
          start = std::max(start, it->second + 1);
        }
        ex.slot[s].push_back(start);
        if (step.send) posted.emplace(key_of(*step.send), start);
        free_at[s] = start + 1;
        ++next[s];
        progress = true;
      }
    }
  }
  std::string stuck;
  for (size_t s = 0; s < P; ++s) {
    if (next[s] == programs[s].size()) continue;
    const StageStep& step = programs[s][next[s]];
    stuck += (stuck.empty() ? "deadlock: stage " : "; stage ") + std::to_string(s) + " waits at step " +
             std::to_string(next[s]) + " (" + op_name(step.op) + ") for " + what(*step.recv) + " from stage " +
             std::to_string(step.recv->from);
  }
  if (!stuck.empty()) return Status::invalid_argument(stuck);
  for (const auto& [key, slot] : posted) {
    if (consumed.count(key) != 0) continue;
    const auto [from, to, tag] = key;
    P2pMessage msg{from, to, tag / 2, (tag % 2) == 1, tag};
    return Status::invalid_argument("stage " + std::to_string(from) + " sends " + what(msg) + " to stage " +
                                    std::to_string(to) + ", which never receives it");
  }
  for (int64_t t : free_at) ex.makespan = std::max(ex.makespan, t);
  return ex;
}

// ---- Tables ---------------------------------------------------------------------------

namespace {

std::string table(const std::string& head, int64_t columns, const std::vector<std::string>& row_names,
                  const std::vector<std::vector<std::string>>& cells) {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on inlined `" " + s`.
  std::string out;
  auto cell = [&out](const std::string& text) {
    out += ' ';
    out += text;
    out += " |";
  };
  out += '|';
  cell(head);
  for (int64_t c = 0; c < columns; ++c) cell(std::to_string(c));
  out += "\n|---|";
  for (int64_t c = 0; c < columns; ++c) out += "---|";
  out += '\n';
  for (size_t r = 0; r < row_names.size(); ++r) {
    out += '|';
    cell(row_names[r]);
    for (const std::string& text : cells[r]) cell(text);
    out += '\n';
  }
  return out;
}

}  // namespace

std::string slot_table(const std::vector<StageProgram>& programs, const Execution& execution) {
  DISTCA_CHECK(execution.slot.size() == programs.size());
  std::vector<std::string> names;
  std::vector<std::vector<std::string>> cells(programs.size(), std::vector<std::string>(static_cast<size_t>(execution.makespan), "."));
  for (size_t s = 0; s < programs.size(); ++s) {
    names.push_back("stage " + std::to_string(s));
    DISTCA_CHECK(execution.slot[s].size() == programs[s].size());
    for (size_t i = 0; i < programs[s].size(); ++i) {
      const int64_t slot = execution.slot[s][i];
      DISTCA_CHECK(slot >= 0 && slot < execution.makespan);
      cells[s][static_cast<size_t>(slot)] = op_name(programs[s][i].op);
    }
  }
  return table("slot", execution.makespan, names, cells);
}

}  // namespace distca
