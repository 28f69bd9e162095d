// kSimple: the obvious CUDA kernels, one warp per query row (forward, dQ) or key row (dK/dV),
// fp32 compute on CUDA cores, any dtype, head_dim <= 256. They are the device yardstick the
// tiled kernel is compared with and the path for shapes the tiled kernel does not take.
//
// Each lane holds head_dim / 32 columns (column c = lane + 32 i) of its row; a dot product is a
// per-lane partial sum and a butterfly __shfl_xor reduction (every lane ends with the same bits:
// each step adds the same two values, and addition commutes). Keys (or, for dK/dV, query rows)
// are staged in shared memory kSimpleChunk at a time and shared by the block's warps. Every
// loop runs in a fixed order and every output element is written by one lane: deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "distca/core/cuda_check.h"
#include "kernel_shapes.h"
#include "launch.h"

namespace distca::kernels::cuda_detail {
namespace {

using cuda_shapes::kPerLane;
using cuda_shapes::kSimpleChunk;
using cuda_shapes::kSimpleRows;

template <class T>
__device__ __forceinline__ float to_f(T x);
template <>
__device__ __forceinline__ float to_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_f<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Loads this lane's columns of a row (zeros past head_dim, or for an inactive row).
template <class T>
__device__ __forceinline__ void load_row(const T* row, int d, int lane, bool active, float (&x)[kPerLane]) {
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    x[i] = (active && c < d) ? to_f(row[c]) : 0.0f;
  }
}
template <class T>
__device__ __forceinline__ void store_row(T* row, int d, int lane, const float (&x)[kPerLane], float mul) {
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c < d) row[c] = from_f<T>(x[i] * mul);
  }
}
// This lane's share of dot(x, s[0..d)), s in shared memory.
__device__ __forceinline__ float lane_dot(const float (&x)[kPerLane], const float* s, int d, int lane) {
  float acc = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c < d) acc = fmaf(x[i], s[c], acc);
  }
  return acc;
}

// Stages rows [first, first + n) (n <= kSimpleChunk) of head `head` of a (rows, heads, d) tensor
// into s (n x d, fp32). All threads of the block call it.
template <class T>
__device__ __forceinline__ void stage_rows(float* s, const T* x, int64_t first, int n, int heads, int head, int d) {
  for (int idx = threadIdx.x; idx < n * d; idx += blockDim.x) {
    const int j = idx / d, c = idx - j * d;
    s[idx] = to_f(x[((first + j) * heads + head) * d + c]);
  }
}

// Forward: O and LSE of rows tile.block * kSimpleRows + warp of task tile.task, head blockIdx.y.
template <class T>
__global__ void __launch_bounds__(cuda_shapes::kSimpleThreads)
    simple_forward_kernel(DeviceArgs a, const CudaTile* __restrict__ tiles) {
  extern __shared__ float smem[];
  const int d = a.head_dim;
  float* ks = smem;                      // (kSimpleChunk, d)
  float* vs = smem + kSimpleChunk * d;   // (kSimpleChunk, d)
  const CudaTile tile = tiles[blockIdx.x];
  const int h = blockIdx.y, g = h / a.group;
  const int64_t q0 = a.cu_q[tile.task], k0 = a.cu_k[tile.task];
  const int ql = a.cu_q[tile.task + 1] - static_cast<int>(q0), kl = a.cu_k[tile.task + 1] - static_cast<int>(k0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = tile.block * kSimpleRows + warp;
  const bool active = r < ql;
  const int r_last = min(ql, (tile.block + 1) * kSimpleRows) - 1;
  const int block_keys = a.causal ? min(kl, kl - ql + r_last + 1) : kl;
  const int my_keys = !active ? 0 : (a.causal ? kl - ql + r + 1 : kl);
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);

  float qr[kPerLane], acc[kPerLane];
  load_row(q + ((q0 + r) * a.n_heads + h) * d, d, lane, active, qr);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int c0 = 0; c0 < block_keys; c0 += kSimpleChunk) {
    const int n = min(kSimpleChunk, block_keys - c0);
    __syncthreads();
    stage_rows(ks, k, k0 + c0, n, a.n_kv_heads, g, d);
    stage_rows(vs, v, k0 + c0, n, a.n_kv_heads, g, d);
    __syncthreads();
    const int visible = min(n, my_keys - c0);  // warp-uniform
    if (visible <= 0) continue;
    float s[kSimpleChunk];
    float cmax = -INFINITY;
#pragma unroll
    for (int j = 0; j < kSimpleChunk; ++j) {
      s[j] = 0.0f;
      if (j < visible) {
        s[j] = warp_sum(lane_dot(qr, ks + j * d, d, lane)) * a.scale;
        cmax = fmaxf(cmax, s[j]);
      }
    }
    const float m_new = fmaxf(m, cmax);
    const float corr = expf(m - m_new);  // 0 on the first visible chunk (m = -inf)
    l *= corr;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] *= corr;
