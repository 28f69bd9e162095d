// CAD: core attention served by every unit as an in-place attention server, with PP over
// 1F1B's unit-time slots as mixed ticks (one_f_one_b_ticks), each direction of a tick planned
// exactly as the trainer plans it (pool_tick over every unit, then schedule_nano_batches with
// align_rows = SimOptions::attention_tile: the same cut, the same stage of every document),
// run with ping-pong nano-batches, single-stream or signal (docs/simulation-model.md, "CAD").
// The per-op bookkeeping (bytes, message pairs, buffers) is cad_contribution.h's.
#include <algorithm>
#include <array>
#include <chrono>

#include "distca/plan/cad.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/nano_plan.h"
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
  Vec tp_seconds[2], tp_bytes[2];  // [x][unit] TP collectives after the linear work (Rates::tp_slot)
  Vec dispatch_sent[2], dispatch_recv[2], return_sent[2], return_recv[2];
  // [x][direction]: the messages of each direction's exchange (plan/link_model.h). Inside a
  // direction the ops share one plan and one exchange (a pair's entries add up to one
  // message); a mixed tick's two directions are two exchanges (the runtime's TickRunner has a
  // dispatcher per direction), posted one after the other.
  Contribution::Messages dispatch_msgs[2][2], return_msgs[2][2];
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
        dispatch_msgs[x][d].clear();
        return_msgs[x][d].clear();
      }
      for (Vec* v : {&linear[x], &attention[x], &tp_seconds[x], &tp_bytes[x], &dispatch_sent[x], &dispatch_recv[x],
                     &return_sent[x], &return_recv[x]}) {
        v->assign(units, 0.0);
      }
    }
  }
};

// One exchange on the links: in flight from `start` (every unit has posted it) until end[u]
// on unit u.
struct Collective {
  double start = 0;
  std::vector<double> end;
  bool valid = false;
  // [units] 1 where the unit moves bytes in it: waiting for a collective one takes no part in
  // (a unit that neither holds nor serves any of its tasks) is idle, not exposed.
  std::vector<char> part;
};

