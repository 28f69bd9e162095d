// OpenBLAS access for the kernels layer (internal): the checked wrapper of
// include/distca/kernels/blas.h under the name the kernels use. The kernels run BLAS
// single-threaded inside their own OpenMP regions (ScopedBlasThreads).
#pragma once

#include <cblas.h>

#include <cstdint>

#include "distca/kernels/blas.h"

namespace distca::kernels {

// Row-major C = alpha * op(A) op(B) + beta * C (checks: distca/kernels/blas.h).
inline void sgemm_checked(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k,
                          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                          float beta, float* c, int64_t ldc) {
  gemm<float>(ta == CblasTrans, tb == CblasTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace distca::kernels
