// simulate() against independent computations: equal documents (the strategies tie up to
// their overheads), the 1F1B bubble (p-1)/(m+p-1) for uniform work, CAD replaying 1F1B's
// lockstep ticks (pipeline_reference.h's, not the schedule code the engine runs), one giant
// document (colocated = its last rank's time, from the model's dimensions), conservation of
// attention work (pairs counted row by row), determinism, the ablation order signal <=
// pingpong <= single-stream, CAD never slower than colocated by more than its communication,
// parameters against Llama-3-8B's published size, the gradient all-reduce formula, and OOM
// reporting. test_sim_reference.cpp has the closed-form and event-by-event references.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include <nlohmann/json.hpp>

#include "distca/core/specs.h"
#include "distca/cost/profiled.h"
#include "distca/data/workload.h"
#include "distca/plan/pipeline_schedule.h"
#include "distca/sim/simulator.h"
#include "pipeline_reference.h"
#include "sim_test_util.h"

namespace distca::sim {
namespace {

using testing::drawn;
using testing::options;
using testing::run;

// `ranks` ranks each holding `per_rank` documents of `len` tokens.
Batch equal_docs(int64_t ranks, int64_t per_rank, int64_t len) {
  std::vector<int64_t> lengths(static_cast<size_t>(ranks * per_rank), len);
  return pack_documents(lengths, ranks, per_rank * len, Layout::kContiguous);
}

// Causal pairs of every document of b, row by row.
double total_pairs(const Batch& b) {
  std::map<int64_t, int64_t> doc_len;
  for (const auto& pieces : b.per_rank) for (const Piece& p : pieces) doc_len[p.doc] = p.doc_len;
  double s = 0;
  for (const auto& [doc, len] : doc_len) s += testing::causal_pairs(0, len);
  return s;
}

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-300); }

TEST(Strategies, EqualDocumentsTieUpToOverheads) {
  const std::vector<Batch> mbs = {equal_docs(8, 4, 4096)};
  const SimResult colo = run(options("colocated", 8), mbs);
  const SimResult wlb = run(options("wlb", 8), mbs);
  const SimResult cad = run(options("cad", 8), mbs);
  const SimResult percp = run(options("percp:2", 8), mbs);
  // WLB-ideal keeps CP 1 and re-packs to the same balance.
  EXPECT_EQ(wlb.cp_degree, 1);
  EXPECT_LT(rel(wlb.iteration_seconds, colo.iteration_seconds), 1e-12);
  // CAD moves nothing (already balanced): only its four collectives per layer slot remain,
  // each one latency (33 slots forward, 33 backward, 4 per slot).
  EXPECT_EQ(cad.plan.comm_bytes_forward, 0);
  EXPECT_GE(cad.iteration_seconds, colo.iteration_seconds * (1 - 1e-12));
  const double lat = colo.iteration_seconds > 0 ? options("cad", 8).cluster.hw.inter_node_latency : 0;
  EXPECT_LE(cad.iteration_seconds - colo.iteration_seconds, 2 * 33 * 4 * lat * (1 + 1e-9));
  // percp:2 = colocated + per layer the forward's all-gather, the recompute's and the
  // backward's, and the backward's reduce-scatter (checkpointing): each unit holds half of each
  // of its group's 8 documents (head-tail: the same pairs, 2048 rows each) and each collective
  // moves one message of 8 x 2048 K/V rows each way between the group's two units.
  const SimOptions po = options("percp:2", 8);
  const double bytes = 8.0 * 2048.0 * testing::kv_row_bytes(po.model, 2);
  const double coll = bytes / (8 * po.cluster.hw.inter_node_bw) + po.cluster.hw.inter_node_latency;
  EXPECT_LT(rel(percp.iteration_seconds - colo.iteration_seconds, 4 * 32 * coll), 1e-9);
  EXPECT_EQ(percp.cp_degree, 2);
  EXPECT_EQ(percp.dp, 4);
}

