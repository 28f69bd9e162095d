// The naive reference (see reference.h). Written for obviousness, not speed.
#include "distca/kernels/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace distca::kernels {
namespace {

struct Dims {
  int64_t H, Hkv, G, d, total_q, total_kv;
};

Dims dims(const AttentionParams& s) {
  return {s.n_heads, s.n_kv_heads, s.n_heads / s.n_kv_heads, s.head_dim, s.total_q(), s.total_kv()};
}

// Number of keys query row i of a task sees.
int64_t visible(const AttentionParams& s, int64_t i, int64_t q_len, int64_t kv_len) {
  return s.causal ? kv_len - q_len + i + 1 : kv_len;
}

// p[j] = softmax over the visible keys of scale * q_row . k_j; returns the log-sum-exp.
template <class T>
T softmax_row(const AttentionParams& s, const Dims& dm, const T* qrow, const T* k, int64_t k0,
              int64_t hk, int64_t nvis, std::vector<T>& p) {
  const T scale = static_cast<T>(s.scale());
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < nvis; ++j) {
    const T* krow = k + ((k0 + j) * dm.Hkv + hk) * dm.d;
    T dot = 0;
    for (int64_t c = 0; c < dm.d; ++c) dot += qrow[c] * krow[c];
    p[static_cast<size_t>(j)] = scale * dot;
    mx = std::max(mx, p[static_cast<size_t>(j)]);
  }
  if (nvis == 0) return -std::numeric_limits<T>::infinity();
  T sum = 0;
  for (int64_t j = 0; j < nvis; ++j) {
    p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx);
    sum += p[static_cast<size_t>(j)];
  }
  for (int64_t j = 0; j < nvis; ++j) p[static_cast<size_t>(j)] /= sum;
  return mx + std::log(sum);
}

}  // namespace

template <class T>
void reference_forward(const AttentionParams& s, const T* q, const T* k, const T* v, T* o, T* lse) {
  const Dims dm = dims(s);
  std::vector<T> p(static_cast<size_t>(std::max<int64_t>(1, s.max_seqlen_k > 0 ? s.max_seqlen_k : dm.total_kv)));
  for (int64_t t = 0; t < s.n_tasks; ++t) {
    const int64_t q0 = s.cu_seqlens_q[t], k0 = s.cu_seqlens_k[t];
    const int64_t q_len = s.cu_seqlens_q[t + 1] - q0, kv_len = s.cu_seqlens_k[t + 1] - k0;
    if (static_cast<int64_t>(p.size()) < kv_len) p.resize(static_cast<size_t>(kv_len));
    for (int64_t h = 0; h < dm.H; ++h) {
      const int64_t hk = h / dm.G;
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t row = q0 + i, nvis = visible(s, i, q_len, kv_len);
        const T* qrow = q + (row * dm.H + h) * dm.d;
        lse[h * dm.total_q + row] = softmax_row(s, dm, qrow, k, k0, hk, nvis, p);
        T* orow = o + (row * dm.H + h) * dm.d;
        for (int64_t c = 0; c < dm.d; ++c) orow[c] = 0;
        for (int64_t j = 0; j < nvis; ++j) {
          const T* vrow = v + ((k0 + j) * dm.Hkv + hk) * dm.d;
          for (int64_t c = 0; c < dm.d; ++c) orow[c] += p[static_cast<size_t>(j)] * vrow[c];
        }
      }
    }
  }
}

