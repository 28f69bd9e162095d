// CAD: core attention served by every unit as an in-place attention server, planned by
// schedule_cad, run with ping-pong nano-batches (or single-stream / signal), and with PP
// 1F1B's unit-time slots as mixed ticks (one_f_one_b_ticks, the runtime's schedule): per tick
// the forward members are pooled into ONE plan over ALL units and the backward members into
// another (docs/simulation-model.md, "CAD").
//
// Per plan: the pooled batch (plan/pool.h) puts stage s's micro-batch on the units of
// stage s (the other units hold nothing and only serve); document ids become id * pp + stage
// so they stay unique. schedule_cad balances UnitAttentionCost (seconds, padded short shards). The pooled
// batch is split as the runtime splits it (plan/nano_split.h: split_nano_batches on the grid
// of SimOptions::attention_tile, the runtime's align_rows): every document is cut near
// L / sqrt(2) (documents under two tiles go whole to one side), and schedule_cad plans the
// split batch in every mode. Ping-pong cuts every task at its document's cut into a ping and a
// pong task on the same server (ping must be a prefix of each document; a unit holding only a
// long document's tail so has only pong tokens). single-stream runs the micro-batch as ONE
// batch with every exchange waited for (the ablation without ping-pong; runtime/pingpong.h's
// single-stream likewise runs the split batch's whole plan). The bytes of each (nano-batch,
// stage) task list follow traffic.h (compute_traffic), split into the dispatch (Q, K/V) and the return (O + LSE);
// that per-op bookkeeping (bytes, message pairs, buffers) is cad_contribution.h's.
// Without PP the backward of a micro-batch runs on the servers of its forward (servers keep
// their inputs): dO out, dQ and dK/dV back; stateless servers (SimOptions::cad_stateless) get
// Q, K/V and O + LSE again with dO and keep nothing. With PP every backward is planned anew
// with other micro-batches than its forward, so its servers are stateless (as the runtime's).
#include <algorithm>
#include <array>
#include <chrono>

#include "distca/plan/cad.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/nano_split.h"
#include "distca/plan/pool.h"
#include "distca/plan/traffic.h"
#include "cad_contribution.h"
#include "engine.h"

namespace distca::sim::detail {
namespace {

using Vec = std::vector<double>;

// The work of one layer slot on every unit, per nano-batch: linear seconds, then (when
// has_attention) the dispatch, the attention seconds and the return.
struct Slot {
  Vec linear[2], attention[2];
  Vec dispatch_sent[2], dispatch_recv[2], return_sent[2], return_recv[2];
  // [x][direction]: the message pairs of each direction's exchange. Inside a direction the ops
  // share one plan and one all-to-all (a pair is one message); a mixed tick's two directions
  // are two all-to-alls (the runtime's TickRunner has a dispatcher per direction), so a pair
  // both use is two messages.
  PeerLists dispatch_peers[2][2], return_peers[2][2];
  bool has_attention = false;
  // [units] the direction (-1 none, 0 forward, 1 backward) and micro-batch of the op the
  // unit's stage runs in this slot (a stage runs at most one op per tick).
  std::vector<signed char> unit_dir;
  std::vector<int64_t> unit_mb;
  void reset(size_t units) {
    unit_dir.assign(units, -1);
    unit_mb.assign(units, -1);
    for (int x = 0; x < 2; ++x) {
      for (int d = 0; d < 2; ++d) {
        for (PeerLists* p : {&dispatch_peers[x][d], &return_peers[x][d]}) {
          if (p->units() == static_cast<int64_t>(units)) {
            p->clear();
          } else {
            p->reset(static_cast<int64_t>(units));
          }
        }
      }
      for (Vec* v : {&linear[x], &attention[x], &dispatch_sent[x], &dispatch_recv[x], &return_sent[x],
                     &return_recv[x]}) {
        v->assign(units, 0.0);
      }
    }
  }
};

// One all-to-all on the network: in flight over [start, end).
struct Collective {
  double start = 0, end = 0;
  bool valid = false;
  // [units] 1 where the unit moves bytes in it: waiting for a collective one takes no part in
  // (an idle stage's unit under a plan of the active stages only) is idle, not exposed.
  std::vector<char> part;
};

// Advances the units' clocks through layer slots: compute per unit, exchanges as collectives
// on one network (one at a time), ping-pong overlap of one nano-batch's exchange with the
// other's compute.
class TickRunner {
 public:
  TickRunner(const Rates& R, Recorder& rec, Vec& unit_clock) : R_(R), rec_(rec), clock_(unit_clock), U_(R.units) {}