TEST(Strategies, UniformPipelineBubbleIsPMinusOneOverMPlusPMinusOne) {
  for (const auto& [p, m] : std::vector<std::pair<int64_t, int64_t>>{{2, 4}, {4, 8}, {4, 3}, {8, 16}}) {
    std::vector<Batch> mbs(static_cast<size_t>(m), equal_docs(2, 2, 8192));
    for (const char* strategy : {"colocated", "wlb:1"}) {
      SimOptions o = options(strategy, 2 * p, p);
      o.cluster.hw.inter_node_bw = 1e30;  // free transfers: the bubble alone
      o.cluster.hw.inter_node_latency = 0;
      o.grad_sync = false;
      o.lm_head = false;
      const SimResult r = run(o, mbs);
      const double want = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
      for (const UnitStats& u : r.per_unit) {
        EXPECT_LT(std::fabs(u.idle / r.iteration_seconds - want), 1e-9) << strategy << " p=" << p << " m=" << m;
      }
      EXPECT_LT(std::fabs(r.idle_fraction - want), 1e-9);
      // 1F1B holds min(p - s, m) micro-batches on stage s (equal layers per stage here).
      const double last_stage = r.per_unit.back().memory.activations;
      for (const UnitStats& u : r.per_unit) {
        const double held = static_cast<double>(std::min(p - u.stage, m));
        EXPECT_LT(rel(u.memory.activations, held * last_stage), 1e-12) << strategy << " stage " << u.stage;
      }
      if (std::string(strategy) == "colocated") {
        // CAD replays 1F1B's unit-time slots as mixed ticks (the runtime's schedule), in
        // lockstep: every layer step's exchange is collective over all units, so a tick lasts
        // as its slowest op (a tick holding a backward as a backward) unless pooling moves
        // attention to idle units. Bound: the ticks' slowest ops, each op's compute as
        // colocated measures it (stage 0, micro-batch 0). (Before the mixed ticks this
        // asserted cad <= colocated: with uniform micro-batches and backward = 2-2.5x forward
        // that no longer holds, as colocated's stages run 1F1B asynchronously.)
        SimOptions oc = o;
        oc.record_events = true;
        const SimResult colo = run(oc, mbs);
        double t_op[2] = {0, 0};  // [backward] one op's compute seconds on unit 0
        for (const TraceEvent& e : colo.events) {
          if (e.pid != 0 || e.tid != 0 || e.args.empty() || e.args[0].value != 0) continue;
          t_op[e.name.rfind("bwd", 0) == 0 ? 1 : 0] += (e.end_us - e.start_us) * 1e-6;
        }
        ASSERT_GT(t_op[0], 0);
        ASSERT_GT(t_op[1], t_op[0]);
        double bound = 0;
        for (const auto& tick : testing::reference_ticks(p, m)) {
          bool bwd = false;
          for (const testing::RefOp& op : tick) bwd = bwd || op.backward;
          bound += t_op[bwd ? 1 : 0];
        }
        SimOptions c = o;
        c.strategy = parse_strategy("cad").value();
        const SimResult cad = run(c, mbs);
        EXPECT_EQ(cad.pp_ticks, 2 * (m + p - 1));
        EXPECT_LE(cad.iteration_seconds, bound * (1 + 1e-6)) << "p=" << p << " m=" << m;
        // Memory follows 1F1B's: stage s holds min(p - s, m) micro-batches, as colocated.
        const double cad_last = cad.per_unit.back().memory.activations;
        EXPECT_LT(rel(cad_last, last_stage), 1e-12);
        for (const UnitStats& u : cad.per_unit) {
          const double held = static_cast<double>(std::min(p - u.stage, m));
          EXPECT_LT(rel(u.memory.activations, held * cad_last), 1e-12) << "cad stage " << u.stage;
        }
      }
    }
  }
}