template <class T>
void reference_backward(const AttentionParams& s, const T* q, const T* k, const T* v, const T* d_o,
                        T* dq, T* dk, T* dv) {
  const Dims dm = dims(s);
  std::fill(dq, dq + dm.total_q * dm.H * dm.d, T(0));
  std::fill(dk, dk + dm.total_kv * dm.Hkv * dm.d, T(0));
  std::fill(dv, dv + dm.total_kv * dm.Hkv * dm.d, T(0));
  const T scale = static_cast<T>(s.scale());
  std::vector<T> p, dp;
  for (int64_t t = 0; t < s.n_tasks; ++t) {
    const int64_t q0 = s.cu_seqlens_q[t], k0 = s.cu_seqlens_k[t];
    const int64_t q_len = s.cu_seqlens_q[t + 1] - q0, kv_len = s.cu_seqlens_k[t + 1] - k0;
    p.resize(static_cast<size_t>(std::max<int64_t>(1, kv_len)));
    dp.resize(p.size());
    for (int64_t h = 0; h < dm.H; ++h) {
      const int64_t hk = h / dm.G;
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t row = q0 + i, nvis = visible(s, i, q_len, kv_len);
        const T* qrow = q + (row * dm.H + h) * dm.d;
        const T* dorow = d_o + (row * dm.H + h) * dm.d;
        softmax_row(s, dm, qrow, k, k0, hk, nvis, p);
        // dP_j = dO . v_j; D = sum_j P_j dP_j; dS_j = P_j (dP_j - D)
        T D = 0;
        for (int64_t j = 0; j < nvis; ++j) {
          const T* vrow = v + ((k0 + j) * dm.Hkv + hk) * dm.d;
          T dot = 0;
          for (int64_t c = 0; c < dm.d; ++c) dot += dorow[c] * vrow[c];
          dp[static_cast<size_t>(j)] = dot;
          D += p[static_cast<size_t>(j)] * dot;
        }
        T* dqrow = dq + (row * dm.H + h) * dm.d;
        for (int64_t j = 0; j < nvis; ++j) {
          const T pj = p[static_cast<size_t>(j)];
          const T ds = pj * (dp[static_cast<size_t>(j)] - D);
          const T* krow = k + ((k0 + j) * dm.Hkv + hk) * dm.d;
          T* dkrow = dk + ((k0 + j) * dm.Hkv + hk) * dm.d;
          T* dvrow = dv + ((k0 + j) * dm.Hkv + hk) * dm.d;
          for (int64_t c = 0; c < dm.d; ++c) {
            dqrow[c] += scale * ds * krow[c];
            dkrow[c] += scale * ds * qrow[c];
            dvrow[c] += pj * dorow[c];
          }
        }
      }
    }
  }
}

template <class T>
void reference_backward_from_lse(const AttentionParams& s, const T* q, const T* k, const T* v, const T* o,
                                 const T* lse, const T* d_o, T* dq, T* dk, T* dv) {
  const Dims dm = dims(s);
  std::fill(dq, dq + dm.total_q * dm.H * dm.d, T(0));
  std::fill(dk, dk + dm.total_kv * dm.Hkv * dm.d, T(0));
  std::fill(dv, dv + dm.total_kv * dm.Hkv * dm.d, T(0));
  const T scale = static_cast<T>(s.scale());
  for (int64_t t = 0; t < s.n_tasks; ++t) {
    const int64_t q0 = s.cu_seqlens_q[t], k0 = s.cu_seqlens_k[t];
    const int64_t q_len = s.cu_seqlens_q[t + 1] - q0, kv_len = s.cu_seqlens_k[t + 1] - k0;
    for (int64_t h = 0; h < dm.H; ++h) {
      const int64_t hk = h / dm.G;
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t row = q0 + i, nvis = visible(s, i, q_len, kv_len);
        const T* qrow = q + (row * dm.H + h) * dm.d;
        const T* orow = o + (row * dm.H + h) * dm.d;
        const T* dorow = d_o + (row * dm.H + h) * dm.d;
        const T L = lse[h * dm.total_q + row];
        T D = 0;
        for (int64_t c = 0; c < dm.d; ++c) D += dorow[c] * orow[c];
        T* dqrow = dq + (row * dm.H + h) * dm.d;
        for (int64_t j = 0; j < nvis; ++j) {
          const T* krow = k + ((k0 + j) * dm.Hkv + hk) * dm.d;
          const T* vrow = v + ((k0 + j) * dm.Hkv + hk) * dm.d;
          T sc = 0, dp = 0;
          for (int64_t c = 0; c < dm.d; ++c) {
            sc += qrow[c] * krow[c];
            dp += dorow[c] * vrow[c];
          }
          const T pj = std::exp(scale * sc - L);
          const T ds = pj * (dp - D);
          T* dkrow = dk + ((k0 + j) * dm.Hkv + hk) * dm.d;
          T* dvrow = dv + ((k0 + j) * dm.Hkv + hk) * dm.d;
          for (int64_t c = 0; c < dm.d; ++c) {
            dqrow[c] += scale * ds * krow[c];
            dkrow[c] += scale * ds * qrow[c];
            dvrow[c] += pj * dorow[c];
          }
        }
      }
    }
  }
}

template void reference_backward_from_lse<float>(const AttentionParams&, const float*, const float*,
                                                 const float*, const float*, const float*, const float*,
                                                 float*, float*, float*);
template void reference_forward<float>(const AttentionParams&, const float*, const float*, const float*,
                                       float*, float*);
template void reference_forward<double>(const AttentionParams&, const double*, const double*,
                                        const double*, double*, double*);
template void reference_backward<float>(const AttentionParams&, const float*, const float*,
                                        const float*, const float*, float*, float*, float*);
template void reference_backward<double>(const AttentionParams&, const double*, const double*,
                                         const double*, const double*, double*, double*, double*);

}  // namespace distca::kernels
