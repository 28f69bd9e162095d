// kTiled forward: FlashAttention-2's design on tensor cores, bf16/fp16 in, fp32 accumulate.
//
// A block owns one tile (64 query rows of one task, one head); its 4 warps own 16 rows each.
// Q stays in registers as mma A fragments; K and V blocks of 64 keys stream through shared
// memory with cp.async, double-buffered (block kb + 1 loads while kb computes). Per key block:
// S = Q K^T (mma.sync m16n8k16, fp32), masking only on blocks that cross the causal diagonal or
// the task's end, online softmax in the log2 domain (exp2f of scale * log2(e) * s), P rounded
// to the input type as the A operand of O += P V (V's B fragments by ldmatrix.trans). Shared
// memory rows are swizzled (16-byte chunk c of row r lives at c ^ (r & 7)) so ldmatrix reads
// are free of bank conflicts. Row sums are per-thread partials reduced over the quad at the end,
// in a fixed order; nothing is atomic: deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "distca/core/cuda_check.h"
#include "kernel_shapes.h"
#include "launch.h"
#include "mma_util.cuh"

namespace distca::kernels::cuda_detail {
namespace {

using cuda_shapes::kTiledKeys;
using cuda_shapes::kTiledRows;
using cuda_shapes::kTiledThreads;

template <class T, int D>
__global__ void __launch_bounds__(kTiledThreads)
    tiled_forward_kernel(DeviceArgs a, const CudaTile* __restrict__ tiles) {
  static_assert(D % 64 == 0, "the swizzle needs >= 8 chunks of 16 bytes per row");
  constexpr int kKSteps = D / 16;  // k-steps of S = Q K^T
  constexpr int kONt = D / 8;      // n-tiles of O
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sq = reinterpret_cast<T*>(smem_raw);  // (64, D)
  T* sk = sq + kTiledRows * D;             // (2, 64, D)
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
  const int qd = lane >> 2, qt = lane & 3;  // mma fragment: row group and thread in quad
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);

  load_tile<T, D>(sq, q, q0 + row0, rows, a.n_heads, h);
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

  float o[kONt][4];
#pragma unroll
  for (int n = 0; n < kONt; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.0f, 0.0f};  // rows qd and qd + 8 of the warp
  const float sl2 = a.scale * 1.4426950408889634f;
  const int diag = kl - ql;  // causal: row r sees keys <= diag + r
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

    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, skb + swz<D>(frag::b_row(lane, np), frag::b_chunk(lane, kk)));
        Mma<T>::run(s[2 * np], qf[kk], b[0], b[1]);
        Mma<T>::run(s[2 * np + 1], qf[kk], b[2], b[3]);
      }
    }

    const int kbase = kb * kTiledKeys;
    const bool need_mask = kbase + kTiledKeys > kl || (a.causal && kbase + kTiledKeys - 1 > diag + warp_row0);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * sl2;
        if (need_mask) {
          const int key = kbase + n * 8 + frag::c_col(lane, e);
          const int r = warp_row0 + frag::c_row(lane, e);
          if (key >= kl || (a.causal && key > diag + r)) x = -INFINITY;
        }
        s[n][e] = x;
      }
    }
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * rh], s[n][2 * rh + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_r[rh], mx);
      const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet
      const float corr = exp2f(m_r[rh] - base);
      m_r[rh] = m_new;
      l_r[rh] *= corr;
#pragma unroll
      for (int n = 0; n < kONt; ++n) {
        o[n][2 * rh] *= corr;
        o[n][2 * rh + 1] *= corr;
      }
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        s[n][2 * rh] = exp2f(s[n][2 * rh] - base);
        s[n][2 * rh + 1] = exp2f(s[n][2 * rh + 1] - base);
        l_r[rh] += s[n][2 * rh] + s[n][2 * rh + 1];
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t pa[4];
      c_to_a<T>(pa, s, j);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, svb + swz<D>(frag::bt_row(lane, j), frag::bt_chunk(lane, dp)));
        Mma<T>::run(o[2 * dp], pa, b[0], b[1]);
        Mma<T>::run(o[2 * dp + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // the next iteration's prefetch overwrites this stage
  }

  T* out = static_cast<T*>(a.o);
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    float l = l_r[rh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = warp * 16 + qd + rh * 8;  // row within the tile
    if (r >= rows) continue;
    const float inv = l > 0 ? 1.0f / l : 0.0f;
    T* orow = out + ((q0 + row0 + r) * a.n_heads + h) * D;
#pragma unroll
    for (int n = 0; n < kONt; ++n) {
      *reinterpret_cast<uint32_t*>(orow + n * 8 + 2 * qt) = Mma<T>::pack(o[n][2 * rh] * inv, o[n][2 * rh + 1] * inv);
    }
    if (qt == 0) {
      a.lse[h * a.total_q + q0 + row0 + r] = l > 0 ? (m_r[rh] + log2f(l)) * 0.6931471805599453f : -INFINITY;
    }
  }
}

template <class T, int D>
Status launch(const DeviceArgs& a, const CudaLaunchPlan& plan, const CudaTile* tiles, cudaStream_t stream) {
  const auto smem = static_cast<int>(plan.fwd_smem_bytes);
  DISTCA_CUDA_CHECK(cudaFuncSetAttribute(tiled_forward_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(static_cast<unsigned>(plan.fwd_tiles.size()), static_cast<unsigned>(a.n_heads));
  tiled_forward_kernel<T, D><<<grid, kTiledThreads, smem, stream>>>(a, tiles);
  DISTCA_CUDA_CHECK_LAUNCH("tiled_forward_kernel");
  return {};
}

}  // namespace

Status launch_tiled_forward(const DeviceArgs& a, const CudaLaunchPlan& plan, const CudaTile* tiles,
                            cudaStream_t stream) {
  if (plan.fwd_tiles.empty()) return {};
  const bool bf16 = a.dtype == DType::kBFloat16;
  if (a.dtype != DType::kBFloat16 && a.dtype != DType::kFloat16) {
    return Status::invalid_argument("tiled forward: dtype must be bf16 or fp16");
  }
  switch (a.head_dim) {
    case 64: return bf16 ? launch<__nv_bfloat16, 64>(a, plan, tiles, stream) : launch<__half, 64>(a, plan, tiles, stream);
    case 128:
      return bf16 ? launch<__nv_bfloat16, 128>(a, plan, tiles, stream) : launch<__half, 128>(a, plan, tiles, stream);
    default: return Status::invalid_argument("tiled forward: head_dim must be 64 or 128");
  }
}

}  // namespace distca::kernels::cuda_detail
