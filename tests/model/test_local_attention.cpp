// LocalAttentionExecutor against a dense masked attention written independently (a full
// n x n score matrix with a same-document-and-causal mask), its backward against finite
// differences, and its refusal of layouts that need the CA runtime.
#include "distca/model/local_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "distca/core/rng.h"

namespace distca::model {
namespace {

std::vector<double> randn(Rng& rng, size_t n) {
  std::vector<double> v(n);
  for (auto& x : v) x = rng.normal();
  return v;
}

// o (n, nh, hd) by dense masked softmax; doc_of: (n) document index of each row, pos: (n).
std::vector<double> dense_attention(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, const std::vector<int>& doc_of,
                                    const std::vector<int>& pos, int64_t nh, int64_t nkv,
                                    int64_t hd) {
  const auto n = static_cast<int64_t>(doc_of.size());
  std::vector<double> o(q.size(), 0.0);
  for (int64_t h = 0; h < nh; ++h) {
    const int64_t kh = h * nkv / nh;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> s(n, -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        if (doc_of[j] != doc_of[i] || pos[j] > pos[i]) continue;
        double d = 0;
        for (int64_t c = 0; c < hd; ++c) d += q[(i * nh + h) * hd + c] * k[(j * nkv + kh) * hd + c];
        s[j] = d / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, s[j]);
      }
      double z = 0;
      for (int64_t j = 0; j < n; ++j) z += std::exp(s[j] - mx);
      for (int64_t j = 0; j < n; ++j) {
        const double p = std::exp(s[j] - mx) / z;
        for (int64_t c = 0; c < hd; ++c) o[(i * nh + h) * hd + c] += p * v[(j * nkv + kh) * hd + c];
      }
    }
  }
  return o;
}

struct DocLayout {
  int64_t nh = 4, nkv = 2, hd = 4;
  // Document 7 is given as two adjacent pieces, which the executor merges.
  std::vector<Piece> pieces = {{7, 0, 3, 5}, {7, 3, 2, 5}, {2, 0, 4, 4}, {9, 0, 1, 1}};
  std::vector<int> doc_of = {0, 0, 0, 0, 0, 1, 1, 1, 1, 2};
  std::vector<int> pos = {0, 1, 2, 3, 4, 0, 1, 2, 3, 0};
  int64_t n() const { return static_cast<int64_t>(doc_of.size()); }
};

TEST(LocalAttention, ForwardMatchesDenseMaskedAttention) {
  DocLayout s;
  auto ex = LocalAttentionExecutor<double>::create(s.nh, s.nkv, s.hd, s.pieces);
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  EXPECT_EQ(ex->shape().n_tokens, s.n());
  ASSERT_EQ(ex->segments().size(), 3u);
  Rng rng(11);
  const auto q = randn(rng, s.n() * s.nh * s.hd), k = randn(rng, s.n() * s.nkv * s.hd),
             v = randn(rng, s.n() * s.nkv * s.hd);
  std::vector<double> o(q.size());
  ASSERT_TRUE(ex->forward(0, q.data(), k.data(), v.data(), o.data()).ok());
  const auto want = dense_attention(q, k, v, s.doc_of, s.pos, s.nh, s.nkv, s.hd);
  for (size_t i = 0; i < o.size(); ++i) EXPECT_NEAR(o[i], want[i], 1e-12);
}

TEST(LocalAttention, BackwardMatchesFiniteDifferences) {
  DocLayout s;
  auto ex = LocalAttentionExecutor<double>::create(s.nh, s.nkv, s.hd, s.pieces);
  ASSERT_TRUE(ex.ok());
  Rng rng(12);
  auto q = randn(rng, s.n() * s.nh * s.hd), k = randn(rng, s.n() * s.nkv * s.hd),
       v = randn(rng, s.n() * s.nkv * s.hd);
  const auto d_o = randn(rng, q.size());
  std::vector<double> o(q.size());
  auto f = [&] {
    const auto out = dense_attention(q, k, v, s.doc_of, s.pos, s.nh, s.nkv, s.hd);
    double t = 0;
    for (size_t i = 0; i < out.size(); ++i) t += out[i] * d_o[i];
    return t;
  };
  ASSERT_TRUE(ex->forward(3, q.data(), k.data(), v.data(), o.data()).ok());
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  ASSERT_TRUE(ex->backward(3, d_o.data(), dq.data(), dk.data(), dv.data()).ok());
  auto check = [&](std::vector<double>& x, const std::vector<double>& g, const char* what) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + 1e-6;
      const double up = f();
      x[i] = keep - 1e-6;
      const double down = f();
      x[i] = keep;
      EXPECT_NEAR(g[i], (up - down) / 2e-6, 1e-7 * (1 + std::abs(g[i]))) << what << i;
    }
  };
  check(q, dq, "dq");
  check(k, dk, "dk");
  check(v, dv, "dv");
}

