// The memory model with activation checkpointing (docs/simulation-model.md, "Memory"): a
// hand-built per-document CP case whose fetched K/V bytes, the recompute's second fetch
// (bytes and seconds) and the memory terms are computed here from the model's shapes, and
// invariants over every strategy: checkpointing never raises a unit's peak, the K/V part is
// inside the buffers, bytes sent equal bytes received, and the recompute's re-fetch adds
// exactly the forward's K/V bytes once more.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "distca/core/specs.h"
#include "distca/cost/analytic.h"
#include "distca/data/workload.h"
#include "distca/sim/simulator.h"
#include "sim_test_util.h"

namespace distca::sim {
namespace {

using testing::options;
using testing::run;

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-300); }

// Two units, percp:2, one document of 2T tokens: percp_repack's head-tail shards give unit 0
// rows [0, T/2) and [3T/2, 2T), unit 1 rows [T/2, 3T/2), T rows each. The group all-gathers the
// document every layer (each unit sends its T rows and receives the other's T), gathers again in
// backward and reduce-scatters the dK/dV partials (T rows each way); each unit's gathered buffer
// holds the whole 2T rows, and its dK/dV partials as many in backward: rows * 2 kv_dim * 2
// bytes (whole node of 8 GPUs). Nothing is kept between layers, with or without checkpointing.
TEST(Memory, PerCpTwoUnitsOneDocumentByHand) {
  const int64_t T = 8192;
  const Batch b = pack_documents({2 * T}, 2, T, Layout::kContiguous);
  SimOptions ck = options("percp:2", 2);
  ck.grad_sync = false;  // only the CP exchanges move bytes
  ck.lm_head = false;
  ck.record_events = true;
  SimOptions full = ck;
  full.activation_checkpointing = false;
  const SimResult a = run(ck, {b}), f = run(full, {b});
  const ModelSpec& m = ck.model;
  const double G = 8, L = 32;
  const double kv_row = 2.0 * 1024 * 2;  // K and V of one token: 8 KV heads x 128, bf16
  ASSERT_EQ(m.kv_dim(), 1024);
  const double moved = static_cast<double>(T) * kv_row;                // each way, per collective
  const double held = 2 * static_cast<double>(2 * T) * kv_row;         // gathered + dK/dV partials
  const double h = 4096, q = 4096, kvd = 1024, ffn = 14336, lse = 4.0 * 32;
  const double stored = 2 * (h + q) + lse;                              // layer input, O, LSE
  const double all = 2 * (4 * h + 2 * q + 2 * kvd + 3 * ffn) + lse;     // every activation
  for (size_t u = 0; u < 2; ++u) {
    const MemoryStats& ma = a.per_unit[u].memory;
    const MemoryStats& mf = f.per_unit[u].memory;
    // Checkpointing: the layer in flight's gathered K/V and dK/dV; the layer being recomputed.
    EXPECT_LT(rel(ma.kv_buffers, held / G), 1e-12) << u;
    EXPECT_LT(rel(ma.buffers, held / G + all * T / G), 1e-12) << u;
    EXPECT_LT(rel(ma.activations, stored * L * T / G), 1e-12) << u;
    // Without: the same K/V (gathered again in backward, not kept); every activation stored,
    // nothing recomputed.
    EXPECT_LT(rel(mf.kv_buffers, held / G), 1e-12) << u;
    EXPECT_LT(rel(mf.buffers, mf.kv_buffers), 1e-12) << u;
    EXPECT_LT(rel(mf.activations, all * L * T / G), 1e-12) << u;
    EXPECT_LT(ma.total(), mf.total()) << u;
    // Bytes per layer, each way: the forward's gather, the backward's and the reduce-scatter,
    // and with checkpointing the recompute's gather.
    EXPECT_LT(rel(a.per_unit[u].bytes_received, L * 4 * moved), 1e-12) << u;
    EXPECT_LT(rel(a.per_unit[u].bytes_sent, L * 4 * moved), 1e-12) << u;
    EXPECT_LT(rel(f.per_unit[u].bytes_sent, L * 3 * moved), 1e-12) << u;
  }
  const double fwd = 2 * moved;
  EXPECT_LT(rel(a.plan.comm_bytes_forward, fwd), 1e-12);
  EXPECT_LT(rel(a.plan.comm_bytes_backward, 3 * fwd), 1e-12);
  EXPECT_LT(rel(f.plan.comm_bytes_backward, 2 * fwd), 1e-12);
  // Time: each collective is one message each way of T rows per unit; the re-gather costs what
  // the forward's costs, and the recomputed forward adds one forward of linear work per layer.
  const double xfer = moved / (G * ck.cluster.hw.inter_node_bw) + ck.cluster.hw.inter_node_latency;
  const double lin_fwd = static_cast<double>(T) * linear_forward_flops_per_token(m) / (G * ck.cluster.hw.peak_flops * 0.5);
  EXPECT_LT(rel(a.iteration_seconds - f.iteration_seconds, L * (xfer + lin_fwd)), 1e-9);
  EXPECT_LT(rel(a.per_unit[0].exposed_comm, 4 * L * xfer), 1e-9);
  int refetches = 0;
  for (const TraceEvent& e : a.events) {
    if (e.name != "K/V re-fetch (recompute)") continue;
    ++refetches;
    EXPECT_LT(rel((e.end_us - e.start_us) * 1e-6, xfer), 1e-9);
  }
  EXPECT_EQ(refetches, 2 * 32);
  // The JSON carries the K/V part.
  const nlohmann::json j = to_json(a);
  EXPECT_EQ(j["per_unit"][0]["memory"]["kv_buffers"].get<double>(), a.per_unit[0].memory.kv_buffers);
}