// Time blocked in communication counts as the runtime's comm_s does. Uniform 1F1B with free
// transfers: every wait of stage 0 is for a gradient from stage 1 and it runs until the end,
// so its blocked time is its whole bubble, (p - 1) / (m + p - 1) of the iteration; later
// stages also sit idle after their last backward, which no wait covers. Data parallel with a
// straggler: the faster unit waits for the slower one in every layer's exchange (the
// dispatcher's all-to-all joins the stage's units, zero bytes included), and the runtime
// counts that wait as communication, so every moment a unit does not compute it is blocked:
// comm_blocked = iteration - busy on both, the slower unit's being its fetches and the
// all-reduce. Every strategy: exposed <= blocked <= exposed + idle.
TEST(Strategies, CommBlockedIsTheRuntimesWaitsInCommunication) {
  const int64_t p = 4, m = 8;
  std::vector<Batch> mbs(static_cast<size_t>(m), equal_docs(1, 2, 8192));
  SimOptions o = options("colocated", p, p);
  o.cluster.hw.inter_node_bw = 1e30;
  o.cluster.hw.inter_node_latency = 0;
  o.grad_sync = false;
  o.lm_head = false;
  const SimResult pipe = run(o, mbs);
  const double bubble = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
  EXPECT_LT(std::fabs(pipe.per_unit[0].comm_blocked / pipe.iteration_seconds - bubble), 1e-9);
  for (const UnitStats& u : pipe.per_unit) {
    EXPECT_LE(u.comm_blocked, u.idle + 1e-9 * pipe.iteration_seconds) << "stage " << u.stage;
    EXPECT_GT(u.comm_blocked, 0) << "stage " << u.stage;
  }

  Batch skew = pack_documents({16384, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048}, 2, 16384, Layout::kContiguous);
  ASSERT_EQ(skew.per_rank[0].size(), 1u);
  const SimResult dp = run(options("colocated", 2), {skew});
  ASSERT_GT(dp.grad_sync_seconds, 0);
  ASSERT_GT(dp.per_unit[1].idle, 0.1 * dp.iteration_seconds);  // the short unit waits for the long one
  for (const UnitStats& u : dp.per_unit) {
    EXPECT_NEAR(u.comm_blocked, dp.iteration_seconds - u.busy, 1e-9 * dp.iteration_seconds);
  }
  EXPECT_GT(dp.per_unit[1].comm_blocked, dp.grad_sync_seconds + 0.1 * dp.iteration_seconds);

  for (const char* strategy : {"colocated", "wlb", "percp:2", "cad", "cad:single-stream", "cad:signal"}) {
    for (int64_t pp : {1, 2}) {
      const SimResult r = run(options(strategy, 4, pp), drawn(4 / pp, 32768, 2 * pp, 7));
      for (const UnitStats& u : r.per_unit) {
        const double eps = 1e-9 * r.iteration_seconds;
        EXPECT_GE(u.comm_blocked, u.exposed_comm - eps) << strategy << " pp " << pp;
        EXPECT_LE(u.comm_blocked, u.exposed_comm + u.idle + eps) << strategy << " pp " << pp;
      }
    }
  }
}