#pragma unroll
    for (int j = 0; j < kSimpleChunk; ++j) {
      if (j < visible) {
        const float p = expf(s[j] - m_new);
        l += p;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const int c = lane + 32 * i;
          if (c < d) acc[i] = fmaf(p, vs[j * d + c], acc[i]);
        }
      }
    }
    m = m_new;
  }
  if (!active) return;
  store_row(static_cast<T*>(a.o) + ((q0 + r) * a.n_heads + h) * d, d, lane, acc, l > 0 ? 1.0f / l : 0.0f);
  if (lane == 0) a.lse[h * a.total_q + q0 + r] = l > 0 ? m + logf(l) : -INFINITY;
}

// D[h][row] = sum_c dO[row][h][c] * O[row][h][c]: one warp per (row, head).
template <class T>
__global__ void __launch_bounds__(cuda_shapes::kSimpleThreads) dsum_kernel(DeviceArgs a) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kSimpleRows + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (w >= a.total_q * a.n_heads) return;
  const int64_t row = w / a.n_heads;
  const int h = static_cast<int>(w - row * a.n_heads);
  const int d = a.head_dim;
  float o[kPerLane], g[kPerLane];
  load_row(static_cast<const T*>(a.o) + (row * a.n_heads + h) * d, d, lane, true, o);
  load_row(static_cast<const T*>(a.d_o) + (row * a.n_heads + h) * d, d, lane, true, g);
  float acc = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc = fmaf(o[i], g[i], acc);
  acc = warp_sum(acc);
  if (lane == 0) a.dsum[h * a.total_q + row] = acc;
}

// dQ of one query row per warp: dq = scale * sum_j P_ij (dP_ij - D_i) k_j with
// P_ij = exp(scale q.k_j - LSE_i), dP_ij = dO_i . v_j.
template <class T>
__global__ void __launch_bounds__(cuda_shapes::kSimpleThreads)
    simple_dq_kernel(DeviceArgs a, const CudaTile* __restrict__ tiles) {
  extern __shared__ float smem[];
  const int d = a.head_dim;
  float* ks = smem;
  float* vs = smem + kSimpleChunk * d;
  const CudaTile tile = tiles[blockIdx.x];
  const int h = blockIdx.y, g = h / a.group;
  const int64_t q0 = a.cu_q[tile.task], k0 = a.cu_k[tile.task];
  const int ql = a.cu_q[tile.task + 1] - static_cast<int>(q0), kl = a.cu_k[tile.task + 1] - static_cast<int>(k0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = tile.block * kSimpleRows + warp;
  const bool active = r < ql;
  const int r_last = min(ql, (tile.block + 1) * kSimpleRows) - 1;
  const int block_keys = a.causal ? min(kl, kl - ql + r_last + 1) : kl;
  const int my_keys = !active ? 0 : (a.causal ? kl - ql + r + 1 : kl);
  const int64_t qrow = ((q0 + r) * a.n_heads + h) * d;

  float qr[kPerLane], gr[kPerLane], dq[kPerLane];
  load_row(static_cast<const T*>(a.q) + qrow, d, lane, active, qr);
  load_row(static_cast<const T*>(a.d_o) + qrow, d, lane, active, gr);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) dq[i] = 0.0f;
  const float lse = active ? a.lse[h * a.total_q + q0 + r] : 0.0f;
  const float dsum = active ? a.dsum[h * a.total_q + q0 + r] : 0.0f;
  for (int c0 = 0; c0 < block_keys; c0 += kSimpleChunk) {
    const int n = min(kSimpleChunk, block_keys - c0);
    __syncthreads();
    stage_rows(ks, static_cast<const T*>(a.k), k0 + c0, n, a.n_kv_heads, g, d);
    stage_rows(vs, static_cast<const T*>(a.v), k0 + c0, n, a.n_kv_heads, g, d);
    __syncthreads();
    const int visible = min(n, my_keys - c0);
    for (int j = 0; j < visible; ++j) {
      const float s = warp_sum(lane_dot(qr, ks + j * d, d, lane)) * a.scale;
      const float p = expf(s - lse);
      const float dp = warp_sum(lane_dot(gr, vs + j * d, d, lane));
      const float ds = p * (dp - dsum);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int c = lane + 32 * i;
        if (c < d) dq[i] = fmaf(ds, ks[j * d + c], dq[i]);
      }
    }
  }
  if (active) store_row(static_cast<T*>(a.dq) + qrow, d, lane, dq, a.scale);
}

