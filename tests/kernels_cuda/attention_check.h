// The accuracy criterion of the CUDA kernel tests, shared by the device tests
// (test_attention_cuda.cpp) and the host emulation of the tiled kernels (test_emulated.cpp):
// FlashAttention's criterion, the error against fp64 on the same rounded inputs within 2x the
// error of a plain implementation in the same precision (fp32: reference_forward<float> /
// reference_backward_from_lse<float> fed that reference's own O and LSE; bf16/fp16: standard
// attention with every matmul and softmax output rounded to the type, as PyTorch computes it).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "distca/kernels/problem.h"
#include "distca/kernels/reference.h"
#include "distca/kernels_cuda/attention_cuda.h"

namespace distca::kernels::check {

using Tasks = std::vector<std::pair<int64_t, int64_t>>;

struct Case {
  Tasks tasks;
  int32_t heads, kv_heads, head_dim;
  bool causal = true;
};

struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;  // decoded to float
  std::vector<unsigned char> o_bits, lse_bits, dq_bits, dk_bits, dv_bits;
  CudaLaunchPlan fwd_plan, bwd_plan;
};

// Standard attention with every matmul output (and the softmax output) rounded to dtype.
// o: like q; lse: (n_heads, total_q); then the backward in the same style.
struct Emulated {
  std::vector<float> o, lse, dq, dk, dv;
};
inline Emulated emulate(const AttentionProblem& pr, const AttentionParams& p, DType t) {
  const int d = p.head_dim, H = p.n_heads, KH = p.n_kv_heads, G = H / KH;
  const float scale = p.scale();
  auto rnd = [t](double x) { return testing::round_to(t, static_cast<float>(x)); };
  Emulated e;
  e.o.assign(pr.q.size(), 0.0f);
  e.dq.assign(pr.q.size(), 0.0f);
  e.lse.assign(pr.lse.size(), 0.0f);
  std::vector<float> dk32(pr.k.size(), 0.0f), dv32(pr.k.size(), 0.0f);  // fp32 sums over the group's heads
  const int64_t total_q = p.total_q();
  for (int32_t task = 0; task < p.n_tasks; ++task) {
    const int64_t q0 = pr.cu_q[task], k0 = pr.cu_k[task];
    const int64_t ql = pr.cu_q[task + 1] - q0, kl = pr.cu_k[task + 1] - k0;
    for (int h = 0; h < H; ++h) {
      const int g = h / G;
      auto Q = [&](int64_t i, int c) { return pr.q[((q0 + i) * H + h) * d + c]; };
      auto DO = [&](int64_t i, int c) { return pr.d_o[((q0 + i) * H + h) * d + c]; };
      auto K = [&](int64_t j, int c) { return pr.k[((k0 + j) * KH + g) * d + c]; };
      auto V = [&](int64_t j, int c) { return pr.v[((k0 + j) * KH + g) * d + c]; };
      std::vector<float> dk_h(kl * d, 0.0f), dv_h(kl * d, 0.0f);
      for (int64_t i = 0; i < ql; ++i) {
        const int64_t nvis = p.causal ? kl - ql + i + 1 : kl;
        std::vector<float> s(nvis), pp(nvis), dp(nvis), ds(nvis);
        float mx = -INFINITY;
        for (int64_t j = 0; j < nvis; ++j) {
          float acc = 0;
          for (int c = 0; c < d; ++c) acc += Q(i, c) * K(j, c);
          s[j] = rnd(rnd(acc) * scale);
          mx = std::max(mx, s[j]);
        }
        float sum = 0;
        for (int64_t j = 0; j < nvis; ++j) sum += std::exp(s[j] - mx);
        e.lse[h * total_q + q0 + i] = nvis > 0 ? mx + std::log(sum) : -INFINITY;
        for (int64_t j = 0; j < nvis; ++j) pp[j] = rnd(std::exp(s[j] - mx) / sum);
        for (int c = 0; c < d; ++c) {
          float acc = 0;
          for (int64_t j = 0; j < nvis; ++j) acc += pp[j] * V(j, c);
          e.o[((q0 + i) * H + h) * d + c] = rnd(acc);
        }
        float dsum = 0;
        for (int64_t j = 0; j < nvis; ++j) {
          float acc = 0;
          for (int c = 0; c < d; ++c) acc += DO(i, c) * V(j, c);
          dp[j] = rnd(acc);
          dsum += pp[j] * dp[j];
        }
        dsum = rnd(dsum);
        for (int64_t j = 0; j < nvis; ++j) ds[j] = rnd(pp[j] * (dp[j] - dsum));
        for (int c = 0; c < d; ++c) {
          float acc = 0;
          for (int64_t j = 0; j < nvis; ++j) acc += ds[j] * K(j, c);
          e.dq[((q0 + i) * H + h) * d + c] = rnd(rnd(acc) * scale);
        }
        for (int64_t j = 0; j < nvis; ++j) {
          for (int c = 0; c < d; ++c) {
            dv_h[j * d + c] += pp[j] * DO(i, c);
            dk_h[j * d + c] += ds[j] * Q(i, c);
          }
        }
      }
      for (int64_t j = 0; j < kl; ++j) {
        for (int c = 0; c < d; ++c) {
          dv32[((k0 + j) * KH + g) * d + c] += rnd(dv_h[j * d + c]);
          dk32[((k0 + j) * KH + g) * d + c] += rnd(rnd(dk_h[j * d + c]) * scale);
        }
      }
    }
  }
  e.dk.resize(dk32.size());
  e.dv.resize(dv32.size());
  for (size_t i = 0; i < dk32.size(); ++i) e.dk[i] = rnd(dk32[i]), e.dv[i] = rnd(dv32[i]);
  return e;
}