  // Runs one layer slot. `dir`: the directions in it (0 forward, 1 backward, 2 both: a mixed
  // tick, whose exchanges carry both directions' bytes at once). `mb` labels events (-1:
  // several); a unit's linear work is labelled with its own op.
  void slot(const Slot& s, int dir, int64_t mb) {
    const CadMode mode = R_.o.strategy.cad_mode;
    const auto d3 = static_cast<size_t>(dir);
    static constexpr const char* kLin[2][2] = {{"fwd linear ping", "fwd linear pong"}, {"bwd linear ping", "bwd linear pong"}};
    static constexpr const char* kAtt[3][2] = {{"fwd attention ping", "fwd attention pong"},
                                               {"bwd attention ping", "bwd attention pong"},
                                               {"fwd+bwd attention ping", "fwd+bwd attention pong"}};
    static constexpr const char* kDis[3][2] = {{"Q/KV dispatch ping", "Q/KV dispatch pong"},
                                               {"dO dispatch ping", "dO dispatch pong"},
                                               {"Q/KV+dO dispatch ping", "Q/KV+dO dispatch pong"}};
    static constexpr const char* kRet[3][2] = {{"O return ping", "O return pong"},
                                               {"dQ/dKV return ping", "dQ/dKV return pong"},
                                               {"O+dQ/dKV return ping", "O+dQ/dKV return pong"}};
    const char* const* att_name = kAtt[d3];
    const char* const* d_name = kDis[d3];
    const char* const* r_name = kRet[d3];
    if (mode == CadMode::kSingleStream) {  // one batch (nano-batch 1 is empty), no overlap
      for (int x = 0; x < 1; ++x) {
        linear(s, x, Collective{}, kLin, mb);
        if (!s.has_attention) continue;
        const Collective d = issue(s.dispatch_sent[x], s.dispatch_recv[x], s.dispatch_peers[x], d_name[x], mb);
        attention(s.attention[x], d, att_name[x], mb);
        const Collective r = issue(s.return_sent[x], s.return_recv[x], s.return_peers[x], r_name[x], mb);
        wait_all(r);
      }
      return;
    }
    Collective d[2];
    for (int x = 0; x < 2; ++x) {
      linear(s, x, returns_[x], kLin, mb);
      returns_[x].valid = false;
      if (s.has_attention) d[x] = issue(s.dispatch_sent[x], s.dispatch_recv[x], s.dispatch_peers[x], d_name[x], mb);
    }
    if (!s.has_attention) return;
    for (int x = 0; x < 2; ++x) {
      attention(s.attention[x], d[x], att_name[x], mb);
      returns_[x] = issue(s.return_sent[x], s.return_recv[x], s.return_peers[x], r_name[x], mb);
    }
  }

  // A global step: every unit waits for the slowest, then a transfer of `dur` seconds in
  // which units move data: sent[0] / recv[0] activations, sent[1] / recv[1] gradients (PP,
  // between ticks).
  void barrier_transfer(double dur, const Vec (&sent)[2], const Vec (&recv)[2]) {
    static constexpr const char* kName[2] = {"PP activation transfer", "PP grad transfer"};
    double t = *std::max_element(clock_.begin(), clock_.end());
    t = std::max(t, net_free_);
    for (int64_t u = 0; u < U_; ++u) {
      const auto i = static_cast<size_t>(u);
      bool waits = false;
      for (int d = 0; d < 2; ++d) {
        if (sent[d][i] > 0 || recv[d][i] > 0) rec_.comm(u, t, dur, sent[d][i], recv[d][i], kName[d], -1);
        waits = waits || recv[d][i] > 0;
      }
      if (waits) rec_.wait(u, clock_[i], t + dur, t);
      clock_[i] = t + dur;
    }
    net_free_ = t + dur;
  }

  double net_free() const { return net_free_; }

