// Where each lane's mma.sync / ldmatrix fragments come from: the index arithmetic of the tiled
// kernels, in one header compiled both by nvcc (the kernels) and by the host compiler
// (tests/kernels_cuda/test_fragments.cpp, which emulates ldmatrix and mma.m16n8k16 as the PTX
// ISA defines them and checks that these formulas compose into the right matrix products).
//
// Shared-memory tiles are (rows, D) of 16-bit elements, row-major, in 16-byte chunks of 8
// elements; chunk c of row r is stored at chunk position c ^ (r & 7), so the 8 rows one
// ldmatrix phase reads hit 8 different bank groups (D must be a multiple of 64).
//
// Operand cases of the kernels (S = Q K^T, O = P V, dP = dO V^T, dQ = dS K, S^T = K Q^T,
// dV = P^T dO, dK = dS^T Q):
//   A from a row-major (m, k) tile                       : a_row, a_chunk      (ldmatrix)
//   B from an (n, k) tile, i.e. B^T stored row-major     : b_row, b_chunk      (ldmatrix)
//   B from a (k, n) tile, i.e. B stored row-major        : bt_row, bt_chunk    (ldmatrix.trans)
// For the two B cases one ldmatrix.x4 yields (b0, b1) of n-tile 2p in registers 0, 1 and of
// n-tile 2p + 1 in registers 2, 3. A C fragment's element e sits at (c_row, c_col); two C
// n-tiles side by side are the A fragment of the next product: register r of A at k-step j
// packs elements 2 (r & 1) and 2 (r & 1) + 1 of C n-tile c_to_a_tile(j, r).
#pragma once

#if defined(__CUDACC__)
#define DISTCA_FRAG_FN __host__ __device__ __forceinline__
#else
#define DISTCA_FRAG_FN inline
#endif

namespace distca::kernels::frag {

// Element offset of chunk `chunk` of row `row` in a swizzled (rows, D) tile.
template <int D>
DISTCA_FRAG_FN int swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// A (16 x 16 at k-step kk) from rows [0, 16) of a row-major tile.
DISTCA_FRAG_FN int a_row(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
DISTCA_FRAG_FN int a_chunk(int lane, int kk) { return kk * 2 + (lane >> 4); }
// B for n-tiles 2p, 2p + 1 (rows 16 p .. 16 p + 15 of the (n, k) tile) at k-step kk.
DISTCA_FRAG_FN int b_row(int lane, int p) { return p * 16 + (lane >> 4) * 8 + (lane & 7); }
DISTCA_FRAG_FN int b_chunk(int lane, int kk) { return kk * 2 + ((lane >> 3) & 1); }
// B for n-tiles 2p, 2p + 1 (columns 16 p .. of the (k, n) tile) at k-step j (rows 16 j ..).
DISTCA_FRAG_FN int bt_row(int lane, int j) { return j * 16 + ((lane >> 3) & 1) * 8 + (lane & 7); }
DISTCA_FRAG_FN int bt_chunk(int lane, int p) { return p * 2 + (lane >> 4); }
// Row and column, within its 16 x 8 tile, of element e (0..3) of a C fragment.
DISTCA_FRAG_FN int c_row(int lane, int e) { return (lane >> 2) + (e >> 1) * 8; }
DISTCA_FRAG_FN int c_col(int lane, int e) { return 2 * (lane & 3) + (e & 1); }
// The C n-tile that register r of the A fragment at k-step j comes from.
DISTCA_FRAG_FN int c_to_a_tile(int j, int r) { return 2 * j + (r >> 1); }

}  // namespace distca::kernels::frag
