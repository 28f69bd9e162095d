// CAD: core attention served by every unit as an in-place attention server, planned by
// schedule_cad, run with ping-pong nano-batches (or single-stream / signal), and with PP the
// phase-aligned 1F1B whose forward ticks pool every active stage's micro-batch into ONE plan
// over ALL units (docs/simulation-model.md, "CAD").
//
// Per forward tick: the pooled batch puts stage s's micro-batch on the units of stage s (the
// other units hold nothing and only serve); document ids become id * pp + stage so they stay
// unique. schedule_cad balances UnitAttentionCost (seconds, padded short shards). Every task
// is cut at its document's nano cut floor(L / 2) into a ping and a pong task on the same
// server (as runtime/pingpong.h does: ping must be a prefix of each document, see nano_cut;
// a unit holding only a long document's tail so has only pong tokens). single-stream runs the
// micro-batch as ONE batch with every exchange waited for (the ablation without ping-pong:
// runtime/pingpong.h's single-stream instead runs the two nano plans one after the other,
// which here would add the nano-batches' imbalance to the missing overlap). The bytes of each (nano-batch, stage) task list follow
// traffic.h (compute_traffic), split into the dispatch (Q, K/V) and the return (O + LSE). The
// backward of a micro-batch runs on the servers of its forward (servers keep their inputs):
// dO out, dQ and dK/dV back; stateless servers (SimOptions::cad_stateless) get Q, K/V and
// O + LSE again with dO and keep nothing. A B tick composes the stored forward contributions of its ops.
#include <algorithm>
#include <chrono>

#include "distca/plan/cad.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/traffic.h"
#include "engine.h"

namespace distca::sim::detail {
namespace {

using Vec = std::vector<double>;

// What one (stage, micro-batch) puts on the cluster in one layer, per nano-batch x, per unit.
struct Contribution {
  Vec tokens[2];            // home rows of nano-batch x (units of the stage)
  Vec att[2], pairs[2];     // forward + backward seconds, causal pairs (servers)
  Vec fds[2], fdr[2];       // forward dispatch sent / received (Q, K/V)
  Vec frs[2], frr[2];       // forward return sent / received (O + LSE)
  Vec bds[2], bdr[2];       // backward dispatch (dO)
  Vec brs[2], brr[2];       // backward return (dQ, dK/dV)
  Vec kept_bytes;           // per layer: server inputs + outputs kept for the backward
  void init(size_t U) {
    for (int x = 0; x < 2; ++x) {
      for (Vec* v : {&tokens[x], &att[x], &pairs[x], &fds[x], &fdr[x], &frs[x], &frr[x], &bds[x], &bdr[x], &brs[x],
                     &brr[x]}) {
        v->assign(U, 0.0);
      }
    }
    kept_bytes.assign(U, 0.0);
  }
};

// Arrays of one layer slot (every unit).
struct Slot {
  Vec lin[2], att[2], ds[2], dr[2], rs[2], rr[2];
  bool attention = false;
  void reset(size_t U) {
    for (int x = 0; x < 2; ++x) {
      for (Vec* v : {&lin[x], &att[x], &ds[x], &dr[x], &rs[x], &rr[x]}) v->assign(U, 0.0);
    }
  }
};

struct Coll {
  double start = 0, end = 0;
  bool valid = false;
  // [units] 1 where the unit moves bytes in it: waiting for a collective one takes no part in
  // (an idle stage's unit under a plan of the active stages only) is idle, not exposed.
  std::vector<char> part;
};

class TickRunner {
 public:
  TickRunner(const Rates& R, Recorder& rec, Vec& tc) : R_(R), rec_(rec), tc_(tc), U_(R.units) {}

