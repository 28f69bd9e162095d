#include "distca/model/layers.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "distca/core/check.h"
#include "distca/kernels/blas.h"

namespace distca::model {
namespace {

// Below this many elements a loop stays on one thread: a team costs more than it saves, and
// every region waits for its slowest thread, which on a machine other jobs load can be a whole
// scheduler time slice. (Row- and element-wise loops: the bits do not depend on it.)
constexpr int64_t kParallelMin = 100000;

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          const T* b, T beta, T* c) {
  // Dense operands: the leading dimensions are the stored row widths (at least 1, as BLAS
  // wants even for empty operands).
  const int64_t lda = std::max<int64_t>(1, trans_a ? m : k);
  const int64_t ldb = std::max<int64_t>(1, trans_b ? k : n);
  const int64_t ldc = std::max<int64_t>(1, n);
  // Tiled over the OpenMP team with a fixed partition: the same bits for any thread count.
  kernels::gemm_tiled<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <class T>
void linear_forward(T* y, const T* x, const T* w, int64_t n, int64_t in, int64_t out) {
  // y (n, out) = x (n, in) @ w^T (in, out)
  gemm<T>(false, true, n, out, in, T(1), x, w, T(0), y);
}

template <class T>
void linear_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t n, int64_t in,
                     int64_t out, bool accumulate_dx) {
  // dx (n, in) = dy (n, out) @ w (out, in)
  gemm<T>(false, false, n, in, out, T(1), dy, w, accumulate_dx ? T(1) : T(0), dx);
  // dw (out, in) += dy^T (out, n) @ x (n, in)
  gemm<T>(true, false, out, in, n, T(1), dy, x, T(1), dw);
}

template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gain, int64_t n, int64_t c, double eps) {
#pragma omp parallel for schedule(static) if (n * c > kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const T* xt = x + t * c;  // (c)
    double ss = 0;
    for (int64_t i = 0; i < c; ++i) ss += static_cast<double>(xt[i]) * xt[i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(c) + eps);
    rstd[t] = static_cast<T>(r);
    T* yt = y + t * c;  // (c)
    for (int64_t i = 0; i < c; ++i) yt[i] = static_cast<T>(xt[i] * r * gain[i]);
  }
}

template <class T>
void rmsnorm_backward(T* dx, T* dgain, const T* dy, const T* x, const T* rstd, const T* gain,
                      int64_t n, int64_t c) {
  // With xh = x * r (r = rstd): y = xh * gain, and dr/dx_i = -r^3 x_i / c, so
  // dx_i = r * (gain_i dy_i - xh_i * mean_j(gain_j dy_j xh_j)).
#pragma omp parallel for schedule(static) if (n * c > kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const T* xt = x + t * c;    // (c)
    const T* dyt = dy + t * c;  // (c)
    const double r = rstd[t];
    double dot = 0;
    for (int64_t i = 0; i < c; ++i) dot += static_cast<double>(gain[i]) * dyt[i] * xt[i] * r;
    const double mean = dot / static_cast<double>(c);
    T* dxt = dx + t * c;  // (c)
    for (int64_t i = 0; i < c; ++i) {
      const double xh = xt[i] * r;
      dxt[i] += static_cast<T>(r * (static_cast<double>(gain[i]) * dyt[i] - xh * mean));
    }
  }
  // The gain's gradient sums over tokens: one fixed (token) order, so the bits do not depend on
  // the thread count.
  for (int64_t t = 0; t < n; ++t) {
    const T* xt = x + t * c;
    const T* dyt = dy + t * c;
    const T r = rstd[t];
    for (int64_t i = 0; i < c; ++i) dgain[i] += dyt[i] * (xt[i] * r);
  }
}

template <class T>
void rope_tables(T* cos_t, T* sin_t, const int32_t* positions, int64_t n, int64_t head_dim,
                 double theta) {
  DISTCA_CHECK(head_dim % 2 == 0);
  const int64_t half = head_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));  // (half)
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[static_cast<size_t>(i)] =
        std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  }
  for (int64_t t = 0; t < n; ++t) {
    DISTCA_CHECK(positions[t] >= 0);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[t]) * inv_freq[static_cast<size_t>(i)];
      cos_t[t * half + i] = static_cast<T>(std::cos(angle));
      sin_t[t * half + i] = static_cast<T>(std::sin(angle));
    }
  }
}