// dK, dV of one key row per warp (kv head blockIdx.y), summed over the GQA group's query heads
// in ascending order, then query rows in ascending order:
// dv = sum P_ij dO_i, dk = scale * sum P_ij (dP_ij - D_i) q_i.
template <class T>
__global__ void __launch_bounds__(cuda_shapes::kSimpleThreads)
    simple_dkv_kernel(DeviceArgs a, const CudaTile* __restrict__ tiles) {
  extern __shared__ float smem[];
  const int d = a.head_dim;
  float* qs = smem;                       // (kSimpleChunk, d)
  float* gs = smem + kSimpleChunk * d;    // (kSimpleChunk, d): dO
  float* ls = gs + kSimpleChunk * d;      // (kSimpleChunk): LSE
  float* ds_ = ls + kSimpleChunk;         // (kSimpleChunk): D
  const CudaTile tile = tiles[blockIdx.x];
  const int g = blockIdx.y;
  const int64_t q0 = a.cu_q[tile.task], k0 = a.cu_k[tile.task];
  const int ql = a.cu_q[tile.task + 1] - static_cast<int>(q0), kl = a.cu_k[tile.task + 1] - static_cast<int>(k0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int j = tile.block * kSimpleRows + warp;
  const bool active = j < kl;
  const int off = kl - ql;  // causal: query row r sees keys <= off + r
  const int block_first = a.causal ? max(0, tile.block * kSimpleRows - off) : 0;
  const int my_first = !active ? ql : (a.causal ? max(0, j - off) : 0);
  const int64_t krow = ((k0 + j) * a.n_kv_heads + g) * d;

  float kr[kPerLane], vr[kPerLane], dk[kPerLane], dv[kPerLane];
  load_row(static_cast<const T*>(a.k) + krow, d, lane, active, kr);
  load_row(static_cast<const T*>(a.v) + krow, d, lane, active, vr);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) dk[i] = dv[i] = 0.0f;
  for (int hh = 0; hh < a.group; ++hh) {
    const int h = g * a.group + hh;
    for (int i0 = block_first; i0 < ql; i0 += kSimpleChunk) {
      const int n = min(kSimpleChunk, ql - i0);
      __syncthreads();
      stage_rows(qs, static_cast<const T*>(a.q), q0 + i0, n, a.n_heads, h, d);
      stage_rows(gs, static_cast<const T*>(a.d_o), q0 + i0, n, a.n_heads, h, d);
      for (int idx = threadIdx.x; idx < n; idx += blockDim.x) {
        ls[idx] = a.lse[h * a.total_q + q0 + i0 + idx];
        ds_[idx] = a.dsum[h * a.total_q + q0 + i0 + idx];
      }
      __syncthreads();
      for (int i = max(0, my_first - i0); i < n; ++i) {  // warp-uniform bounds
        const float s = warp_sum(lane_dot(kr, qs + i * d, d, lane)) * a.scale;
        const float p = expf(s - ls[i]);
        const float dp = warp_sum(lane_dot(vr, gs + i * d, d, lane));
        const float dsv = p * (dp - ds_[i]);
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          const int c = lane + 32 * e;
          if (c < d) {
            dv[e] = fmaf(p, gs[i * d + c], dv[e]);
            dk[e] = fmaf(dsv, qs[i * d + c], dk[e]);
          }
        }
      }
    }
  }
  if (!active) return;
  store_row(static_cast<T*>(a.dk) + krow, d, lane, dk, a.scale);
  store_row(static_cast<T*>(a.dv) + krow, d, lane, dv, 1.0f);
}