// Advances the units' clocks through layer slots: compute per unit, exchanges on the link
// model (plan/link_model.h, the ping-pong timeline's: per-direction queues, every pair a
// message), ping-pong overlap of one nano-batch's exchange with the other's compute.
class TickRunner {
 public:
  TickRunner(const Rates& R, Recorder& rec, Vec& unit_clock)
      : R_(R), rec_(rec), clock_(unit_clock), U_(R.units), links_(R.units, R.unit_hosts, R.cad_links),
        draws_(static_cast<size_t>(R.units)) {}

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
        const Collective d = issue(s.dispatch_sent[x], s.dispatch_recv[x], s.dispatch_msgs[x], dir, d_name[x], mb);
        attention(s.attention[x], d, att_name[x], mb);
        const Collective r = issue(s.return_sent[x], s.return_recv[x], s.return_msgs[x], dir, r_name[x], mb);
        wait_all(r);
      }
      return;
    }
    // The runtime's lane order (runtime/tick_runner.h): a forward runs ping, then pong; a
    // backward pong first (ping's pre-CA backward reads pong's dK/dV partials), so pong's
    // return of a layer is waited for before any linear work of the next one. A mixed tick
    // (dir 2) pairs each direction's nano-batch x in lane x and runs ping first.
    const std::array<int, 2> order = dir == 1 ? std::array{1, 0} : std::array{0, 1};
    Collective d[2];
    for (const int x : order) {
      linear(s, x, returns_[x], kLin, mb);
      returns_[x].valid = false;
      if (s.has_attention) d[x] = issue(s.dispatch_sent[x], s.dispatch_recv[x], s.dispatch_msgs[x], dir, d_name[x], mb);
    }
    if (!s.has_attention) return;
    for (const int x : order) {
      attention(s.attention[x], d[x], att_name[x], mb);
      returns_[x] = issue(s.return_sent[x], s.return_recv[x], s.return_msgs[x], dir, r_name[x], mb);
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
    links_.hold_until(net_free_);
  }

  double net_free() const { return net_free_; }

 private:
  // One exchange per direction of the slot (`dir`: 0, 1, or 2 both, forward first) on the
  // links, posted by every unit at its clock; signal mode sends its messages with no payload.
  // A unit that moves no bytes in it waits as idle, not exposed (Collective::part).
  Collective issue(const Vec& sent, const Vec& recv, const Contribution::Messages (&msgs)[2], int dir,
                   const char* name, int64_t mb) {
    const bool signal = R_.o.strategy.cad_mode == CadMode::kSignal;
    Collective c{0, clock_, true, std::vector<char>(static_cast<size_t>(U_), 0)};
    for (int d = 0; d < 2; ++d) {
      if (dir != 2 && dir != d) continue;
      const ExchangeTimes t = links_.post(clock_, msgs[d], signal);
      c.start = t.all_posted;
      for (size_t i = 0; i < c.end.size(); ++i) c.end[i] = std::max(c.end[i], t.done[i]);
    }
    for (int64_t u = 0; u < U_; ++u) {
      const auto i = static_cast<size_t>(u);
      c.part[i] = sent[i] > 0 || recv[i] > 0;
      if (c.part[i]) {
        rec_.comm(u, c.start, c.end[i] - c.start, signal ? 0.0 : sent[i], signal ? 0.0 : recv[i], name, mb);
      }
      // Each of the unit's G ranks moves its share of the bytes on its own cores.
      const double cpu = R_.comm_cpu_per_byte * (sent[i] + recv[i]) / static_cast<double>(R_.gpus_per_unit);
      if (!signal && cpu > 0 && c.end[i] > c.start) draws_[i].push_back({c.start, c.end[i], cpu});
      net_free_ = std::max(net_free_, c.end[i]);
    }
    return c;
  }
  void wait_for(size_t i, const Collective& c) {
    if (!c.valid || c.end[i] <= clock_[i]) return;
    if (c.part[i]) rec_.wait(static_cast<int64_t>(i), clock_[i], c.end[i], c.start);
    clock_[i] = c.end[i];
  }
  void wait_all(const Collective& c) {
    for (size_t i = 0; i < clock_.size(); ++i) wait_for(i, c);
  }
  // Nano-batch x's linear work of slot s; names[dir][x] by the unit's op.
  void linear(const Slot& s, int x, const Collective& after, const char* const (&names)[2][2], int64_t mb) {
    for (size_t i = 0; i < clock_.size(); ++i) {
      wait_for(i, after);
      const double dur = taxed(i, s.linear[x][i]);
      const bool own = s.unit_dir[i] >= 0;
      clock_[i] += rec_.linear(static_cast<int64_t>(i), clock_[i], dur, names[own && s.unit_dir[i] == 1 ? 1 : 0][x],
                               own ? s.unit_mb[i] : mb);
      const Rates::TpCost tp{s.tp_seconds[x][i], s.tp_bytes[x][i], R_.tp_wait};
      clock_[i] += rec_.tp(static_cast<int64_t>(i), clock_[i], tp, own ? s.unit_mb[i] : mb);
    }
  }
  void attention(const Vec& seconds, const Collective& after, const char* name, int64_t mb) {
    for (size_t i = 0; i < clock_.size(); ++i) {
      wait_for(i, after);
      clock_[i] += rec_.attention(static_cast<int64_t>(i), clock_[i], taxed(i, seconds[i]), name, mb);
    }
  }

  // Unit i's compute of `seconds` from its clock, lengthened by the CPU its transfers in flight
  // take meanwhile (charge_transfer_cpu).
  double taxed(size_t i, double seconds) { return charge_transfer_cpu(draws_[i], clock_[i], seconds); }

  const Rates& R_;
  Recorder& rec_;
  Vec& clock_;  // [units] when each unit's compute stream is next free
  int64_t U_;
  double net_free_ = 0;  // the latest end of any exchange or transfer so far
  ExchangeLinks links_;
  std::vector<std::vector<CpuDraw>> draws_;  // [units] transfers whose CPU is not yet charged
  Collective returns_[2];  // returns in flight from the previous slot
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The plan's cut tasks by nano-batch and stage: [x][stage].
using NanoTaskLists = std::array<std::vector<std::vector<TaskPlacement>>, 2>;

