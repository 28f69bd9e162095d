// simulate() against references written in the test from first principles (pipeline_reference.h),
// not from the plan and cost code the simulator calls: colocated data parallelism's step time in
// closed form (layer FLOPs from the model's dimensions, causal pairs row by row, the LM head,
// the ring all-reduce of the parameters' fp32 gradients), a colocated 1F1B pipeline timed event
// by event over stages x micro-batches of different lengths with its stage-to-stage transfers,
// and the re-packing baselines' tokens, attention and K/V collective bytes enumerated row by
// row from the chunking's output (plan::wlb_repack, plan::percp_repack).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "distca/core/specs.h"
#include "distca/data/workload.h"
#include "distca/plan/chunking.h"
#include "distca/sim/simulator.h"
#include "pipeline_reference.h"
#include "sim_test_util.h"

namespace distca::sim {
namespace {

using testing::options;
using testing::run;

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-300); }

// Per-unit seconds of a colocated op from the model's dimensions (G GPUs of one unit).
struct ClosedForm {
  explicit ClosedForm(const SimOptions& o) : o(o) {
    const double G = static_cast<double>(o.cluster.gpus_per_node), peak = o.cluster.hw.peak_flops;
    lin = testing::layer_matmul_flops_per_token(o.model) / (G * peak * o.mfu);
    lm = 2.0 * static_cast<double>(o.model.hidden * o.model.vocab) / (G * peak * o.mfu);
    pair = 3.5 * testing::attention_forward_flops_of(o.model, 1.0) / (G * peak * o.attention_efficiency);  // bwd 2.5x
    link = G * o.cluster.hw.inter_node_bw;
  }
  // Forward + backward attention seconds of whole documents held by one unit, one layer: a
  // document under one 128-row tile runs as a full tile.
  double attention(const std::vector<int64_t>& docs) const {
    double s = 0;
    for (int64_t len : docs) s += testing::causal_pairs(0, std::max<int64_t>(len, 128)) * pair;
    return s;
  }
  const SimOptions& o;
  double lin = 0, lm = 0, pair = 0, link = 0;
};

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

// 4 data-parallel units, each holding whole documents (nothing fetched), the LM head and the
// gradient all-reduce on: the step is the slowest unit's 32 layers forward and backward (3x the
// linear forward with checkpointing, 2.5x the attention forward) and the LM head (1x + 2x),
// then a ring all-reduce over the 4 units of every parameter's fp32 gradient.
TEST(Reference, ColocatedDataParallelStepIsClosedForm) {
  const std::vector<std::vector<int64_t>> docs = {{16384}, {8192, 8192}, {4096, 4096, 4096, 4096}, {12288, 4000, 96}};
  std::vector<int64_t> lengths;
  for (const auto& d : docs) lengths.insert(lengths.end(), d.begin(), d.end());
  const SimOptions o = options("colocated", 4);
  const SimResult r = run(o, {pack_documents(lengths, 4, 16384, Layout::kContiguous)});
  const ClosedForm cf(o);
  const double L = static_cast<double>(o.model.n_layers);
  double slowest = 0;
  for (size_t u = 0; u < docs.size(); ++u) {
    const auto T = static_cast<double>(sum(docs[u]));
    const double busy = L * (4.0 * T * cf.lin + cf.attention(docs[u])) + 3.0 * T * cf.lm;
    EXPECT_LT(rel(r.per_unit[u].busy, busy), 1e-12) << "unit " << u;
    slowest = std::max(slowest, busy);
  }
  const ModelSpec& m = o.model;
  const double h = static_cast<double>(m.hidden);
  const double params = L * (testing::layer_matmul_flops_per_token(m) / 2.0 + 2.0 * h) +  // + two RMSNorms
                        2.0 * h * static_cast<double>(m.vocab) + h;  // embedding, LM head, final norm
  const double n = 4, moved = 2.0 * (n - 1.0) / n * 4.0 * params;
  const double all_reduce = 2.0 * (n - 1.0) * o.cluster.hw.inter_node_latency + moved / cf.link;
  EXPECT_LT(rel(r.grad_sync_seconds, all_reduce), 1e-12);
  EXPECT_LT(rel(r.iteration_seconds, slowest + all_reduce), 1e-12);
}

