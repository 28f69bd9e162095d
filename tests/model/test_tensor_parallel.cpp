// Tensor-parallel layer math (model/tensor_parallel.h) against the unsharded layer written
// out with layers.h: forward and backward of one decoder layer on TP 2 (and TP 4 in the
// collectives), over TP groups of a larger local job (TP innermost: ranks {0, 1} and {2, 3}
// are the TP groups of TP 2 x DP 2).
#include "distca/model/tensor_parallel.h"

#include <gtest/gtest.h>

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "distca/comm/group.h"
#include "distca/comm/local.h"
#include "distca/core/rng.h"
#include "distca/model/layers.h"
#include "distca/model/tp_layer_harness.h"
#include "model_test_util.h"

namespace distca::model {
namespace {

// hidden 32, 4 heads, 2 KV heads, head_dim 8, ffn 47 (odd: the ffn split is uneven at TP 2).
ModelSpec tp_spec() {
  ModelSpec s = testing::tiny_spec();
  s.ffn = 47;
  return s;
}
constexpr int64_t kTokens = 13;  // odd: the row split is uneven at TP 2

template <class T>
std::vector<T> random_vec(int64_t count, uint64_t stream, double scale = 1.0) {
  Rng rng(2024, stream);
  std::vector<T> v(static_cast<size_t>(count));
  for (T& e : v) e = static_cast<T>(scale * rng.normal());
  return v;
}

// Everything one layer's step reads and writes, in the unsharded shapes.
template <class T>
struct Problem {
  ModelSpec spec;
  int64_t n;
  std::vector<T> params, x, o, dout, dq, dk, dv, cos_t, sin_t;
  // Outputs:
  std::vector<T> q, k, v, x_mid, out, d_o, dx, grads;
  explicit Problem(const ModelSpec& sp = tp_spec(), int64_t tokens = kTokens) : spec(sp), n(tokens) {
    const auto full = param_layout(spec);  // tensors 1..9: layer 0; 10: layer 1's first
    const int64_t layer = full[10].offset - full[1].offset;
    params = random_vec<T>(layer, 1, 0.2);
    for (int64_t i = 0; i < spec.hidden; ++i) {  // gains around 1
      params[static_cast<size_t>(i)] += T(1);
      params[static_cast<size_t>(layer_offsets().ffn_norm + i)] += T(1);
    }
    x = random_vec<T>(n * spec.hidden, 2);
    o = random_vec<T>(n * spec.q_dim(), 3);
    dout = random_vec<T>(n * spec.hidden, 4);
    dq = random_vec<T>(n * spec.q_dim(), 5);
    dk = random_vec<T>(n * spec.kv_dim(), 6);
    dv = random_vec<T>(n * spec.kv_dim(), 7);
    std::vector<int32_t> positions(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(3 * t + 1);
    cos_t.resize(static_cast<size_t>(n * spec.head_dim / 2));
    sin_t.resize(cos_t.size());
    rope_tables<T>(cos_t.data(), sin_t.data(), positions.data(), n, spec.head_dim, 10000.0);
  }
  struct Offsets {
    int64_t attn_norm, wq, wk, wv, wo, ffn_norm, w1, w3, w2;
  };
  Offsets layer_offsets() const {
    const auto full = param_layout(spec);
    const int64_t base = full[1].offset;
    auto at = [&](size_t i) { return full[i].offset - base; };
    return {at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8), at(9)};
  }
};

// The unsharded layer, written out with layers.h as llama.cpp's phases compose it.
template <class T>
void reference(Problem<T>& p) {
  const ModelSpec& s = p.spec;
  const int64_t n = p.n, h = s.hidden, qd = s.q_dim(), kvd = s.kv_dim(), f = s.ffn;
  const auto o = p.layer_offsets();
  const T* w = p.params.data();
  p.grads.assign(p.params.size(), T(0));
  T* gw = p.grads.data();
  std::vector<T> rstd1(n), xn1(n * h), rstd2(n), xn2(n * h), g(n * f), u(n * f), a(n * f);
  p.q.resize(n * qd);
  p.k.resize(n * kvd);
  p.v.resize(n * kvd);
  p.x_mid.resize(n * h);
  p.out.resize(n * h);
  rmsnorm_forward<T>(xn1.data(), rstd1.data(), p.x.data(), w + o.attn_norm, n, h, 1e-5);
  linear_forward<T>(p.q.data(), xn1.data(), w + o.wq, n, h, qd);
  linear_forward<T>(p.k.data(), xn1.data(), w + o.wk, n, h, kvd);
  linear_forward<T>(p.v.data(), xn1.data(), w + o.wv, n, h, kvd);
  rope_apply<T>(p.q.data(), p.cos_t.data(), p.sin_t.data(), n, s.n_heads, s.head_dim, +1);
  rope_apply<T>(p.k.data(), p.cos_t.data(), p.sin_t.data(), n, s.n_kv_heads, s.head_dim, +1);
  linear_forward<T>(p.x_mid.data(), p.o.data(), w + o.wo, n, qd, h);
  for (int64_t i = 0; i < n * h; ++i) p.x_mid[i] += p.x[i];
  rmsnorm_forward<T>(xn2.data(), rstd2.data(), p.x_mid.data(), w + o.ffn_norm, n, h, 1e-5);
  linear_forward<T>(g.data(), xn2.data(), w + o.w1, n, h, f);
  linear_forward<T>(u.data(), xn2.data(), w + o.w3, n, h, f);
  swiglu_forward<T>(a.data(), g.data(), u.data(), n, f);
  linear_forward<T>(p.out.data(), a.data(), w + o.w2, n, f, h);
  for (int64_t i = 0; i < n * h; ++i) p.out[i] += p.x_mid[i];
  // Backward.
  std::vector<T> da(n * f), dg(n * f), du(n * f), dxn(n * h);
  p.dx = p.dout;
  p.d_o.resize(n * qd);
  linear_backward<T>(da.data(), gw + o.w2, p.dx.data(), a.data(), w + o.w2, n, f, h, false);
  swiglu_backward<T>(dg.data(), du.data(), da.data(), g.data(), u.data(), n, f);
  linear_backward<T>(dxn.data(), gw + o.w1, dg.data(), xn2.data(), w + o.w1, n, h, f, false);
  linear_backward<T>(dxn.data(), gw + o.w3, du.data(), xn2.data(), w + o.w3, n, h, f, true);
  rmsnorm_backward<T>(p.dx.data(), gw + o.ffn_norm, dxn.data(), p.x_mid.data(), rstd2.data(),
                      w + o.ffn_norm, n, h);
  linear_backward<T>(p.d_o.data(), gw + o.wo, p.dx.data(), p.o.data(), w + o.wo, n, qd, h, false);
  rope_apply<T>(p.dq.data(), p.cos_t.data(), p.sin_t.data(), n, s.n_heads, s.head_dim, -1);
  rope_apply<T>(p.dk.data(), p.cos_t.data(), p.sin_t.data(), n, s.n_kv_heads, s.head_dim, -1);
  linear_backward<T>(dxn.data(), gw + o.wq, p.dq.data(), xn1.data(), w + o.wq, n, h, qd, false);
  linear_backward<T>(dxn.data(), gw + o.wk, p.dk.data(), xn1.data(), w + o.wk, n, h, kvd, true);
  linear_backward<T>(dxn.data(), gw + o.wv, p.dv.data(), xn1.data(), w + o.wv, n, h, kvd, true);
  rmsnorm_backward<T>(p.dx.data(), gw + o.attn_norm, dxn.data(), p.x.data(), rstd1.data(),
                      w + o.attn_norm, n, h);
}

// Columns [c0, c0 + cols) of every row of a (n, width) buffer, and back.
template <class T>
std::vector<T> columns(const std::vector<T>& a, int64_t n, int64_t width, int64_t c0, int64_t cols) {
  std::vector<T> out(static_cast<size_t>(n * cols));
  for (int64_t t = 0; t < n; ++t) std::copy_n(a.data() + t * width + c0, cols, out.data() + t * cols);
  return out;
}
template <class T>
void put_columns(std::vector<T>& a, int64_t n, int64_t width, int64_t c0, int64_t cols, const T* src) {
  for (int64_t t = 0; t < n; ++t) std::copy_n(src + t * cols, cols, a.data() + t * width + c0);
}

// Runs the TP layer on `world` ranks as TP groups of `tp` consecutive ranks (TP innermost);
// every TP group runs the same problem (Problem<T>(spec, n)), with the collectives overlapped
// or blocking (TpStep::overlap). Returns the outputs assembled into the unsharded shapes, from
// TP group `group`.
template <class T>
Problem<T> run_tp(int world, int tp, int group, bool overlap = true, const ModelSpec& spec = tp_spec(),
                  int64_t tokens = kTokens) {
  Problem<T> in(spec, tokens);
  Problem<T> res = in;
  const ModelSpec& s = in.spec;
  const int64_t n = in.n, h = s.hidden, hd = s.head_dim;
  res.q.assign(n * s.q_dim(), T(0));
  res.k.assign(n * s.kv_dim(), T(0));
  res.v = res.k;
  res.d_o = res.q;
  res.x_mid.assign(n * h, T(0));
  res.out = res.dx = res.x_mid;
  res.grads.assign(in.params.size(), T(0));
  std::mutex mu;
  const Status st = comm::run_local(world, [&](comm::Communicator& c) -> Status {
    const int g = c.rank() / tp;
    std::vector<int> members;
    for (int i = 0; i < tp; ++i) members.push_back(g * tp + i);
    DISTCA_ASSIGN_OR_RETURN(auto tpc, comm::GroupCommunicator::create(c, members, 7));
    const TpDims d = tp_dims(s, tp, tpc->rank());
    const RowRange mine = tp_rows(n, tp, tpc->rank());
    std::vector<T> shard(d.layer_params()), grad(d.layer_params(), T(0));
    tp_shard_layer<T>(s, d, in.params.data(), shard.data());
    const TpLayerTensors<const T> w = tp_layer_tensors<const T>(d, shard.data());
    const TpLayerTensors<T> gw = tp_layer_tensors<T>(d, grad.data());
    const int64_t nr = mine.size(), qd = d.qd(), kvd = d.kvd(), f = d.f();
    std::vector<T> x(in.x.begin() + mine.begin * h, in.x.begin() + mine.end * h);
    std::vector<T> rstd1(nr), xn1(n * h), q(n * qd), k(n * kvd), v(n * kvd), x_mid(nr * h),
        rstd2(nr), xn2(n * h), gg(n * f), u(n * f), a(n * f), out(nr * h);
    std::vector<T> o = columns(in.o, n, s.q_dim(), d.head0 * hd, qd);
    const TpLayerActs<T> acts{x.data(), rstd1.data(), xn1.data(), q.data(), k.data(), v.data(),
                              o.data(), x_mid.data(), rstd2.data(), xn2.data(), gg.data(),
                              u.data(), a.data(), out.data()};
    TpStep<T> step{n, in.cos_t.data(), in.sin_t.data(), 1e-5};
    step.overlap = overlap;
    DISTCA_RETURN_IF_ERROR(tp_attention_in_forward<T>(*tpc, d, step, w, acts));
    DISTCA_RETURN_IF_ERROR(tp_attention_out_mlp_forward<T>(*tpc, d, step, w, acts));
    std::vector<T> dx(in.dout.begin() + mine.begin * h, in.dout.begin() + mine.end * h);
    std::vector<T> d_o(n * qd);
    DISTCA_RETURN_IF_ERROR(
        tp_attention_out_mlp_backward<T>(*tpc, d, step, w, gw, acts, dx.data(), d_o.data()));
    std::vector<T> dq = columns(in.dq, n, s.q_dim(), d.head0 * hd, qd);
    std::vector<T> dk = columns(in.dk, n, s.kv_dim(), d.kv_head0 * hd, kvd);
    std::vector<T> dv = columns(in.dv, n, s.kv_dim(), d.kv_head0 * hd, kvd);
    DISTCA_RETURN_IF_ERROR(tp_attention_in_backward<T>(*tpc, d, step, w, gw, acts, dq.data(),
                                                       dk.data(), dv.data(), dx.data()));
    // The replicated norm gains' gradients are partial over the rank's rows.
    DISTCA_RETURN_IF_ERROR(tp_all_reduce_replicated(*tpc, std::span<T>(gw.attn_norm, h)));
    DISTCA_RETURN_IF_ERROR(tp_all_reduce_replicated(*tpc, std::span<T>(gw.ffn_norm, h)));
    if (g != group) return Status::ok_status();
    std::lock_guard<std::mutex> lock(mu);
    put_columns(res.q, n, s.q_dim(), d.head0 * hd, qd, q.data());
    put_columns(res.k, n, s.kv_dim(), d.kv_head0 * hd, kvd, k.data());
    put_columns(res.v, n, s.kv_dim(), d.kv_head0 * hd, kvd, v.data());
    put_columns(res.d_o, n, s.q_dim(), d.head0 * hd, qd, d_o.data());
    std::copy(x_mid.begin(), x_mid.end(), res.x_mid.begin() + mine.begin * h);
    std::copy(out.begin(), out.end(), res.out.begin() + mine.begin * h);
    std::copy(dx.begin(), dx.end(), res.dx.begin() + mine.begin * h);
    tp_unshard_layer<T>(s, d, grad.data(), res.grads.data());
    return Status::ok_status();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
  return res;
}

// max |a - b| / max |b|: the error relative to the tensor's scale.
template <class T>
double rel_diff(const std::vector<T>& a, const std::vector<T>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

template <class T>
void expect_matches(const Problem<T>& tp, const Problem<T>& ref, double tol) {
  EXPECT_LE(rel_diff(tp.q, ref.q), tol);
  EXPECT_LE(rel_diff(tp.k, ref.k), tol);
  EXPECT_LE(rel_diff(tp.v, ref.v), tol);
  EXPECT_LE(rel_diff(tp.x_mid, ref.x_mid), tol);
  EXPECT_LE(rel_diff(tp.out, ref.out), tol);
  EXPECT_LE(rel_diff(tp.d_o, ref.d_o), tol);
  EXPECT_LE(rel_diff(tp.dx, ref.dx), tol);
  EXPECT_LE(rel_diff(tp.grads, ref.grads), tol);
}

TEST(TensorParallel, LayerMatchesUnshardedInDouble) {
  Problem<double> ref;
  reference(ref);
  for (int group : {0, 1}) expect_matches(run_tp<double>(4, 2, group), ref, 1e-13);
  expect_matches(run_tp<double>(2, 2, 0), ref, 1e-13);
}

// In float, the row-parallel sums differ from one GEMM's at rounding level only.
TEST(TensorParallel, LayerMatchesUnshardedInFloat) {
  Problem<float> ref;
  reference(ref);
  expect_matches(run_tp<float>(4, 2, 1), ref, 1e-6);
}

// A TP 1 "group" is the unsharded layer: the same bits.
TEST(TensorParallel, TpOneIsBitwiseUnsharded) {
  Problem<float> ref;
  reference(ref);
  const Problem<float> tp = run_tp<float>(2, 1, 1);
  EXPECT_EQ(tp.q, ref.q);
  EXPECT_EQ(tp.out, ref.out);
  EXPECT_EQ(tp.dx, ref.dx);
  EXPECT_EQ(tp.grads, ref.grads);
}

// The reduce-scatter gives each rank the rank-order sum of its rows (the reference of
// communicator.h's all-reduce), and the all-gather every rank's rows: TP 3 over 10 rows
// (uneven), and a rank with no rows (TP 3 over 2 rows).
TEST(TensorParallel, RowCollectivesAreRankOrderSumsAndGathers) {
  for (const int64_t n : {10, 2}) {
    const int tp = 3;
    const int64_t width = 5;
    std::vector<std::vector<double>> partials;
    for (int r = 0; r < tp; ++r) partials.push_back(random_vec<double>(n * width, 40 + static_cast<uint64_t>(r)));
    const std::vector<double> sum = comm::serial_rank_order_sum(partials);
    const std::vector<double> all = random_vec<double>(n * width, 50);
    const Status st = comm::run_local(tp, [&](comm::Communicator& c) -> Status {
      const RowRange mine = tp_rows(n, tp, c.rank());
      std::vector<double> out(static_cast<size_t>(mine.size() * width));
      DISTCA_RETURN_IF_ERROR(tp_reduce_scatter_rows<double>(
          c, partials[static_cast<size_t>(c.rank())].data(), out.data(), n, width));
      for (int64_t i = 0; i < mine.size() * width; ++i) {
        if (out[static_cast<size_t>(i)] != sum[static_cast<size_t>(mine.begin * width + i)]) {
          return Status::internal("reduce-scatter differs at " + std::to_string(i));
        }
      }
      std::vector<double> gathered(all.size(), -1.0);
      std::copy_n(all.begin() + mine.begin * width, mine.size() * width,
                  gathered.begin() + mine.begin * width);
      DISTCA_RETURN_IF_ERROR(tp_all_gather_rows<double>(c, gathered.data(), n, width));
      if (gathered != all) return Status::internal("all-gather differs");
      return Status::ok_status();
    });
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
}

// The shard holds the rank's heads' rows of wq (and its columns of wo, its ffn rows of w1),
// counted independently of the shard code; unsharding every rank rebuilds the layer.
TEST(TensorParallel, ShardsHoldTheRanksHeadsAndRebuildTheLayer) {
  const Problem<float> p;
  const ModelSpec& s = p.spec;
  const auto o = p.layer_offsets();
  const int64_t h = s.hidden, hd = s.head_dim;
  std::vector<float> rebuilt(p.params.size(), 0.0f);
  for (int64_t r = 0; r < 2; ++r) {
    const TpDims d = tp_dims(s, 2, r);
    EXPECT_EQ(d.heads, 2);
    EXPECT_EQ(d.kv_heads, 1);
    EXPECT_EQ(d.f(), r == 0 ? 24 : 23);
    std::vector<float> shard(static_cast<size_t>(d.layer_params()));
    tp_shard_layer<float>(s, d, p.params.data(), shard.data());
    const TpLayerTensors<float> t = tp_layer_tensors<float>(d, shard.data());
    // wq row i of the shard is full row 2 r hd + i; wo (h, 32) column j is full column 16 r + j.
    EXPECT_EQ(t.wq[3 * h + 5], p.params[static_cast<size_t>(o.wq + (2 * r * hd + 3) * h + 5)]);
    EXPECT_EQ(t.wo[7 * d.qd() + 2], p.params[static_cast<size_t>(o.wo + 7 * s.q_dim() + 16 * r + 2)]);
    EXPECT_EQ(t.w1[4 * h + 1], p.params[static_cast<size_t>(o.w1 + (24 * r + 4) * h + 1)]);
    EXPECT_EQ(t.w2[3 * d.f() + 6], p.params[static_cast<size_t>(o.w2 + 3 * s.ffn + 24 * r + 6)]);
    tp_unshard_layer<float>(s, d, shard.data(), rebuilt.data());
  }
  EXPECT_EQ(rebuilt, p.params);
}

// 6 heads, 3 KV heads, hidden 48: TP 3 divides them (and the ffn 47 and 13 rows unevenly).
ModelSpec tp3_spec() {
  ModelSpec s = tp_spec();
  s.n_heads = 6;
  s.n_kv_heads = 3;
  s.hidden = 48;
  return s;
}

TEST(TensorParallel, TpThreeLayerMatchesUnsharded) {
  Problem<double> ref(tp3_spec());
  reference(ref);
  expect_matches(run_tp<double>(6, 3, 1, true, tp3_spec()), ref, 1e-13);
  Problem<float> reff(tp3_spec());
  reference(reff);
  expect_matches(run_tp<float>(6, 3, 0, true, tp3_spec()), reff, 1e-6);
}

// The overlapped collectives (products run on whole row tiles as their rows arrive, or before
// their rows are sent) give the bits of the blocking reference: each tile is the same BLAS
// call as in the one product over all rows, the weight gradients are one product over all
// rows either way, and the reduce-scatter sums in rank order. TP 2 and TP 3; 13 rows (one
// tile: no overlap), 261 and 300 rows (blocks that end inside tiles, tiles spanning two or
// three ranks' blocks) and 2 rows (TP 3: a rank with none). Fails if a tile's products are
// skipped or computed from rows not yet received, or if the partial sums are added in
// another order.
TEST(TensorParallel, OverlappedCollectivesGiveTheBlockingBits) {
  struct Case {
    int world, tp;
    ModelSpec spec;
    int64_t tokens;
  };
  for (const Case& c : {Case{4, 2, tp_spec(), kTokens}, Case{6, 3, tp3_spec(), kTokens}, Case{2, 2, tp_spec(), 261},
                        Case{3, 3, tp3_spec(), 300}, Case{3, 3, tp3_spec(), 2}}) {
    SCOPED_TRACE("tp " + std::to_string(c.tp) + ", " + std::to_string(c.tokens) + " rows");
    const Problem<float> blocking = run_tp<float>(c.world, c.tp, c.world / c.tp - 1, false, c.spec, c.tokens);
    const Problem<float> overlapped = run_tp<float>(c.world, c.tp, c.world / c.tp - 1, true, c.spec, c.tokens);
    EXPECT_EQ(overlapped.q, blocking.q);
    EXPECT_EQ(overlapped.k, blocking.k);
    EXPECT_EQ(overlapped.v, blocking.v);
    EXPECT_EQ(overlapped.x_mid, blocking.x_mid);
    EXPECT_EQ(overlapped.out, blocking.out);
    EXPECT_EQ(overlapped.d_o, blocking.d_o);
    EXPECT_EQ(overlapped.dx, blocking.dx);
    EXPECT_EQ(overlapped.grads, blocking.grads);
  }
}

// The fixed-input layer the profile times (tp_layer_harness.h): a run repeats the same work
// (the second blocking run gives the first one's bits: the gradients start from zero every
// run), overlapping changes no bit, the outputs are finite and not all zero, and every blocking
// run exchanges 8 times (4 all-gathers, 4 reduce-scatters), counted on the group.
TEST(TensorParallel, LayerHarnessRunsRepeatAndOverlapKeepsTheBits) {
  const ModelSpec spec = tp_spec();
  const Status st = comm::run_local(2, [&](comm::Communicator& c) -> Status {
    TpLayerHarness layer(spec, 2, c.rank(), 37);
    testing::CountingCommunicator counted(c);
    DISTCA_RETURN_IF_ERROR(layer.run(counted, false));
    if (counted.calls != 8 || counted.sends != 0) {
      return Status::internal("a blocking run made " + std::to_string(counted.calls) + " collectives");
    }
    const std::vector<float> first = layer.outputs();
    bool nonzero = false;
    for (float x : first) {
      if (!std::isfinite(x)) return Status::internal("a non-finite output");
      nonzero = nonzero || x != 0.0f;
    }
    if (!nonzero) return Status::internal("every output is zero");
    DISTCA_RETURN_IF_ERROR(layer.run(c, false));
    if (layer.outputs() != first) return Status::internal("a second run differs");
    DISTCA_RETURN_IF_ERROR(layer.run(c, true));
    if (layer.outputs() != first) return Status::internal("the overlapped run differs");
    return Status::ok_status();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
}

// The harness's memory bound (for the profile's check before work): at least what
// constructing it allocated, measured by the allocator (mallinfo2: heap in use plus mapped
// blocks), and growing with the rows.
TEST(TensorParallel, LayerHarnessPeakBytesBoundItsBuffers) {
  const ModelSpec spec = tp_spec();
  for (const int64_t rows : {int64_t{64}, int64_t{4096}}) {
    const struct mallinfo2 before = mallinfo2();
    TpLayerHarness layer(spec, 2, 0, rows);
    const struct mallinfo2 after = mallinfo2();
    const double allocated = static_cast<double>((after.uordblks + after.hblkhd) - (before.uordblks + before.hblkhd));
    EXPECT_GT(allocated, 0);
    EXPECT_GE(TpLayerHarness::peak_bytes(spec, 2, rows), allocated) << rows;
  }
  EXPECT_LT(TpLayerHarness::peak_bytes(spec, 2, 64), TpLayerHarness::peak_bytes(spec, 2, 4096));
}

TEST(TensorParallel, SizesThatDoNotDivideTheHeadsAreRefused) {
  const ModelSpec s = tp_spec();  // 4 heads, 2 KV heads
  EXPECT_TRUE(check_tp(s, 1).ok());
  EXPECT_TRUE(check_tp(s, 2).ok());
  EXPECT_FALSE(check_tp(s, 4).ok());  // 4 does not divide 2 KV heads
  EXPECT_FALSE(check_tp(s, 3).ok());
  EXPECT_FALSE(check_tp(s, 0).ok());
  EXPECT_NE(check_tp(s, 4).message().find("n_kv_heads (2)"), std::string::npos);
}

}  // namespace
}  // namespace distca::model
