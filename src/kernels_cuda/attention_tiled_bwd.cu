// kTiled backward: FlashAttention-2's backward on tensor cores, made deterministic by computing
// dQ and dK/dV in two kernels that each own their output (no atomics; P is recomputed in both).
//
// dQ kernel: a block owns 64 query rows of one head (4 warps x 16 rows), like the forward; per
// block of 64 keys: S = Q K^T, P = exp2(scale log2(e) S - log2(e) LSE), dP = dO V^T,
// dS = P (dP - D), dQ += dS K. Q stays in registers; dO fragments are re-read from shared memory.
// dK/dV kernel: a block owns 64 key rows of one kv head (4 warps x 16 keys); it streams chunks
// of 32 query rows of every query head of the GQA group (ascending head, then ascending rows):
// S^T = K Q^T, P^T, dP^T = V dO^T, dS^T, dV += P^T dO, dK += dS^T Q. The fixed loop orders make
// the bits a function of the shapes. P and dS are rounded to the input type as mma operands,
// as in FlashAttention-2; D = rowsum(dO o O) comes from dsum_kernel (attention_simple.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "distca/core/cuda_check.h"
#include "kernel_shapes.h"
#include "launch.h"
#include "mma_util.cuh"

namespace distca::kernels::cuda_detail {
namespace {

using cuda_shapes::kTiledDkvChunk;
using cuda_shapes::kTiledKeys;
using cuda_shapes::kTiledRows;
using cuda_shapes::kTiledThreads;

constexpr float kLog2e = 1.4426950408889634f;

template <class T, int D>
__global__ void __launch_bounds__(kTiledThreads) tiled_dq_kernel(DeviceArgs a, const CudaTile* __restrict__ tiles) {
  constexpr int kKSteps = D / 16;
  constexpr int kNt = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sq = reinterpret_cast<T*>(smem_raw);  // (64, D)
  T* sdo = sq + kTiledRows * D;            // (64, D)
  T* sk = sdo + kTiledRows * D;            // (2, 64, D)
  T* sv = sk + 2 * kTiledKeys * D;         // (2, 64, D)

  const CudaTile tile = tiles[blockIdx.x];
  const int h = blockIdx.y, g = h / a.group;
  const int64_t q0 = a.cu_q[tile.task], k0 = a.cu_k[tile.task];
  const int ql = a.cu_q[tile.task + 1] - static_cast<int>(q0), kl = a.cu_k[tile.task + 1] - static_cast<int>(k0);
  const int row0 = tile.block * kTiledRows;
  const int rows = min(kTiledRows, ql - row0);
  const int keys = a.causal ? min(kl, kl - ql + row0 + rows) : kl;
  const int n_kb = (keys + kTiledKeys - 1) / kTiledKeys;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int qd = lane >> 2, qt = lane & 3;
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);

  load_tile<T, D>(sq, static_cast<const T*>(a.q), q0 + row0, rows, a.n_heads, h);
  load_tile<T, D>(sdo, static_cast<const T*>(a.d_o), q0 + row0, rows, a.n_heads, h);
  cp_async_commit();
  if (n_kb > 0) {
    load_tile<T, D>(sk, k, k0, min(kTiledKeys, kl), a.n_kv_heads, g);
    load_tile<T, D>(sv, v, k0, min(kTiledKeys, kl), a.n_kv_heads, g);
  }
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  uint32_t qf[kKSteps][4];
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) ldmatrix_x4(qf[kk], sq + swz<D>(warp * 16 + frag::a_row(lane), frag::a_chunk(lane, kk)));

  // LSE (log2 units) and D of this thread's two rows; rows past the task get 0 (their Q and dO
  // are zero, so their dS is 0 and nothing of them is stored).
  float lse2[2], dsum[2];
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    const int r = warp * 16 + qd + rh * 8;
    const bool ok = r < rows;
    lse2[rh] = ok ? a.lse[h * a.total_q + q0 + row0 + r] * kLog2e : 0.0f;
    dsum[rh] = ok ? a.dsum[h * a.total_q + q0 + row0 + r] : 0.0f;
  }
  float dq[kNt][4];