// The CAD pipeline model runs exactly 1F1B's lockstep ticks (the reference's): read back from
// the trace, every stage's linear work comes op by op in its order there, every op of a tick
// starts after every op of the previous tick (whose exchanges are collective over all units),
// and the ops of one tick start together when a PP transfer (a global step) ended the
// previous tick. Homogeneous ticks with deferred backwards would fail the per-stage order.
TEST(Strategies, CadPipelineReplaysOneFOneBTicks) {
  for (const auto& [p, m] : std::vector<std::pair<int64_t, int64_t>>{{2, 4}, {3, 5}, {4, 8}}) {
    std::vector<Batch> mbs;
    for (int64_t j = 0; j < m; ++j) mbs.push_back(equal_docs(1, 2, 4096 * (1 + j % 3)));
    SimOptions o = options("cad", p, p);  // one unit per stage
    o.record_events = true;
    o.grad_sync = false;
    const SimResult r = run(o, mbs);
    const auto ticks = testing::reference_ticks(p, m);
    ASSERT_EQ(r.pp_ticks, static_cast<int64_t>(ticks.size()));
    // [unit] (op, start of its first linear work) in trace order.
    std::vector<std::vector<std::pair<PipeOp, double>>> seen(static_cast<size_t>(p));
    for (const TraceEvent& e : r.events) {
      if (e.tid != 0 || e.name.find("lin") == std::string::npos || e.args.empty()) continue;
      const PipeOp op{e.pid, e.args[0].value, e.name.rfind("bwd", 0) == 0};
      auto& v = seen[static_cast<size_t>(e.pid)];
      if (v.empty() || !(v.back().first == op)) v.emplace_back(op, e.start_us);
    }
    std::vector<size_t> next(static_cast<size_t>(p), 0);
    double prev_last = -1;  // the latest start of the previous tick's ops
    bool prev_sent = false;  // the previous tick ended with a PP transfer
    for (size_t t = 0; t < ticks.size(); ++t) {
      double first = -1, last = -1;
      bool sent = false;
      for (const testing::RefOp& op : ticks[t]) {
        auto& v = seen[static_cast<size_t>(op.stage)];
        const size_t i = next[static_cast<size_t>(op.stage)]++;
        ASSERT_LT(i, v.size()) << "p=" << p << " tick " << t;
        EXPECT_EQ(v[i].first, (PipeOp{op.stage, op.microbatch, op.backward})) << "p=" << p << " tick " << t << " stage " << op.stage;
        if (first < 0) first = v[i].second;
        if (prev_sent) {
          EXPECT_EQ(v[i].second, first) << "p=" << p << " tick " << t << " stage " << op.stage;
        }
        first = std::min(first, v[i].second);
        last = std::max(last, v[i].second);
        sent = sent || (op.backward ? op.stage > 0 : op.stage < p - 1);
      }
      EXPECT_GT(first, prev_last) << "p=" << p << " tick " << t;
      prev_last = last;
      prev_sent = sent;
    }
    for (int64_t s = 0; s < p; ++s) EXPECT_EQ(next[static_cast<size_t>(s)], seen[static_cast<size_t>(s)].size());
  }
}

TEST(Strategies, OneGiantDocumentColocatedIsItsLastRanksTime) {
  const int64_t R = 8, T = 8192;
  const Batch b = pack_documents({R * T}, R, T, Layout::kContiguous);
  SimOptions o = options("colocated", R);
  o.grad_sync = false;
  o.lm_head = false;
  const SimResult r = run(o, {b});
  // Rank R-1 holds rows [(R-1)T, RT): its attention sees the whole prefix, and the K/V of
  // (R-1)T rows come from the other R-1 ranks, one message each (dK/dV go back in backward):
  // its NIC takes R-1 message latencies and all the bytes (network.h).
  const ModelSpec& m = o.model;
  const double G = 8, peak = o.cluster.hw.peak_flops;
  const double att_fwd = testing::attention_forward_flops_of(m, testing::causal_pairs((R - 1) * T, R * T)) / (G * peak * 0.5);
  const double lin_fwd = static_cast<double>(T) * testing::layer_matmul_flops_per_token(m) / (G * peak * 0.5);
  const double xfer = static_cast<double>(R - 1) * o.cluster.hw.inter_node_latency +
                      static_cast<double>((R - 1) * T) * testing::kv_row_bytes(m, 2) / (G * o.cluster.hw.inter_node_bw);
  const double fwd = xfer + lin_fwd + att_fwd;
  // Checkpointing: 2x + the recomputed forward, which fetches the K/V again before dK/dV go back.
  const double bwd = 2 * xfer + 3 * lin_fwd + 2.5 * att_fwd;
  EXPECT_LT(rel(r.iteration_seconds, 32 * (fwd + bwd)), 1e-9);
  EXPECT_LT(rel(r.per_unit.back().busy, 32 * (4 * lin_fwd + 3.5 * att_fwd)), 1e-9);
  EXPECT_NEAR(r.per_unit.back().idle, 0.0, 1e-9 * r.iteration_seconds);
  // Rank 0 is the least loaded: its idle time is the imbalance.
  EXPECT_GT(r.per_unit.front().idle, 0.5 * r.iteration_seconds);
}

