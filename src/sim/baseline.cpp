// The co-located strategies: colocated packing, WLB-ideal (wlb, wlb:C) and per-document CP
// (percp:C), each pipeline replica running standard 1F1B (docs/simulation-model.md,
// "Co-located strategies").
//
// Per micro-batch the planner gives each unit its tokens, its attention tasks and its bytes:
//   colocated / wlb at CP 1   schedule_colocated / schedule_wlb; the K/V context of a document's
//                             earlier pieces held on other units is fetched before attention
//                             (compute_traffic), exposed, per unit (no group to wait for).
//   CP degree C > 1, percp    documents are served head-tail over the units of the CP groups
//                             holding them (what schedule_percp places); the group all-gathers
//                             K/V once per layer (exposed, a group barrier) and reduce-scatters
//                             dK/dV in backward. wlb:C first re-packs documents over the DP
//                             groups with schedule_wlb (a group is one rank of C x the tokens).
// The head-tail CP accounting is done here in closed form (chunk k of 2C' to server k or
// 2C'-1-k; each server receives the rows it does not hold) because schedule_percp's task list
// has 2C' tasks per document and compute_allgather walks C'^2 runs per document: at C = 512
// that is too slow for a sweep. test_sim_strategies checks this accounting against
// schedule_percp + server_loads + compute_allgather.
#include <algorithm>
#include <chrono>

#include "distca/plan/doc_index.h"
#include "distca/plan/plan.h"
#include "distca/plan/schedule.h"
#include "distca/plan/traffic.h"
#include "engine.h"