// Colocated packing, one document cut across two units: unit 1 fetches unit 0's K/V for its
// attention; with checkpointing its recompute fetches them again (same seconds), and only the
// layer in flight holds them.
TEST(Memory, ColocatedContextFetchFollowsTheSameRule) {
  const int64_t T = 8192;
  const Batch b = pack_documents({2 * T}, 2, T, Layout::kContiguous);
  SimOptions ck = options("colocated", 2);
  ck.grad_sync = false;
  ck.lm_head = false;
  SimOptions full = ck;
  full.activation_checkpointing = false;
  const SimResult a = run(ck, {b}), f = run(full, {b});
  const double fetched = static_cast<double>(T) * 2.0 * 1024 * 2, L = 32, G = 8;
  EXPECT_EQ(a.per_unit[0].memory.kv_buffers, 0);  // holds the prefix: fetches nothing
  EXPECT_LT(rel(a.per_unit[1].memory.kv_buffers, 2 * fetched / G), 1e-12);
  EXPECT_LT(rel(f.per_unit[1].memory.kv_buffers, (L + 1) * fetched / G), 1e-12);
  EXPECT_LT(rel(a.per_unit[1].bytes_received, 2 * L * fetched), 1e-12);  // K/V twice; dK/dV go out
  EXPECT_LT(rel(a.per_unit[1].bytes_sent, L * fetched), 1e-12);
  const double xfer = ck.cluster.hw.inter_node_latency + fetched / (G * ck.cluster.hw.inter_node_bw);
  EXPECT_LT(rel(a.per_unit[1].exposed_comm, 3 * L * xfer), 1e-9);
  EXPECT_LT(rel(f.per_unit[1].exposed_comm, 2 * L * xfer), 1e-9);
}

// The framework's memory per GPU (docs/simulation-model.md, "Framework memory"), by hand on two
// h200 units (G = 8) with one document cut across them: the 768 MiB context; 4 MiB NCCL
// buffers on 16 channels to each ring neighbour (tensor parallelism over 8 GPUs: 2; the
// gradient all-reduce over 2 units: 1) and on 2 channels to each point-to-point peer (the
// other unit, which the fetch connects in one direction or the other; CAD: every other unit);
// the allocator's 15% of the activations and buffers. FrameworkMemory{} adds nothing.
TEST(Memory, FrameworkMemoryIsContextBuffersAndFragmentationByHand) {
  const int64_t T = 8192;
  const Batch b = pack_documents({2 * T}, 2, T, Layout::kContiguous);
  for (const char* s : {"colocated", "cad"}) {
    SimOptions o = options(s, 2);
    const SimResult r = run(o, {b});
    o.framework = FrameworkMemory{};
    const SimResult bare = run(o, {b});
    const double mib = 1024.0 * 1024.0;
    for (size_t u = 0; u < 2; ++u) {
      const MemoryStats& m = r.per_unit[u].memory;
      const double dynamic = m.activations + m.buffers;
      const double want = 768 * mib + 4 * mib * (16 * (2 + 1) + 2 * 1) + dynamic * 0.15 / 0.85;
      EXPECT_LT(rel(m.framework, want), 1e-12) << s << " unit " << u;
      EXPECT_LT(rel(m.total(), m.params + m.grads + m.optimizer + dynamic + want), 1e-12) << s;
      const MemoryStats& z = bare.per_unit[u].memory;
      EXPECT_EQ(z.framework, 0) << s;
      EXPECT_EQ(z.total(), z.params + z.grads + z.optimizer + z.activations + z.buffers) << s;
      EXPECT_EQ(z.activations, m.activations) << s;
    }
    EXPECT_EQ(bare.iteration_seconds, r.iteration_seconds) << s;  // memory only
    EXPECT_GT(r.peak_memory, bare.peak_memory) << s;
  }
}

