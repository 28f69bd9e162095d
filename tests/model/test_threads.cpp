// Determinism across thread counts: one training step (forward, backward, clip, AdamW) of a
// model whose matrix products span many gemm tiles gives the same bits (loss, gradients,
// gradient norm, parameters) with 1, 2 and 3 OpenMP threads, with OpenBLAS itself set to 1 or
// 2 threads. The independent reference is the single-threaded run; OpenBLAS's own threading would fail it
// (docs/model.md, "Numerics and determinism").
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "distca/core/rng.h"
#include "distca/kernels/blas.h"
#include "distca/model/layers.h"
#include "distca/model/llama.h"
#include "distca/model/local_attention.h"
#include "distca/model/optimizer.h"
#include "model_test_util.h"

namespace distca::model {
namespace {

struct StepBits {
  double loss_sum = 0;
  double grad_norm = 0;
  std::vector<float> grads, params;
};

// Global norm and clipping over more than one chunk and more than the team threshold (a ragged
// tail too): a long-double reference, and the same bits for 1 and 3 threads.
TEST(Threads, GlobalNormIsExactEnoughAndThreadIndependent) {
  const int64_t n = 5 * (1 << 14) + 13;
  Rng rng(4, 4);
  std::vector<float> g(static_cast<size_t>(n));
  for (auto& x : g) x = static_cast<float>(rng.normal());
  long double ref = 0;
  for (const float x : g) ref += static_cast<long double>(x) * x;
  double norms[2];
  std::vector<float> clipped[2];
  for (int i = 0; i < 2; ++i) {
    const kernels::ScopedComputeThreads team(i == 0 ? 1 : 3);
    clipped[i] = g;
    norms[i] = clip_grad_norm(clipped[i], 1.0);
  }
  EXPECT_NEAR(norms[0], std::sqrt(static_cast<double>(ref)), 1e-12 * norms[0]);
  EXPECT_EQ(std::memcmp(&norms[0], &norms[1], sizeof(double)), 0);
  EXPECT_TRUE(clipped[0] == clipped[1]);
  for (size_t i = 0; i < g.size(); i += 997) {
    EXPECT_EQ(clipped[0][i], static_cast<float>(g[i] * (1.0 / norms[0]))) << i;
  }
}

// Wide enough that every gemm of the step has several (128, 128) tiles and crosses the team
// threshold, and that the element-wise loops (RMSNorm, RoPE, SwiGLU, cross-entropy) run on the
// team too: 400 tokens, hidden 256, ffn 320, vocab 260 (not all multiples of the tile).
ModelSpec wide_spec() {
  ModelSpec s = testing::tiny_spec();
  s.hidden = 256;
  s.n_heads = 8;
  s.n_kv_heads = 2;
  s.head_dim = 32;
  s.ffn = 320;
  s.vocab = 260;
  return s;
}

StepBits one_step(int threads) {
  const kernels::ScopedComputeThreads team(threads);
  const ModelSpec spec = wide_spec();
  Rng rng(3, 1);
  testing::Packed p;
  for (int64_t d = 0; d < 4; ++d) testing::append_doc(p, d, testing::random_ids(rng, 100, spec.vocab));
  auto model = Llama<float>::create(spec, static_cast<int64_t>(p.tokens.size()), 11);
  EXPECT_TRUE(model.ok());
  testing::perturb_gains(*model, 5);
  auto ex = LocalAttentionExecutor<float>::create(spec.n_heads, spec.n_kv_heads, spec.head_dim, p.pieces);
  EXPECT_TRUE(ex.ok());
  auto opt = AdamW::create(param_count(spec), decay_groups(model->layout()));
  EXPECT_TRUE(opt.ok());
  StepBits out;
  // Two steps, so the second runs on parameters the first step's update produced.
  for (int step = 0; step < 2; ++step) {
    model->zero_grads();
    auto r = model->forward_backward(p.inputs(), *ex, 1.0 / 396);
    EXPECT_TRUE(r.ok());
    out.loss_sum = r->loss_sum;
    out.grads.assign(model->grads().begin(), model->grads().end());
    out.grad_norm = clip_grad_norm(model->grads(), 1e-3);  // small: the scaling runs too
    EXPECT_TRUE(opt->step(model->params(), model->grads(), 1e-3).ok());
  }
  out.params.assign(model->params().begin(), model->params().end());
  return out;
}

void expect_same_bits(const StepBits& a, const StepBits& b, const char* what) {
  EXPECT_EQ(std::memcmp(&a.loss_sum, &b.loss_sum, sizeof(double)), 0) << what << ": loss";
  EXPECT_EQ(std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(double)), 0) << what << ": gradient norm";
  ASSERT_EQ(a.grads.size(), b.grads.size());
  size_t grad_diff = 0, param_diff = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) grad_diff += std::memcmp(&a.grads[i], &b.grads[i], 4) != 0;
  for (size_t i = 0; i < a.params.size(); ++i) param_diff += std::memcmp(&a.params[i], &b.params[i], 4) != 0;
  EXPECT_EQ(grad_diff, 0u) << what << ": gradients differing in bits";
  EXPECT_EQ(param_diff, 0u) << what << ": parameters differing in bits";
}

TEST(Threads, TrainingStepIsBitwiseIdenticalFor1To3Threads) {
  const kernels::ScopedBlasThreads blas(1);
  const StepBits one = one_step(1);
  expect_same_bits(one, one_step(2), "2 threads");
  expect_same_bits(one, one_step(3), "3 threads");
}

// A caller that left OpenBLAS multi-threaded gets the same bits: the tiles run it on one.
TEST(Threads, OpenBlasThreadCountDoesNotChangeTheBits) {
  StepBits one;
  {
    const kernels::ScopedBlasThreads blas(1);
    one = one_step(1);
  }
  const kernels::ScopedBlasThreads blas(2);
  expect_same_bits(one, one_step(2), "OpenBLAS 2, 2 threads");
  EXPECT_EQ(kernels::blas_threads(), 2);  // and the setting is given back
}

// The tiled gemm against a plain double-precision reference, on a shape with ragged tiles and
// every transpose combination (a wrong tile offset would misplace whole blocks).
TEST(Threads, TiledGemmMatchesAReferenceForEveryTranspose) {
  const int64_t m = 150, n = 270, k = 90;
  Rng rng(9, 2);
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c0(static_cast<size_t>(m * n));
  for (auto& x : a) x = static_cast<float>(rng.normal());
  for (auto& x : b) x = static_cast<float>(rng.normal());
  for (auto& x : c0) x = static_cast<float>(rng.normal());
  const kernels::ScopedComputeThreads team(2);
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      std::vector<float> c = c0;
      gemm<float>(ta, tb, m, n, k, 0.5f, a.data(), b.data(), 2.0f, c.data());
      double worst = 0;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t l = 0; l < k; ++l) {
            const double av = ta ? a[static_cast<size_t>(l * m + i)] : a[static_cast<size_t>(i * k + l)];
            const double bv = tb ? b[static_cast<size_t>(j * k + l)] : b[static_cast<size_t>(l * n + j)];
            s += av * bv;
          }
          const double want = 0.5 * s + 2.0 * c0[static_cast<size_t>(i * n + j)];
          worst = std::max(worst, std::abs(want - c[static_cast<size_t>(i * n + j)]));
        }
      }
      EXPECT_LT(worst, 1e-4) << "trans_a " << ta << " trans_b " << tb;
    }
  }
}

}  // namespace
}  // namespace distca::model