TEST(Strategies, AttentionWorkIsConserved) {
  const auto mbs = drawn(8, 32768, 3, 11);
  double want = 0;
  for (const Batch& b : mbs) want += 32 * total_pairs(b);
  for (const char* s : {"colocated", "wlb", "wlb:4", "percp:2", "percp:8", "cad", "cad:single-stream"}) {
    for (int64_t pp : {1, 2}) {
      SimOptions o = options(s, 8 * pp, pp);
      const SimResult r = run(o, mbs);
      double got = 0;
      for (const UnitStats& u : r.per_unit) got += u.attention_pairs;
      EXPECT_LT(rel(got, want), 1e-12) << s << " pp=" << pp;
    }
  }
}

TEST(Strategies, SameInputsGiveIdenticalResults) {
  for (const char* s : {"colocated", "wlb", "percp:4", "cad", "cad:signal"}) {
    SimOptions o = options(s, 8, 2);
    o.record_events = true;
    const auto a = run(o, drawn(4, 32768, 4, 5));
    const auto b = run(o, drawn(4, 32768, 4, 5));
    nlohmann::json ja = to_json(a), jb = to_json(b);
    ja["plan"].erase("plan_seconds");  // wall clock
    jb["plan"].erase("plan_seconds");
    EXPECT_EQ(ja.dump(), jb.dump()) << s;
    ASSERT_EQ(a.events.size(), b.events.size());
    EXPECT_TRUE(a.events == b.events) << s;
    const auto c = run(o, drawn(4, 32768, 4, 6));
    EXPECT_NE(to_json(c)["iteration_seconds"], ja["iteration_seconds"]) << s;
  }
}

TEST(Strategies, AblationOrderAndCadAgainstColocated) {
  for (uint64_t seed : {1, 2, 3}) {
    const auto mbs = drawn(16, 262144, 1, seed);
    const SimResult colo = run(options("colocated", 16), mbs);
    const SimResult signal = run(options("cad:signal", 16), mbs);
    const SimResult ping = run(options("cad", 16), mbs);
    const SimResult single = run(options("cad:single-stream", 16), mbs);
    EXPECT_LE(signal.iteration_seconds, ping.iteration_seconds) << seed;
    EXPECT_LE(ping.iteration_seconds, single.iteration_seconds) << seed;
    EXPECT_GT(single.exposed_comm_fraction, ping.exposed_comm_fraction) << seed;
    double comm = 0;
    for (const UnitStats& u : ping.per_unit) comm = std::max(comm, u.comm);
    EXPECT_LE(ping.iteration_seconds, colo.iteration_seconds + comm) << seed;
    EXPECT_LT(ping.plan.load_max_over_mean, colo.plan.load_max_over_mean) << seed;
    // Same schedule for the three modes; single-stream runs it as one batch, so it moves no
    // more than ping-pong (whose pong re-reads ping's context); signal sends nothing.
    EXPECT_EQ(ping.plan.tasks, single.plan.tasks);
    EXPECT_LE(single.plan.comm_bytes_forward, ping.plan.comm_bytes_forward);
    EXPECT_EQ(ping.plan.comm_bytes_forward, signal.plan.comm_bytes_forward);
    EXPECT_LT(signal.bytes_total, ping.bytes_total);
  }
}