// Plans one direction of a tick as the trainer does (pool_tick over every unit, then
// schedule_nano_batches: one plan whose tasks are cut at the nano-batch boundary) and fills
// the contributions of its ops: outs[i] receives tick.ops[i]'s. fresh_backward: a backward
// planned anew (its servers did not run the forward: pipelines), so the inputs travel again
// with dO: Q, K/V, O + LSE out; dQ, dK/dV back (the forward fields are filled as for a
// forward plan).
Status plan_tick(const Rates& R, const std::vector<Batch>& mbs, const Tick& tick, const std::vector<Contribution*>& outs,
                 bool fresh_backward, PlanStats& ps) {
  const int64_t ups = R.units_per_stage;
  DISTCA_ASSIGN_OR_RETURN(const PooledBatch pooled, pool_tick(tick, mbs, R.pp, ups));
  ScheduleOptions so;
  so.model = R.o.model;
  so.dtype_bytes = R.o.dtype_bytes;
  so.tolerance = R.o.tolerance;
  so.cost = &R.cost;
  // The runtime's align_rows (`distca train`, `bench step`): the kernel's query tile, the grid
  // of the nano-batch cut and of every cut the scheduler makes (no task pays tile padding).
  so.align_rows = R.o.attention_tile;
  // The topology over the pooled ranks (each a unit), as the trainer's planner has it.
  if (!R.o.topology.empty()) {
    so.topology.inter_host_price = R.o.topology.inter_host_price;
    for (const int64_t u : pooled.unit_of) so.topology.host.push_back(R.o.topology.host[static_cast<size_t>(u)]);
  }
  const auto t0 = std::chrono::steady_clock::now();
  double cut_fraction = 0;  // the L / sqrt(2) rule
  if (R.auto_model != nullptr) {  // --tolerance auto, as the trainer's planner chooses
    DISTCA_ASSIGN_OR_RETURN(const AutoToleranceChoice c, choose_tolerance(pooled.batch, SchedulerSpec{}, so, *R.auto_model));
    so.tolerance = c.tolerance;
    cut_fraction = c.cut_fraction;
  }
  DISTCA_ASSIGN_OR_RETURN(const NanoSchedule ns, schedule_nano_batches(pooled.batch, SchedulerSpec{}, so, cut_fraction));
  ps.plan_seconds += seconds_since(t0);
  const NanoSplit& nano = ns.split;
  const Batch& planned = nano.batch;  // same ranks and units as the pooled batch
  // Single-stream runs the whole plan's tasks as nano-batch 0 (nano-batch 1 empty), as the
  // runtime's single-stream runs NanoPlans::full.
  const bool split = R.o.strategy.cad_mode != CadMode::kSingleStream;
  const std::array<const std::vector<TaskPlacement>*, 2> by_nano =
      split ? std::array{&ns.nano[0], &ns.nano[1]} : std::array<const std::vector<TaskPlacement>*, 2>{&ns.full, nullptr};
  NanoTaskLists lists;
  for (size_t x = 0; x < 2; ++x) {
    lists[x].assign(static_cast<size_t>(R.pp), {});
    if (by_nano[x] == nullptr) continue;
    for (const TaskPlacement& t : *by_nano[x]) lists[x][static_cast<size_t>(pooled.stage_of_doc(t.doc))].push_back(t);
  }
  const DocumentIndex index(planned);
  // Ping-pong: each stage's K/V wire (plan/kv_once.h), from its whole task list.
  std::vector<KvWireBytes> wire;
  if (split) {
    std::vector<std::vector<TaskPlacement>> full(static_cast<size_t>(R.pp));
    for (const TaskPlacement& t : ns.full) full[static_cast<size_t>(pooled.stage_of_doc(t.doc))].push_back(t);
    for (const auto& f : full) wire.push_back(relayed_kv_wire(R, pooled, index, f, nano));
  }
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
                             fresh_backward, c, ps, split ? &wire[static_cast<size_t>(op.stage)] : nullptr);
    }
  }
  ps.plans += 1;
  ps.tasks += static_cast<int64_t>(ns.scheduled.size());
  ps.load_max_over_mean =
      std::max(ps.load_max_over_mean, max_over_mean(server_loads(pooled.batch.ranks, ns.scheduled, &R.cost)));
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
// backward members into another (plan_direction, planned apart; pp = 1 has one op per tick and
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
      if (!f.tick->ops.empty()) DISTCA_RETURN_IF_ERROR(plan_direction(*f.tick, f.src, r.plan));
      if (!b.tick->ops.empty() && R_.pp > 1) DISTCA_RETURN_IF_ERROR(plan_direction(*b.tick, b.src, r.plan));
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
    std::vector<TickParts> out;
    out.reserve(ticks.size());
    for (const std::vector<PipeOp>& t : ticks) {
      std::array<Tick, 2> dirs = tick_directions(t);
      out.push_back({std::move(dirs[0]), std::move(dirs[1])});
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
          const Rates::TpCost tp = R_.tp_slot(x == 0 ? 0.0 : c.tokens[0][u], c.tokens[x][u],
                                              c.tokens[0][u] + c.tokens[1][u], bwd, k, op.stage);
          slot_.tp_seconds[x][u] += tp.seconds;
          slot_.tp_bytes[x][u] += tp.bytes;
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
        const Contribution::Messages& dm = bwd ? c.bwd_dispatch_msgs[x] : c.fwd_dispatch_msgs[x];
        const Contribution::Messages& rm = bwd ? c.bwd_return_msgs[x] : c.fwd_return_msgs[x];
        Contribution::Messages& ds = slot_.dispatch_msgs[x][bwd ? 1 : 0];
        Contribution::Messages& rs = slot_.return_msgs[x][bwd ? 1 : 0];
        ds.insert(ds.end(), dm.begin(), dm.end());
        rs.insert(rs.end(), rm.begin(), rm.end());
      }
    }
  }

  // One tick's layer slots on `runner`:
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

  // One direction of a tick, planned as the trainer plans it (plan_tick). A forward's plan is
  // stored as the ops' contributions (tokens, memory, pp = 1's backward); a backward (pp > 1:
  // planned anew, stateless servers) replaces `src` for this tick.
  Status plan_direction(const Tick& tick, std::vector<Contribution*>& src, PlanStats& plan) {
    if (tick.backward) {
      backward_.assign(tick.ops.size(), Contribution{});
      src = as_ptrs(backward_);
      ++plan.backward_replans;
    }
    return plan_tick(R_, mbs_, tick, src, tick.backward, plan);
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
      mem[u].exchange_peers = static_cast<int64_t>(U_) - 1;  // the exchanges span every unit
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
  std::vector<Contribution> backward_;  // the backward plan of the tick being run (pp > 1)
};

}  // namespace

Status run_cad(const Rates& R, const std::vector<Batch>& mbs, SimResult& r) {
  CadEngine engine(R, mbs);
  return engine.run(r);
}

}  // namespace distca::sim::detail