namespace distca::sim::detail {
namespace {

// One unit's figures for one micro-batch, one layer.
struct UnitWork {
  double tokens = 0;
  double attention_seconds = 0;  // forward + backward
  double pairs = 0;              // causal pairs served
  double fwd_sent = 0, fwd_recv = 0, bwd_sent = 0, bwd_recv = 0;  // bytes
  // CP 1: messages of the context fetch (peers sent to / received from, network.h); the
  // backward returns dK/dV over the same pairs reversed.
  int64_t fwd_sends = 0, fwd_receives = 0;
};
// work[j][i]: micro-batch j, unit i of a stage.
using Work = std::vector<std::vector<UnitWork>>;

ScheduleOptions schedule_options(const Rates& R) {
  ScheduleOptions so;
  so.model = R.o.model;
  so.dtype_bytes = R.o.dtype_bytes;
  so.tolerance = R.o.tolerance;
  so.cost = &R.cost;
  so.wlb_mem_cap = R.o.wlb_mem_cap;
  return so;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// `c` consecutive units form one rank of c x the tokens.
Batch merge_groups(const Batch& b, int64_t c) {
  Batch g;
  g.ranks = b.ranks / c;
  g.tokens_per_rank = b.tokens_per_rank * c;
  g.per_rank.assign(static_cast<size_t>(g.ranks), {});
  for (int64_t r = 0; r < b.ranks; ++r) {
    auto& dst = g.per_rank[static_cast<size_t>(r / c)];
    const auto& src = b.per_rank[static_cast<size_t>(r)];
    dst.insert(dst.end(), src.begin(), src.end());
  }
  return g;
}

// Head-tail CP accounting (see the file comment). `groups` from percp_groups over `index`:
// the serving units of group g are g*c .. g*c+c-1. peers (c = 1, where the gather is timed as
// an all-to-all of each unit's own messages; else nullptr): every unit holding rows of a
// document sends to every other serving unit of it.
void cp_accounting(const Rates& R, const DocumentIndex& index, const std::vector<std::vector<int64_t>>& groups,
                   int64_t c, std::vector<UnitWork>& out, int64_t& tasks, PeerLists* peers) {
  const auto kv = static_cast<double>(R.row_bytes.kv);
  // Every serving unit receives the whole document but what it holds: L rows are added per
  // group here (once per document, not per unit) and each chunk's rows subtracted below, so a
  // document costs O(groups + non-empty chunks), not O(C').
  std::vector<double> group_recv(out.size() / static_cast<size_t>(c), 0.0);
  for (size_t slot = 0; slot < groups.size(); ++slot) {
    const int64_t L = index.doc_len(index.doc_ids()[slot]);
    const std::vector<int64_t>& grp = groups[slot];
    const auto C = static_cast<int64_t>(grp.size()) * c;  // serving units S[0 .. C)
    for (int64_t g : grp) group_recv[static_cast<size_t>(g)] += static_cast<double>(L) * kv;
    std::vector<int64_t> holders;  // units holding a chunk (peers only)
    auto chunk = [&](int64_t k, int64_t lo, int64_t hi) {  // chunk k = rows [lo, hi)
      const int64_t i = k < C ? k : 2 * C - 1 - k;
      const int64_t unit = grp[static_cast<size_t>(i / c)] * c + i % c;
      if (peers != nullptr && (holders.empty() || holders.back() != unit)) holders.push_back(unit);
      UnitWork& w = out[static_cast<size_t>(unit)];
      const auto rows = static_cast<double>(hi - lo);
      w.attention_seconds += R.cost.seconds(hi - lo, hi);
      w.pairs += static_cast<double>(causal_pairs(lo, hi));
      w.tokens += rows;
      w.fwd_recv -= rows * kv;
      w.fwd_sent += rows * static_cast<double>(C - 1) * kv;
      ++tasks;
    };
    if (L >= 2 * C) {  // every chunk k = [floor(kL/2C), floor((k+1)L/2C)) is non-empty
      for (int64_t k = 0; k < 2 * C; ++k) chunk(k, k * L / (2 * C), (k + 1) * L / (2 * C));
    } else {  // chunks of 0 or 1 row: row r lies in chunk ceil(2C(r+1)/L) - 1
      for (int64_t r = 0; r < L; ++r) chunk(((r + 1) * 2 * C - 1) / L, r, r + 1);
    }
    if (peers != nullptr && C > 1) {
      for (const int64_t from : holders) {
        for (const int64_t g : grp) peers->add(from, g);  // c = 1: unit g serves (from == g is dropped)
      }
    }
  }
  for (size_t u = 0; u < out.size(); ++u) {
    UnitWork& w = out[u];
    w.fwd_recv += group_recv[u / static_cast<size_t>(c)];
    w.bwd_sent = w.fwd_recv;  // backward: the reduce-scatter of dK/dV mirrors the all-gather
    w.bwd_recv = w.fwd_sent;
  }
}

Status layout_microbatch(const Rates& R, const Batch& b, int64_t c, std::vector<UnitWork>& out, PlanStats& ps) {
  const StrategyKind kind = R.o.strategy.kind;
  const ScheduleOptions so = schedule_options(R);
  out.assign(static_cast<size_t>(R.units_per_stage), {});
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tasks = 0;
  const double fwd_bytes_before = ps.comm_bytes_forward;
  if (kind != StrategyKind::kPerCp && c == 1) {
    auto s = kind == StrategyKind::kColocated ? schedule_colocated(b, so) : schedule_wlb(b, so);
    if (!s.ok()) return s.status();
    ps.plan_seconds += seconds_since(t0);
    const DocumentIndex index(s->batch);
    const Traffic t = compute_traffic(index, s->tasks, R.row_bytes);
    PeerLists fetch(R.units_per_stage), queries(R.units_per_stage);
    add_plan_peers(index, s->tasks, nullptr, fetch, queries);
    fetch.merge(queries.transposed());  // O + LSE back, should a task run away from home
    std::vector<int64_t> sends, receives;
    fetch.counts(sends, receives);
    for (const TaskPlacement& task : s->tasks) {
      UnitWork& w = out[static_cast<size_t>(task.server)];
      const int64_t q = task.q_end - task.q_begin;
      w.attention_seconds += R.cost.task_cost(q, task.q_end);
      w.pairs += static_cast<double>(task_pairs(q, task.q_end));
    }
    for (int64_t r = 0; r < R.units_per_stage; ++r) {
      UnitWork& w = out[static_cast<size_t>(r)];
      const RankBytes& rb = t.per_rank[static_cast<size_t>(r)];
      w.tokens = static_cast<double>(s->batch.rank_tokens(r));
      w.fwd_sends = sends[static_cast<size_t>(r)];
      w.fwd_receives = receives[static_cast<size_t>(r)];
      w.fwd_sent = static_cast<double>(rb.fwd_sent);
      w.fwd_recv = static_cast<double>(rb.fwd_recv);
      w.bwd_sent = static_cast<double>(rb.bwd_sent);
      w.bwd_recv = static_cast<double>(rb.bwd_recv);
    }
    tasks = static_cast<int64_t>(s->tasks.size());
    ps.comm_bytes_forward += static_cast<double>(t.bytes.forward());
    ps.comm_bytes_backward += static_cast<double>(t.bytes.backward());
  } else {
    Schedule repacked;
    const Batch* src = &b;
    int64_t k = c;
    if (kind == StrategyKind::kWlb) {
      auto s = schedule_wlb(merge_groups(b, c), so);
      if (!s.ok()) return s.status();
      repacked = std::move(s).value();
      src = &repacked.batch;
      k = 1;
    } else {
      DISTCA_RETURN_IF_ERROR(b.validate());
    }
    const DocumentIndex index(*src);
    PeerLists peers(R.units_per_stage);
    cp_accounting(R, index, percp_groups(index, k), c, out, tasks, c == 1 ? &peers : nullptr);
    if (c == 1) {
      peers.normalize();
      std::vector<int64_t> sends, receives;
      peers.counts(sends, receives);
      for (size_t u = 0; u < out.size(); ++u) {
        out[u].fwd_sends = sends[u];
        out[u].fwd_receives = receives[u];
      }
    }
    ps.plan_seconds += seconds_since(t0);
    for (const UnitWork& w : out) {
      ps.comm_bytes_forward += w.fwd_recv;
      ps.comm_bytes_backward += w.bwd_recv;
    }
  }
  // With checkpointing the backward's recompute gathers (fetches) the K/V again.
  if (R.o.activation_checkpointing) ps.comm_bytes_backward += ps.comm_bytes_forward - fwd_bytes_before;
  std::vector<double> loads;
  for (const UnitWork& w : out) loads.push_back(w.attention_seconds);
  ps.plans += 1;
  ps.tasks += tasks;
  ps.load_max_over_mean = std::max(ps.load_max_over_mean, max_over_mean(loads));
  ps.load_before_max_over_mean =
      std::max(ps.load_before_max_over_mean, max_over_mean(colocated_loads(b, &R.cost)));
  return Status::ok_status();
}

// Seconds of one unit's context fetch (forward) or dK/dV return (backward): its part of an
// all-to-all of its own messages (no messages: nothing to wait for).
double transfer_seconds(const Rates& R, const UnitWork& w, bool bwd) {
  // The bytes (traffic.h) and the pairs (add_plan_peers) are two books of one plan.
  if (bwd) {
    DISTCA_CHECK(messages_cover_bytes(w.bwd_sent, w.bwd_recv, w.fwd_receives, w.fwd_sends));
    return all_to_all_unit_seconds(R.exchange, w.bwd_sent, w.bwd_recv, w.fwd_receives, w.fwd_sends);
  }
  DISTCA_CHECK(messages_cover_bytes(w.fwd_sent, w.fwd_recv, w.fwd_sends, w.fwd_receives));
  return all_to_all_unit_seconds(R.exchange, w.fwd_sent, w.fwd_recv, w.fwd_sends, w.fwd_receives);
}

// One op (micro-batch j, forward or backward) of CP group g on stage s, starting at t: the
// stage's layers, a group barrier per layer when c > 1. Returns the end time.
double run_group_op(const Rates& R, const Work& work, Recorder& rec, int64_t c, int64_t s, int64_t g, int64_t j,
                    bool bwd, double t) {
  const int64_t p = R.pp, ups = R.units_per_stage;
  const double share = R.attn_fwd_share;
  const auto& W = work[static_cast<size_t>(j)];
  const int64_t base = s * ups + g * c;
  const int64_t layers = R.stage_layers[static_cast<size_t>(s)];
  const bool last = s == p - 1;
  const char* lin_name = bwd ? "bwd linear" : "fwd linear";
  const char* att_name = bwd ? "bwd attention" : "fwd attention";
  const char* comm_name = c > 1 ? (bwd ? "dK/dV reduce-scatter" : "K/V all-gather")
                                : (bwd ? "dK/dV return" : "K/V fetch");
  auto lm = [&]() {
    double end = t;
    for (int64_t i = 0; i < c; ++i) {
      const UnitWork& w = W[static_cast<size_t>(g * c + i)];
      const double d = rec.linear(base + i, t, (bwd ? R.lm_head_bwd_per_token : R.lm_head_fwd_per_token) * w.tokens,
                                  bwd ? "bwd lm head" : "fwd lm head", j);
      end = std::max(end, t + d);
    }
    t = end;
  };
  if (last && bwd) lm();
  // The group's all-gather (grads: its reduce-scatter of dK/dV), a barrier of the group.
  auto group_collective = [&](bool grads) {
    double coll = 0;
    for (int64_t i = 0; i < c; ++i) {  // the ring lasts as long as its busiest unit's part
      const UnitWork& w = W[static_cast<size_t>(g * c + i)];
      coll = std::max(coll, grads ? ring_seconds(R.exchange, c, w.bwd_sent, w.bwd_recv)
                                  : ring_seconds(R.exchange, c, w.fwd_sent, w.fwd_recv));
    }
    return coll;
  };
  // With checkpointing nothing gathered is kept: the backward's recompute of a layer gathers
  // (fetches) its K/V again, at the forward's cost, before the attention backward.
  const bool regather = bwd && R.o.activation_checkpointing;
  const char* regather_name = c > 1 ? "K/V re-gather (recompute)" : "K/V re-fetch (recompute)";
  for (int64_t k = 0; k < layers; ++k) {
    const double coll = c > 1 ? group_collective(bwd) : 0.0;
    const double coll_again = c > 1 && regather ? group_collective(false) : 0.0;
    double end = t;
    for (int64_t i = 0; i < c; ++i) {
      const UnitWork& w = W[static_cast<size_t>(g * c + i)];
      const int64_t u = base + i;
      const double sent = bwd ? w.bwd_sent : w.fwd_sent, recv = bwd ? w.bwd_recv : w.fwd_recv;
      const double x0 = !regather ? 0.0 : (c > 1 ? coll_again : transfer_seconds(R, w, false));
      const double xr = c > 1 ? coll : transfer_seconds(R, w, bwd);
      // Forward: the K/V fetch (all-gather), then the layer. Backward: the linear backward
      // (with the recompute), the K/V re-gather, the attention backward, then the dK/dV it
      // produced goes back (reduce-scatter): exposed either way.
      const double pre = bwd ? 0.0 : xr;
      if (!bwd) {
        rec.comm(u, t, xr, sent, recv, comm_name, j);
        rec.wait(u, t, t + xr, t);
      }
      // Durations as the recorder charged them (wall seconds under processor sharing).
      const double lin = rec.linear(u, t + pre, (bwd ? R.linear_bwd_per_token : R.linear_fwd_per_token) * w.tokens,
                                    lin_name, j);
      const double t_att = t + pre + lin + x0;
      if (regather) {
        rec.comm(u, t_att - x0, x0, w.fwd_sent, w.fwd_recv, regather_name, j);
        rec.wait(u, t_att - x0, t_att, t_att - x0);
      }
      const double att =
          rec.attention(u, t_att, w.attention_seconds * (bwd ? 1.0 - share : share), att_name, j);
      if (!bwd) rec.stats()[static_cast<size_t>(u)].attention_pairs += w.pairs;
      if (bwd) {
        rec.comm(u, t_att + att, xr, sent, recv, comm_name, j);
        rec.wait(u, t_att + att, t_att + att + xr, t_att + att);
      }
      end = std::max(end, t_att + att + (bwd ? xr : 0.0));
    }
    t = end;
  }
  if (last && !bwd) lm();
  return t;
}

// CP group g's 1F1B over the stages, each op as soon as its input and its stage are free
// (a p2p transfer between stages); folds the stages' finish times into stage_finish and
// unit_end.
void run_group(const Rates& R, const Work& work, const std::vector<std::vector<PipeOp>>& ops, Recorder& rec,
               int64_t c, int64_t g, std::vector<double>& stage_finish, std::vector<double>& unit_end) {
  const int64_t p = R.pp, m = static_cast<int64_t>(work.size()), ups = R.units_per_stage;
  const auto P = static_cast<size_t>(p), M = static_cast<size_t>(m);
  std::vector<std::vector<double>> f_end(P, std::vector<double>(M, -1.0)), b_end = f_end;
  std::vector<size_t> next(P, 0);
  std::vector<double> free_at(P, 0.0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t s = 0; s < p; ++s) {
      const auto& list = ops[static_cast<size_t>(s)];
      while (next[static_cast<size_t>(s)] < list.size()) {
        const PipeOp op = list[next[static_cast<size_t>(s)]];
        const auto J = static_cast<size_t>(op.microbatch);
        double dep = 0;
        bool remote = false;  // the input comes from another stage (a p2p transfer)
        if (!op.backward) {
          if (s > 0) {
            dep = f_end[static_cast<size_t>(s - 1)][J];
            remote = true;
          }
        } else if (s == p - 1) {
          dep = f_end[static_cast<size_t>(s)][J];
        } else {
          dep = b_end[static_cast<size_t>(s + 1)][J];
          remote = true;
        }
        if (dep < 0) break;
        const double ready = free_at[static_cast<size_t>(s)];
        double start = std::max(ready, dep);
        if (remote) {
          const auto& W = work[J];
          double x = 0;
          const int64_t from = op.backward ? s + 1 : s - 1;
          for (int64_t i = 0; i < c; ++i) {
            const double bytes = R.boundary_bytes(W[static_cast<size_t>(g * c + i)].tokens);
            const double d = R.p2p(bytes);
            x = std::max(x, d);
            rec.comm(from * ups + g * c + i, dep, d, bytes, 0, op.backward ? "send grad" : "send act", op.microbatch);
            rec.comm(s * ups + g * c + i, dep, d, 0, bytes, op.backward ? "recv grad" : "recv act", op.microbatch);
          }
          start = std::max(ready, dep + x);
          for (int64_t i = 0; i < c; ++i) rec.wait(s * ups + g * c + i, ready, start, dep);
        }
        const double end = run_group_op(R, work, rec, c, s, g, op.microbatch, op.backward, start);
        (op.backward ? b_end : f_end)[static_cast<size_t>(s)][J] = end;
        free_at[static_cast<size_t>(s)] = end;
        ++next[static_cast<size_t>(s)];
        progress = true;
      }
    }
  }
  for (int64_t s = 0; s < p; ++s) {
    DISTCA_CHECK(next[static_cast<size_t>(s)] == ops[static_cast<size_t>(s)].size());
    stage_finish[static_cast<size_t>(s)] = std::max(stage_finish[static_cast<size_t>(s)], free_at[static_cast<size_t>(s)]);
    for (int64_t i = 0; i < c; ++i) unit_end[static_cast<size_t>(s * ups + g * c + i)] = free_at[static_cast<size_t>(s)];
  }
}

// Memory: the peak over each stage's op order of the micro-batches held, per unit.
std::vector<MemoryInput> baseline_memory(const Rates& R, const Work& work, const std::vector<std::vector<PipeOp>>& ops) {
  const int64_t p = R.pp, ups = R.units_per_stage;
  std::vector<MemoryInput> mem(static_cast<size_t>(R.units));
  for (int64_t s = 0; s < p; ++s) {
    for (int64_t i = 0; i < ups; ++i) {
      MemoryInput& mi = mem[static_cast<size_t>(s * ups + i)];
      const double layers = static_cast<double>(R.stage_layers[static_cast<size_t>(s)]);
      // Gathered (fetched) K/V: without checkpointing every layer's is kept until its
      // backward; with it only the layer in flight holds it (the recompute gathers again).
      // Either way the layer in backward also holds its dK/dV (as large) until it is sent back.
      const bool keep_kv = !R.o.activation_checkpointing;
      double tok = 0, kept = 0;
      for (const PipeOp& op : ops[static_cast<size_t>(s)]) {
        const UnitWork& w = work[static_cast<size_t>(op.microbatch)][static_cast<size_t>(i)];
        const double sign = op.backward ? -1.0 : 1.0;
        tok += sign * w.tokens;
        if (keep_kv) kept += sign * w.fwd_recv * layers;
        mi.tokens_in_flight = std::max(mi.tokens_in_flight, tok);
        mi.kept_bytes = std::max(mi.kept_bytes, kept);
        mi.tokens_max = std::max(mi.tokens_max, w.tokens);
        mi.transient_bytes = std::max(mi.transient_bytes, (keep_kv ? 1.0 : 2.0) * w.fwd_recv);
      }
      mi.kept_kv_bytes = mi.kept_bytes;
      mi.transient_kv_bytes = mi.transient_bytes;
    }
  }
  return mem;
}

}  // namespace

Status run_baseline(const Rates& R, const std::vector<Batch>& mbs, int64_t c, SimResult& r) {
  const auto m = static_cast<int64_t>(mbs.size());
  const int64_t p = R.pp, ups = R.units_per_stage, groups = ups / c;
  // work[j][i]: micro-batch j, unit i of a stage (every stage sees the same micro-batch).
  Work work(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) {
    DISTCA_RETURN_IF_ERROR(layout_microbatch(R, mbs[static_cast<size_t>(j)], c, work[static_cast<size_t>(j)], r.plan));
  }
  Recorder rec(R.units, R.o.record_events, R.sharing);
  const auto ops = one_f_one_b(p, m);
  std::vector<double> stage_finish(static_cast<size_t>(p), 0.0);
  std::vector<double> unit_end(static_cast<size_t>(R.units), 0.0);
  for (int64_t g = 0; g < groups; ++g) run_group(R, work, ops, rec, c, g, stage_finish, unit_end);

  // DP gradient all-reduce per stage once every replica of the stage is done.
  r.pipeline_seconds = *std::max_element(stage_finish.begin(), stage_finish.end());
  run_grad_sync(R, rec, stage_finish, unit_end, r);

  const std::vector<MemoryInput> mem = baseline_memory(R, work, ops);
  r.per_unit = std::move(rec.stats());
  r.events = std::move(rec.events());
  for (int64_t u = 0; u < R.units; ++u) {
    r.per_unit[static_cast<size_t>(u)].stage = u / ups;
    r.per_unit[static_cast<size_t>(u)].tokens = static_cast<int64_t>(mem[static_cast<size_t>(u)].tokens_max);
  }
  apply_memory(R, mem, r);
  r.cp_degree = c;
  r.dp = groups;
  return Status::ok_status();
}

}  // namespace distca::sim::detail