// Stateless servers: the same schedule; backward sends the forward's bytes again (plan
// figures: backward = keep's backward + forward), servers keep no buffers, never faster.
// Pipelines plan every backward anew (the runtime's mixed ticks pool a micro-batch's backward
// with other micro-batches than its forward), so their servers are stateless either way and
// the option changes nothing there. (Before the mixed ticks, pp = 2 was checked as pp = 1.)
TEST(Strategies, StatelessServersTradeBuffersForBytes) {
  for (int64_t pp : {1, 2}) {
    const auto mbs = drawn(8 / pp, 262144, pp == 1 ? 1 : 4, 5);
    SimOptions keep_o = options("cad", 8, pp), sl_o = keep_o;
    sl_o.cad_stateless = true;
    const SimResult keep = run(keep_o, mbs), sl = run(sl_o, mbs);
    EXPECT_EQ(to_json(sl)["cad_servers"], "stateless");
    EXPECT_EQ(keep.plan.tasks, sl.plan.tasks) << pp;
    EXPECT_DOUBLE_EQ(sl.plan.comm_bytes_forward, keep.plan.comm_bytes_forward) << pp;
    if (pp > 1) {
      EXPECT_EQ(keep.plan.backward_replans, 2 * (4 + pp - 1) - (pp - 1) - 1) << "every backward tick planned anew";
      EXPECT_EQ(sl.plan.comm_bytes_backward, keep.plan.comm_bytes_backward);
      EXPECT_EQ(sl.bytes_total, keep.bytes_total);
      EXPECT_EQ(sl.iteration_seconds, keep.iteration_seconds);
      for (size_t u = 0; u < sl.per_unit.size(); ++u) {
        EXPECT_EQ(sl.per_unit[u].memory.buffers, keep.per_unit[u].memory.buffers) << "unit " << u;
      }
      continue;
    }
    EXPECT_DOUBLE_EQ(sl.plan.comm_bytes_backward, keep.plan.comm_bytes_backward + keep.plan.comm_bytes_forward);
    EXPECT_GT(sl.bytes_total, keep.bytes_total);
    EXPECT_GE(sl.iteration_seconds, keep.iteration_seconds);
    double keep_buffers = 0;
    for (size_t u = 0; u < sl.per_unit.size(); ++u) {
      keep_buffers += keep.per_unit[u].memory.buffers;
      EXPECT_LE(sl.per_unit[u].memory.buffers, keep.per_unit[u].memory.buffers) << "unit " << u;
    }
    EXPECT_GT(keep_buffers, 0);
  }
}

TEST(Strategies, ParametersMatchLlama3_8B) {
  SimOptions o = options("colocated", 8);
  const SimResult r = run(o, {equal_docs(8, 1, 4096)});
  // bf16 parameters per GPU x 8 GPUs / 2 bytes: Llama-3-8B has 8.03 billion parameters.
  const double params = r.per_unit[0].memory.params * 8 / 2;
  EXPECT_LT(rel(params, 8.03e9), 0.005) << params;
  EXPECT_DOUBLE_EQ(r.per_unit[0].memory.grads, 2 * r.per_unit[0].memory.params);
  // Adam state sharded over the 8 DP units.
  EXPECT_DOUBLE_EQ(r.per_unit[0].memory.optimizer, 6 * r.per_unit[0].memory.params / 8);
  // Ring all-reduce of fp32 gradients over 8 units: 2 (n-1)/n bytes per GPU at its link.
  const double n = 8;
  const double want = 2 * (n - 1) / n * r.per_unit[0].memory.grads / o.cluster.hw.inter_node_bw +
                      2 * (n - 1) * o.cluster.hw.inter_node_latency;
  EXPECT_LT(rel(r.grad_sync_seconds, want), 1e-12);
}

TEST(Strategies, ActivationsScaleWithTokensAndOomIsReported) {
  SimOptions o = options("colocated", 8);
  const SimResult a = run(o, {equal_docs(8, 4, 4096)});
  const SimResult b = run(o, {equal_docs(8, 8, 4096)});
  EXPECT_LT(rel(b.per_unit[0].memory.activations, 2 * a.per_unit[0].memory.activations), 1e-12);
  EXPECT_FALSE(a.oom);
  o.cluster.hw.memory_bytes = 1e9;
  const SimResult c = run(o, {equal_docs(8, 4, 4096)});
  EXPECT_TRUE(c.oom);
  EXPECT_EQ(c.oom_unit, 0);
  EXPECT_NE(c.oom_reason.find("unit 0"), std::string::npos) << c.oom_reason;
  // WLB-ideal reports a fitting CP degree when there is one, and every degree it tried.
  SimOptions w = options("wlb", 8);
  const SimResult d = run(w, drawn(8, 65536, 1, 9));
  EXPECT_EQ(d.cp_candidates.size(), 4u);  // 1, 2, 4, 8
  for (const CpCandidate& cand : d.cp_candidates) {
    if (!cand.oom) {
      EXPECT_GE(cand.iteration_seconds, d.iteration_seconds);
    }
  }
}

