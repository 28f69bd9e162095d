// Vectorised row operations of the online softmax (internal to the kernels layer).
//
// Why hand-written: the exp of every score is the only non-BLAS work of any size in the
// attention kernels, and libm's expf does not vectorise. exp2 here is a degree-7 polynomial on
// the reduced argument f in [-0.5, 0.5] (truncation error < 1e-9 relative, so the result is
// within about 1 ulp of the true 2^x) scaled by 2^n; inputs below -160 (including -inf, the
// masked scores) give exactly 0. The AVX-512 path is used when the compiler targets it
// (-march=native on this machine); otherwise a scalar loop over std::exp2 (portable build).
//
// Every function reduces in a fixed order that depends only on n, so results are the same
// bits whichever thread calls them.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12 flags the _mm512_undefined_ps() inside its own unmasked AVX-512 intrinsics as
// "may be used uninitialized" once they are inlined (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace distca::kernels::detail {

#if defined(__AVX512F__)
inline __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-160.0f));
  x = _mm512_min_ps(x, _mm512_set1_ps(127.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  // Taylor coefficients of 2^f = e^(f ln 2): ln2^k / k!.
  __m512 p = _mm512_set1_ps(1.5252733804059841e-05f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381610e-04f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
#endif

inline float exp2_scalar(float x) { return x < -160.0f ? 0.0f : std::exp2(x); }

// max(x[0..n)); -inf for n == 0.
inline float row_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 acc = _mm512_set1_ps(m);
  for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(acc, _mm512_loadu_ps(x + i));
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    acc = _mm512_mask_max_ps(acc, mask, acc, _mm512_maskz_loadu_ps(mask, x + i));
    i = n;
  }
  m = _mm512_reduce_max_ps(acc);
#endif
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// x[i] = 2^(x[i] - shift); returns the sum of the new x (fixed summation order).
inline float exp2_shift_sum(float* x, int64_t n, float shift) {
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__AVX512F__)
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    _mm512_storeu_ps(x + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 e = exp2_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), s));
    _mm512_mask_storeu_ps(x + i, mask, e);
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(mask, e));
    i = n;
  }
  sum = _mm512_reduce_add_ps(acc);
#endif
  for (; i < n; ++i) {
    x[i] = exp2_scalar(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

// x[i] = 2^(x[i] - shift) (the backward's recomputation of P from the saved LSE).
inline void exp2_shift(float* x, int64_t n, float shift) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 s = _mm512_set1_ps(shift);
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(x + i, exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), s)));
  }
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(x + i, mask,
                          exp2_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), s)));
    i = n;
  }
#endif
  for (; i < n; ++i) x[i] = exp2_scalar(x[i] - shift);
}

// dp[i] = p[i] * (dp[i] - d): the softmax backward dS = P o (dP - rowsum(dO o O)).
inline void softmax_grad(float* dp, const float* p, int64_t n, float d) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 dd = _mm512_set1_ps(d);
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dp + i, _mm512_mul_ps(_mm512_loadu_ps(p + i),
                                           _mm512_sub_ps(_mm512_loadu_ps(dp + i), dd)));
  }
#endif
  for (; i < n; ++i) dp[i] = p[i] * (dp[i] - d);
}

// x[i] *= a.
inline void scale_row(float* x, int64_t n, float a) {
  for (int64_t i = 0; i < n; ++i) x[i] *= a;
}

}  // namespace distca::kernels::detail
