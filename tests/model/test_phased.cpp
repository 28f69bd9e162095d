// The phased step (llama.h, "Phased step"): the phases driven by hand against the blocking
// forward_backward, which is the independent reference here only in the sense that it is a
// single uninterrupted call; the one-range phased run must give its bits, a two-range
// (nano-batch) run the same function up to rounding, and the weight gradients' bits must be
// fixed by each tensor's per-range call order alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "distca/core/rng.h"
#include "distca/model/llama.h"
#include "distca/model/local_attention.h"
#include "model_test_util.h"

namespace distca::model {
namespace {

using testing::append_doc;
using testing::Packed;
using testing::random_ids;
using testing::tiny_spec;

// Rows [0, a) hold a prefix of every document, rows [a, n) the rest: doc 2 whole (9 tokens),
// then doc 0 (24 tokens) cut after its 10th token, then doc 1 whole (14 tokens) in the second
// range. The cut pieces stay adjacent with consecutive offsets, which the local executor
// accepts; to the model they are one document at positions 0..23 (targets cross the cut).
struct Split {
  Packed packed;
  std::vector<float> report_weights;  // (n)
  int64_t a = 0;                      // first row of the second range
  int64_t n() const { return static_cast<int64_t>(packed.tokens.size()); }
  StepInputs inputs() const {
    return {packed.tokens, packed.positions, packed.targets, report_weights};
  }
};

Split prefix_suffix_split(int64_t vocab) {
  Rng rng(17, 5);
  Split s;
  append_doc(s.packed, 2, random_ids(rng, 9, vocab));
  append_doc(s.packed, 0, random_ids(rng, 24, vocab));
  append_doc(s.packed, 1, random_ids(rng, 14, vocab));
  const int64_t cut = 10;
  s.packed.pieces = {{2, 0, 9, 9}, {0, 0, cut, 24}, {0, cut, 24 - cut, 24}, {1, 0, 14, 14}};
  s.a = 9 + cut;
  for (int64_t t = 0; t < s.n(); ++t) {
    s.report_weights.push_back(static_cast<float>(t % 3) * 0.5f);
  }
  return s;
}

template <class T>
Llama<T> make_model(const ModelSpec& spec) {
  LlamaOptions opt;
  opt.init_std = 0.2;  // far from linear, so a misplaced row or term shows up
  auto m = Llama<T>::create(spec, 64, 41, opt);
  DISTCA_CHECK_MSG(m.ok(), m.status().to_string());
  Llama<T> model = std::move(m).value();
  testing::perturb_gains(model, 41);
  return model;
}

template <class T>
LocalAttentionExecutor<T> executor_for(const ModelSpec& s, const Packed& p,
                                       LocalAttentionBackend backend) {
  auto ex = LocalAttentionExecutor<T>::create(s.n_heads, s.n_kv_heads, s.head_dim, p.pieces,
                                              backend);
  DISTCA_CHECK_MSG(ex.ok(), ex.status().to_string());
  return std::move(ex).value();
}

template <class T>
struct Outcome {
  StepLoss loss;
  std::vector<T> per_token_loss;
  std::vector<T> grads;
};

template <class T>
bool same_bits(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

bool same_bits(const StepLoss& x, const StepLoss& y) {
  return std::memcmp(&x.loss_sum, &y.loss_sum, sizeof(double)) == 0 && x.count == y.count &&
         std::memcmp(&x.report_sum, &y.report_sum, sizeof(double)) == 0 &&
         std::memcmp(&x.report_weight, &y.report_weight, sizeof(double)) == 0;
}

template <class T>
Outcome<T> blocking(Llama<T>& m, const Split& s, LocalAttentionBackend backend,
                    double grad_scale) {
  auto ex = executor_for<T>(m.spec(), s.packed, backend);
  Outcome<T> out;
  out.per_token_loss.assign(static_cast<size_t>(s.n()), T(-1));
  m.zero_grads();
  auto r = m.forward_backward(s.inputs(), ex, grad_scale, out.per_token_loss);
  DISTCA_CHECK_MSG(r.ok(), r.status().to_string());
  out.loss = *r;
  out.grads.assign(m.grads().begin(), m.grads().end());
  return out;
}

// A schedule: the calls of one phased step after begin_step, with the attention of a layer
// (all rows at once, through the local executor) as one of its steps.
template <class T>
struct Driver {
  Llama<T>& m;
  LocalAttentionExecutor<T>& ex;
  double grad_scale;
  void attention_forward(int l) {
    const LayerAttentionIo<T> io = m.attention_io(l);
    ASSERT_TRUE(ex.forward(l, io.q, io.k, io.v, io.o).ok());
  }
  void attention_backward(int l) {
    const LayerAttentionIo<T> io = m.attention_io(l);
    ASSERT_TRUE(ex.backward(l, io.d_o, io.dq, io.dk, io.dv).ok());
  }
};

template <class T>
using Schedule = std::function<void(Driver<T>&, RowRange a, RowRange b)>;

template <class T>
Outcome<T> phased(Llama<T>& m, const Split& s, LocalAttentionBackend backend,
                  double grad_scale, RowRange a, RowRange b, const Schedule<T>& schedule) {
  auto ex = executor_for<T>(m.spec(), s.packed, backend);
  Outcome<T> out;
  out.per_token_loss.assign(static_cast<size_t>(s.n()), T(-1));
  m.zero_grads();
  const Status st = m.begin_step(s.inputs(), out.per_token_loss);
  DISTCA_CHECK_MSG(st.ok(), st.to_string());
  Driver<T> d{m, ex, grad_scale};
  schedule(d, a, b);
  out.loss = m.step_loss();
  out.grads.assign(m.grads().begin(), m.grads().end());
  return out;
}

// One range: exactly the blocking sequence (b is unused).
template <class T>
void one_range(Driver<T>& d, RowRange a, RowRange) {
  const int L = static_cast<int>(d.m.spec().n_layers);
  for (int l = 0; l < L; ++l) {
    d.m.forward_pre(l, a);
    d.attention_forward(l);
    d.m.forward_post(l, a);
  }
  d.m.forward_head(a);
  d.m.backward_head(a, d.grad_scale);
  for (int l = L - 1; l >= 0; --l) {
    d.m.backward_post(l, a);
    d.attention_backward(l);
    d.m.backward_pre(l, a);
  }
}

// Two ranges in lock step: each phase on a then b in forward, b then a in backward.
template <class T>
void lock_step(Driver<T>& d, RowRange a, RowRange b) {
  const int L = static_cast<int>(d.m.spec().n_layers);
  for (int l = 0; l < L; ++l) {
    d.m.forward_pre(l, a);
    d.m.forward_pre(l, b);
    d.attention_forward(l);
    d.m.forward_post(l, a);
    d.m.forward_post(l, b);
  }
  d.m.forward_head(a);
  d.m.forward_head(b);
  d.m.backward_head(b, d.grad_scale);
  d.m.backward_head(a, d.grad_scale);
  for (int l = L - 1; l >= 0; --l) {
    d.m.backward_post(l, b);
    d.m.backward_post(l, a);
    d.attention_backward(l);
    d.m.backward_pre(l, b);
    d.m.backward_pre(l, a);
  }
}

// The ping-pong interleaving: post of layer l fused with pre of layer l+1 per range (and the
// mirror in backward), so the layers' calls interleave differently from lock_step while every
// tensor still sees a before b in forward and b before a in backward.
template <class T>
void fused(Driver<T>& d, RowRange a, RowRange b) {
  const int L = static_cast<int>(d.m.spec().n_layers);
  d.m.forward_pre(0, a);
  d.m.forward_pre(0, b);
  for (int l = 0; l < L; ++l) {
    d.attention_forward(l);
    for (const RowRange r : {a, b}) {
      d.m.forward_post(l, r);
      if (l + 1 < L) {
        d.m.forward_pre(l + 1, r);
      } else {
        d.m.forward_head(r);
      }
    }
  }
  d.m.backward_head(b, d.grad_scale);
  d.m.backward_post(L - 1, b);
  d.m.backward_head(a, d.grad_scale);
  d.m.backward_post(L - 1, a);
  for (int l = L - 1; l >= 0; --l) {
    d.attention_backward(l);
    for (const RowRange r : {b, a}) {
      d.m.backward_pre(l, r);
      if (l > 0) d.m.backward_post(l - 1, r);
    }
  }
}

template <class T>
void expect_bitwise(const Outcome<T>& x, const Outcome<T>& y, const std::string& what) {
  EXPECT_TRUE(same_bits(x.loss, y.loss)) << what << ": loss " << x.loss.loss_sum << " vs "
                                         << y.loss.loss_sum;
  EXPECT_TRUE(same_bits(x.per_token_loss, y.per_token_loss)) << what << ": per-token loss";
  EXPECT_TRUE(same_bits(x.grads, y.grads)) << what << ": gradients";
}

// Every tensor's gradient within tol of the reference's, relative to the tensor's largest
// element (a weight gradient is a sum over tokens whose terms cancel, so an element-wise
// relative bound would be meaningless for its small elements).
template <class T>
void expect_close(const Llama<T>& m, const Outcome<T>& x, const Outcome<T>& ref, double loss_tol,
                  double tol) {
  EXPECT_EQ(x.loss.count, ref.loss.count);
  EXPECT_NEAR(x.loss.loss_sum, ref.loss.loss_sum, loss_tol * std::abs(ref.loss.loss_sum));
  EXPECT_NEAR(x.loss.report_sum, ref.loss.report_sum, loss_tol * std::abs(ref.loss.report_sum));
  EXPECT_EQ(x.loss.report_weight, ref.loss.report_weight);  // a sum of halves: exact
  double worst = 0;
  std::string worst_name;
  for (const TensorInfo& t : m.layout()) {
    double scale = 0, diff = 0;
    for (int64_t e = t.offset; e < t.offset + t.size(); ++e) {
      const auto i = static_cast<size_t>(e);
      scale = std::max(scale, std::abs(static_cast<double>(ref.grads[i])));
      diff = std::max(diff, std::abs(static_cast<double>(x.grads[i]) - ref.grads[i]));
    }
    ASSERT_GT(scale, 0) << t.name << " has no gradient";
    EXPECT_LE(diff, tol * scale) << t.name;
    if (diff / scale > worst) {
      worst = diff / scale;
      worst_name = t.name;
    }
  }
  std::cout << "    loss relative difference "
            << std::abs(x.loss.loss_sum - ref.loss.loss_sum) / ref.loss.loss_sum
            << ", largest gradient difference / tensor max " << worst << " (" << worst_name
            << ")\n";
}

constexpr double kGradScale = 1.0 / 44;  // 47 tokens, 3 documents: 44 targets

TEST(PhasedStep, OneRangeGivesTheBitsOfForwardBackward) {
  const Split s = prefix_suffix_split(tiny_spec().vocab);
  const RowRange all{0, s.n()};
  {
    Llama<float> m = make_model<float>(tiny_spec());
    for (const auto backend : {LocalAttentionBackend::kReference, LocalAttentionBackend::kKernel}) {
      const Outcome<float> ref = blocking(m, s, backend, kGradScale);
      ASSERT_EQ(ref.loss.count, 44);
      expect_bitwise(phased<float>(m, s, backend, kGradScale, all, {}, one_range<float>), ref,
                     "float");
    }
  }
  Llama<double> m = make_model<double>(tiny_spec());
  const Outcome<double> ref = blocking(m, s, LocalAttentionBackend::kReference, kGradScale);
  expect_bitwise(
      phased<double>(m, s, LocalAttentionBackend::kReference, kGradScale, all, {},
                     one_range<double>),
      ref, "double");
}

// Two nano-batches against one range: the same function. The two runs differ only by rounding:
// products over 19 or 28 rows instead of 47 (a row's bits depend on the rows computed with it)
// and the weight gradients' two partial sums. Bounds, float: loss 1e-6 relative (measured
// 1.0e-8), every tensor's gradient 1e-5 of its largest element (measured 1.4e-6, on
// layers.1.attn_norm, a sum over tokens that cancels); double: 1e-12 for both (measured 1e-15).
// A misplaced row offset in any phase (RoPE tables, the next layer's x, a gradient row) is an
// O(1) error.
TEST(PhasedStep, TwoRangesInPingPongOrderMatchOneRange) {
  const Split s = prefix_suffix_split(tiny_spec().vocab);
  const RowRange a{0, s.a}, b{s.a, s.n()};
  {
    Llama<float> m = make_model<float>(tiny_spec());
    const auto backend = LocalAttentionBackend::kKernel;
    const Outcome<float> ref = blocking(m, s, backend, kGradScale);
    const Outcome<float> two = phased<float>(m, s, backend, kGradScale, a, b, lock_step<float>);
    expect_close(m, two, ref, 1e-6, 1e-5);
    for (int64_t t = 0; t < s.n(); ++t) {
      const auto i = static_cast<size_t>(t);
      EXPECT_NEAR(two.per_token_loss[i], ref.per_token_loss[i], 1e-6 * ref.per_token_loss[i] + 1e-7)
          << t;
    }
  }
  Llama<double> m = make_model<double>(tiny_spec());
  const auto backend = LocalAttentionBackend::kReference;
  const Outcome<double> ref = blocking(m, s, backend, kGradScale);
  expect_close(m, phased<double>(m, s, backend, kGradScale, a, b, lock_step<double>), ref,
               1e-12, 1e-12);
}

// Per-tensor range order fixes the bits: lock step and the fused interleaving agree bitwise,
// and a repeated run gives the same bits again.
TEST(PhasedStep, InterleavingsWithTheSamePerTensorOrderGiveTheSameBits) {
  const Split s = prefix_suffix_split(tiny_spec().vocab);
  const RowRange a{0, s.a}, b{s.a, s.n()};
  ModelSpec spec = tiny_spec();
  spec.n_layers = 3;  // an odd count, so both dk/dv sets and a middle layer take part
  Llama<float> m = make_model<float>(spec);
  const auto backend = LocalAttentionBackend::kKernel;
  const Outcome<float> first = phased<float>(m, s, backend, kGradScale, a, b, lock_step<float>);
  const Outcome<float> again = phased<float>(m, s, backend, kGradScale, a, b, lock_step<float>);
  const Outcome<float> other = phased<float>(m, s, backend, kGradScale, a, b, fused<float>);
  expect_bitwise(again, first, "repeated lock step");
  expect_bitwise(other, first, "fused vs lock step");
  // Not vacuous: the split changes some bits against the one-range run.
  const Outcome<float> one = blocking(m, s, backend, kGradScale);
  EXPECT_FALSE(same_bits(one.grads, first.grads));
}

// Records the buffers the blocking path hands the executor.
template <class T>
class RecordingExecutor final : public BasicAttentionExecutor<T> {
 public:
  explicit RecordingExecutor(LocalAttentionExecutor<T> inner) : inner_(std::move(inner)) {}
  AttentionShape shape() const override { return inner_.shape(); }
  Status forward(int layer, const T* q, const T* k, const T* v, T* o) override {
    fwd.push_back({layer, {q, k, v, o}});
    return inner_.forward(layer, q, k, v, o);
  }
  Status backward(int layer, const T* d_o, T* dq, T* dk, T* dv) override {
    bwd.push_back({layer, {d_o, dq, dk, dv}});
    return inner_.backward(layer, d_o, dq, dk, dv);
  }
  struct Call {
    int layer;
    std::vector<const void*> ptrs;
  };
  std::vector<Call> fwd, bwd;

 private:
  LocalAttentionExecutor<T> inner_;
};

TEST(PhasedStep, AttentionIoIsWhatTheExecutorSeesAndDkDvAlternate) {
  const Split s = prefix_suffix_split(tiny_spec().vocab);
  ModelSpec spec = tiny_spec();
  spec.n_layers = 3;
  Llama<float> m = make_model<float>(spec);
  RecordingExecutor<float> ex(
      executor_for<float>(spec, s.packed, LocalAttentionBackend::kReference));
  ASSERT_TRUE(m.forward_backward(s.inputs(), ex, kGradScale).ok());
  ASSERT_EQ(ex.fwd.size(), 3u);
  ASSERT_EQ(ex.bwd.size(), 3u);
  for (int l = 0; l < 3; ++l) {
    const LayerAttentionIo<float> io = m.attention_io(l);
    EXPECT_EQ(ex.fwd[static_cast<size_t>(l)].layer, l);
    EXPECT_EQ(ex.fwd[static_cast<size_t>(l)].ptrs,
              (std::vector<const void*>{io.q, io.k, io.v, io.o}));
    EXPECT_EQ(ex.bwd[static_cast<size_t>(2 - l)].layer, l);
    EXPECT_EQ(ex.bwd[static_cast<size_t>(2 - l)].ptrs,
              (std::vector<const void*>{io.d_o, io.dq, io.dk, io.dv}));
  }
  // dk, dv of neighbouring layers: disjoint regions of max_tokens rows (not only different
  // pointers), and disjoint from dq, d_o.
  const int64_t kv = spec.kv_dim() * m.max_tokens(), qd = spec.q_dim() * m.max_tokens();
  auto disjoint = [](const float* x, int64_t nx, const float* y, int64_t ny) {
    return x + nx <= y || y + ny <= x;
  };
  for (int l = 1; l < 3; ++l) {
    const LayerAttentionIo<float> cur = m.attention_io(l), prev = m.attention_io(l - 1);
    EXPECT_TRUE(disjoint(cur.dk, kv, prev.dk, kv)) << l;
    EXPECT_TRUE(disjoint(cur.dv, kv, prev.dv, kv)) << l;
    EXPECT_TRUE(disjoint(cur.dk, kv, prev.dv, kv)) << l;
    EXPECT_TRUE(disjoint(cur.dv, kv, prev.dk, kv)) << l;
    EXPECT_TRUE(disjoint(cur.dk, kv, cur.dv, kv)) << l;
    for (const float* p : {cur.dk, cur.dv, prev.dk, prev.dv}) {
      EXPECT_TRUE(disjoint(p, kv, cur.dq, qd)) << l;
      EXPECT_TRUE(disjoint(p, kv, cur.d_o, qd)) << l;
    }
    EXPECT_NE(cur.q, prev.q);  // forward buffers are each layer's own
    EXPECT_NE(cur.o, prev.o);
  }
}

// begin_step refuses what forward refuses, with the same message, and leaves no step ready.
TEST(PhasedStep, BeginStepValidatesLikeForward) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Split s = prefix_suffix_split(tiny_spec().vocab);
  Llama<float> m = make_model<float>(tiny_spec());
  auto ex = executor_for<float>(tiny_spec(), s.packed, LocalAttentionBackend::kReference);
  s.packed.targets[5] = 99;
  const Status st = m.begin_step(s.inputs());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.to_string(), m.forward(s.inputs(), ex).status().to_string());
  EXPECT_NE(st.to_string().find("targets[5]"), std::string::npos) << st.to_string();
  EXPECT_DEATH(m.forward_pre(0, {0, 1}), "begin_step");
}

TEST(PhasedStep, PhasePreconditionsAreChecked) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Split s = prefix_suffix_split(tiny_spec().vocab);
  Llama<float> m = make_model<float>(tiny_spec());
  ASSERT_TRUE(m.begin_step(s.inputs()).ok());
  EXPECT_DEATH(m.forward_pre(0, {0, s.n() + 1}), "rows");
  EXPECT_DEATH(m.forward_post(0, {3, 2}), "rows");
  EXPECT_DEATH(m.backward_pre(2, {0, 1}), "layer");
  EXPECT_DEATH(m.attention_io(-1), "layer");
}

}  // namespace
}  // namespace distca::model