 private:
  // One exchange (network.h): every unit's part from its bytes and its messages (the peers
  // it exchanges bytes with, per direction: see Slot); signal mode sends its messages with no
  // payload.
  Collective issue(const Vec& sent, const Vec& recv, const PeerLists (&peers)[2], const char* name, int64_t mb) {
    const bool signal = R_.o.strategy.cad_mode == CadMode::kSignal;
    peers[0].counts(sends_, receives_);
    peers[1].add_counts(sends_, receives_);
    double start = net_free_, dur = 0;
    for (int64_t u = 0; u < U_; ++u) {
      const auto i = static_cast<size_t>(u);
      // The bytes (traffic.h) and the pairs (add_plan_peers) are two books of one plan.
      DISTCA_CHECK(messages_cover_bytes(sent[i], recv[i], sends_[i], receives_[i]));
      start = std::max(start, clock_[i]);
      dur = std::max(dur, all_to_all_unit_seconds(R_.exchange, signal ? 0.0 : sent[i], signal ? 0.0 : recv[i],
                                                  sends_[i], receives_[i]));
    }
    Collective c{start, start + dur, true, std::vector<char>(static_cast<size_t>(U_), 0)};
    for (int64_t u = 0; u < U_; ++u) {
      const auto i = static_cast<size_t>(u);
      c.part[i] = sent[i] > 0 || recv[i] > 0;
      if (c.part[i]) rec_.comm(u, start, dur, signal ? 0.0 : sent[i], signal ? 0.0 : recv[i], name, mb);
    }
    net_free_ = start + dur;
    return c;
  }
  void wait_for(size_t i, const Collective& c) {
    if (!c.valid || c.end <= clock_[i]) return;
    if (c.part[i]) rec_.wait(static_cast<int64_t>(i), clock_[i], c.end, c.start);
    clock_[i] = c.end;
  }
  void wait_all(const Collective& c) {
    for (size_t i = 0; i < clock_.size(); ++i) wait_for(i, c);
  }
  // Nano-batch x's linear work of slot s; names[dir][x] by the unit's op.
  void linear(const Slot& s, int x, const Collective& after, const char* const (&names)[2][2], int64_t mb) {
    for (size_t i = 0; i < clock_.size(); ++i) {
      wait_for(i, after);
      const double dur = s.linear[x][i];
      const bool own = s.unit_dir[i] >= 0;
      clock_[i] += rec_.linear(static_cast<int64_t>(i), clock_[i], dur, names[own && s.unit_dir[i] == 1 ? 1 : 0][x],
                               own ? s.unit_mb[i] : mb);
    }
  }
  void attention(const Vec& seconds, const Collective& after, const char* name, int64_t mb) {
    for (size_t i = 0; i < clock_.size(); ++i) {
      wait_for(i, after);
      clock_[i] += rec_.attention(static_cast<int64_t>(i), clock_[i], seconds[i], name, mb);
    }
  }