// Colocated pipelines, one unit per stage, micro-batches of different lengths, the h200 link
// between stages: every stage's finish against time_1f1b's enumeration (stage s runs its
// layers, the first L % p stages one more; the last stage adds the LM head), and every unit's
// busy time against the sum of its ops.
TEST(Reference, ColocatedPipelineMatchesAnEventByEventEnumeration) {
  const std::vector<std::vector<int64_t>> pool = {{8192}, {2048, 2048, 4096}, {1024, 7000, 96, 72}, {4096, 4096},
                                                  {512, 512, 7168}};
  for (int64_t p : {2, 3, 4}) {
    for (int64_t m : {1, 2, 5}) {
      std::vector<std::vector<int64_t>> docs;
      std::vector<Batch> mbs;
      for (int64_t j = 0; j < m; ++j) {
        docs.push_back(pool[static_cast<size_t>((j + p) % static_cast<int64_t>(pool.size()))]);
        mbs.push_back(pack_documents(docs.back(), 1, sum(docs.back()), Layout::kContiguous));
      }
      const SimOptions o = options("colocated", p, p);
      const SimResult r = run(o, mbs);
      const ClosedForm cf(o);
      auto layers = [&](int64_t s) { return o.model.n_layers / p + (s < o.model.n_layers % p ? 1 : 0); };
      auto duration = [&](const testing::RefOp& op) {
        const auto J = static_cast<size_t>(op.microbatch);
        const auto T = static_cast<double>(sum(docs[J]));
        const double A = cf.attention(docs[J]);
        const double per_layer = op.backward ? 3.0 * T * cf.lin + 2.5 / 3.5 * A : T * cf.lin + A / 3.5;
        const double head = op.stage == p - 1 ? (op.backward ? 2.0 : 1.0) * T * cf.lm : 0.0;
        return static_cast<double>(layers(op.stage)) * per_layer + head;
      };
      auto transfer = [&](int64_t j) {
        const double bytes = static_cast<double>(sum(docs[static_cast<size_t>(j)]) * o.model.hidden * 2);
        return o.cluster.hw.inter_node_latency + bytes / cf.link;
      };
      const testing::RefEnds ends = testing::time_1f1b(p, m, duration, transfer);
      double want_iteration = 0;
      for (int64_t s = 0; s < p; ++s) {
        double finish = 0, busy = 0;
        for (int64_t j = 0; j < m; ++j) {
          finish = std::max({finish, ends.at({s, j, false}), ends.at({s, j, true})});
          busy += duration({s, j, false}) + duration({s, j, true});
        }
        want_iteration = std::max(want_iteration, finish);
        EXPECT_LT(rel(r.per_unit[static_cast<size_t>(s)].busy, busy), 1e-12) << "p=" << p << " m=" << m << " s=" << s;
      }
      EXPECT_LT(rel(r.pipeline_seconds, want_iteration), 1e-12) << "p=" << p << " m=" << m;
      EXPECT_LT(rel(r.iteration_seconds, want_iteration), 1e-12) << "p=" << p << " m=" << m;
    }
  }
}