TEST(LocalAttention, FloatAgreesWithDouble) {
  DocLayout s;
  auto exd = LocalAttentionExecutor<double>::create(s.nh, s.nkv, s.hd, s.pieces);
  auto exf = LocalAttentionExecutor<float>::create(s.nh, s.nkv, s.hd, s.pieces);
  ASSERT_TRUE(exd.ok() && exf.ok());
  Rng rng(13);
  const auto q = randn(rng, s.n() * s.nh * s.hd), k = randn(rng, s.n() * s.nkv * s.hd),
             v = randn(rng, s.n() * s.nkv * s.hd);
  const std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end());
  std::vector<double> od(q.size());
  std::vector<float> of(q.size());
  ASSERT_TRUE(exd->forward(0, q.data(), k.data(), v.data(), od.data()).ok());
  ASSERT_TRUE(exf->forward(0, qf.data(), kf.data(), vf.data(), of.data()).ok());
  for (size_t i = 0; i < od.size(); ++i) EXPECT_NEAR(of[i], od[i], 1e-6);
}

TEST(LocalAttention, KernelBackendMatchesReference) {
  // Lengths around the kernel's block sizes, a one-token document, GQA 8:2.
  const int64_t nh = 8, nkv = 2, hd = 16;
  const std::vector<Piece> pieces = {{0, 0, 300, 300}, {1, 0, 1, 1}, {2, 0, 37, 37},
                                     {3, 0, 130, 130}};
  auto ref = LocalAttentionExecutor<float>::create(nh, nkv, hd, pieces);
  auto ker = LocalAttentionExecutor<float>::create(nh, nkv, hd, pieces,
                                                   LocalAttentionBackend::kKernel);
  ASSERT_TRUE(ref.ok() && ker.ok()) << ker.status().to_string();
  const int64_t n = ref->shape().n_tokens;
  Rng rng(14);
  auto fill = [&](size_t count) {
    std::vector<float> v(count);
    for (auto& x : v) x = static_cast<float>(rng.normal());
    return v;
  };
  const auto q = fill(n * nh * hd), k = fill(n * nkv * hd), v = fill(n * nkv * hd),
             d_o = fill(n * nh * hd);
  std::vector<float> o_ref(q.size()), o_ker(q.size());
  ASSERT_TRUE(ref->forward(1, q.data(), k.data(), v.data(), o_ref.data()).ok());
  ASSERT_TRUE(ker->forward(1, q.data(), k.data(), v.data(), o_ker.data()).ok());
  for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(o_ker[i], o_ref[i], 2e-5) << i;
  std::vector<float> dq_r(q.size()), dk_r(k.size()), dv_r(v.size());
  std::vector<float> dq_k(q.size()), dk_k(k.size()), dv_k(v.size());
  ASSERT_TRUE(ref->backward(1, d_o.data(), dq_r.data(), dk_r.data(), dv_r.data()).ok());
  ASSERT_TRUE(ker->backward(1, d_o.data(), dq_k.data(), dk_k.data(), dv_k.data()).ok());
  for (size_t i = 0; i < q.size(); ++i) {
    ASSERT_NEAR(dq_k[i], dq_r[i], 1e-4 * (1 + std::abs(dq_r[i]))) << i;
  }
  for (size_t i = 0; i < k.size(); ++i) {
    ASSERT_NEAR(dk_k[i], dk_r[i], 1e-4 * (1 + std::abs(dk_r[i]))) << i;
    ASSERT_NEAR(dv_k[i], dv_r[i], 1e-4 * (1 + std::abs(dv_r[i]))) << i;
  }
  // Backward of a layer that never ran forward.
  EXPECT_FALSE(ker->backward(5, d_o.data(), dq_k.data(), dk_k.data(), dv_k.data()).ok());
  // The kernel is fp32 only.
  EXPECT_FALSE(LocalAttentionExecutor<double>::create(nh, nkv, hd, pieces,
                                                      LocalAttentionBackend::kKernel)
                   .ok());
}

TEST(LocalAttention, RefusesLayoutsThatNeedTheRuntime) {
  auto make = [](std::vector<Piece> pieces) {
    return LocalAttentionExecutor<float>::create(4, 2, 8, pieces).status();
  };
  // A piece that continues a document held elsewhere.
  EXPECT_FALSE(make({{1, 5, 3, 8}}).ok());
  // The front of a document whose rest lives elsewhere.
  const Status front = make({{1, 0, 3, 8}});
  EXPECT_EQ(front.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(front.message().find("CA runtime"), std::string::npos) << front.message();
  // Both pieces local but not adjacent (head-tail style).
  EXPECT_FALSE(make({{1, 0, 2, 4}, {2, 0, 1, 1}, {1, 2, 2, 4}}).ok());
  // A gap between two pieces of one document.
  EXPECT_FALSE(make({{1, 0, 2, 5}, {1, 3, 2, 5}}).ok());
  // Bad head configuration.
  EXPECT_FALSE(LocalAttentionExecutor<float>::create(4, 3, 8, {}).ok());
  // Empty layout is fine (a rank with no tokens).
  EXPECT_TRUE(make({}).ok());
}

TEST(LocalAttention, BackwardBeforeForwardIsAnError) {
  std::vector<Piece> pieces = {{0, 0, 2, 2}};
  auto ex = LocalAttentionExecutor<float>::create(2, 1, 2, pieces);
  ASSERT_TRUE(ex.ok());
  std::vector<float> buf(8);
  EXPECT_FALSE(ex->backward(0, buf.data(), buf.data(), buf.data(), buf.data()).ok());
}

}  // namespace
}  // namespace distca::model
