// The device kernels against the CPU references (kernels/reference.h) on random task packs, by
// FlashAttention's criterion: the device error (against fp64 on the same, already rounded,
// inputs) stays within 2x the error of a plain implementation in the same precision.
//   fp32: the plain implementation is reference_forward<float> / reference_backward_from_lse<float>
//         (the backward fed that reference's own O and LSE).
//   bf16, fp16: the plain implementation is standard attention with every matmul output rounded
//         to the type (what PyTorch computes in that dtype), emulated here on the host.
// Also: empty tasks, rows without keys, GQA, non-causal, head_dim 32..256, and bitwise
// determinism (two runs). Every test skips, saying so, on a machine without a GPU.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "attention_check.h"
#include "cuda_test_util.h"
#include "distca/kernels/problem.h"
#include "distca/kernels/reference.h"
#include "distca/kernels_cuda/attention_cuda.h"

namespace distca::kernels {
namespace {

using testing::DeviceBuffer;
using namespace check;  // NOLINT: Case, Outputs, check_case, ... (attention_check.h)

// Runs forward then backward on the device with inputs `pr` (already rounded to dtype).
Outputs run_device(AttentionProblem& pr, DType dtype, CudaAttentionOptions opt) {
  AttentionParams hp = params_for(pr);
  const int64_t nq = static_cast<int64_t>(pr.q.size()), nk = static_cast<int64_t>(pr.k.size());
  const size_t eb = testing::dtype_bytes(dtype);
  DeviceBuffer q(nq * eb), k(nk * eb), v(nk * eb), o(nq * eb), d_o(nq * eb), dq(nq * eb), dk(nk * eb), dv(nk * eb);
  DeviceBuffer lse(pr.lse.size() * sizeof(float));
  DeviceBuffer cu_q(pr.cu_q.size() * sizeof(int32_t)), cu_k(pr.cu_k.size() * sizeof(int32_t));
  q.upload(testing::encode(dtype, pr.q).data());
  k.upload(testing::encode(dtype, pr.k).data());
  v.upload(testing::encode(dtype, pr.v).data());
  d_o.upload(testing::encode(dtype, pr.d_o).data());
  cu_q.upload(pr.cu_q.data());
  cu_k.upload(pr.cu_k.data());
  AttentionParams p = hp;
  p.dtype = dtype;
  p.q = static_cast<const float*>(q.get());
  p.k = static_cast<const float*>(k.get());
  p.v = static_cast<const float*>(v.get());
  p.o = static_cast<float*>(o.get());
  p.lse = static_cast<float*>(lse.get());
  p.d_o = static_cast<const float*>(d_o.get());
  p.dq = static_cast<float*>(dq.get());
  p.dk = static_cast<float*>(dk.get());
  p.dv = static_cast<float*>(dv.get());
  p.cu_seqlens_q = static_cast<const int32_t*>(cu_q.get());
  p.cu_seqlens_k = static_cast<const int32_t*>(cu_k.get());

  Outputs out;
  CudaAttention att(opt);
  Status st = att.forward(p, pr.cu_q.data(), pr.cu_k.data(), nullptr);
  EXPECT_TRUE(st.ok()) << st.to_string();
  out.fwd_plan = att.last_plan();
  st = att.backward(p, pr.cu_q.data(), pr.cu_k.data(), nullptr);
  EXPECT_TRUE(st.ok()) << st.to_string();
  out.bwd_plan = att.last_plan();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.o_bits = o.download();
  out.lse_bits = lse.download();
  out.dq_bits = dq.download();
  out.dk_bits = dk.download();
  out.dv_bits = dv.download();
  out.o = testing::decode(dtype, out.o_bits);
  out.lse = testing::decode(DType::kFloat32, out.lse_bits);
  out.dq = testing::decode(dtype, out.dq_bits);
  out.dk = testing::decode(dtype, out.dk_bits);
  out.dv = testing::decode(dtype, out.dv_bits);
  return out;
}

const CudaAttentionOptions kAuto{};
const CudaAttentionOptions kSimple{CudaKernel::kSimple, CudaKernel::kSimple};
Runner device(CudaAttentionOptions opt) {
  return [opt](AttentionProblem& pr, DType t) { return run_device(pr, t, opt); };
}
void check_case(const Case& c, DType dtype, CudaAttentionOptions opt, uint64_t seed) {
  check_case(c, dtype, device(opt), seed);
}

TEST(CudaAttention, Fp32MatchesTheReference) {
  DISTCA_SKIP_WITHOUT_GPU();
  check_case(kPack, DType::kFloat32, kAuto, 1);
  check_case(kEdges, DType::kFloat32, kAuto, 2);
  check_case(kGqa, DType::kFloat32, kAuto, 3);
}

TEST(CudaAttention, Bf16TiledAndSimpleMatchTheReference) {
  DISTCA_SKIP_WITHOUT_GPU();
  for (const auto& opt : {kAuto, kSimple}) {
    check_case(kPack, DType::kBFloat16, opt, 4);
    check_case(kEdges, DType::kBFloat16, opt, 5);
    check_case(kGqa, DType::kBFloat16, opt, 6);
  }
}

TEST(CudaAttention, Fp16TiledAndSimpleMatchTheReference) {
  DISTCA_SKIP_WITHOUT_GPU();
  for (const auto& opt : {kAuto, kSimple}) {
    check_case(kPack, DType::kFloat16, opt, 7);
    check_case(kEdges, DType::kFloat16, opt, 8);
    check_case(kGqa, DType::kFloat16, opt, 9);
  }
}

TEST(CudaAttention, OtherHeadDimsTakeTheSimpleKernel) {
  DISTCA_SKIP_WITHOUT_GPU();
  for (int d : {32, 96, 256}) {
    const Case c = {{{50, 80}, {17, 17}}, 2, 2, d};
    check_case(c, DType::kFloat32, kAuto, 10 + d);
    check_case(c, DType::kBFloat16, kAuto, 11 + d);
  }
}

TEST(CudaAttention, TwoRunsGiveTheSameBits) {
  DISTCA_SKIP_WITHOUT_GPU();
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    AttentionProblem pr = make_problem(kPack.tasks, kPack.heads, kPack.kv_heads, kPack.head_dim, 12);
    const Outputs a = run_device(pr, t, kAuto);
    const Outputs b = run_device(pr, t, kAuto);
    EXPECT_EQ(a.o_bits, b.o_bits) << testing::dtype_name(t);
    EXPECT_EQ(a.lse_bits, b.lse_bits) << testing::dtype_name(t);
    EXPECT_EQ(a.dq_bits, b.dq_bits) << testing::dtype_name(t);
    EXPECT_EQ(a.dk_bits, b.dk_bits) << testing::dtype_name(t);
    EXPECT_EQ(a.dv_bits, b.dv_bits) << testing::dtype_name(t);
  }
}

// The tiled kernels are what kAuto picks for bf16 at d = 128 (so the tests above ran them).
TEST(CudaAttention, AutoRunsTheTiledKernelsForBf16) {
  DISTCA_SKIP_WITHOUT_GPU();
  AttentionProblem pr = make_problem({{70, 90}}, 2, 1, 128, 13);
  const Outputs a = run_device(pr, DType::kBFloat16, kAuto);
  EXPECT_EQ(a.fwd_plan.forward, CudaKernel::kTiled);
  EXPECT_EQ(a.bwd_plan.backward, CudaKernel::kTiled);
}

// A small pack through every kernel, for compute-sanitizer (scripts/gpu-check.sh runs memcheck
// and racecheck on this test alone): finite outputs of the right kind of kernel.
TEST(CudaAttention, SanitizerPack) {
  DISTCA_SKIP_WITHOUT_GPU();
  const Tasks tasks = {{1, 65}, {70, 70}, {0, 9}, {33, 130}};
  for (int d : {64, 128}) {
    for (const auto& [t, opt] : {std::pair{DType::kBFloat16, kAuto}, std::pair{DType::kFloat16, kSimple},
                                 std::pair{DType::kFloat32, kAuto}}) {
      AttentionProblem pr = make_problem(tasks, 4, 2, d, 30 + d);
      const Outputs out = run_device(pr, t, opt);
      for (const auto* x : {&out.o, &out.lse, &out.dq, &out.dk, &out.dv}) {
        for (float e : *x) ASSERT_TRUE(std::isfinite(e)) << testing::dtype_name(t) << " d=" << d;
      }
    }
  }
}

}  // namespace
}  // namespace distca::kernels
