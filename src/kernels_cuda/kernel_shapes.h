// The CUDA kernels' tile shapes and workspace layout: the one place the numbers live, shared by
// the host planner (plan.cpp, tested without a GPU) and the kernels (*.cu).
#pragma once

#include <cstdint>

#include "distca/kernels_cuda/attention_cuda.h"

namespace distca::kernels::cuda_shapes {

inline constexpr int kMaxHeadDim = 256;   // kSimple keeps head_dim / 32 <= 8 values per lane
inline constexpr int kPerLane = kMaxHeadDim / 32;
inline constexpr int64_t kMaxGridX = 2147483647;
inline constexpr int kMaxGridY = 65535;

// kSimple: one warp per row, kSimpleRows rows (warps) per block, keys (or query rows, for
// dK/dV) staged through shared memory kSimpleChunk at a time, as fp32.
inline constexpr int kSimpleRows = 8;
inline constexpr int kSimpleThreads = kSimpleRows * 32;
inline constexpr int kSimpleChunk = 16;
constexpr int64_t simple_forward_smem_bytes(int64_t d) { return 2 * kSimpleChunk * d * 4; }  // K, V chunk
constexpr int64_t simple_dkv_smem_bytes(int64_t d) { return (2 * kSimpleChunk * d + 2 * kSimpleChunk) * 4; }  // Q, dO, lse, D

// kTiled forward: 4 warps x 16 query rows, key blocks of 64, bf16/fp16 tiles in shared memory:
// Q (64 x d) and two stages of K and V (64 x d each) for the cp.async double buffer.
inline constexpr int kTiledRows = 64;
inline constexpr int kTiledKeys = 64;
inline constexpr int kTiledThreads = 128;
constexpr int64_t tiled_forward_smem_bytes(int64_t d) { return (kTiledRows * d + 2 * 2 * kTiledKeys * d) * 2; }

// kTiled backward (deterministic, no atomics): dQ tiles of 64 query rows stream K and V blocks
// of 64 keys (smem: Q, dO, two stages of K and V); dK/dV tiles of 64 key rows stream chunks of
// 32 query rows of every head of the GQA group (smem: K, V, two stages of Q and dO).
inline constexpr int kTiledDkvChunk = 32;
constexpr int64_t tiled_dq_smem_bytes(int64_t d) { return (2 * kTiledRows * d + 2 * 2 * kTiledKeys * d) * 2; }
constexpr int64_t tiled_dkv_smem_bytes(int64_t d) { return (2 * kTiledKeys * d + 2 * 2 * kTiledDkvChunk * d) * 2; }

// Byte offsets inside the device workspace of one call (256-byte aligned pieces).
struct WorkspaceLayout {
  int64_t fwd_tiles = 0, dq_tiles = 0, dkv_tiles = 0, dsum = 0;  // offsets
  int64_t tiles_bytes = 0;  // the tile lists (what is staged from the host), from offset 0
  int64_t total = 0;
};
inline int64_t align256(int64_t x) { return (x + 255) / 256 * 256; }
inline WorkspaceLayout workspace_layout(const CudaLaunchPlan& p, int64_t n_heads) {
  WorkspaceLayout w;
  const auto bytes = [](const std::vector<CudaTile>& t) { return static_cast<int64_t>(t.size() * sizeof(CudaTile)); };
  w.fwd_tiles = 0;
  w.dq_tiles = align256(bytes(p.fwd_tiles));
  w.dkv_tiles = w.dq_tiles + align256(bytes(p.dq_tiles));
  w.tiles_bytes = w.dkv_tiles + align256(bytes(p.dkv_tiles));
  w.dsum = w.tiles_bytes;
  const bool backward = p.dq_rows > 0;  // set only when planning a backward
  w.total = w.dsum + (backward ? align256(n_heads * p.total_q * static_cast<int64_t>(sizeof(float))) : 0);
  return w;
}

}  // namespace distca::kernels::cuda_shapes
