// The tiling of the CPU attention kernels that callers may depend on (in the manner of
// FlashAttention's kernel traits): the one place the numbers live. The fast path
// (src/kernels/attention.cpp) tiles with exactly these, and a caller that must reproduce the
// kernel's bits across differently cut calls (the CA runtime pads each task of its fused call to
// whole query tiles, docs/runtime.md "Numerics") reads them here instead of copying them.
//
// Contract (docs/kernels.md, "Tiles"): a task's query rows are processed in tiles of
// query_tile_rows(G) rows starting at the task's first row, G = n_heads / n_kv_heads. The bits
// of a query row's O and LSE depend only on its inputs, its place inside its tile, and the
// document positions its tile covers (which fix the tile's key blocks). So a task holding rows
// [a, b) of a document of length L, with context [0, b), gives every row the bits of the
// whole-document call when a is a multiple of query_tile_rows(G) and b is a multiple of it or L.
//
// Thread safety: constants only.
#pragma once

#include <cstdint>

namespace distca::kernels {

struct AttentionTraits {
  // Stacked rows of one forward/backward tile: query rows times the G query heads of a GQA
  // group, stacked into one sgemm operand (chosen by measurement, docs/benchmarks.md).
  static constexpr int64_t kStackedRows = 256;
  // Keys per forward block (and the widest backward block).
  static constexpr int64_t kBlockKeys = 512;

  // Query rows per tile for a GQA group of `group` query heads per kv head: kStackedRows /
  // group, at least 1. Precondition: group >= 1.
  static constexpr int64_t query_tile_rows(int64_t group) {
    return kStackedRows / group > 0 ? kStackedRows / group : 1;
  }
};

}  // namespace distca::kernels
