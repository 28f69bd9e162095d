// The co-located strategies: colocated packing, WLB-ideal (wlb, wlb:C) and per-document CP
// (percp:C), each pipeline replica running standard 1F1B (docs/simulation-model.md,
// "Co-located strategies").
//
// Per micro-batch each unit gets its tokens, its attention and its bytes from the batch the
// runtime trains on (`distca train --mode`): colocated the batch as loaded; wlb:C the data
// loader's re-pack plan::wlb_repack with sim::wlb_chunking(options, C) (the trainer's rule:
// documents re-packed whole over every unit of the stage under the token cap, the long ones
// sharded head-tail over a CP group of C units); percp:C plan::percp_repack over groups of C.
// One policy, the plan layer's, decides the layout for the runtime and the simulator alike.
// The laid-out batch is then served as the runtime serves it, every piece where it is held:
//   colocated (the dispatcher's fetch): the K/V of its document's earlier rows held on other
//     units fetched before attention (compute_traffic; dK/dV returned in backward), each unit's
//     part of an all-to-all of its own messages; the all-to-all runs every layer, zero bytes
//     included, and joins the stage's units as a collective does (run_colocated_op);
//   wlb:C, percp:C (per-document CP through collectives, train/cp_attention.h): a document on
//     one unit moves nothing; the documents spread over units of one CP group are all-gathered
//     (their whole K/V) over the group, those spread over several groups over the stage's
//     units; backward gathers again and reduce-scatters the dK/dV partials to the rows'
//     holders. Each collective is one all-to-all (Communicator::all_gather_v and
//     reduce_scatter_sum run on all_to_all_v), costed as the unit's part of it. A collective
//     completes for no member before every member has called it: the stage's units run each
//     op in lockstep, each collective starting at its members' latest arrival (the group's
//     units, or every unit of the stage for the wide class) and ending for each member its
//     own part of the all-to-all later (run_cp_op). Forward, per layer: the linear work, the
//     gathers, the attention; backward: the linear work, the gathers, the attention, the
//     reduce-scatters (CpRunner's order), so a backward layer waits for the group twice.
// Attention: each task's cost at the rows its kernel call runs (cp_task_rows: wlb and percp pad
// a piece to the kernel's query tiles, as CpAttention does; colocated runs whole documents).
#include <algorithm>
#include <array>
#include <chrono>
#include <unordered_map>
#include <utility>

#include "distca/plan/chunking.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/nano_split.h"
#include "distca/plan/plan.h"
#include "distca/plan/schedule.h"
#include "distca/plan/traffic.h"
#include "engine.h"