#pragma unroll
  for (int n = 0; n < kNt; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  const float sl2 = a.scale * kLog2e;
  const int diag = kl - ql;
  const int warp_row0 = row0 + warp * 16;

  for (int kb = 0; kb < n_kb; ++kb) {
    const int st = kb & 1;
    if (kb + 1 < n_kb) {
      const int next = (kb + 1) * kTiledKeys;
      load_tile<T, D>(sk + (st ^ 1) * kTiledKeys * D, k, k0 + next, min(kTiledKeys, kl - next), a.n_kv_heads, g);
      load_tile<T, D>(sv + (st ^ 1) * kTiledKeys * D, v, k0 + next, min(kTiledKeys, kl - next), a.n_kv_heads, g);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T* skb = sk + st * kTiledKeys * D;
    const T* svb = sv + st * kTiledKeys * D;

    float s[8][4], dp[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t dof[4];
      ldmatrix_x4(dof, sdo + swz<D>(warp * 16 + frag::a_row(lane), frag::a_chunk(lane, kk)));
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, skb + swz<D>(frag::b_row(lane, np), frag::b_chunk(lane, kk)));
        Mma<T>::run(s[2 * np], qf[kk], b[0], b[1]);
        Mma<T>::run(s[2 * np + 1], qf[kk], b[2], b[3]);
        ldmatrix_x4(b, svb + swz<D>(frag::b_row(lane, np), frag::b_chunk(lane, kk)));
        Mma<T>::run(dp[2 * np], dof, b[0], b[1]);
        Mma<T>::run(dp[2 * np + 1], dof, b[2], b[3]);
      }
    }
    const int kbase = kb * kTiledKeys;
    const bool need_mask = kbase + kTiledKeys > kl || (a.causal && kbase + kTiledKeys - 1 > diag + warp_row0);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2f(s[n][e] * sl2 - lse2[e >> 1]);
        if (need_mask) {
          const int key = kbase + n * 8 + frag::c_col(lane, e);
          const int r = warp_row0 + frag::c_row(lane, e);
          if (key >= kl || (a.causal && key > diag + r)) p = 0.0f;
        }
        s[n][e] = p * (dp[n][e] - dsum[e >> 1]);  // dS
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t da[4];
      c_to_a<T>(da, s, j);
#pragma unroll
      for (int dd = 0; dd < D / 16; ++dd) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, skb + swz<D>(frag::bt_row(lane, j), frag::bt_chunk(lane, dd)));
        Mma<T>::run(dq[2 * dd], da, b[0], b[1]);
        Mma<T>::run(dq[2 * dd + 1], da, b[2], b[3]);
      }
    }
    __syncthreads();
  }

  T* out = static_cast<T*>(a.dq);
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    const int r = warp * 16 + qd + rh * 8;
    if (r >= rows) continue;
    T* row = out + ((q0 + row0 + r) * a.n_heads + h) * D;
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
      *reinterpret_cast<uint32_t*>(row + n * 8 + 2 * qt) =
          Mma<T>::pack(dq[n][2 * rh] * a.scale, dq[n][2 * rh + 1] * a.scale);
    }
  }
}

