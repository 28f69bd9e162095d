// Pack / unpack / gather-add kernels (pack_kernels.h). One thread block per destination row
// (grid-stride beyond the grid limit), its threads over the row's columns: rows are hundreds to
// thousands of floats (heads x head_dim), so a block keeps the loads coalesced for row-major
// windows. Built with --fmad=false: the sums must be the host reference's bits.
#include "pack_kernels.h"

namespace distca::runtime::device {
namespace {

struct Win {
  int64_t row_stride, col, col_stride;
};
Win win(const Window& w) { return {w.row_stride, w.col, w.col_stride}; }

constexpr int kThreads = 128;
constexpr int64_t kMaxGrid = 65535;

unsigned grid_for(int64_t rows) { return static_cast<unsigned>(rows < kMaxGrid ? rows : kMaxGrid); }

__global__ void copy_rows_kernel(const int64_t* __restrict__ pairs, int64_t rows, const float* __restrict__ src, Win sw,
                                 float* __restrict__ dst, Win dw, int64_t width) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const float* s = src + pairs[2 * i] * sw.row_stride + sw.col;
    float* d = dst + pairs[2 * i + 1] * dw.row_stride + dw.col;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) d[c * dw.col_stride] = s[c * sw.col_stride];
  }
}

// Each destination element is owned by one thread, which adds its sources in table order.
__global__ void gather_add_kernel(const int64_t* __restrict__ dsts, const int64_t* __restrict__ offsets,
                                  const int64_t* __restrict__ srcs, int64_t n_dst, const float* __restrict__ src, Win sw,
                                  float* __restrict__ dst, Win dw, int64_t width) {
  for (int64_t k = blockIdx.x; k < n_dst; k += gridDim.x) {
    float* d = dst + dsts[k] * dw.row_stride + dw.col;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
      float acc = d[c * dw.col_stride];
      for (int64_t j = offsets[k]; j < offsets[k + 1]; ++j) acc += src[srcs[j] * sw.row_stride + sw.col + c * sw.col_stride];
      d[c * dw.col_stride] = acc;
    }
  }
}

}  // namespace

cudaError_t launch_copy_rows(const int64_t* pairs, int64_t rows, const float* src, const Window& sw, float* dst,
                             const Window& dw, int64_t width, cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return cudaSuccess;
  copy_rows_kernel<<<grid_for(rows), kThreads, 0, stream>>>(pairs, rows, src, win(sw), dst, win(dw), width);
  return cudaGetLastError();
}

cudaError_t launch_gather_add(const int64_t* dsts, const int64_t* offsets, const int64_t* srcs, int64_t n_dst,
                              const float* src, const Window& sw, float* dst, const Window& dw, int64_t width,
                              cudaStream_t stream) {
  if (n_dst <= 0 || width <= 0) return cudaSuccess;
  gather_add_kernel<<<grid_for(n_dst), kThreads, 0, stream>>>(dsts, offsets, srcs, n_dst, src, win(sw), dst, win(dw), width);
  return cudaGetLastError();
}

}  // namespace distca::runtime::device