TEST(Strategies, ProfiledTableAtConstantThroughputMatchesTheAnalyticModel) {
  // A table measured at a flat T FLOP/s for the model's own heads: a unit (G GPUs) runs
  // attention at G * T, exactly the analytic model with efficiency T / peak (shards >= 128
  // rows, so no padding difference); half the heads in the table: the same, since seconds
  // scale by the FLOPs ratio.
  SimOptions o = options("colocated", 8);
  const double T = 0.4 * o.cluster.hw.peak_flops;
  for (int64_t heads : {o.model.n_heads, o.model.n_heads / 2}) {
    CostTable table;
    table.n_heads = heads;
    table.n_kv_heads = heads / 4;
    table.head_dim = o.model.head_dim;
    table.q_lens = {128, 1024, 8192, 65536};
    table.kv_lens = {128, 1024, 8192, 65536};
    for (int64_t q : table.q_lens) {
      std::vector<double> row;
      for (int64_t kv : table.kv_lens) row.push_back(q <= kv ? table.task_flops(q, kv) / T : 0.0);
      table.seconds.push_back(row);
    }
    ASSERT_TRUE(table.validate("test").ok());
    const ProfiledCostModel model(table);
    const std::vector<Batch> mbs = {equal_docs(8, 4, 4096)};
    SimOptions analytic = o;
    analytic.attention_efficiency = 0.4;
    SimOptions profiled = o;
    profiled.attention_table = &model;
    const SimResult a = run(analytic, mbs), b = run(profiled, mbs);
    EXPECT_LT(rel(b.iteration_seconds, a.iteration_seconds), 1e-9) << heads;
    EXPECT_LT(rel(b.per_unit[0].attention, a.per_unit[0].attention), 1e-9) << heads;
  }
}

// The memory estimates are upper bounds of what they count: the trace-event bound holds for
// every strategy with and without PP (on the tiny model's layers too), the trace adds to the
// estimate, and the draw estimate covers a Batch of the shortest pieces the quantum allows.
TEST(Estimates, TraceEventBoundHoldsAndCounts) {
  for (const char* s : {"colocated", "wlb", "percp:2", "cad", "cad:signal", "cad:single-stream"}) {
    for (int64_t pp : {1, 2}) {
      for (const char* model : {"llama-8b", "tiny"}) {
        SimOptions o = options(s, 4, pp);
        o.model = model_preset(model).value();
        o.record_events = true;
        const auto mbs = drawn(4 / pp, 32768, 2 * pp, 7, "pretrain");
        const SimResult r = run(o, mbs);
        EXPECT_GT(r.events.size(), 0u);
        EXPECT_LE(static_cast<int64_t>(r.events.size()), max_trace_events(o, static_cast<int64_t>(mbs.size())))
            << s << " pp=" << pp << " " << model;
        SimOptions quiet = o;
        quiet.record_events = false;
        EXPECT_GT(estimate_simulate_bytes(o, mbs), estimate_simulate_bytes(quiet, mbs));
      }
    }
  }
  const ClusterSpec c = options("cad", 4).cluster;
  // 4 units of 1024 tokens in 16-token pieces: 64 pieces of 32 bytes each per unit at least.
  EXPECT_GE(estimate_draw_bytes(c, 1024, 1), 4.0 * 64 * static_cast<double>(sizeof(Piece)));
  EXPECT_DOUBLE_EQ(estimate_draw_bytes(c, 1024, 3), 3 * estimate_draw_bytes(c, 1024, 1));
}

// validate_draw names the cluster's flags for limits the workload's ranks would hit.
TEST(Estimates, ValidateDrawNamesTheClusterFlags) {
  WorkloadOptions w;
  w.tokens_per_rank = 16384;
  SimOptions o = options("cad", 1);
  o.cluster.gpus = int64_t{1} << 31;
  Status st = validate_draw(w, o.cluster, 1);
  EXPECT_NE(st.message().find("--gpus"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("--ranks"), std::string::npos) << st.message();
  o.cluster.gpus = 64;
  EXPECT_TRUE(validate_draw(w, o.cluster, 1).ok());
  EXPECT_NE(validate_draw(w, o.cluster, 0).message().find("--microbatches"), std::string::npos);
  EXPECT_NE(validate_draw(w, o.cluster, 10001).message().find("--microbatches"), std::string::npos);
}

}  // namespace
}  // namespace distca::sim