template <class T>
void rope_apply(T* x, const T* cos_t, const T* sin_t, int64_t n, int64_t n_heads,
                int64_t head_dim, int sign) {
  DISTCA_CHECK(head_dim % 2 == 0 && (sign == 1 || sign == -1));
  const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (n * n_heads * head_dim > kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const T* ct = cos_t + t * half;  // (half)
    const T* st = sin_t + t * half;  // (half)
    for (int64_t h = 0; h < n_heads; ++h) {
      T* xh = x + (t * n_heads + h) * head_dim;  // (head_dim)
      for (int64_t i = 0; i < half; ++i) {
        const T re = xh[2 * i];
        const T im = xh[2 * i + 1];
        const T c = ct[i];
        const T s = sign > 0 ? st[i] : -st[i];
        xh[2 * i] = re * c - im * s;
        xh[2 * i + 1] = re * s + im * c;
      }
    }
  }
}

template <class T>
void swiglu_forward(T* a, const T* g, const T* u, int64_t n, int64_t f) {
  const int64_t total = n * f;
#pragma omp parallel for schedule(static) if (total > kParallelMin)
  for (int64_t i = 0; i < total; ++i) {
    const T sig = T(1) / (T(1) + std::exp(-g[i]));
    a[i] = g[i] * sig * u[i];
  }
}

template <class T>
void swiglu_backward(T* dg, T* du, const T* da, const T* g, const T* u, int64_t n, int64_t f) {
  const int64_t total = n * f;
#pragma omp parallel for schedule(static) if (total > kParallelMin)
  for (int64_t i = 0; i < total; ++i) {
    const T sig = T(1) / (T(1) + std::exp(-g[i]));
    const T silu = g[i] * sig;
    // d silu / dg = sig * (1 + g * (1 - sig))
    dg[i] = da[i] * u[i] * sig * (T(1) + g[i] * (T(1) - sig));
    du[i] = da[i] * silu;
  }
}

template <class T>
double cross_entropy_forward(T* loss_out, const T* logits, const int32_t* targets, int64_t n,
                             int64_t vocab) {
#pragma omp parallel for schedule(static) if (n * vocab > kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const int32_t target = targets[t];
    DISTCA_CHECK(target >= -1 && target < vocab);
    if (target < 0) {
      loss_out[t] = T(0);
      continue;
    }
    const T* lt = logits + t * vocab;  // (vocab)
    double mx = lt[0];
    for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, static_cast<double>(lt[j]));
    double sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(lt[j]) - mx);
    loss_out[t] = static_cast<T>(mx + std::log(sum) - static_cast<double>(lt[target]));
  }
  double total = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (targets[t] >= 0) total += static_cast<double>(loss_out[t]);
  }
  return total;
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, int64_t n,
                            int64_t vocab, double scale) {
#pragma omp parallel for schedule(static) if (n * vocab > kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const int32_t target = targets[t];
    DISTCA_CHECK(target >= -1 && target < vocab);
    const T* lt = logits + t * vocab;  // (vocab)
    T* dt = dlogits + t * vocab;       // (vocab)
    if (target < 0) {
      for (int64_t j = 0; j < vocab; ++j) dt[j] = T(0);
      continue;
    }
    double mx = lt[0];
    for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, static_cast<double>(lt[j]));
    double sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(lt[j]) - mx);
    const double inv = 1.0 / sum;
    // Read lt[j] before writing dt[j]: the two may be the same buffer.
    for (int64_t j = 0; j < vocab; ++j) {
      const double p = std::exp(static_cast<double>(lt[j]) - mx) * inv;
      dt[j] = static_cast<T>(scale * (p - (j == target ? 1.0 : 0.0)));
    }
  }
}

#define DISTCA_MODEL_INSTANTIATE_LAYERS(T)                                                    \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, const T*, T, T*); \
  template void linear_forward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t);        \
  template void linear_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t,   \
                                   int64_t, bool);                                           \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, double);    \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, \
                                    int64_t);                                                \
  template void rope_tables<T>(T*, T*, const int32_t*, int64_t, int64_t, double);            \
  template void rope_apply<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int);       \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t, int64_t);                 \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t);  \
  template double cross_entropy_forward<T>(T*, const T*, const int32_t*, int64_t, int64_t);  \
  template void cross_entropy_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t,    \
                                          double);

DISTCA_MODEL_INSTANTIATE_LAYERS(float)
DISTCA_MODEL_INSTANTIATE_LAYERS(double)
#undef DISTCA_MODEL_INSTANTIATE_LAYERS

}  // namespace distca::model