inline double max_err(const std::vector<float>& a, const std::vector<double>& ref, const char* what) {
  EXPECT_EQ(a.size(), ref.size()) << what;
  double e = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      EXPECT_EQ(static_cast<double>(a[i]), ref[i]) << what << " entry " << i;
      continue;
    }
    EXPECT_TRUE(std::isfinite(a[i])) << what << " entry " << i;
    e = std::max(e, std::abs(static_cast<double>(a[i]) - ref[i]));
  }
  return e;
}
inline double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) {
    if (std::isfinite(v)) m = std::max(m, std::abs(v));
  }
  return m;
}
// 2x the plain implementation's error, floored at one unit of the output type at the largest
// reference value (an exactly representable case must not demand bit equality).
inline void expect_within(const std::string& what, const std::vector<float>& dev, const std::vector<float>& plain,
                   const std::vector<double>& ref, double eps) {
  const double e_dev = max_err(dev, ref, what.c_str());
  const double e_plain = max_err(plain, ref, (what + " (plain)").c_str());
  const double floor = eps * max_abs(ref);
  EXPECT_LE(e_dev, 2.0 * std::max(e_plain, floor)) << what << ": device error " << e_dev << " vs plain " << e_plain;
}

inline std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

using Runner = std::function<Outputs(AttentionProblem&, DType)>;

// The CPU fast path as a stand-in device: fp32 kernels on the rounded inputs, outputs rounded to
// dtype. It lets the criterion itself be tested where there is no GPU.
inline Outputs run_cpu(AttentionProblem& pr, DType dtype) {
  const AttentionParams p = params_for(pr);
  attention_forward(p);
  attention_backward(p);
  Outputs out;
  auto rounded = [dtype](const std::vector<float>& x) {
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); ++i) r[i] = testing::round_to(dtype, x[i]);
    return r;
  };
  out.o = rounded(pr.o);
  out.lse = pr.lse;
  out.dq = rounded(pr.dq);
  out.dk = rounded(pr.dk);
  out.dv = rounded(pr.dv);
  return out;
}

// Long-ish tasks crossing the tiles' edges (1, 63/64/65, 130 rows; a 1000-key context), GQA 2.
inline const Case kPack = {{{1, 300}, {64, 64}, {65, 200}, {130, 130}, {7, 1000}}, 4, 2, 128};
// Empty tasks, a q-only task without keys (non-causal: O = 0, LSE = -inf), GQA 1.
inline const Case kEdges = {{{0, 50}, {33, 33}, {3, 0}, {100, 257}}, 2, 1, 64, false};
// GQA group of 4, one long causal shard.
inline const Case kGqa = {{{129, 300}, {128, 128}}, 8, 2, 64};

inline void check_case(const Case& c, DType dtype, const Runner& run, uint64_t seed) {
  AttentionProblem pr = make_problem(c.tasks, c.heads, c.kv_heads, c.head_dim, seed);
  pr.causal = c.causal;
  for (auto* x : {&pr.q, &pr.k, &pr.v, &pr.d_o}) {
    for (float& e : *x) e = testing::round_to(dtype, e);
  }
  const AttentionParams p = params_for(pr);
  ASSERT_TRUE(validate(p).ok()) << validate(p).message();
  const Outputs dev = run(pr, dtype);
  const std::string tag = std::string(testing::dtype_name(dtype)) + " fwd " + cuda_kernel_name(dev.fwd_plan.forward) +
                          " bwd " + cuda_kernel_name(dev.bwd_plan.backward) + " d=" + std::to_string(c.head_dim) + " ";

  const size_t nq = pr.q.size(), nk = pr.k.size(), nl = pr.lse.size();
  const auto q64 = to_double(pr.q), k64 = to_double(pr.k), v64 = to_double(pr.v), do64 = to_double(pr.d_o);
  std::vector<double> o64(nq), lse64(nl), dq64(nq), dk64(nk), dv64(nk);
  reference_forward<double>(p, q64.data(), k64.data(), v64.data(), o64.data(), lse64.data());
  reference_backward<double>(p, q64.data(), k64.data(), v64.data(), do64.data(), dq64.data(), dk64.data(), dv64.data());

  std::vector<float> o_p(nq), lse_p(nl), dq_p(nq), dk_p(nk), dv_p(nk);
  if (dtype == DType::kFloat32) {
    reference_forward<float>(p, pr.q.data(), pr.k.data(), pr.v.data(), o_p.data(), lse_p.data());
    // The plain implementation's own O and LSE: fed the device's, its backward would follow the
    // device's forward error and loosen the bound on dQ, dK, dV.
    reference_backward_from_lse<float>(p, pr.q.data(), pr.k.data(), pr.v.data(), o_p.data(), lse_p.data(),
                                       pr.d_o.data(), dq_p.data(), dk_p.data(), dv_p.data());
  } else {
    Emulated e = emulate(pr, p, dtype);
    o_p = std::move(e.o), lse_p = std::move(e.lse), dq_p = std::move(e.dq), dk_p = std::move(e.dk), dv_p = std::move(e.dv);
  }
  const double eps = testing::dtype_epsilon(dtype);
  expect_within(tag + "O", dev.o, o_p, o64, eps);
  expect_within(tag + "LSE", dev.lse, lse_p, lse64, FLT_EPSILON);
  expect_within(tag + "dQ", dev.dq, dq_p, dq64, eps);
  expect_within(tag + "dK", dev.dk, dk_p, dk64, eps);
  expect_within(tag + "dV", dev.dv, dv_p, dv64, eps);
}


}  // namespace distca::kernels::check