using testing::drawn;

// Over every strategy, with and without pipelines: checkpointing never raises a unit's peak
// (at least two layers per stage: one layer's checkpoint plus its recompute can exceed it),
// the K/V part is inside the buffers, every byte sent is received, and (pp = 1 baselines,
// where every byte is a K/V exchange) the re-gather adds the forward's bytes once per layer.
TEST(Memory, CheckpointingNeverRaisesPeakAndBytesBalance) {
  for (int64_t pp : {1, 2}) {
    const auto mbs = drawn(8 / pp, 65536, pp == 1 ? 2 : 4, 11);
    for (const char* s : {"colocated", "wlb:1", "wlb:2", "percp:2", "percp:4", "cad", "cad:single-stream"}) {
      for (bool stateless : {false, true}) {
        SimOptions ck = options(s, 8, pp);
        ck.cad_stateless = stateless;
        ck.grad_sync = false;
        SimOptions full = ck;
        full.activation_checkpointing = false;
        const SimResult a = run(ck, mbs), f = run(full, mbs);
        double sent = 0, recv = 0;
        for (size_t u = 0; u < a.per_unit.size(); ++u) {
          const MemoryStats& ma = a.per_unit[u].memory;
          EXPECT_LE(ma.total(), f.per_unit[u].memory.total() * (1 + 1e-12)) << s << " pp " << pp << " unit " << u;
          EXPECT_LE(ma.kv_buffers, ma.buffers * (1 + 1e-12)) << s << " unit " << u;
          EXPECT_LE(f.per_unit[u].memory.kv_buffers, f.per_unit[u].memory.buffers * (1 + 1e-12)) << s;
          sent += a.per_unit[u].bytes_sent;
          recv += a.per_unit[u].bytes_received;
        }
        EXPECT_LT(rel(sent, recv), 1e-12) << s << " pp " << pp;
        if (pp == 1 && a.strategy.kind != StrategyKind::kCad) {
          EXPECT_LT(rel(a.bytes_total - f.bytes_total, 32 * a.plan.comm_bytes_forward), 1e-9) << s;
          EXPECT_LE(f.iteration_seconds, a.iteration_seconds) << s;
        }
        if (a.strategy.kind == StrategyKind::kCad) {  // CAD's exchanges do not depend on it
          EXPECT_EQ(a.bytes_total, f.bytes_total) << s;
        }
      }
    }
  }
}

// CAD servers: keeping servers hold every layer's received Q, K/V and O + LSE until the
// backward (the runtime's default dispatcher), so their K/V part grows with the layers;
// stateless ones (and every pipeline's) hold one layer's, received again with dO.
TEST(Memory, CadKeepingServersHoldEveryLayerStatelessOne) {
  const auto mbs = drawn(8, 131072, 1, 4);
  SimOptions keep_o = options("cad", 8), sl_o = keep_o;
  sl_o.cad_stateless = true;
  const SimResult keep = run(keep_o, mbs), sl = run(sl_o, mbs);
  double keep_kv = 0, sl_kv = 0;
  for (size_t u = 0; u < keep.per_unit.size(); ++u) {
    keep_kv += keep.per_unit[u].memory.kv_buffers;
    sl_kv += sl.per_unit[u].memory.kv_buffers;
    EXPECT_LE(sl.per_unit[u].memory.kv_buffers, keep.per_unit[u].memory.kv_buffers) << u;
  }
  ASSERT_GT(sl_kv, 0);
  // Keep: 32 layers of K/V contexts + the backward's dK/dV partials of one layer; stateless:
  // one layer's K/V (received again in backward) and partials, 2 per layer at most.
  EXPECT_GT(keep_kv, 16 * sl_kv);
}

}  // namespace
}  // namespace distca::sim