template <class T, int D>
__global__ void __launch_bounds__(kTiledThreads) tiled_dkv_kernel(DeviceArgs a, const CudaTile* __restrict__ tiles) {
  constexpr int kKSteps = D / 16;
  constexpr int kNt = D / 8;
  constexpr int kC = kTiledDkvChunk;  // query rows per step
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sk = reinterpret_cast<T*>(smem_raw);  // (64, D)
  T* sv = sk + kTiledKeys * D;             // (64, D)
  T* sq = sv + kTiledKeys * D;             // (2, 32, D)
  T* sdo = sq + 2 * kC * D;                // (2, 32, D)

  const CudaTile tile = tiles[blockIdx.x];
  const int g = blockIdx.y;
  const int64_t q0 = a.cu_q[tile.task], k0 = a.cu_k[tile.task];
  const int ql = a.cu_q[tile.task + 1] - static_cast<int>(q0), kl = a.cu_k[tile.task + 1] - static_cast<int>(k0);
  const int key0 = tile.block * kTiledKeys;
  const int diag = kl - ql;
  const int first = a.causal ? max(0, key0 - diag) : 0;  // the first query row that sees a key of the tile
  const int steps = ql > first ? (ql - first + kC - 1) / kC : 0;
  const int total = steps * a.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int qd = lane >> 2, qt = lane & 3;
  const T* q = static_cast<const T*>(a.q);
  const T* d_o = static_cast<const T*>(a.d_o);

  load_tile<T, D>(sk, static_cast<const T*>(a.k), k0 + key0, min(kTiledKeys, kl - key0), a.n_kv_heads, g);
  load_tile<T, D>(sv, static_cast<const T*>(a.v), k0 + key0, min(kTiledKeys, kl - key0), a.n_kv_heads, g);
  if (total > 0) {
    load_tile<T, D, kC>(sq, q, q0 + first, min(kC, ql - first), a.n_heads, g * a.group);
    load_tile<T, D, kC>(sdo, d_o, q0 + first, min(kC, ql - first), a.n_heads, g * a.group);
  }
  cp_async_commit();

  float dk[kNt][4], dv[kNt][4];
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
  }
  const float sl2 = a.scale * kLog2e;
  const int warp_key0 = key0 + warp * 16;

  for (int it = 0; it < total; ++it) {
    const int st = it & 1;
    const int h = g * a.group + it / steps;
    const int i0 = first + (it % steps) * kC;
    if (it + 1 < total) {
      const int hn = g * a.group + (it + 1) / steps;
      const int in = first + ((it + 1) % steps) * kC;
      load_tile<T, D, kC>(sq + (st ^ 1) * kC * D, q, q0 + in, min(kC, ql - in), a.n_heads, hn);
      load_tile<T, D, kC>(sdo + (st ^ 1) * kC * D, d_o, q0 + in, min(kC, ql - in), a.n_heads, hn);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T* sqb = sq + st * kC * D;
    const T* sdob = sdo + st * kC * D;

    // S^T and dP^T: this warp's 16 keys x 32 query rows (4 n-tiles).
    float s[4][4], dp[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t kf[4], vf[4];
      ldmatrix_x4(kf, sk + swz<D>(warp * 16 + frag::a_row(lane), frag::a_chunk(lane, kk)));
      ldmatrix_x4(vf, sv + swz<D>(warp * 16 + frag::a_row(lane), frag::a_chunk(lane, kk)));
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, sqb + swz<D>(frag::b_row(lane, np), frag::b_chunk(lane, kk)));
        Mma<T>::run(s[2 * np], kf, b[0], b[1]);
        Mma<T>::run(s[2 * np + 1], kf, b[2], b[3]);
        ldmatrix_x4(b, sdob + swz<D>(frag::b_row(lane, np), frag::b_chunk(lane, kk)));
        Mma<T>::run(dp[2 * np], vf, b[0], b[1]);
        Mma<T>::run(dp[2 * np + 1], vf, b[2], b[3]);
      }
    }
    // Element (n, e): key row warp_key0 + qd + (e >> 1) * 8, query row i0 + n * 8 + 2 qt + (e & 1).
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int i = i0 + n * 8 + frag::c_col(lane, c);
        const bool qok = i < ql;
        const float lse2 = qok ? a.lse[h * a.total_q + q0 + i] * kLog2e : 0.0f;
        const float dsum = qok ? a.dsum[h * a.total_q + q0 + i] : 0.0f;
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) {
          const int e = rh * 2 + c;
          const int key = warp_key0 + frag::c_row(lane, e);
          const bool ok = qok && key < kl && (!a.causal || key <= diag + i);
          const float p = ok ? exp2f(s[n][e] * sl2 - lse2) : 0.0f;
          s[n][e] = p;
          dp[n][e] = p * (dp[n][e] - dsum);  // dS^T
        }
      }
    }
    // dV += P^T dO and dK += dS^T Q over the chunk's 32 query rows (2 k-steps of 16).
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint32_t pa[4];
      c_to_a<T>(pa, s, j);
      uint32_t da[4];
      c_to_a<T>(da, dp, j);
