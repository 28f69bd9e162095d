// Per-document CP in the simulator as the runtime runs it (src/sim/baseline.cpp): its
// collectives wait for their group (run_cp_op), as the runtime's all-gather and reduce-scatter
// do, and colocated's per-layer exchanges for the stage (run_colocated_op), as the
// dispatcher's all-to-all does, each checked against a hand computation of the critical path
// from the per-unit phase lengths the run charged; and per-document CP's attention is charged at the query rows the runtime's kernel call
// runs, each piece widened to the kernel's query tiles (cp_task_rows, train/cp_attention.h),
// checked against causal pairs counted by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "distca/sim/simulator.h"
#include "sim_test_util.h"

namespace distca::sim {
namespace {

// One unit's phase lengths of one layer (seconds; every layer of a unit charges the same).
struct Phases {
  double lf = 0, af = 0, lb = 0, ab = 0;  // linear and attention, forward and backward
};

// Each unit's first span of each phase, from the run's events.
std::map<int64_t, Phases> phases_of(const SimResult& r) {
  std::map<int64_t, Phases> out;
  std::map<std::pair<int64_t, std::string>, bool> seen;
  for (const TraceEvent& e : r.events) {
    if (!seen.emplace(std::make_pair(e.pid, e.name), true).second) continue;
    const double d = (e.end_us - e.start_us) * 1e-6;
    Phases& p = out[e.pid];
    if (e.name == "fwd linear") p.lf = d;
    if (e.name == "fwd attention") p.af = d;
    if (e.name == "bwd linear") p.lb = d;
    if (e.name == "bwd attention") p.ab = d;
  }
  return out;
}

// Two units running only their layers (no LM head, no gradient all-reduce, no recompute) over
// free links (infinite bandwidth, no latency), events kept: what is left between their phases
// is waiting for one another.
SimOptions bare_layers(const char* strategy) {
  SimOptions o = testing::options(strategy, 2);
  o.cluster.hw.inter_node_bw = o.cluster.hw.intra_node_bw = 1e30;
  o.cluster.hw.inter_node_latency = o.cluster.hw.intra_node_latency = 0;
  o.activation_checkpointing = false;
  o.lm_head = false;
  o.grad_sync = false;
  o.record_events = true;
  return o;
}

// Two units, one micro-batch, collectives free (infinite bandwidth, no latency): every
// layer's all-gather waits for both units' linear work, the backward's reduce-scatter for both
// attentions. By hand, with L layers and the units' phases:
//   forward   the first gather at max(lf); then each layer adds max(af + lf) (a unit's
//             attention, then its next layer's linear, up to the next gather);
//   backward  the first gather at (forward's last gather) + max(af + lb); then per layer
//             max(ab) to the reduce-scatter and, but for the last layer, max(lb) to the next
//             gather.
//   T = max(lf) + (L - 1) max(af + lf) + max(af + lb) + L max(ab) + (L - 1) max(lb).
// The batch: a 30000-token document no rank has room for (20480 each, cap 1.2) and short ones.
// wlb:1 cuts the long document over both units (the dp-wide collective joins them), the unit
// holding its tail with fewer tokens but more attention: there the step exceeds the slower
// unit's own sum, L max(lf + af + lb + ab), which is what the simulator gave without the
// barrier. wlb:2 and percp:2 shard it head-tail over the group (balanced: the same phases on
// both units) and must still follow the formula.
TEST(CpBarrier, CollectivesWaitForTheGroupAsAHandComputation) {
  for (const char* strategy : {"wlb:1", "wlb:2", "percp:2"}) {
    const SimOptions o = bare_layers(strategy);
    // A long document over both units and short ones whole on one (wlb); percp shards every
    // document over the two units, the long one's head-tail halves nearly equal.
    const Batch b = pack_documents({30000, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 1760},
                                   2, 20480, Layout::kContiguous);
    const SimResult r = testing::run(o, {b});
    EXPECT_EQ(r.cp_degree, strategy[std::string(strategy).size() - 1] - '0');
    const auto ph = phases_of(r);
    ASSERT_EQ(ph.size(), 2u) << strategy;
    const double L = static_cast<double>(o.model.n_layers);
    double lf = 0, af_lf = 0, af_lb = 0, ab = 0, lb = 0, own = 0;
    for (const auto& [u, p] : ph) {
      ASSERT_GT(p.lf * p.af * p.lb * p.ab, 0) << strategy << " unit " << u;
      lf = std::max(lf, p.lf);
      af_lf = std::max(af_lf, p.af + p.lf);
      af_lb = std::max(af_lb, p.af + p.lb);
      ab = std::max(ab, p.ab);
      lb = std::max(lb, p.lb);
      own = std::max(own, L * (p.lf + p.af + p.lb + p.ab));
    }
    const double want = lf + (L - 1) * af_lf + af_lb + L * ab + (L - 1) * lb;
    EXPECT_NEAR(r.pipeline_seconds, want, 1e-9 * want) << strategy;
    if (std::string(strategy) == "wlb:1") {
      EXPECT_GT(want, own * 1.005) << "the batch does not exercise the barrier";
    }
  }
}

// Colocated as the runtime runs it: the dispatcher's all-to-all of every layer (forward: the
// context fetch before the layer; backward: the dK/dV return after its attention) joins the
// stage's units, zero bytes included, so with free links a lighter unit waits there for the
// heaviest, and that wait is blocked communication (what the runtime's comm_s counts), not
// idle at the end. By hand, with L layers and the units' phases:
//   T = L max(lf + af) + L max(lb + ab),  unit u blocked: T - L (lf + af + lb + ab)_u,
// its exposed communication (the bytes' own time) zero. Before the lockstep every unit ran
// alone and the lighter one's blocked time was 0.
TEST(ColocatedBarrier, EveryLayersExchangeWaitsForTheStageAsAHandComputation) {
  const SimOptions o = bare_layers("colocated");
  // Unit 0 one long document, unit 1 many short ones: equal tokens, unequal attention.
  std::vector<int64_t> docs{8192};
  for (int i = 0; i < 32; ++i) docs.push_back(256);
  const SimResult r = testing::run(o, {pack_documents(docs, 2, 8192, Layout::kContiguous)});
  const auto ph = phases_of(r);
  ASSERT_EQ(ph.size(), 2u);
  const double L = static_cast<double>(o.model.n_layers);
  double fwd = 0, bwd = 0;
  for (const auto& [u, p] : ph) {
    ASSERT_GT(p.lf * p.af * p.lb * p.ab, 0) << "unit " << u;
    fwd = std::max(fwd, p.lf + p.af);
    bwd = std::max(bwd, p.lb + p.ab);
  }
  const double T = L * fwd + L * bwd;
  EXPECT_NEAR(r.pipeline_seconds, T, 1e-9 * T);
  double lightest_blocked = 0;
  for (const auto& [u, p] : ph) {
    const UnitStats& st = r.per_unit[static_cast<size_t>(u)];
    const double blocked = T - L * (p.lf + p.af + p.lb + p.ab);
    EXPECT_NEAR(st.comm_blocked, blocked, 1e-9 * T) << "unit " << u;
    EXPECT_NEAR(st.exposed_comm, 0.0, 1e-12) << "unit " << u;
    lightest_blocked = std::max(lightest_blocked, blocked);
  }
  EXPECT_GT(lightest_blocked, 0.05 * T) << "the batch does not exercise the barrier";
}

// percp:2 on one document of 300 rows over 2 units, tile 128: percp_repack gives unit 0 the
// head [0, 75) and the tail [225, 300), unit 1 [75, 150) and [150, 225). CpAttention runs each
// piece as the tile-aligned rows around it against the context up to their end:
//   unit 0: [0, 128) kv 128, [128, 300) kv 300;   unit 1: [0, 256) kv 256, [128, 256) kv 256.
// Causal pairs of q rows ending at kv: q (2 kv - q + 1) / 2 (the analytic model charges a task
// of fewer than a tile of rows as a tile, which no padded task here has):
//   unit 0: 128 x 129 / 2 + 172 x 429 / 2 = 8256 + 36894 = 45150
//   unit 1: 256 x 257 / 2 + 128 x 385 / 2 = 32896 + 24640 = 57536
// against, unpadded, 38528 and 31744 (the pieces alone, each at least a tile). A seconds-per-
// pair rate from one whole document on one unit (colocated, 1024 rows: 1024 x 1025 / 2 pairs)
// turns them into each unit's attention seconds; the pairs served stay the pieces' own.
TEST(CpTiles, PerCpPiecesRunAtTheKernelsTiles) {
  auto attention = [](const char* strategy, int64_t units, const Batch& b) {
    SimOptions o = testing::options(strategy, units);
    o.attention_tile = 128;
    o.lm_head = false;
    o.grad_sync = false;
    return testing::run(o, {b});
  };
  const SimResult one = attention("colocated", 1, pack_documents({1024}, 1, 1024, Layout::kContiguous));
  ASSERT_EQ(one.per_unit.size(), 1u);
  const double per_pair = one.per_unit[0].attention / (1024.0 * 1025.0 / 2.0);
  const SimResult r = attention("percp:2", 2, pack_documents({300}, 2, 150, Layout::kContiguous));
  ASSERT_EQ(r.per_unit.size(), 2u);
  const double want[2] = {45150 * per_pair, 57536 * per_pair};
  for (size_t u = 0; u < 2; ++u) EXPECT_NEAR(r.per_unit[u].attention, want[u], 1e-9 * want[u]) << u;
  const double pairs = r.per_unit[0].attention_pairs + r.per_unit[1].attention_pairs;
  EXPECT_NEAR(pairs, static_cast<double>(one.per_unit[0].attention_pairs) * (300.0 * 301.0) / (1024.0 * 1025.0),
              1e-9 * pairs);
}

}  // namespace
}  // namespace distca::sim