  // Runs one layer slot. `mb` labels events (-1: several).
  void slot(const Slot& s, bool bwd, int64_t mb) {
    const CadMode mode = R_.o.strategy.cad_mode;
    const char* lin_name[2] = {bwd ? "bwd linear ping" : "fwd linear ping", bwd ? "bwd linear pong" : "fwd linear pong"};
    const char* att_name[2] = {bwd ? "bwd attention ping" : "fwd attention ping",
                               bwd ? "bwd attention pong" : "fwd attention pong"};
    const char* d_name[2] = {bwd ? "dO dispatch ping" : "Q/KV dispatch ping", bwd ? "dO dispatch pong" : "Q/KV dispatch pong"};
    const char* r_name[2] = {bwd ? "dQ/dKV return ping" : "O return ping", bwd ? "dQ/dKV return pong" : "O return pong"};
    if (mode == CadMode::kSingleStream) {  // one batch (nano-batch 1 is empty), no overlap
      for (int x = 0; x < 1; ++x) {
        linear(s.lin[x], Coll{}, lin_name[x], mb);
        if (!s.attention) continue;
        const Coll d = issue(s.ds[x], s.dr[x], d_name[x], mb);
        attention(s.att[x], d, att_name[x], mb);
        const Coll r = issue(s.rs[x], s.rr[x], r_name[x], mb);
        wait_all(r);
      }
      return;
    }
    Coll d[2];
    for (int x = 0; x < 2; ++x) {
      linear(s.lin[x], ret_[x], lin_name[x], mb);
      ret_[x].valid = false;
      if (s.attention) d[x] = issue(s.ds[x], s.dr[x], d_name[x], mb);
    }
    if (!s.attention) return;
    for (int x = 0; x < 2; ++x) {
      attention(s.att[x], d[x], att_name[x], mb);
      ret_[x] = issue(s.rs[x], s.rr[x], r_name[x], mb);
    }
  }

  // A global step: every unit waits for the slowest, then a transfer of `dur` seconds in
  // which `sent` / `recv` units move data (PP activations between ticks).
  void barrier_transfer(double dur, const Vec& sent, const Vec& recv, const char* name, int64_t mb) {
    double t = *std::max_element(tc_.begin(), tc_.end());
    t = std::max(t, net_free_);
    for (int64_t u = 0; u < U_; ++u) {
      const auto i = static_cast<size_t>(u);
      if (sent[i] > 0 || recv[i] > 0) rec_.comm(u, t, dur, sent[i], recv[i], name, mb);
      if (recv[i] > 0) rec_.wait(u, tc_[i], t + dur, t);
      tc_[i] = t + dur;
    }
    net_free_ = t + dur;
  }

  double net_free() const { return net_free_; }

 private:
  Coll issue(const Vec& sent, const Vec& recv, const char* name, int64_t mb) {
    const bool signal = R_.o.strategy.cad_mode == CadMode::kSignal;
    double start = net_free_, worst = 0;
    for (int64_t u = 0; u < U_; ++u) {
      const auto i = static_cast<size_t>(u);
      start = std::max(start, tc_[i]);
      worst = std::max(worst, std::max(sent[i], recv[i]));
    }
    const double dur = R_.lat + (signal ? 0.0 : worst / R_.bw);
    Coll c{start, start + dur, true, std::vector<char>(static_cast<size_t>(U_), 0)};
    for (int64_t u = 0; u < U_; ++u) {
      const auto i = static_cast<size_t>(u);
      c.part[i] = sent[i] > 0 || recv[i] > 0;
      if (c.part[i]) rec_.comm(u, start, dur, signal ? 0.0 : sent[i], signal ? 0.0 : recv[i], name, mb);
    }
    net_free_ = start + dur;
    return c;
  }
  void wait_for(size_t i, const Coll& c) {
    if (!c.valid || c.end <= tc_[i]) return;
    if (c.part[i]) rec_.wait(static_cast<int64_t>(i), tc_[i], c.end, c.start);
    tc_[i] = c.end;
  }
  void wait_all(const Coll& c) {
    for (size_t i = 0; i < tc_.size(); ++i) wait_for(i, c);
  }
  void linear(const Vec& lin, const Coll& after, const char* name, int64_t mb) {
    for (size_t i = 0; i < tc_.size(); ++i) {
      wait_for(i, after);
      rec_.linear(static_cast<int64_t>(i), tc_[i], lin[i], name, mb);
      tc_[i] += lin[i];
    }
  }
  void attention(const Vec& att, const Coll& after, const char* name, int64_t mb) {
    for (size_t i = 0; i < tc_.size(); ++i) {
      wait_for(i, after);
      rec_.attention(static_cast<int64_t>(i), tc_[i], att[i], name, mb);
      tc_[i] += att[i];
    }
  }

