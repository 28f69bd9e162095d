// Each building block against an independent reference: naive loops for the matrix products,
// a complex-number formula for RoPE, and central finite differences (in double) for every
// backward.
#include "distca/model/layers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <functional>
#include <vector>

#include "distca/core/rng.h"

namespace distca::model {
namespace {

std::vector<double> randn(Rng& rng, size_t n, double scale = 1.0) {
  std::vector<double> v(n);
  for (auto& x : v) x = scale * rng.normal();
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of f at x, element by element.
std::vector<double> numeric_grad(std::vector<double>& x, const std::function<double()>& f,
                                 double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f();
    x[i] = keep - h;
    const double down = f();
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << "[" << i << "]";
  }
}

TEST(Gemm, AllTransposesMatchNaiveLoops) {
  Rng rng(1);
  const int64_t m = 5, n = 7, k = 4;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      const auto a = randn(rng, m * k), b = randn(rng, k * n), c0 = randn(rng, m * n);
      std::vector<double> c = c0;
      gemm<double>(ta, tb, m, n, k, 0.5, a.data(), b.data(), 2.0, c.data());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p) {
            const double av = ta ? a[p * m + i] : a[i * k + p];
            const double bv = tb ? b[j * k + p] : b[p * n + j];
            s += av * bv;
          }
          EXPECT_NEAR(c[i * n + j], 0.5 * s + 2.0 * c0[i * n + j], 1e-12);
        }
      }
    }
  }
  // float goes through sgemm.
  std::vector<float> af = {1, 2, 3, 4}, bf = {5, 6, 7, 8}, cf(4, 0.f);
  gemm<float>(false, false, 2, 2, 2, 1.f, af.data(), bf.data(), 0.f, cf.data());
  EXPECT_EQ(cf, (std::vector<float>{19, 22, 43, 50}));
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  Rng rng(2);
  const int64_t n = 3, in = 5, out = 4;
  auto x = randn(rng, n * in), w = randn(rng, out * in);
  const auto dy = randn(rng, n * out);
  std::vector<double> y(n * out);
  auto f = [&] {
    linear_forward<double>(y.data(), x.data(), w.data(), n, in, out);
    return dot(y, dy);
  };
  std::vector<double> dx(n * in, 1.0), dw(out * in, 0.25);  // dx is accumulated into, dw too
  linear_backward<double>(dx.data(), dw.data(), dy.data(), x.data(), w.data(), n, in, out, true);
  auto ndx = numeric_grad(x, f), ndw = numeric_grad(w, f);
  for (auto& v : ndx) v += 1.0;
  for (auto& v : ndw) v += 0.25;
  expect_close(dx, ndx, 1e-7, "dx");
  expect_close(dw, ndw, 1e-7, "dw");
}

TEST(RmsNorm, ForwardMatchesDefinition) {
  Rng rng(3);
  const int64_t n = 2, c = 6;
  const auto x = randn(rng, n * c), gain = randn(rng, c);
  std::vector<double> y(n * c), rstd(n);
  rmsnorm_forward<double>(y.data(), rstd.data(), x.data(), gain.data(), n, c, 1e-5);
  for (int64_t t = 0; t < n; ++t) {
    double ms = 0;
    for (int64_t i = 0; i < c; ++i) ms += x[t * c + i] * x[t * c + i] / c;
    for (int64_t i = 0; i < c; ++i) {
      EXPECT_NEAR(y[t * c + i], x[t * c + i] / std::sqrt(ms + 1e-5) * gain[i], 1e-12);
    }
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  Rng rng(4);
  const int64_t n = 3, c = 8;
  auto x = randn(rng, n * c), gain = randn(rng, c);
  const auto dy = randn(rng, n * c);
  std::vector<double> y(n * c), rstd(n);
  auto f = [&] {
    rmsnorm_forward<double>(y.data(), rstd.data(), x.data(), gain.data(), n, c, 1e-5);
    return dot(y, dy);
  };
  f();
  std::vector<double> dx(n * c, 0.0), dgain(c, 0.0);
  rmsnorm_backward<double>(dx.data(), dgain.data(), dy.data(), x.data(), rstd.data(),
                           gain.data(), n, c);
  expect_close(dx, numeric_grad(x, f), 1e-7, "dx");
  expect_close(dgain, numeric_grad(gain, f), 1e-7, "dgain");
}

TEST(Rope, RotationMatchesComplexFormulaAtLargePositions) {
  Rng rng(5);
  const int64_t n_heads = 3, hd = 8;
  const std::vector<int32_t> pos = {0, 1, 7, 100, 101, 5000, 131071};
  const auto n = static_cast<int64_t>(pos.size());
  const double theta = 10000.0;
  auto x = randn(rng, n * n_heads * hd);
  const auto x0 = x;
  std::vector<double> cs(n * hd / 2), sn(n * hd / 2);
  rope_tables<double>(cs.data(), sn.data(), pos.data(), n, hd, theta);
  rope_apply<double>(x.data(), cs.data(), sn.data(), n, n_heads, hd, +1);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      for (int64_t i = 0; i < hd / 2; ++i) {
        const int64_t base = (t * n_heads + h) * hd + 2 * i;
        const std::complex<double> z(x0[base], x0[base + 1]);
        const double freq = 1.0 / std::pow(theta, static_cast<double>(2 * i) / hd);
        const std::complex<double> r = z * std::polar(1.0, pos[t] * freq);
        EXPECT_NEAR(x[base], r.real(), 1e-12) << "t=" << t << " i=" << i;
        EXPECT_NEAR(x[base + 1], r.imag(), 1e-12) << "t=" << t << " i=" << i;
      }
    }
  }
  // Position 0 is the identity; the inverse rotation restores the input.
  for (int64_t e = 0; e < n_heads * hd; ++e) EXPECT_EQ(x[e], x0[e]);
  rope_apply<double>(x.data(), cs.data(), sn.data(), n, n_heads, hd, -1);
  for (size_t e = 0; e < x.size(); ++e) EXPECT_NEAR(x[e], x0[e], 1e-12);
}