#pragma unroll
      for (int dd = 0; dd < D / 16; ++dd) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sdob + swz<D>(frag::bt_row(lane, j), frag::bt_chunk(lane, dd)));
        Mma<T>::run(dv[2 * dd], pa, b[0], b[1]);
        Mma<T>::run(dv[2 * dd + 1], pa, b[2], b[3]);
        ldmatrix_x4_trans(b, sqb + swz<D>(frag::bt_row(lane, j), frag::bt_chunk(lane, dd)));
        Mma<T>::run(dk[2 * dd], da, b[0], b[1]);
        Mma<T>::run(dk[2 * dd + 1], da, b[2], b[3]);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();  // a tile without query rows still has its K/V copies in flight

  T* dko = static_cast<T*>(a.dk);
  T* dvo = static_cast<T*>(a.dv);
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    const int key = warp_key0 + qd + rh * 8;
    if (key >= kl) continue;
    const int64_t off = ((k0 + key) * a.n_kv_heads + g) * D;
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
      *reinterpret_cast<uint32_t*>(dko + off + n * 8 + 2 * qt) =
          Mma<T>::pack(dk[n][2 * rh] * a.scale, dk[n][2 * rh + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(dvo + off + n * 8 + 2 * qt) = Mma<T>::pack(dv[n][2 * rh], dv[n][2 * rh + 1]);
    }
  }
}

template <class T, int D>
Status launch(const DeviceArgs& a, const CudaLaunchPlan& plan, const CudaTile* dq_tiles, const CudaTile* dkv_tiles,
              cudaStream_t stream) {
  if (!plan.dq_tiles.empty()) {
    const auto smem = static_cast<int>(plan.dq_smem_bytes);
    DISTCA_CUDA_CHECK(cudaFuncSetAttribute(tiled_dq_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid(static_cast<unsigned>(plan.dq_tiles.size()), static_cast<unsigned>(a.n_heads));
    tiled_dq_kernel<T, D><<<grid, kTiledThreads, smem, stream>>>(a, dq_tiles);
    DISTCA_CUDA_CHECK_LAUNCH("tiled_dq_kernel");
  }
  if (!plan.dkv_tiles.empty()) {
    const auto smem = static_cast<int>(plan.dkv_smem_bytes);
    DISTCA_CUDA_CHECK(cudaFuncSetAttribute(tiled_dkv_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid(static_cast<unsigned>(plan.dkv_tiles.size()), static_cast<unsigned>(a.n_kv_heads));
    tiled_dkv_kernel<T, D><<<grid, kTiledThreads, smem, stream>>>(a, dkv_tiles);
    DISTCA_CUDA_CHECK_LAUNCH("tiled_dkv_kernel");
  }
  return {};
}

}  // namespace

Status launch_tiled_backward(const DeviceArgs& a, const CudaLaunchPlan& plan, const CudaTile* dq_tiles,
                             const CudaTile* dkv_tiles, cudaStream_t stream) {
  if (a.dtype != DType::kBFloat16 && a.dtype != DType::kFloat16) {
    return Status::invalid_argument("tiled backward: dtype must be bf16 or fp16");
  }
  const bool bf16 = a.dtype == DType::kBFloat16;
  switch (a.head_dim) {
    case 64:
      return bf16 ? launch<__nv_bfloat16, 64>(a, plan, dq_tiles, dkv_tiles, stream)
                  : launch<__half, 64>(a, plan, dq_tiles, dkv_tiles, stream);
    case 128:
      return bf16 ? launch<__nv_bfloat16, 128>(a, plan, dq_tiles, dkv_tiles, stream)
                  : launch<__half, 128>(a, plan, dq_tiles, dkv_tiles, stream);
    default: return Status::invalid_argument("tiled backward: head_dim must be 64 or 128");
  }
}

}  // namespace distca::kernels::cuda_detail
