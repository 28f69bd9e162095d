// Per-document CP's collectives in the simulator wait for their group (src/sim/baseline.cpp,
// run_cp_op), as the runtime's all-gather and reduce-scatter do: checked against a hand
// computation of the critical path from the per-unit phase lengths the run charged.
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
    SimOptions o = testing::options(strategy, 2);
    o.cluster.hw.inter_node_bw = o.cluster.hw.intra_node_bw = 1e30;
    o.cluster.hw.inter_node_latency = o.cluster.hw.intra_node_latency = 0;
    o.activation_checkpointing = false;
    o.lm_head = false;
    o.grad_sync = false;
    o.record_events = true;
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

}  // namespace
}  // namespace distca::sim