  const Rates& R_;
  Recorder& rec_;
  Vec& clock_;  // [units] when each unit's compute stream is next free
  int64_t U_;
  double net_free_ = 0;
  Collective returns_[2];  // returns in flight from the previous slot
  std::vector<int64_t> sends_, receives_;  // scratch of issue
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The ranks of one plan: the active stages' micro-batches pooled into one Batch
// (plan/pool.h, the runtime's definition) over the units that take part. all_units: every
// unit takes part (idle stages' units serve); otherwise the active stages' units only. Units
// are the pool's global ranks (stage-major, units_per_stage replicas per stage).
Result<PooledBatch> pool_tick(const Rates& R, const std::vector<Batch>& mbs, const Tick& tick, bool all_units) {
  std::vector<PoolMember> members;
  members.reserve(tick.ops.size());
  for (const PipeOp& op : tick.ops) {
    members.push_back({op.stage, op.microbatch, op.backward, &mbs[static_cast<size_t>(op.microbatch)]});
  }
  return pool_batches(members, R.pp, R.units_per_stage, all_units ? PoolRanks::kAll : PoolRanks::kActiveStages);
}

// The plan's tasks cut at the nano-batch boundary and split by stage: [x][stage].
using NanoTaskLists = std::array<std::vector<std::vector<TaskPlacement>>, 2>;
// `split`: the nano-batch split (nullptr for single-stream: no nano-batches, the whole
// micro-batch is "ping", pong is empty).
NanoTaskLists split_nano(const Rates& R, const std::vector<TaskPlacement>& tasks, const NanoSplit* split) {
  const int64_t p = R.pp;
  NanoTaskLists lists;
  lists[0].assign(static_cast<size_t>(p), {});
  lists[1].assign(static_cast<size_t>(p), {});
  for (const TaskPlacement& t : tasks) {
    const int64_t s = t.doc % p;  // PooledBatch::stage_of_doc
    const int64_t cut = split ? split->cut_of(t.doc) : t.q_end;
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
  return lists;
}

// Plans one direction of a tick and fills the contributions of its ops: outs[i] receives
// tick.ops[i]'s. all_units: see pool_tick. fresh_backward: a backward planned anew (its
// servers did not run the forward: pipelines), so the inputs travel again with dO: Q, K/V,
// O + LSE out; dQ, dK/dV back (the forward fields are filled as for a forward plan).
Status plan_tick(const Rates& R, const std::vector<Batch>& mbs, const Tick& tick, const std::vector<Contribution*>& outs,
                 bool all_units, bool fresh_backward, PlanStats& ps) {
  const int64_t ups = R.units_per_stage;
  DISTCA_ASSIGN_OR_RETURN(const PooledBatch pooled, pool_tick(R, mbs, tick, all_units));
  ScheduleOptions so;
  so.model = R.o.model;
  so.dtype_bytes = R.o.dtype_bytes;
  so.tolerance = R.o.tolerance;
  so.cost = &R.cost;
  // Every mode plans the split batch, as the runtime does (its single-stream runs the split
  // batch's whole plan): the three modes share one schedule.
  const bool split = R.o.strategy.cad_mode != CadMode::kSingleStream;
  // The split's grid is the kernel's query tile (the runtime's align_rows in `distca train`
  // and `bench step`): short shards are padded to it, so cutting a document under two tiles
  // would pay padding on both halves.
  DISTCA_ASSIGN_OR_RETURN(const NanoSplit nano, split_nano_batches(pooled.batch, R.o.attention_tile));
  const Batch& planned = nano.batch;  // same ranks and units as the pooled batch
  const auto t0 = std::chrono::steady_clock::now();
  auto sched = schedule_cad(planned, so, nullptr);
  if (!sched.ok()) return sched.status();
  ps.plan_seconds += seconds_since(t0);
  const DocumentIndex index(planned);
  const NanoTaskLists lists = split_nano(R, sched->tasks, split ? &nano : nullptr);
  for (size_t oi = 0; oi < tick.ops.size(); ++oi) {
    const PipeOp& op = tick.ops[oi];
    Contribution& c = *outs[oi];
    c.init(static_cast<size_t>(R.units));
    for (int64_t i = 0; i < ups; ++i) {
      const int64_t u = op.stage * ups + i;
      const int64_t rank = pooled.rank_of(op.stage, i);
      for (int x = 0; x < 2; ++x) {
        const int64_t rows = split ? nano.tokens[static_cast<size_t>(rank)][static_cast<size_t>(x)]
                                   : (x == 0 ? pooled.batch.rank_tokens(rank) : 0);
        c.tokens[x][static_cast<size_t>(u)] = static_cast<double>(rows);
      }
    }
    for (int x = 0; x < 2; ++x) {
      fill_nano_contribution(R, pooled, index, lists[static_cast<size_t>(x)][static_cast<size_t>(op.stage)], x,
                             fresh_backward, c, ps);
    }
  }
  ps.plans += 1;
  ps.tasks += static_cast<int64_t>(sched->tasks.size());
  ps.load_max_over_mean =
      std::max(ps.load_max_over_mean, max_over_mean(server_loads(pooled.batch.ranks, sched->tasks, &R.cost)));
  ps.load_before_max_over_mean =
      std::max(ps.load_before_max_over_mean, max_over_mean(colocated_loads(pooled.batch, &R.cost)));
  return Status::ok_status();
}

std::vector<Contribution*> as_ptrs(std::vector<Contribution>& v) {
  std::vector<Contribution*> out;
  for (Contribution& c : v) out.push_back(&c);
  return out;
}

// The CAD engine over 1F1B's unit-time slots as mixed ticks (one_f_one_b_ticks, what `distca
// train --mode cad --pp P` runs): per tick, the forward members pooled into one plan and the
// backward members into another (choose_plan, planned apart; pp = 1 has one op per tick and
// its backward reuses its forward's servers), both directions' layer slots run together on
// every unit (run_tick), then PP activations and gradients move (pp_transfer); then the
// gradient all-reduce and memory.
class CadEngine {
 public:
  CadEngine(const Rates& R, const std::vector<Batch>& mbs)
      : R_(R),
        mbs_(mbs),
        U_(static_cast<size_t>(R.units)),
        ticks_(split_ticks(one_f_one_b_ticks(R.pp, static_cast<int64_t>(mbs.size())))),
        contrib_(static_cast<size_t>(R.pp), std::vector<Contribution>(mbs.size())),
        rec_(R.units, R.o.record_events, R.sharing),
        clock_(U_, 0.0),
        runner_(R, rec_, clock_),
        transient_(U_, 0.0),
        transient_kv_(U_, 0.0) {
    for (int64_t n : R.stage_layers) max_stage_layers_ = std::max(max_stage_layers_, n);
  }

  Status run(SimResult& r) {
    for (const TickParts& tick : ticks_) {
      if (tick.fwd.ops.empty() && tick.bwd.ops.empty()) continue;
      Part f{&tick.fwd, {}}, b{&tick.bwd, {}};
      for (const PipeOp& op : tick.fwd.ops) f.src.push_back(&stored(op));
      for (const PipeOp& op : tick.bwd.ops) b.src.push_back(&stored(op));
      // Forward first: its winner is stored (candidates_ is then free for the backward's).
      if (!f.tick->ops.empty()) DISTCA_RETURN_IF_ERROR(choose_plan(*f.tick, f.src, r.plan));
      if (!b.tick->ops.empty() && R_.pp > 1) DISTCA_RETURN_IF_ERROR(choose_plan(*b.tick, b.src, r.plan));
      note_transients(f.src, b.src, transient_, transient_kv_);
      run_tick({&f, &b}, runner_, rec_);
      if (R_.pp > 1) pp_transfer(tick);
      release_after(tick);
    }
    // Gradient all-reduce per stage after its last backward.
    r.pipeline_seconds = std::max(*std::max_element(clock_.begin(), clock_.end()), runner_.net_free());
    // Every unit serves attention until the last tick, so every all-reduce starts after it.
    run_grad_sync(R_, rec_, std::vector<double>(static_cast<size_t>(R_.pp), r.pipeline_seconds), clock_, r);
    r.iteration_seconds = std::max(r.iteration_seconds, r.pipeline_seconds);
    finish(r);
    return Status::ok_status();
  }

 private:
  // One tick's members by direction (fwd.backward = false, bwd.backward = true).
  struct TickParts {
    Tick fwd, bwd;
  };
  // One direction of a tick with the contributions it runs (one per op).
  struct Part {
    const Tick* tick = nullptr;
    std::vector<Contribution*> src;
  };
  static std::vector<TickParts> split_ticks(const std::vector<std::vector<PipeOp>>& ticks) {
    std::vector<TickParts> out(ticks.size());
    for (size_t t = 0; t < ticks.size(); ++t) {
      out[t].bwd.backward = true;
      for (const PipeOp& op : ticks[t]) (op.backward ? out[t].bwd : out[t].fwd).ops.push_back(op);
    }
    return out;
  }

  // contrib_ lives for the whole run: free what no later tick reads (a pipeline's backward is
  // planned anew, so its forward's exchanges go after the forward tick; pp = 1's after its
  // backward).
  void release_after(const TickParts& tick) {
    for (const PipeOp& op : tick.fwd.ops) {
      if (R_.pp > 1) {
        stored(op).release_exchanges();
      } else {
        stored(op).release_forward();
      }
    }
    if (R_.pp == 1) {
      for (const PipeOp& op : tick.bwd.ops) stored(op).release_exchanges();
    }
  }

  Contribution& stored(const PipeOp& op) {
    return contrib_[static_cast<size_t>(op.stage)][static_cast<size_t>(op.microbatch)];
  }

  // Layer slot k of one direction `tick` (contributions `src`, one per op) added into slot_;
  // counts the forward's attention pairs in `rcd`. Slot k runs layer k's attention (a
  // backward: layer n-1-k's, the runtime's layer step k) after the linear work between layers
  // k-1 and k; slot n (the stage's layer count) is the linear tail without attention.
  void fill_slot(const Tick& tick, const std::vector<Contribution*>& src, int64_t k, Recorder& rcd) {
    const bool bwd = tick.backward;
    const int64_t p = R_.pp, ups = R_.units_per_stage;
    const double share = R_.attn_fwd_share;
    for (size_t oi = 0; oi < tick.ops.size(); ++oi) {
      const PipeOp& op = tick.ops[oi];
      for (int64_t i = 0; i < ups; ++i) {
        const auto u = static_cast<size_t>(op.stage * ups + i);
        slot_.unit_dir[u] = bwd ? 1 : 0;
        slot_.unit_mb[u] = op.microbatch;
      }
      const int64_t n = R_.stage_layers[static_cast<size_t>(op.stage)];
      if (k > n) continue;
      const Contribution& c = *src[oi];
      const bool last = op.stage == p - 1;
      // Linear share of this slot: the first slot runs the pre-CA part of layer 0 (forward)
      // or the post-CA backward of the last layer; slot n the remainder; between, a full
      // layer (post-CA of the previous fused with pre-CA of the next).
      const double first = bwd ? 1.0 - R_.pre_share : R_.pre_share;
      double frac = k == 0 ? first : (k == n ? 1.0 - first : 1.0);
      if (n == 0) frac = 0;
      const double per_tok = bwd ? R_.linear_bwd_per_token : R_.linear_fwd_per_token;
      for (int x = 0; x < 2; ++x) {
        for (int64_t i = 0; i < ups; ++i) {
          const auto u = static_cast<size_t>(op.stage * ups + i);
          double lin = frac * per_tok * c.tokens[x][u];
          if (last && !bwd && k == n) lin += R_.lm_head_fwd_per_token * c.tokens[x][u];
          if (last && bwd && k == 0) lin += R_.lm_head_bwd_per_token * c.tokens[x][u];
          slot_.linear[x][u] += lin;
        }
        if (k == n) continue;  // the tail slot has no attention
        slot_.has_attention = true;
        for (size_t u = 0; u < U_; ++u) {
          slot_.attention[x][u] += c.attention_seconds[x][u] * (bwd ? 1.0 - share : share);
          slot_.dispatch_sent[x][u] += bwd ? c.bwd_dispatch_sent[x][u] : c.fwd_dispatch_sent[x][u];
          slot_.dispatch_recv[x][u] += bwd ? c.bwd_dispatch_recv[x][u] : c.fwd_dispatch_recv[x][u];
          slot_.return_sent[x][u] += bwd ? c.bwd_return_sent[x][u] : c.fwd_return_sent[x][u];
          slot_.return_recv[x][u] += bwd ? c.bwd_return_recv[x][u] : c.fwd_return_recv[x][u];
          if (!bwd) rcd.stats()[u].attention_pairs += c.attention_pairs[x][u];
        }
        slot_.dispatch_peers[x][bwd ? 1 : 0].merge(bwd ? c.bwd_dispatch_peers[x] : c.fwd_dispatch_peers[x]);
        slot_.return_peers[x][bwd ? 1 : 0].merge(bwd ? c.bwd_return_peers[x] : c.fwd_return_peers[x]);
      }
    }
  }

  // One tick's layer slots on `runner` (the real timeline, or a scratch one to estimate):
  // slot k holds every part's slot k (forward layer k beside backward layer n-1-k, as the
  // runtime's TickRunner interleaves them), every unit doing both directions' work in it.
  void run_tick(const std::vector<const Part*>& parts, TickRunner& runner, Recorder& rcd) {
    int dir = -1;
    size_t ops = 0;
    int64_t mb = -1;
    for (const Part* pt : parts) {
      if (pt->tick->ops.empty()) continue;
      const int d = pt->tick->backward ? 1 : 0;
      dir = dir < 0 ? d : (dir == d ? d : 2);
      ops += pt->tick->ops.size();
      mb = pt->tick->ops.front().microbatch;
    }
    if (dir < 0) return;
    if (ops != 1) mb = -1;
    for (int64_t k = 0; k <= max_stage_layers_; ++k) {
      slot_.reset(U_);
      slot_.has_attention = false;
      for (const Part* pt : parts) fill_slot(*pt->tick, pt->src, k, rcd);
      runner.slot(slot_, dir, mb);
    }
  }

  // The duration of one direction of a tick run alone from an idle cluster.
  double estimate(const Tick& tick, const std::vector<Contribution*>& src) {
    Recorder scratch(R_.units, false);
    Vec clock(U_, 0.0);
    TickRunner runner(R_, scratch, clock);
    const Part part{&tick, src};
    run_tick({&part}, runner, scratch);
    return std::max(*std::max_element(clock.begin(), clock.end()), runner.net_free());
  }

  // One direction of a tick: one plan pooled over every unit (idle stages serve); when
  // stages do not run this direction, also the plan over its own stages' units only, and the
  // faster (run alone) wins (pooling can cost more bytes than the attention it moves). A
  // forward's winner is stored as the op's contribution (tokens, memory, pp = 1's backward);
  // a backward (pp > 1: planned anew, stateless servers) replaces `src` for this tick.
  Status choose_plan(const Tick& tick, std::vector<Contribution*>& src, PlanStats& plan) {
    const bool bwd = tick.backward;
    const bool idle_stages = static_cast<int64_t>(tick.ops.size()) < R_.pp;
    candidates_.clear();
    std::vector<PlanStats> cand_stats;
    std::vector<bool> cand_all_units;
    auto add_candidate = [&](bool all_units) -> Status {
      candidates_.emplace_back(tick.ops.size());
      cand_stats.emplace_back();
      cand_all_units.push_back(all_units);
      return plan_tick(R_, mbs_, tick, as_ptrs(candidates_.back()), all_units, bwd, cand_stats.back());
    };
    DISTCA_RETURN_IF_ERROR(add_candidate(true));
    if (idle_stages) DISTCA_RETURN_IF_ERROR(add_candidate(false));
    for (const PlanStats& cs : cand_stats) plan.plan_seconds += cs.plan_seconds;
    size_t b = 0;
    if (candidates_.size() > 1) {  // a single candidate needs no estimate
      double best_time = 0;
      for (size_t ci = 0; ci < candidates_.size(); ++ci) {
        const double t = estimate(tick, as_ptrs(candidates_[ci]));
        if (ci == 0 || t < best_time) {
          best_time = t;
          b = ci;
        }
      }
    }
    if (bwd) {
      src = as_ptrs(candidates_[b]);
      ++plan.backward_replans;
    } else {
      for (size_t oi = 0; oi < tick.ops.size(); ++oi) *src[oi] = std::move(candidates_[b][oi]);
    }
    const PlanStats& cs = cand_stats[b];
    plan.plans += cs.plans;
    plan.tasks += cs.tasks;
    plan.load_max_over_mean = std::max(plan.load_max_over_mean, cs.load_max_over_mean);
    plan.load_before_max_over_mean = std::max(plan.load_before_max_over_mean, cs.load_before_max_over_mean);
    plan.comm_bytes_forward += cs.comm_bytes_forward;
    plan.comm_bytes_backward += cs.comm_bytes_backward;
    if (!cand_all_units[b]) ++plan.active_only_plans;
    return Status::ok_status();
  }

  // PP: after a tick, the forwards' activations cross to the next stage and the backwards'
  // gradients to the previous one, in one global step (every unit waits for the slowest).
  void pp_transfer(const TickParts& tick) {
    const int64_t p = R_.pp, ups = R_.units_per_stage;
    Vec sent[2], recv[2];  // [0] activations, [1] gradients
    double dur = 0;
    for (int d = 0; d < 2; ++d) {
      sent[d].assign(U_, 0.0);
      recv[d].assign(U_, 0.0);
      for (const PipeOp& op : (d == 1 ? tick.bwd : tick.fwd).ops) {
        const int64_t to = d == 1 ? op.stage - 1 : op.stage + 1;
        if (to < 0 || to >= p) continue;
        const Contribution& c = stored(op);
        for (int64_t i = 0; i < ups; ++i) {
          const auto from_u = static_cast<size_t>(op.stage * ups + i), to_u = static_cast<size_t>(to * ups + i);
          const double bytes = R_.boundary_bytes(c.tokens[0][from_u] + c.tokens[1][from_u]);
          sent[d][from_u] += bytes;
          recv[d][to_u] += bytes;
          dur = std::max(dur, R_.p2p(bytes));
        }
      }
    }
    if (dur > 0) runner_.barrier_transfer(dur, sent, recv);
  }
  // Memory: unit u's own activations follow its stage's ops; the buffers it keeps as a server
  // follow every (stage, micro-batch) it served, held from that forward tick to its backward.
  // Then the per-unit figures of the result.
  void finish(SimResult& r) {
    const int64_t ups = R_.units_per_stage;
    std::vector<MemoryInput> mem(U_);
    Vec kept(U_, 0.0), kept_kv(U_, 0.0);
    std::vector<double> tokens_held(U_, 0.0);
    for (const TickParts& tick : ticks_) {
      for (const PipeOp& op : tick.fwd.ops) account(op, kept, kept_kv, tokens_held, mem);
      for (const PipeOp& op : tick.bwd.ops) account(op, kept, kept_kv, tokens_held, mem);
      for (size_t u = 0; u < U_; ++u) {
        mem[u].kept_bytes = std::max(mem[u].kept_bytes, kept[u]);
        mem[u].kept_kv_bytes = std::max(mem[u].kept_kv_bytes, kept_kv[u]);
        mem[u].tokens_in_flight = std::max(mem[u].tokens_in_flight, tokens_held[u]);
      }
    }
    for (size_t u = 0; u < U_; ++u) {
      mem[u].transient_bytes = transient_[u];
      mem[u].transient_kv_bytes = transient_kv_[u];
    }
    r.per_unit = std::move(rec_.stats());
    r.events = std::move(rec_.events());
    for (size_t u = 0; u < U_; ++u) {
      r.per_unit[u].stage = static_cast<int64_t>(u) / ups;
      r.per_unit[u].tokens = static_cast<int64_t>(mem[u].tokens_max);
    }
    apply_memory(R_, mem, r);
    r.cp_degree = 1;
    r.dp = ups;
    r.pp_ticks = static_cast<int64_t>(ticks_.size());
  }
  // One op's change to the memory held (a forward adds, a backward frees).
  void account(const PipeOp& op, Vec& kept, Vec& kept_kv, std::vector<double>& tokens_held,
               std::vector<MemoryInput>& mem) {
    const int64_t ups = R_.units_per_stage;
    const Contribution& c = stored(op);
    const double sign = op.backward ? -1.0 : 1.0;
    const double layers = static_cast<double>(R_.stage_layers[static_cast<size_t>(op.stage)]);
    for (size_t u = 0; u < U_; ++u) {
      kept[u] += sign * c.kept_bytes[u] * layers;
      kept_kv[u] += sign * c.kept_kv[u] * layers;
    }
    for (int64_t i = 0; i < ups; ++i) {
      const auto u = static_cast<size_t>(op.stage * ups + i);
      const double t = c.tokens[0][u] + c.tokens[1][u];
      tokens_held[u] += sign * t;
      mem[u].tokens_max = std::max(mem[u].tokens_max, t);
    }
  }

  const Rates& R_;
  const std::vector<Batch>& mbs_;
  const size_t U_;
  const std::vector<TickParts> ticks_;
  std::vector<std::vector<Contribution>> contrib_;  // [stage][micro-batch] as planned forward
  Recorder rec_;
  Vec clock_;  // [units] the real timeline
  TickRunner runner_;
  int64_t max_stage_layers_ = 0;
  Slot slot_;  // scratch of fill_slot
  Vec transient_, transient_kv_;  // [units] peak bytes of the layer step in flight (note_transients)
  std::vector<std::vector<Contribution>> candidates_;  // plans of the tick being chosen
};

}  // namespace

Status run_cad(const Rates& R, const std::vector<Batch>& mbs, SimResult& r) {
  CadEngine engine(R, mbs);
  return engine.run(r);
}

}  // namespace distca::sim::detail