template <class K>
Status set_smem(K kernel, int64_t bytes) {
  if (bytes > 48 * 1024) {
    DISTCA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
  return {};
}

// Calls f(T{}) with T the element type of `dtype`.
template <class F>
Status with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(float{});
    case DType::kBFloat16: return f(__nv_bfloat16{});
    case DType::kFloat16: return f(__half{});
  }
  return Status::invalid_argument("dtype: unknown value");
}

}  // namespace

Status launch_simple_forward(const DeviceArgs& a, const CudaLaunchPlan& plan, const CudaTile* tiles,
                             cudaStream_t stream) {
  if (plan.fwd_tiles.empty()) return {};
  return with_type(a.dtype, [&](auto t) -> Status {
    using T = decltype(t);
    DISTCA_RETURN_IF_ERROR(set_smem(simple_forward_kernel<T>, plan.fwd_smem_bytes));
    const dim3 grid(static_cast<unsigned>(plan.fwd_tiles.size()), static_cast<unsigned>(a.n_heads));
    simple_forward_kernel<T><<<grid, plan.fwd_threads, plan.fwd_smem_bytes, stream>>>(a, tiles);
    DISTCA_CUDA_CHECK_LAUNCH("simple_forward_kernel");
    return {};
  });
}

Status launch_dsum(const DeviceArgs& a, cudaStream_t stream) {
  const int64_t warps = a.total_q * a.n_heads;
  if (warps == 0) return {};
  return with_type(a.dtype, [&](auto t) -> Status {
    using T = decltype(t);
    const auto blocks = static_cast<unsigned>((warps + kSimpleRows - 1) / kSimpleRows);
    dsum_kernel<T><<<blocks, cuda_shapes::kSimpleThreads, 0, stream>>>(a);
    DISTCA_CUDA_CHECK_LAUNCH("dsum_kernel");
    return {};
  });
}

Status launch_simple_dq(const DeviceArgs& a, const CudaLaunchPlan& plan, const CudaTile* tiles, cudaStream_t stream) {
  if (plan.dq_tiles.empty()) return {};
  return with_type(a.dtype, [&](auto t) -> Status {
    using T = decltype(t);
    DISTCA_RETURN_IF_ERROR(set_smem(simple_dq_kernel<T>, plan.dq_smem_bytes));
    const dim3 grid(static_cast<unsigned>(plan.dq_tiles.size()), static_cast<unsigned>(a.n_heads));
    simple_dq_kernel<T><<<grid, plan.bwd_threads, plan.dq_smem_bytes, stream>>>(a, tiles);
    DISTCA_CUDA_CHECK_LAUNCH("simple_dq_kernel");
    return {};
  });
}

Status launch_simple_dkv(const DeviceArgs& a, const CudaLaunchPlan& plan, const CudaTile* tiles, cudaStream_t stream) {
  if (plan.dkv_tiles.empty()) return {};
  return with_type(a.dtype, [&](auto t) -> Status {
    using T = decltype(t);
    DISTCA_RETURN_IF_ERROR(set_smem(simple_dkv_kernel<T>, plan.dkv_smem_bytes));
    const dim3 grid(static_cast<unsigned>(plan.dkv_tiles.size()), static_cast<unsigned>(a.n_kv_heads));
    simple_dkv_kernel<T><<<grid, plan.bwd_threads, plan.dkv_smem_bytes, stream>>>(a, tiles);
    DISTCA_CUDA_CHECK_LAUNCH("simple_dkv_kernel");
    return {};
  });
}

}  // namespace distca::kernels::cuda_detail