namespace distca::sim::detail {
namespace {

// One unit's figures for one micro-batch, one layer.
struct UnitWork {
  double tokens = 0;
  // Rows of nano-batch 0 (the runtime's split_nano_batches at the attention tile): the
  // trainer runs a micro-batch's layer phases, and so its TP collectives, per nano-batch in
  // every mode (colocated too); cp modes run it whole (nano0 = tokens).
  double nano0 = 0;
  double attention_seconds = 0;  // forward + backward
  double pairs = 0;              // causal pairs served
  double fwd_sent = 0, fwd_recv = 0, bwd_sent = 0, bwd_recv = 0;  // bytes
  double fwd_seconds = 0, bwd_seconds = 0;  // the unit's part of the layer's exchanges
  // K/V bytes of one layer: held from its forward to its backward (the fetched rows without
  // checkpointing), and held by the layer in flight (with its dK/dV).
  double kept_per_layer = 0, transient = 0;
  int64_t peers = 0;  // units it exchanges with (the framework's connections)
  // wlb, percp: the unit's part in its CP group's collective [0] and the stage's wide one [1]
  // (active: the collective runs, this unit a member; seconds of its part of the all-gather
  // and of the reduce-scatter; bytes it sends in the all-gather and receives).
  struct Collective {
    bool active = false;
    double gather_s = 0, scatter_s = 0, gathered = 0, others = 0;
  };
  std::array<Collective, 2> coll{};
};
// work[j][i]: micro-batch j, unit i of a stage.
using Work = std::vector<std::vector<UnitWork>>;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The batch the runtime trains on for this strategy at CP degree c (see the file comment).
Result<Batch> laid_out(const SimOptions& o, const Batch& b, int64_t c) {
  switch (o.strategy.kind) {
    case StrategyKind::kWlb: return wlb_repack(b, wlb_chunking(o, c));
    case StrategyKind::kPerCp: return percp_repack(b, c);
    default: break;
  }
  DISTCA_RETURN_IF_ERROR(b.validate());
  return b;
}

// The context fetch's messages (network.h): unit u receives from every other unit holding
// rows of a document u serves before u's last row of it, once per peer (sends[v] counts the
// units v sends to). What add_plan_peers counts for a colocated schedule (every task at home),
// found per server with a [documents] and a [units] scratch array instead of a list of every
// (holder, server) pair: a document sharded over C units holds 2C runs, and the pair list
// would grow as C^2 per document.
void fetch_peer_counts(const DocumentIndex& index, const std::vector<TaskPlacement>& tasks, int64_t units,
                       std::vector<int64_t>& sends, std::vector<int64_t>& receives) {
  const auto U = static_cast<size_t>(units);
  sends.assign(U, 0);
  receives.assign(U, 0);
  std::vector<std::vector<size_t>> by_server(U);
  for (size_t i = 0; i < tasks.size(); ++i) by_server[static_cast<size_t>(tasks[i].server)].push_back(i);
  std::vector<int64_t> need(index.doc_ids().size(), 0);  // slot -> largest q_end (0: none)
  std::vector<int64_t> touched;
  std::vector<char> peer(U, 0);
  std::vector<int64_t> peers;
  for (size_t server = 0; server < U; ++server) {
    for (const size_t i : by_server[server]) {
      const int64_t slot = index.slot(tasks[i].doc);
      int64_t& e = need[static_cast<size_t>(slot)];
      if (e == 0) touched.push_back(slot);
      e = std::max(e, tasks[i].q_end);
    }
    for (const int64_t slot : touched) {
      const int64_t end = need[static_cast<size_t>(slot)];
      need[static_cast<size_t>(slot)] = 0;
      for (const HeldRun& run : index.slot_runs(slot)) {
        if (run.begin >= end) break;  // runs are sorted by begin
        const auto from = static_cast<size_t>(run.rank);
        if (from == server || peer[from] != 0) continue;
        peer[from] = 1;
        peers.push_back(run.rank);
      }
    }
    touched.clear();
    receives[server] = static_cast<int64_t>(peers.size());
    for (const int64_t from : peers) {
      ++sends[static_cast<size_t>(from)];
      peer[static_cast<size_t>(from)] = 0;
    }
    peers.clear();
  }
}

// The dispatcher's context fetch (colocated): bytes by traffic.h, messages by
// fetch_peer_counts; the backward returns dK/dV over the same pairs reversed. Without
// checkpointing every layer's fetched K/V is kept until its backward; with it only the layer
// in flight holds it. Either way the layer in backward also holds its dK/dV.
void fetch_work(const Rates& R, const Schedule& s, std::vector<UnitWork>& out, PlanStats& ps) {
  const DocumentIndex index(s.batch);
  const Traffic t = compute_traffic(index, s.tasks, R.row_bytes);
  std::vector<int64_t> sends, receives;
  fetch_peer_counts(index, s.tasks, R.units_per_stage, sends, receives);
  const bool keep = !R.o.activation_checkpointing;
  for (int64_t r = 0; r < R.units_per_stage; ++r) {
    UnitWork& w = out[static_cast<size_t>(r)];
    const RankBytes& rb = t.per_rank[static_cast<size_t>(r)];
    const auto u = static_cast<size_t>(r);
    w.fwd_sent = static_cast<double>(rb.fwd_sent);
    w.fwd_recv = static_cast<double>(rb.fwd_recv);
    w.bwd_sent = static_cast<double>(rb.bwd_sent);
    w.bwd_recv = static_cast<double>(rb.bwd_recv);
    // The bytes (traffic.h) and the pairs (fetch_peer_counts) are two books of one plan.
    DISTCA_CHECK(messages_cover_bytes(w.fwd_sent, w.fwd_recv, sends[u], receives[u]));
    DISTCA_CHECK(messages_cover_bytes(w.bwd_sent, w.bwd_recv, receives[u], sends[u]));
    w.fwd_seconds = all_to_all_unit_seconds(R.exchange, w.fwd_sent, w.fwd_recv, sends[u], receives[u]);
    w.bwd_seconds = all_to_all_unit_seconds(R.exchange, w.bwd_sent, w.bwd_recv, receives[u], sends[u]);
    w.kept_per_layer = keep ? w.fwd_recv : 0.0;
    w.transient = (keep ? 1.0 : 2.0) * w.fwd_recv;
    w.peers = std::max(sends[u], receives[u]);
  }
  ps.comm_bytes_forward += static_cast<double>(t.bytes.forward());
  ps.comm_bytes_backward += static_cast<double>(t.bytes.backward());
}

// Per-document CP's collectives on one laid-out micro-batch (train/cp_attention.h): each
// document is local (one unit), group (units of one CP group of c) or wide (units of several
// groups); each group's group-class rows are all-gathered over its c units, the wide-class
// rows over all units. Member m of a collective of M units holding `mine` of its `total` rows
// (K and V, kv bytes each): all-gather, it sends its block to the M - 1 others and receives
// the others' blocks (from those holding any); reduce-scatter, it sends each other holder the
// partials of its rows and receives M - 1 partials of its own. Forward: the all-gathers;
// backward: the all-gathers again, then the reduce-scatters (one after another, as the runtime
// calls them). Nothing is kept between layers: the layer in flight holds the gathered buffer
// and, in backward, its dK/dV partials (as large).
void cp_collectives(const Rates& R, const Batch& laid, int64_t c, std::vector<UnitWork>& out, PlanStats& ps) {
  const int64_t U = laid.ranks;
  // [doc] its lowest and highest holder.
  std::unordered_map<int64_t, std::pair<int64_t, int64_t>> span;
  for (int64_t r = 0; r < U; ++r) {
    for (const Piece& p : laid.per_rank[static_cast<size_t>(r)]) {
      auto [it, fresh] = span.try_emplace(p.doc, r, r);
      if (!fresh) it->second = {std::min(it->second.first, r), std::max(it->second.second, r)};
    }
  }
  std::vector<int64_t> group_rows(static_cast<size_t>(U), 0), wide_rows(static_cast<size_t>(U), 0);
  for (int64_t r = 0; r < U; ++r) {
    for (const Piece& p : laid.per_rank[static_cast<size_t>(r)]) {
      const auto [lo, hi] = span.at(p.doc);
      if (lo == hi) continue;
      (lo / c == hi / c ? group_rows : wide_rows)[static_cast<size_t>(r)] += p.len;
    }
  }
  const double kv = static_cast<double>(R.row_bytes.kv);
  const auto collective = [&](const std::vector<int64_t>& rows, int64_t first, int64_t end, size_t cls) {
    int64_t total = 0, holding = 0;
    for (int64_t m = first; m < end; ++m) {
      total += rows[static_cast<size_t>(m)];
      holding += rows[static_cast<size_t>(m)] > 0 ? 1 : 0;
    }
    if (total == 0) return;  // the runtime skips a collective with nothing to move
    const int64_t M = end - first;
    for (int64_t m = first; m < end; ++m) {
      UnitWork& w = out[static_cast<size_t>(m)];
      const int64_t mine = rows[static_cast<size_t>(m)];
      const double own = static_cast<double>(mine) * kv, others = static_cast<double>(total - mine) * kv;
      const int64_t to_all = mine > 0 ? M - 1 : 0, from_holders = holding - (mine > 0 ? 1 : 0);
      const double gathered = static_cast<double>(M - 1) * own;
      const double gather_s = all_to_all_unit_seconds(R.exchange, gathered, others, to_all, from_holders);
      const double scatter_s = all_to_all_unit_seconds(R.exchange, others, gathered, from_holders, to_all);
      w.fwd_sent += gathered;
      w.fwd_recv += others;
      w.bwd_sent += gathered + others;
      w.bwd_recv += others + gathered;
      w.fwd_seconds += gather_s;
      w.bwd_seconds += gather_s + scatter_s;
      w.coll[cls] = {true, gather_s, scatter_s, gathered, others};
      w.transient += 2.0 * static_cast<double>(total) * kv;
      w.peers = std::max(w.peers, M - 1);
      ps.comm_bytes_forward += gathered;
      ps.comm_bytes_backward += gathered + others;
    }
  };
  for (int64_t g = 0; g < U; g += c) collective(group_rows, g, g + c, 0);
  collective(wide_rows, 0, U, 1);
}

// The query rows per-document CP's kernel call runs for a task (train/cp_attention.h): the
// piece's rows widened to the kernel's query tiles of the document, [a rounded down to a tile,
// b rounded up to one or to the document's end), against the context [0, that end), so every
// row's bits are those of the whole-document call. A head-tail shard of L / 2C rows seldom
// starts or ends on a tile: each piece pays up to a tile more on either side, which for
// percp's shards of short documents is most of their work.
std::pair<int64_t, int64_t> cp_task_rows(const TaskPlacement& task, int64_t doc_len, int64_t tile) {
  return {task.q_begin / tile * tile, std::min(doc_len, (task.q_end + tile - 1) / tile * tile)};
}

Status layout_microbatch(const Rates& R, const Batch& b, int64_t c, std::vector<UnitWork>& out, PlanStats& ps) {
  out.assign(static_cast<size_t>(R.units_per_stage), {});
  const auto t0 = std::chrono::steady_clock::now();
  const double fwd_bytes_before = ps.comm_bytes_forward;
  DISTCA_ASSIGN_OR_RETURN(Batch laid, laid_out(R.o, b, c));
  DISTCA_ASSIGN_OR_RETURN(Schedule s, schedule_colocated(laid, ScheduleOptions{}));
  ps.plan_seconds += seconds_since(t0);
  const bool cp = R.o.strategy.kind == StrategyKind::kWlb || R.o.strategy.kind == StrategyKind::kPerCp;
  if (cp) {
    cp_collectives(R, s.batch, c, out, ps);
  } else {
    fetch_work(R, s, out, ps);
  }
  std::unordered_map<int64_t, int64_t> doc_len;
  if (cp) {
    for (const auto& pieces : s.batch.per_rank)
      for (const Piece& p : pieces) doc_len.emplace(p.doc, p.doc_len);
  }
  for (const TaskPlacement& task : s.tasks) {
    UnitWork& w = out[static_cast<size_t>(task.server)];
    const int64_t q = task.q_end - task.q_begin;
    const auto [qa, qb] = cp ? cp_task_rows(task, doc_len.at(task.doc), R.o.attention_tile)
                             : std::pair{task.q_begin, task.q_end};
    w.attention_seconds += R.cost.task_cost(qb - qa, qb);
    w.pairs += static_cast<double>(task_pairs(q, task.q_end));
  }
  for (int64_t r = 0; r < R.units_per_stage; ++r) {
    UnitWork& w = out[static_cast<size_t>(r)];
    w.tokens = static_cast<double>(s.batch.rank_tokens(r));
    w.nano0 = w.tokens;
  }
  if (!cp && R.tp_explicit) {
    DISTCA_ASSIGN_OR_RETURN(const NanoSplit nano, split_nano_batches(s.batch, R.o.attention_tile));
    for (int64_t r = 0; r < R.units_per_stage; ++r) {
      out[static_cast<size_t>(r)].nano0 = static_cast<double>(nano.tokens[static_cast<size_t>(r)][0]);
    }
  }
  // With checkpointing the backward's recompute fetches (or gathers) the K/V again.
  if (R.o.activation_checkpointing) ps.comm_bytes_backward += ps.comm_bytes_forward - fwd_bytes_before;
  std::vector<double> loads;
  for (const UnitWork& w : out) loads.push_back(w.attention_seconds);
  ps.plans += 1;
  ps.tasks += static_cast<int64_t>(s.tasks.size());
  ps.load_max_over_mean = std::max(ps.load_max_over_mean, max_over_mean(loads));
  ps.load_before_max_over_mean =
      std::max(ps.load_before_max_over_mean, max_over_mean(colocated_loads(b, &R.cost)));
  return Status::ok_status();
}

// The TP collectives of layer slot k of a colocated op (Rates::tp_slot): one set per non-empty
// nano-batch of the unit's rows, as the trainer issues them.
Rates::TpCost colocated_tp(const Rates& R, const UnitWork& w, bool bwd, int64_t k, int64_t s) {
  if (!(w.nano0 > 0 && w.nano0 < w.tokens)) return R.tp_slot(0, w.tokens, w.tokens, bwd, k, s);
  Rates::TpCost c = R.tp_slot(0, w.nano0, w.tokens, bwd, k, s);
  const Rates::TpCost pong = R.tp_slot(w.nano0, w.tokens - w.nano0, w.tokens, bwd, k, s);
  c.seconds += pong.seconds;
  c.bytes += pong.bytes;
  c.wait_per_compute = std::max(c.wait_per_compute, pong.wait_per_compute);
  return c;
}

// The last stage's LM head (forward or backward) on every lane of stage s, lane i from t[i].
void lm_head(const Rates& R, const std::vector<UnitWork>& w, Recorder& rec, int64_t s, int64_t j, bool bwd,
             std::vector<double>& t) {
  const int64_t ups = R.units_per_stage;
  for (int64_t i = 0; i < ups; ++i) {
    const double d = rec.linear(s * ups + i, t[static_cast<size_t>(i)],
                                (bwd ? R.lm_head_bwd_per_token : R.lm_head_fwd_per_token) * w[static_cast<size_t>(i)].tokens,
                                bwd ? "bwd lm head" : "fwd lm head", j);
    t[static_cast<size_t>(i)] += std::max(0.0, d);
  }
}

// The colocated dispatcher's exchange of one layer, every lane of stage s at once: one
// all-to-all over the stage's units (each rank posts a message to every other, zero bytes
// included: src/comm/mpi.cpp), so it ends for no unit before the last has called it; lane i's
// part (seconds(i), its bytes) ends that much after the last arrival, and its wait from t[i]
// is blocked communication (what the runtime's comm_s counts), as a CP collective's.
template <class Part>
void colocated_exchange(const Rates& R, Recorder& rec, int64_t s, int64_t j, const char* name, std::vector<double>& t,
                        const Part& part) {
  const int64_t ups = R.units_per_stage;
  const double start = *std::max_element(t.begin(), t.end());
  for (int64_t i = 0; i < ups; ++i) {
    const auto [seconds, sent, recv] = part(i);
    const int64_t u = s * ups + i;
    rec.comm(u, start, seconds, sent, recv, name, j);
    rec.wait(u, t[static_cast<size_t>(i)], start + seconds, start);
    t[static_cast<size_t>(i)] = start + std::max(0.0, seconds);
  }
}

// One colocated op (micro-batch j, forward or backward) of every lane of stage s, lane i
// starting at t[i] (ends written back): the stage's layers, each with its dispatcher exchange
// in lockstep (colocated_exchange): forward the K/V fetch, then the layer; backward the linear
// backward (with the recompute), the K/V re-fetch, the attention backward, then the dK/dV it
// produced goes back.
void run_colocated_op(const Rates& R, const Work& work, Recorder& rec, int64_t s, int64_t j, bool bwd,
                      std::vector<double>& t) {
  const std::vector<UnitWork>& w = work[static_cast<size_t>(j)];
  const int64_t ups = R.units_per_stage;
  const int64_t layers = R.stage_layers[static_cast<size_t>(s)];
  const bool last = s == R.pp - 1;
  const auto lane = [&](int64_t i) -> const UnitWork& { return w[static_cast<size_t>(i)]; };
  const auto fetch = [&](int64_t i) {
    return std::array<double, 3>{lane(i).fwd_seconds, lane(i).fwd_sent, lane(i).fwd_recv};
  };
  const auto give_back = [&](int64_t i) {
    return std::array<double, 3>{lane(i).bwd_seconds, lane(i).bwd_sent, lane(i).bwd_recv};
  };
  if (last && bwd) lm_head(R, w, rec, s, j, bwd, t);
  // With checkpointing the backward's recompute of a layer fetches (gathers) its K/V again, at
  // the forward's cost, before the attention backward.
  const bool refetch = bwd && R.o.activation_checkpointing;
  for (int64_t k = 0; k < layers; ++k) {
    if (!bwd) colocated_exchange(R, rec, s, j, "K/V fetch", t, fetch);
    for (int64_t i = 0; i < ups; ++i) {
      const int64_t u = s * ups + i;
      double& at = t[static_cast<size_t>(i)];
      // Durations as the recorder charged them (wall seconds under processor sharing).
      const double lin = rec.linear(u, at, (bwd ? R.linear_bwd_per_token : R.linear_fwd_per_token) * lane(i).tokens,
                                    bwd ? "bwd linear" : "fwd linear", j);
      at += std::max(0.0, lin);
      at += rec.tp(u, at, colocated_tp(R, lane(i), bwd, k, s), j);
    }
    if (refetch) colocated_exchange(R, rec, s, j, "K/V re-fetch (recompute)", t, fetch);
    for (int64_t i = 0; i < ups; ++i) {
      const int64_t u = s * ups + i;
      const double att = rec.attention(u, t[static_cast<size_t>(i)],
                                       lane(i).attention_seconds * (bwd ? 1.0 - R.attn_fwd_share : R.attn_fwd_share),
                                       bwd ? "bwd attention" : "fwd attention", j);
      t[static_cast<size_t>(i)] += std::max(0.0, att);
      if (!bwd) rec.stats()[static_cast<size_t>(u)].attention_pairs += lane(i).pairs;
    }
    if (bwd) colocated_exchange(R, rec, s, j, "dK/dV return", t, give_back);
  }
  for (int64_t i = 0; i < ups; ++i) {  // the tail after the last layer
    t[static_cast<size_t>(i)] += rec.tp(s * ups + i, t[static_cast<size_t>(i)], colocated_tp(R, lane(i), bwd, layers, s), j);
  }
  if (last && !bwd) lm_head(R, w, rec, s, j, bwd, t);
}

// Per-document CP's collectives of one op of stage s at a point of its layers (after the
// linear work: the all-gathers; after the attention backward: the reduce-scatters), every
// lane of the stage at once: each active collective (the CP groups' of c lanes, then the
// stage's wide one) starts when its last member arrives, and each member's ends its own part
// of the all-to-all later; the time before is the member's wait for the group. recompute: the
// gathers of a backward's recompute (checkpointing), named apart in the trace.
void cp_collectives_at(const Rates& R, const std::vector<UnitWork>& w, Recorder& rec, int64_t s, int64_t c,
                       int64_t j, bool scatter, bool recompute, std::vector<double>& t) {
  const int64_t ups = R.units_per_stage;
  for (size_t cls = 0; cls < 2; ++cls) {
    const int64_t size = cls == 0 ? c : ups;
    for (int64_t first = 0; first < ups; first += size) {
      if (!w[static_cast<size_t>(first)].coll[cls].active) continue;
      double start = 0;
      for (int64_t i = first; i < first + size; ++i) start = std::max(start, t[static_cast<size_t>(i)]);
      for (int64_t i = first; i < first + size; ++i) {
        const UnitWork::Collective& x = w[static_cast<size_t>(i)].coll[cls];
        const int64_t u = s * ups + i;
        const double d = scatter ? x.scatter_s : x.gather_s;
        const char* name = scatter     ? (cls == 0 ? "dK/dV reduce-scatter" : "dK/dV reduce-scatter (dp)")
                           : recompute ? (cls == 0 ? "K/V re-fetch (recompute)" : "K/V re-fetch (recompute, dp)")
                                       : (cls == 0 ? "K/V all-gather" : "K/V all-gather (dp)");
        rec.comm(u, start, d, scatter ? x.others : x.gathered, scatter ? x.gathered : x.others, name, j);
        rec.wait(u, t[static_cast<size_t>(i)], start + d, start);
        t[static_cast<size_t>(i)] = start + d;
      }
    }
  }
}

// One op (micro-batch j, forward or backward) of every lane of stage s under per-document CP,
// lane i starting at t[i] (ends written back): per layer the linear work, the gathers (twice
// in a backward with checkpointing: the recompute's and the attention backward's), the
// attention, and in backward the reduce-scatters.
void run_cp_op(const Rates& R, const Work& work, Recorder& rec, int64_t s, int64_t c, int64_t j, bool bwd,
               std::vector<double>& t) {
  const std::vector<UnitWork>& w = work[static_cast<size_t>(j)];
  const int64_t ups = R.units_per_stage;
  const int64_t layers = R.stage_layers[static_cast<size_t>(s)];
  const bool last = s == R.pp - 1;
  if (last && bwd) lm_head(R, w, rec, s, j, bwd, t);
  const int gathers = bwd && R.o.activation_checkpointing ? 2 : 1;
  for (int64_t k = 0; k < layers; ++k) {
    for (int64_t i = 0; i < ups; ++i) {
      const UnitWork& x = w[static_cast<size_t>(i)];
      t[static_cast<size_t>(i)] += rec.linear(s * ups + i, t[static_cast<size_t>(i)],
                                              (bwd ? R.linear_bwd_per_token : R.linear_fwd_per_token) * x.tokens,
                                              bwd ? "bwd linear" : "fwd linear", j);
    }
    for (int g = 0; g < gathers; ++g) cp_collectives_at(R, w, rec, s, c, j, false, g + 1 < gathers, t);
    for (int64_t i = 0; i < ups; ++i) {
      const UnitWork& x = w[static_cast<size_t>(i)];
      const int64_t u = s * ups + i;
      t[static_cast<size_t>(i)] += rec.attention(u, t[static_cast<size_t>(i)],
                                                 x.attention_seconds * (bwd ? 1.0 - R.attn_fwd_share : R.attn_fwd_share),
                                                 bwd ? "bwd attention" : "fwd attention", j);
      if (!bwd) rec.stats()[static_cast<size_t>(u)].attention_pairs += x.pairs;
    }
    if (bwd) cp_collectives_at(R, w, rec, s, c, j, true, false, t);
  }
  if (last && !bwd) lm_head(R, w, rec, s, j, bwd, t);
}

// The 1F1B of the pipeline replicas over the stages, each
// op as soon as its input and its stage are free (a p2p transfer between stages); folds the
// stages' finish times into stage_finish and unit_end. The lanes are every unit of a stage
// and run each op together: under per-document CP at degree c > 0 (run_cp_op), else
// colocated (run_colocated_op).
void run_replicas(const Rates& R, const Work& work, const std::vector<std::vector<PipeOp>>& ops, Recorder& rec,
                  int64_t c, std::vector<double>& stage_finish, std::vector<double>& unit_end) {
  const int64_t p = R.pp, m = static_cast<int64_t>(work.size()), ups = R.units_per_stage, n = ups;
  const auto P = static_cast<size_t>(p), M = static_cast<size_t>(m), N = static_cast<size_t>(n);
  // [stage][micro-batch][lane]: when the op ended (empty: not yet).
  std::vector<std::vector<std::vector<double>>> f_end(P, std::vector<std::vector<double>>(M)), b_end = f_end;
  std::vector<size_t> next(P, 0);
  std::vector<std::vector<double>> free_at(P, std::vector<double>(N, 0.0));
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t s = 0; s < p; ++s) {
      const auto& list = ops[static_cast<size_t>(s)];
      while (next[static_cast<size_t>(s)] < list.size()) {
        const PipeOp op = list[next[static_cast<size_t>(s)]];
        const auto J = static_cast<size_t>(op.microbatch);
        const std::vector<double>* dep = nullptr;
        bool remote = false;  // the input comes from another stage (a p2p transfer)
        if (!op.backward) {
          if (s > 0) {
            dep = &f_end[static_cast<size_t>(s - 1)][J];
            remote = true;
          }
        } else if (s == p - 1) {
          dep = &f_end[static_cast<size_t>(s)][J];
        } else {
          dep = &b_end[static_cast<size_t>(s + 1)][J];
          remote = true;
        }
        if (dep != nullptr && dep->empty()) break;
        std::vector<double> t = free_at[static_cast<size_t>(s)];
        for (int64_t l = 0; l < n && dep != nullptr; ++l) {
          const double ready = t[static_cast<size_t>(l)], d = (*dep)[static_cast<size_t>(l)];
          t[static_cast<size_t>(l)] = std::max(ready, d);
          if (!remote) continue;
          const int64_t i = l;
          const double bytes = R.boundary_bytes(work[J][static_cast<size_t>(i)].tokens);
          const double x = std::max(0.0, R.p2p(bytes));
          const int64_t from = op.backward ? s + 1 : s - 1;
          rec.comm(from * ups + i, d, x, bytes, 0, op.backward ? "send grad" : "send act", op.microbatch);
          rec.comm(s * ups + i, d, x, 0, bytes, op.backward ? "recv grad" : "recv act", op.microbatch);
          t[static_cast<size_t>(l)] = std::max(ready, d + x);
          rec.wait(s * ups + i, ready, t[static_cast<size_t>(l)], d);
        }
        if (c > 0) {
          run_cp_op(R, work, rec, s, c, op.microbatch, op.backward, t);
        } else {
          run_colocated_op(R, work, rec, s, op.microbatch, op.backward, t);
        }
        (op.backward ? b_end : f_end)[static_cast<size_t>(s)][J] = t;
        free_at[static_cast<size_t>(s)] = t;
        ++next[static_cast<size_t>(s)];
        progress = true;
      }
    }
  }
  for (int64_t s = 0; s < p; ++s) {
    DISTCA_CHECK(next[static_cast<size_t>(s)] == ops[static_cast<size_t>(s)].size());
    for (int64_t l = 0; l < n; ++l) {
      const double end = free_at[static_cast<size_t>(s)][static_cast<size_t>(l)];
      stage_finish[static_cast<size_t>(s)] = std::max(stage_finish[static_cast<size_t>(s)], end);
      unit_end[static_cast<size_t>(s * ups + l)] = end;
    }
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
      // The K/V each layer keeps and the layer in flight holds (UnitWork).
      double tok = 0, kept = 0;
      for (const PipeOp& op : ops[static_cast<size_t>(s)]) {
        const UnitWork& w = work[static_cast<size_t>(op.microbatch)][static_cast<size_t>(i)];
        const double sign = op.backward ? -1.0 : 1.0;
        tok += sign * w.tokens;
        kept += sign * w.kept_per_layer * layers;
        mi.tokens_in_flight = std::max(mi.tokens_in_flight, tok);
        mi.kept_bytes = std::max(mi.kept_bytes, kept);
        mi.tokens_max = std::max(mi.tokens_max, w.tokens);
        mi.transient_bytes = std::max(mi.transient_bytes, w.transient);
        mi.exchange_peers = std::max(mi.exchange_peers, w.peers);
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
  const int64_t p = R.pp, ups = R.units_per_stage;
  // work[j][i]: micro-batch j, unit i of a stage (every stage sees the same micro-batch).
  Work work(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) {
    DISTCA_RETURN_IF_ERROR(layout_microbatch(R, mbs[static_cast<size_t>(j)], c, work[static_cast<size_t>(j)], r.plan));
  }
  Recorder rec(R.units, R.o.record_events, R.sharing);
  const auto ops = one_f_one_b(p, m);
  std::vector<double> stage_finish(static_cast<size_t>(p), 0.0);
  std::vector<double> unit_end(static_cast<size_t>(R.units), 0.0);
  // Every lane of a stage runs each op together: the CP collectives and the colocated
  // dispatcher's exchanges join them.
  const bool cp = R.o.strategy.kind == StrategyKind::kWlb || R.o.strategy.kind == StrategyKind::kPerCp;
  run_replicas(R, work, ops, rec, cp ? c : 0, stage_finish, unit_end);

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
  r.dp = ups / c;
  return Status::ok_status();
}

}  // namespace distca::sim::detail