TEST(Rope, FloatTablesStayAccurateAtLargePositions) {
  // The angle is formed in double: at position 500000 a float angle would be off by ~0.03 rad.
  const std::vector<int32_t> pos = {500000};
  std::vector<float> cs(4), sn(4);
  rope_tables<float>(cs.data(), sn.data(), pos.data(), 1, 8, 10000.0);
  EXPECT_NEAR(cs[0], std::cos(500000.0), 1e-6);
  EXPECT_NEAR(sn[0], std::sin(500000.0), 1e-6);
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  Rng rng(6);
  const int64_t n_heads = 2, hd = 6;
  const std::vector<int32_t> pos = {3, 100, 42};
  const auto n = static_cast<int64_t>(pos.size());
  auto x = randn(rng, n * n_heads * hd);
  const auto dy = randn(rng, x.size());
  std::vector<double> cs(n * hd / 2), sn(n * hd / 2);
  rope_tables<double>(cs.data(), sn.data(), pos.data(), n, hd, 500.0);
  auto f = [&] {
    std::vector<double> y = x;
    rope_apply<double>(y.data(), cs.data(), sn.data(), n, n_heads, hd, +1);
    return dot(y, dy);
  };
  std::vector<double> dx = dy;
  rope_apply<double>(dx.data(), cs.data(), sn.data(), n, n_heads, hd, -1);
  expect_close(dx, numeric_grad(x, f), 1e-7, "dx");
}

TEST(SwiGlu, ForwardAndBackward) {
  Rng rng(7);
  const int64_t n = 3, f = 5;
  auto g = randn(rng, n * f, 2.0), u = randn(rng, n * f);
  const auto da = randn(rng, n * f);
  std::vector<double> a(n * f);
  swiglu_forward<double>(a.data(), g.data(), u.data(), n, f);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-14);
  }
  auto fn = [&] {
    swiglu_forward<double>(a.data(), g.data(), u.data(), n, f);
    return dot(a, da);
  };
  std::vector<double> dg(n * f), du(n * f);
  swiglu_backward<double>(dg.data(), du.data(), da.data(), g.data(), u.data(), n, f);
  expect_close(dg, numeric_grad(g, fn), 1e-7, "dg");
  expect_close(du, numeric_grad(u, fn), 1e-7, "du");
}

TEST(CrossEntropy, LossAndGradientWithMissingTargets) {
  Rng rng(8);
  const int64_t n = 4, vocab = 6;
  auto logits = randn(rng, n * vocab, 3.0);
  const std::vector<int32_t> targets = {2, -1, 5, 0};
  std::vector<double> loss(n);
  const double total =
      cross_entropy_forward<double>(loss.data(), logits.data(), targets.data(), n, vocab);
  double want_total = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (targets[t] < 0) {
      EXPECT_EQ(loss[t], 0.0);
      continue;
    }
    double z = 0;
    for (int64_t j = 0; j < vocab; ++j) z += std::exp(logits[t * vocab + j]);
    const double want = -std::log(std::exp(logits[t * vocab + targets[t]]) / z);
    EXPECT_NEAR(loss[t], want, 1e-12);
    want_total += want;
  }
  EXPECT_NEAR(total, want_total, 1e-12);

  const double scale = 0.25;
  auto f = [&] {
    return scale *
           cross_entropy_forward<double>(loss.data(), logits.data(), targets.data(), n, vocab);
  };
  std::vector<double> dl(n * vocab);
  cross_entropy_backward<double>(dl.data(), logits.data(), targets.data(), n, vocab, scale);
  expect_close(dl, numeric_grad(logits, f), 1e-7, "dlogits");
  for (int64_t j = 0; j < vocab; ++j) EXPECT_EQ(dl[1 * vocab + j], 0.0);  // no target, no grad

  // In place (dlogits aliasing logits) gives the same values.
  std::vector<double> inplace = logits;
  cross_entropy_backward<double>(inplace.data(), inplace.data(), targets.data(), n, vocab, scale);
  EXPECT_EQ(inplace, dl);
}

}  // namespace
}  // namespace distca::model