// The re-packing baselines (wlb:c, percp:c) against the chunking's output, enumerated here row
// by row: the batch the runtime trains on is plan::wlb_repack (options written out below from
// the trainer's documented rule) or plan::percp_repack; a unit holds and serves the rows it is
// given (a row x costs x + 1 pairs); a piece [a, a + n) of a document of length D runs as the
// trainer's kernel call runs it, widened to 128-row query tiles of the document (rows [a', b'),
// a' = a rounded down to a multiple of 128, b' = a + n rounded up to one, at most D), and costs
// the analytic padded pairs q (2 kv - q + 1) / 2 with q = max(b' - a', 128), kv = max(b', q). The K/V move as the trainer's
// per-document CP moves them (train/cp_attention.h): a document on one unit moves nothing; one
// on several units of one CP group (units gc .. gc + c - 1) is all-gathered over the group, one
// on units of several groups over all 8: every row goes from its holder to each other member
// (forward; again in backward, and once more for the recompute with checkpointing), and in
// backward every other member sends the row's dK/dV partial back to its holder.
TEST(Reference, RepackedBaselinesMatchARowByRowEnumeration) {
  const Batch b = testing::drawn(8, 16384, 1, 3).front();
  const ModelSpec mspec = model_preset("llama-8b").value();
  const double kv_row = testing::kv_row_bytes(mspec, 2);
  const double L = static_cast<double>(mspec.n_layers);
  // Linear training FLOPs per token (forward + 2x backward, the LM head once) over attention
  // training FLOPs per pair (forward + 2.5x backward).
  const double lm = 2.0 * static_cast<double>(mspec.hidden * mspec.vocab);
  const double linear_per_token =
      3.0 * (L * testing::layer_matmul_flops_per_token(mspec) + lm) / (L * 3.5 * testing::attention_forward_flops_of(mspec, 1.0));
  for (const char* kind : {"wlb", "percp"}) {
    for (int64_t c : {1, 2, 4, 8}) {
      const std::string name = std::string(kind) + ":" + std::to_string(c);
      SimOptions o = options(name, 8);
      o.grad_sync = false;
      ChunkingOptions co;
      co.cap = 1.2;
      co.cp = c;
      co.tile_rows = 128;
      co.linear_per_token = linear_per_token;
      const ChunkingOptions sim_co = wlb_chunking(o, c);
      EXPECT_LT(rel(sim_co.linear_per_token, linear_per_token), 1e-12) << name;
      auto laid = std::string(kind) == "wlb" ? wlb_repack(b, co) : percp_repack(b, c);
      ASSERT_TRUE(laid.ok()) << laid.status().message();
      // holder[doc][row]: the unit holding that row.
      std::map<int64_t, std::vector<int64_t>> holder;
      std::vector<double> tokens(8, 0.0), pairs(8, 0.0), padded(8, 0.0);
      for (int64_t r = 0; r < 8; ++r) {
        for (const Piece& piece : laid->per_rank[static_cast<size_t>(r)]) {
          auto& rows = holder[piece.doc];
          rows.resize(static_cast<size_t>(piece.doc_len), -1);
          for (int64_t x = piece.offset; x < piece.offset + piece.len; ++x) rows[static_cast<size_t>(x)] = r;
          tokens[static_cast<size_t>(r)] += static_cast<double>(piece.len);
          pairs[static_cast<size_t>(r)] += testing::causal_pairs(piece.offset, piece.offset + piece.len);
          const int64_t a = piece.offset / 128 * 128;
          const int64_t e = std::min(piece.doc_len, (piece.offset + piece.len + 127) / 128 * 128);
          const double q = static_cast<double>(std::max<int64_t>(e - a, 128));
          const double kv = std::max(static_cast<double>(e), q);
          padded[static_cast<size_t>(r)] += q * (2 * kv - q + 1) / 2;
        }
      }
      // gather[u], scatter[u]: bytes unit u sends in one all-gather, in the reduce-scatter.
      std::vector<double> gather(8, 0.0), scatter(8, 0.0);
      for (const auto& [doc, rows] : holder) {
        const auto [lo, hi] = std::minmax_element(rows.begin(), rows.end());
        if (*lo == *hi) continue;  // one unit: nothing moves
        const bool in_group = *lo / c == *hi / c;
        const int64_t first = in_group ? *lo / c * c : 0, end = in_group ? first + c : 8;
        for (const int64_t h : rows) {
          for (int64_t m = first; m < end; ++m) {
            if (m == h) continue;
            gather[static_cast<size_t>(h)] += kv_row;
            scatter[static_cast<size_t>(m)] += kv_row;
          }
        }
      }
      const double bytes = std::accumulate(gather.begin(), gather.end(), 0.0);
      const double scattered = std::accumulate(scatter.begin(), scatter.end(), 0.0);
      const SimResult res = run(o, {b});
      ASSERT_EQ(res.per_unit.size(), 8u);
      const double per_padded_pair = res.per_unit[0].attention / padded[0];
      for (size_t u = 0; u < 8; ++u) {
        EXPECT_EQ(static_cast<double>(res.per_unit[u].tokens), tokens[u]) << name << " unit " << u;
        EXPECT_DOUBLE_EQ(res.per_unit[u].attention_pairs, L * pairs[u]) << name << " unit " << u;
        EXPECT_LT(rel(res.per_unit[u].attention, per_padded_pair * padded[u]), 1e-9) << name << " unit " << u;
      }
      EXPECT_EQ(res.plan.comm_bytes_forward, bytes) << name;
      EXPECT_EQ(res.plan.comm_bytes_backward, 2 * bytes + scattered) << name;
      // Per unit, every layer: the forward's all-gather, the recompute's and the backward's,
      // and the reduce-scatter (the gradient all-reduce is off).
      for (size_t u = 0; u < 8; ++u) {
        EXPECT_EQ(res.per_unit[u].bytes_sent, L * (3 * gather[u] + scatter[u])) << name << " unit " << u;
      }
      EXPECT_EQ(res.cp_degree, c);
    }
  }
}

}  // namespace
}  // namespace distca::sim