  const Rates& R_;
  Recorder& rec_;
  Vec& tc_;
  int64_t U_;
  double net_free_ = 0;
  Coll ret_[2];  // returns in flight from the previous slot
};

// The nano-batch cut of a document (runtime/pingpong.h): rows [0, cut) are ping. Ping must be
// a prefix of every document: pong's K/V of a layer exist only after ping's exchange of that
// layer is under way, so ping may not need them (a cut per piece would break this).
int64_t nano_cut(int64_t doc_len) { return doc_len / 2; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Plans one tick and fills the contributions of its ops: outs[i] receives tick.ops[i]'s.
// all_units: the plan pools the active stages' micro-batches over every unit (idle stages'
// units serve); otherwise over the active stages' units only. fresh_backward: a backward tick
// planned anew (its servers did not run the forward), so the inputs travel again with dO:
// Q, K/V, O + LSE out; dQ, dK/dV back (the forward fields are filled as for a forward plan).
Status plan_tick(const Rates& R, const std::vector<Batch>& mbs, const Tick& tick, const std::vector<Contribution*>& outs,
                 bool all_units, bool fresh_backward, PlanStats& ps) {
  const int64_t p = R.pp, ups = R.ups, U = R.units;
  // unit_of[rank of the pooled batch] = the unit; stage s's units keep their order.
  std::vector<int64_t> unit_of;
  std::vector<int64_t> rank_of(static_cast<size_t>(U), -1);
  std::vector<bool> active(static_cast<size_t>(p), false);
  for (const PipeOp& op : tick.ops) active[static_cast<size_t>(op.stage)] = true;
  for (int64_t u = 0; u < U; ++u) {
    if (!all_units && !active[static_cast<size_t>(u / ups)]) continue;
    rank_of[static_cast<size_t>(u)] = static_cast<int64_t>(unit_of.size());
    unit_of.push_back(u);
  }
  Batch pooled;
  pooled.ranks = static_cast<int64_t>(unit_of.size());
  pooled.tokens_per_rank = 1;
  pooled.per_rank.assign(unit_of.size(), {});
  for (const PipeOp& op : tick.ops) {
    const Batch& b = mbs[static_cast<size_t>(op.microbatch)];
    pooled.tokens_per_rank = std::max(pooled.tokens_per_rank, b.tokens_per_rank);
    for (int64_t i = 0; i < ups; ++i) {
      auto& dst = pooled.per_rank[static_cast<size_t>(rank_of[static_cast<size_t>(op.stage * ups + i)])];
      for (Piece piece : b.per_rank[static_cast<size_t>(i)]) {
        piece.doc = piece.doc * p + op.stage;
        dst.push_back(piece);
      }
    }
  }
  ScheduleOptions so;
  so.model = R.o.model;
  so.dtype_bytes = R.o.dtype_bytes;
  so.tolerance = R.o.tolerance;
  so.cost = &R.cost;
  const auto t0 = std::chrono::steady_clock::now();
  auto sched = schedule_cad(pooled, so, nullptr);
  if (!sched.ok()) return sched.status();
  ps.plan_seconds += seconds_since(t0);
  const DocumentIndex index(pooled);

  // Cut at the nano-batch boundary and split by stage: lists[x][stage].
  std::vector<std::vector<TaskPlacement>> lists[2];
  lists[0].assign(static_cast<size_t>(p), {});
  lists[1].assign(static_cast<size_t>(p), {});
  // single-stream: no nano-batches (the whole micro-batch is "ping", pong is empty).
  const bool split = R.o.strategy.cad_mode != CadMode::kSingleStream;
  for (const TaskPlacement& t : sched->tasks) {
    const int64_t s = t.doc % p;
    const int64_t cut = split ? nano_cut(index.doc_len(t.doc)) : t.q_end;
    if (t.q_begin < cut) {
      TaskPlacement a = t;
      a.q_end = std::min(t.q_end, cut);
      lists[0][static_cast<size_t>(s)].push_back(a);
    }
    if (t.q_end > cut) {
      TaskPlacement b = t;
      b.q_begin = std::max(t.q_begin, cut);
      lists[1][static_cast<size_t>(s)].push_back(b);
    }
  }
  const RowBytes& rb = R.rb;
  const auto Us = static_cast<size_t>(U);
  const auto Rn = unit_of.size();
  for (size_t oi = 0; oi < tick.ops.size(); ++oi) {
    const PipeOp& op = tick.ops[oi];
    Contribution& c = *outs[oi];
    c.init(Us);
    for (int64_t i = 0; i < ups; ++i) {
      const int64_t u = op.stage * ups + i;
      for (const Piece& piece : pooled.per_rank[static_cast<size_t>(rank_of[static_cast<size_t>(u)])]) {
        const int64_t cut = split ? nano_cut(piece.doc_len) : piece.doc_len;
        const int64_t ping = std::clamp(cut - piece.offset, int64_t{0}, piece.len);
        c.tokens[0][static_cast<size_t>(u)] += static_cast<double>(ping);
        c.tokens[1][static_cast<size_t>(u)] += static_cast<double>(piece.len - ping);
      }
    }
    for (int x = 0; x < 2; ++x) {
      const auto& list = lists[x][static_cast<size_t>(op.stage)];
      const Traffic t = compute_traffic(index, list, rb);
      // Indexed by pooled rank; scattered to units below.
      Vec qs(Rn, 0.0), qr(Rn, 0.0), os(Rn, 0.0), orr(Rn, 0.0), dos(Rn, 0.0), dor(Rn, 0.0);
      for (const TaskPlacement& task : list) {
        const int64_t q = task.q_end - task.q_begin;
        const auto srv = static_cast<size_t>(task.server), home = static_cast<size_t>(task.home);
        const auto srv_u = static_cast<size_t>(unit_of[srv]);
        c.att[x][srv_u] += R.cost.task_cost(q, task.q_end);
        c.pairs[x][srv_u] += static_cast<double>(task_pairs(q, task.q_end));
        if (task.home == task.server) continue;
        const auto n = static_cast<double>(q);
        qs[home] += n * static_cast<double>(rb.q);
        qr[srv] += n * static_cast<double>(rb.q);
        os[srv] += n * static_cast<double>(rb.o + rb.lse);
        orr[home] += n * static_cast<double>(rb.o + rb.lse);
        dos[home] += n * static_cast<double>(rb.o);
        dor[srv] += n * static_cast<double>(rb.o);
      }
      for (size_t rk = 0; rk < Rn; ++rk) {
        const RankBytes& b = t.per_rank[rk];
        const auto u = static_cast<size_t>(unit_of[rk]);
        const double kv_sent = static_cast<double>(b.fwd_sent) - qs[rk] - os[rk];
        const double kv_recv = static_cast<double>(b.fwd_recv) - qr[rk] - orr[rk];
        c.fds[x][u] = qs[rk] + kv_sent;
        c.fdr[x][u] = qr[rk] + kv_recv;
        c.frs[x][u] = os[rk];
        c.frr[x][u] = orr[rk];
        c.bds[x][u] = dos[rk];
        c.bdr[x][u] = dor[rk];
        // dQ goes back the way Q came; dK/dV partials go back to the K/V holders.
        c.brs[x][u] = qr[rk] + kv_recv;
        c.brr[x][u] = qs[rk] + kv_sent;
        // Servers that keep their inputs hold the received rows and their outputs; stateless
        // ones (and backward ticks planned anew) get Q, K/V and O + LSE again with dO.
        if (!R.o.cad_stateless) c.kept_bytes[u] += c.fdr[x][u] + c.frs[x][u];
        if (fresh_backward || R.o.cad_stateless) {
          c.bds[x][u] += c.fds[x][u] + orr[rk];
          c.bdr[x][u] += c.fdr[x][u] + os[rk];
        }
      }
      if (!fresh_backward) {
        ps.comm_bytes_forward += static_cast<double>(t.bytes.forward());
        ps.comm_bytes_backward += static_cast<double>(t.bytes.backward());
        if (R.o.cad_stateless) ps.comm_bytes_backward += static_cast<double>(t.bytes.forward());
      }
    }
  }
  if (fresh_backward) return Status::ok_status();  // figures of forward plans only
  ps.plans += 1;
  ps.tasks += static_cast<int64_t>(sched->tasks.size());
  ps.load_max_over_mean = std::max(ps.load_max_over_mean, max_over_mean(server_loads(pooled.ranks, sched->tasks, &R.cost)));
  ps.load_before_max_over_mean = std::max(ps.load_before_max_over_mean, max_over_mean(colocated_loads(pooled, &R.cost)));
  return Status::ok_status();
}

}  // namespace

Status run_cad(const Rates& R, const std::vector<Batch>& mbs, SimResult& r) {
  const auto m = static_cast<int64_t>(mbs.size());
  const int64_t p = R.pp, ups = R.ups, U = R.units;
  const auto Us = static_cast<size_t>(U);
  const std::vector<Tick> ticks = phase_aligned(p, m);
  std::vector<std::vector<Contribution>> contrib(static_cast<size_t>(p), std::vector<Contribution>(static_cast<size_t>(m)));
  Recorder rec(U, R.o.record_events);
  Vec tc(Us, 0.0);
  TickRunner run(R, rec, tc);
  int64_t K = 0;
  for (int64_t n : R.stage_layers) K = std::max(K, n);
  Slot slot;
  const double share = kAttnFwdShare;

  // One tick's layer slots on `runner` (the real timeline, or a scratch one to estimate).
  auto run_tick = [&](const Tick& tick, const std::vector<Contribution*>& src, TickRunner& runner, Recorder& rcd) {
    const bool bwd = tick.backward;
    const int64_t label = tick.ops.size() == 1 ? tick.ops.front().microbatch : -1;
    for (int64_t k = 0; k <= K; ++k) {
      slot.reset(Us);
      slot.attention = false;
      for (size_t oi = 0; oi < tick.ops.size(); ++oi) {
        const PipeOp& op = tick.ops[oi];
        const int64_t n = R.stage_layers[static_cast<size_t>(op.stage)];
        if (k > n) continue;
        const Contribution& c = *src[oi];
        const bool last = op.stage == p - 1;
        // Linear share of this slot: the first slot runs the pre-CA part of layer 0 (forward)
        // or the post-CA backward of the last layer; slot n the remainder; between, a full
        // layer (post-CA of the previous fused with pre-CA of the next).
        const double first = bwd ? 1.0 - R.pre_share : R.pre_share;
        double frac = k == 0 ? first : (k == n ? 1.0 - first : 1.0);
        if (n == 0) frac = 0;
        const double per_tok = bwd ? R.lin_bwd_tok : R.lin_fwd_tok;
        for (int x = 0; x < 2; ++x) {
          for (int64_t i = 0; i < ups; ++i) {
            const auto u = static_cast<size_t>(op.stage * ups + i);
            double lin = frac * per_tok * c.tokens[x][u];
            if (last && !bwd && k == n) lin += R.lm_fwd_tok * c.tokens[x][u];
            if (last && bwd && k == 0) lin += R.lm_bwd_tok * c.tokens[x][u];
            slot.lin[x][u] += lin;
          }
          if (k == n) continue;  // the tail slot has no attention
          slot.attention = true;
          for (size_t u = 0; u < Us; ++u) {
            slot.att[x][u] += c.att[x][u] * (bwd ? 1.0 - share : share);
            slot.ds[x][u] += bwd ? c.bds[x][u] : c.fds[x][u];
            slot.dr[x][u] += bwd ? c.bdr[x][u] : c.fdr[x][u];
            slot.rs[x][u] += bwd ? c.brs[x][u] : c.frs[x][u];
            slot.rr[x][u] += bwd ? c.brr[x][u] : c.frr[x][u];
            if (!bwd) rcd.stats()[u].attention_pairs += c.pairs[x][u];
          }
        }
      }
      runner.slot(slot, bwd, label);
    }
  };
  // The duration of a tick run alone from an idle cluster.
  auto estimate = [&](const Tick& tick, const std::vector<Contribution*>& src) {
    Recorder scratch(U, false);
    Vec t0(Us, 0.0);
    TickRunner runner(R, scratch, t0);
    run_tick(tick, src, runner, scratch);
    return std::max(*std::max_element(t0.begin(), t0.end()), runner.net_free());
  };
  // Candidate plans of one tick (each a list of contributions, one per op).
  std::vector<std::vector<Contribution>> cands;
  auto as_ptrs = [](std::vector<Contribution>& v) {
    std::vector<Contribution*> out;
    for (Contribution& c : v) out.push_back(&c);
    return out;
  };

  for (size_t ti = 0; ti < ticks.size(); ++ti) {
    const Tick& tick = ticks[ti];
    if (tick.ops.empty()) continue;
    const bool bwd = tick.backward;
    const int64_t label = tick.ops.size() == 1 ? tick.ops.front().microbatch : -1;
    const bool idle_stages = static_cast<int64_t>(tick.ops.size()) < p;
    std::vector<Contribution*> src;
    for (const PipeOp& op : tick.ops) src.push_back(&contrib[static_cast<size_t>(op.stage)][static_cast<size_t>(op.microbatch)]);
    // Forward ticks: one plan pooled over every unit (idle stages serve); when stages are
    // idle, also the plan over the active stages' units only, and the faster tick wins
    // (pooling can cost more bytes than the attention it moves). Backward ticks: the forward
    // placements (servers kept the inputs); if they leave the servers outside the tolerance,
    // also fresh plans (inputs sent again), fastest wins.
    cands.clear();
    std::vector<PlanStats> cand_stats;
    std::vector<bool> cand_all;
    auto add_candidate = [&](bool all_units) -> Status {
      cands.emplace_back(tick.ops.size());
      cand_stats.emplace_back();
      cand_all.push_back(all_units);
      return plan_tick(R, mbs, tick, as_ptrs(cands.back()), all_units, bwd, cand_stats.back());
    };
    if (!bwd) {
      DISTCA_RETURN_IF_ERROR(add_candidate(true));
      if (idle_stages) DISTCA_RETURN_IF_ERROR(add_candidate(false));
    } else if (p > 1) {
      Vec load(Us, 0.0);
      for (const Contribution* c : src) {
        for (size_t u = 0; u < Us; ++u) load[u] += c->att[0][u] + c->att[1][u];
      }
      if (max_over_mean(load) > 1.0 + R.o.tolerance + 1e-9) {
        DISTCA_RETURN_IF_ERROR(add_candidate(true));
        if (idle_stages) DISTCA_RETURN_IF_ERROR(add_candidate(false));
      }
    }
    if (!cands.empty()) {
      for (const PlanStats& cs : cand_stats) r.plan.plan_seconds += cs.plan_seconds;
      // Backward: the forward placements are candidate -1. Forward: a single candidate
      // needs no estimate.
      int64_t best = -1;
      double best_time = bwd ? estimate(tick, src) : 0.0;
      for (size_t ci = 0; ci < cands.size(); ++ci) {
        if (!bwd && cands.size() == 1) {
          best = 0;
          break;
        }
        const double t = estimate(tick, as_ptrs(cands[ci]));
        if ((!bwd && ci == 0) || t < best_time) {
          best_time = t;
          best = static_cast<int64_t>(ci);
        }
      }
      if (best >= 0) {
        const auto b = static_cast<size_t>(best);
        if (!bwd) {
          for (size_t oi = 0; oi < tick.ops.size(); ++oi) *src[oi] = std::move(cands[b][oi]);
          PlanStats& cs = cand_stats[b];
          r.plan.plans += cs.plans;
          r.plan.tasks += cs.tasks;
          r.plan.load_max_over_mean = std::max(r.plan.load_max_over_mean, cs.load_max_over_mean);
          r.plan.load_before_max_over_mean = std::max(r.plan.load_before_max_over_mean, cs.load_before_max_over_mean);
          r.plan.comm_bytes_forward += cs.comm_bytes_forward;
          r.plan.comm_bytes_backward += cs.comm_bytes_backward;
          if (!cand_all[b]) ++r.plan.active_only_plans;
        } else {
          src = as_ptrs(cands[b]);
          ++r.plan.backward_replans;
        }
      }
    }
    run_tick(tick, src, run, rec);
    // PP: activations (forward) or their gradients (backward) cross to the neighbour stage.
    if (p > 1) {
      Vec sent(Us, 0.0), recv(Us, 0.0);
      double dur = 0;
      for (const PipeOp& op : tick.ops) {
        const int64_t to = bwd ? op.stage - 1 : op.stage + 1;
        if (to < 0 || to >= p) continue;
        const Contribution& c = contrib[static_cast<size_t>(op.stage)][static_cast<size_t>(op.microbatch)];
        for (int64_t i = 0; i < ups; ++i) {
          const auto from_u = static_cast<size_t>(op.stage * ups + i), to_u = static_cast<size_t>(to * ups + i);
          const double bytes = R.boundary_bytes(c.tokens[0][from_u] + c.tokens[1][from_u]);
          sent[from_u] += bytes;
          recv[to_u] += bytes;
          dur = std::max(dur, R.p2p(bytes));
        }
      }
      if (dur > 0) run.barrier_transfer(dur, sent, recv, bwd ? "PP grad transfer" : "PP activation transfer", label);
    }
  }

  // Gradient all-reduce per stage after its last backward.
  r.pipeline_seconds = std::max(*std::max_element(tc.begin(), tc.end()), run.net_free());
  // Every unit serves attention until the last tick, so every all-reduce starts after it.
  run_grad_sync(R, rec, std::vector<double>(static_cast<size_t>(p), r.pipeline_seconds), tc, r);
  r.iteration_seconds = std::max(r.iteration_seconds, r.pipeline_seconds);

  // Memory: unit u's own activations follow its stage's ops; the buffers it keeps as a server
  // follow every (stage, micro-batch) it served, held from that forward tick to its backward.
  std::vector<MemoryInput> mem(Us);
  Vec kept(Us, 0.0);
  std::vector<double> tok(Us, 0.0);
  for (const Tick& tick : ticks) {
    for (const PipeOp& op : tick.ops) {
      const Contribution& c = contrib[static_cast<size_t>(op.stage)][static_cast<size_t>(op.microbatch)];
      const double sign = op.backward ? -1.0 : 1.0;
      const double layers = static_cast<double>(R.stage_layers[static_cast<size_t>(op.stage)]);
      for (size_t u = 0; u < Us; ++u) kept[u] += sign * c.kept_bytes[u] * layers;
      for (int64_t i = 0; i < ups; ++i) {
        const auto u = static_cast<size_t>(op.stage * ups + i);
        const double t = c.tokens[0][u] + c.tokens[1][u];
        tok[u] += sign * t;
        mem[u].tokens_max = std::max(mem[u].tokens_max, t);
      }
    }
    for (size_t u = 0; u < Us; ++u) {
      mem[u].kept_bytes = std::max(mem[u].kept_bytes, kept[u]);
      mem[u].tokens_in_flight = std::max(mem[u].tokens_in_flight, tok[u]);
    }
  }
  r.per_unit = std::move(rec.stats());
  r.events = std::move(rec.events());
  for (int64_t u = 0; u < U; ++u) {
    r.per_unit[static_cast<size_t>(u)].stage = u / ups;
    r.per_unit[static_cast<size_t>(u)].tokens = static_cast<int64_t>(mem[static_cast<size_t>(u)].tokens_max);
  }
  apply_memory(R, mem, r);
  r.cp_degree = 1;
  r.dp = ups;
  r.pp_ticks = static_cast<int64_t>(ticks.size());
  return Status::ok_status();
}

}  // namespace distca::sim::detail
