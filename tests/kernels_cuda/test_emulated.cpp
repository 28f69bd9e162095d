// The kernels' own code run on the CPU: attention_simple.cu, attention_tiled.cu and
// attention_tiled_bwd.cu are compiled here by the host compiler with DISTCA_CUDA_EMULATION (src/kernels_cuda/
// host_emulation.h: every thread a coroutine, barriers and warp collectives emulated, ldmatrix
// and mma.sync computed from the PTX ISA's fragment tables), driven by the host planner's tile
// lists, and held to the device tests' accuracy criterion (attention_check.h). This checks the
// kernels' control flow, masking, pipelining, softmax and fragment use where no GPU exists;
// what it cannot check is the hardware itself (timing, real cp.async asynchrony, the real mma
// rounding, occupancy).
#define DISTCA_CUDA_EMULATION 1

// clang-format off
#include "attention_simple.cu"     // src/kernels_cuda (private include path of this test)
#include "attention_tiled.cu"
#include "attention_tiled_bwd.cu"
// clang-format on

#include <gtest/gtest.h>

#include "attention_check.h"

namespace distca::kernels {
namespace {

using namespace check;  // NOLINT: Case, Outputs, check_case (attention_check.h)
using cuda_detail::DeviceArgs;

// D = rowsum(dO o O) by dsum_kernel itself (attention_simple.cu), on launch_dsum's grid: one
// warp per (row, head), kSimpleRows warps per block. Both backwards read D from here.
template <class T>
void run_dsum(const DeviceArgs& a) {
  const int64_t warps = a.total_q * a.n_heads;
  for (int64_t b = 0; b * cuda_shapes::kSimpleRows < warps; ++b) {
    emu::BlockRunner::run(static_cast<unsigned>(b), 0, cuda_shapes::kSimpleThreads, 0,
                          [&] { cuda_detail::dsum_kernel<T>(a); });
  }
}

template <class T, int D>
Outputs run_emulated_t(AttentionProblem& pr, DType dtype) {
  AttentionParams p = params_for(pr);
  p.dtype = dtype;
  std::vector<unsigned char> q = testing::encode(dtype, pr.q), k = testing::encode(dtype, pr.k),
                             v = testing::encode(dtype, pr.v), d_o = testing::encode(dtype, pr.d_o);
  std::vector<unsigned char> o(q.size()), dq(q.size()), dk(k.size()), dv(k.size());
  std::vector<float> lse(pr.lse.size()), dsum(pr.lse.size());
  // 16-byte aligned as the tiled kernels require (vectors of unsigned char: copy to aligned).
  p.q = reinterpret_cast<const float*>(q.data());
  p.k = reinterpret_cast<const float*>(k.data());
  p.v = reinterpret_cast<const float*>(v.data());
  p.o = reinterpret_cast<float*>(o.data());
  p.lse = lse.data();
  p.d_o = reinterpret_cast<const float*>(d_o.data());
  p.dq = reinterpret_cast<float*>(dq.data());
  p.dk = reinterpret_cast<float*>(dk.data());
  p.dv = reinterpret_cast<float*>(dv.data());
  const CudaAttentionOptions tiled{CudaKernel::kTiled, CudaKernel::kTiled};
  Result<CudaLaunchPlan> plan = plan_cuda_attention(p, pr.cu_q.data(), pr.cu_k.data(), true, tiled);
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  if (!plan.ok()) return {};

  DeviceArgs a;
  a.dtype = dtype;
  a.q = q.data(), a.k = k.data(), a.v = v.data(), a.o = o.data(), a.lse = lse.data();
  a.d_o = d_o.data(), a.dq = dq.data(), a.dk = dk.data(), a.dv = dv.data(), a.dsum = dsum.data();
  a.cu_q = pr.cu_q.data(), a.cu_k = pr.cu_k.data();
  a.n_heads = p.n_heads, a.n_kv_heads = p.n_kv_heads, a.head_dim = p.head_dim, a.group = p.n_heads / p.n_kv_heads;
  a.scale = p.scale(), a.causal = p.causal, a.total_q = plan->total_q;

  auto grid = [&](const std::vector<CudaTile>& tiles, int heads, int64_t smem, auto kernel) {
    for (size_t t = 0; t < tiles.size(); ++t) {
      for (int h = 0; h < heads; ++h) {
        emu::BlockRunner::run(static_cast<unsigned>(t), static_cast<unsigned>(h), cuda_shapes::kTiledThreads,
                              static_cast<size_t>(smem), [&] { kernel(a, tiles.data()); });
      }
    }
  };
  grid(plan->fwd_tiles, p.n_heads, plan->fwd_smem_bytes, cuda_detail::tiled_forward_kernel<T, D>);
  run_dsum<T>(a);
  grid(plan->dq_tiles, p.n_heads, plan->dq_smem_bytes, cuda_detail::tiled_dq_kernel<T, D>);
  grid(plan->dkv_tiles, p.n_kv_heads, plan->dkv_smem_bytes, cuda_detail::tiled_dkv_kernel<T, D>);

  Outputs out;
  out.o = testing::decode(dtype, o);
  out.lse = lse;
  out.dq = testing::decode(dtype, dq);
  out.dk = testing::decode(dtype, dk);
  out.dv = testing::decode(dtype, dv);
  out.fwd_plan = out.bwd_plan = *plan;
  return out;
}

// The simple kernels: forward, dsum, dQ, dK/dV, with the planner's simple schedule.
template <class T>
Outputs run_emulated_simple_t(AttentionProblem& pr, DType dtype) {
  AttentionParams p = params_for(pr);
  p.dtype = dtype;
  std::vector<unsigned char> q = testing::encode(dtype, pr.q), k = testing::encode(dtype, pr.k),
                             v = testing::encode(dtype, pr.v), d_o = testing::encode(dtype, pr.d_o);
  std::vector<unsigned char> o(q.size()), dq(q.size()), dk(k.size()), dv(k.size());
  std::vector<float> lse(pr.lse.size()), dsum(pr.lse.size());
  p.q = reinterpret_cast<const float*>(q.data());
  p.k = reinterpret_cast<const float*>(k.data());
  p.v = reinterpret_cast<const float*>(v.data());
  p.o = reinterpret_cast<float*>(o.data());
  p.lse = lse.data();
  p.d_o = reinterpret_cast<const float*>(d_o.data());
  p.dq = reinterpret_cast<float*>(dq.data());
  p.dk = reinterpret_cast<float*>(dk.data());
  p.dv = reinterpret_cast<float*>(dv.data());
  const CudaAttentionOptions simple{CudaKernel::kSimple, CudaKernel::kSimple};
  Result<CudaLaunchPlan> plan = plan_cuda_attention(p, pr.cu_q.data(), pr.cu_k.data(), true, simple);
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  if (!plan.ok()) return {};
  DeviceArgs a;
  a.dtype = dtype;
  a.q = q.data(), a.k = k.data(), a.v = v.data(), a.o = o.data(), a.lse = lse.data();
  a.d_o = d_o.data(), a.dq = dq.data(), a.dk = dk.data(), a.dv = dv.data(), a.dsum = dsum.data();
  a.cu_q = pr.cu_q.data(), a.cu_k = pr.cu_k.data();
  a.n_heads = p.n_heads, a.n_kv_heads = p.n_kv_heads, a.head_dim = p.head_dim, a.group = p.n_heads / p.n_kv_heads;
  a.scale = p.scale(), a.causal = p.causal, a.total_q = plan->total_q;
  auto grid = [&](const std::vector<CudaTile>& tiles, int heads, int threads, int64_t smem, auto kernel) {
    for (size_t t = 0; t < tiles.size(); ++t) {
      for (int h = 0; h < heads; ++h) {
        emu::BlockRunner::run(static_cast<unsigned>(t), static_cast<unsigned>(h), threads, static_cast<size_t>(smem),
                              [&] { kernel(a, tiles.data()); });
      }
    }
  };
  grid(plan->fwd_tiles, p.n_heads, plan->fwd_threads, plan->fwd_smem_bytes, cuda_detail::simple_forward_kernel<T>);
  run_dsum<T>(a);
  grid(plan->dq_tiles, p.n_heads, plan->bwd_threads, plan->dq_smem_bytes, cuda_detail::simple_dq_kernel<T>);
  grid(plan->dkv_tiles, p.n_kv_heads, plan->bwd_threads, plan->dkv_smem_bytes, cuda_detail::simple_dkv_kernel<T>);
  Outputs out;
  out.o = testing::decode(dtype, o);
  out.lse = lse;
  out.dq = testing::decode(dtype, dq);
  out.dk = testing::decode(dtype, dk);
  out.dv = testing::decode(dtype, dv);
  out.fwd_plan = out.bwd_plan = *plan;
  return out;
}

Outputs run_emulated_simple(AttentionProblem& pr, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return run_emulated_simple_t<float>(pr, dtype);
    case DType::kBFloat16: return run_emulated_simple_t<__nv_bfloat16>(pr, dtype);
    case DType::kFloat16: break;
  }
  return run_emulated_simple_t<__half>(pr, dtype);
}

Outputs run_emulated(AttentionProblem& pr, DType dtype) {
  const bool bf = dtype == DType::kBFloat16;
  if (pr.head_dim == 64) return bf ? run_emulated_t<__nv_bfloat16, 64>(pr, dtype) : run_emulated_t<__half, 64>(pr, dtype);
  return bf ? run_emulated_t<__nv_bfloat16, 128>(pr, dtype) : run_emulated_t<__half, 128>(pr, dtype);
}

// Causal, GQA 2, tiles' edges (1 row; 70 rows = a full and a partial tile; a 130-key context
// crossing two key blocks), d = 128, bf16.
TEST(CudaTiledEmulated, CausalBf16HeadDim128) {
  check_case({{{1, 65}, {70, 70}, {33, 130}}, 2, 1, 128}, DType::kBFloat16, run_emulated, 41);
}

// Non-causal with an empty task and rows without keys (O = 0, LSE = -inf), d = 64, fp16.
TEST(CudaTiledEmulated, NonCausalFp16HeadDim64) {
  check_case({{{0, 50}, {3, 0}, {20, 90}}, 2, 1, 64, false}, DType::kFloat16, run_emulated, 42);
}

// Causal fp16 with GQA 4 at d = 64: a 200-key context (four key blocks, the last partial) with
// 70 query rows ending on the diagonal, and a 1-row task over 140 keys; the dK/dV kernel walks
// every head of the group per key tile.
TEST(CudaTiledEmulated, CausalFp16Gqa4HeadDim64) {
  check_case({{{70, 200}, {1, 140}}, 4, 1, 64}, DType::kFloat16, run_emulated, 46);
}

// Causal bf16, GQA 4 at d = 128: 17 rows over 140 keys (three key blocks, the last partial).
TEST(CudaTiledEmulated, CausalBf16Gqa4HeadDim128) {
  check_case({{{17, 140}}, 4, 1, 128}, DType::kBFloat16, run_emulated, 47);
}

// The simple kernels: causal GQA 2 at head_dim 32 (one column per lane) and 96 (lanes past the
// end idle), fp32 and bf16; non-causal with empty tasks and rows without keys.
TEST(CudaSimpleEmulated, CausalFp32AndBf16) {
  const Case c32 = {{{1, 17}, {20, 20}}, 2, 1, 32};
  check_case(c32, DType::kFloat32, run_emulated_simple, 43);
  const Case c96 = {{{5, 18}}, 2, 1, 96};
  check_case(c96, DType::kBFloat16, run_emulated_simple, 44);
}
TEST(CudaSimpleEmulated, NonCausalFp16) {
  check_case({{{0, 10}, {3, 0}, {9, 20}}, 2, 2, 64, false}, DType::kFloat16, run_emulated_simple, 45);
}

}  // namespace
}  // namespace distca::kernels
