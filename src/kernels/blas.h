// OpenBLAS access for the kernels layer (internal). The pthread build of OpenBLAS is what the
// project links; its cblas.h also declares openblas_set_num_threads / openblas_get_num_threads,
// which the kernels use to run BLAS single-threaded inside their own OpenMP regions.
#pragma once

#include <cblas.h>

#include <cstdint>

#include "distca/core/check.h"

namespace distca::kernels {

// Row-major C = alpha * op(A) op(B) + beta * C. cblas_sgemm reports nothing, so the shapes are
// checked here (a bad leading dimension would make OpenBLAS print and carry on).
inline void sgemm_checked(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k,
                          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                          float beta, float* c, int64_t ldc) {
  DISTCA_CHECK(m >= 0 && n >= 0 && k >= 0);
  DISTCA_CHECK(lda >= (ta == CblasNoTrans ? k : m) && lda >= 1);
  DISTCA_CHECK(ldb >= (tb == CblasNoTrans ? n : k) && ldb >= 1);
  DISTCA_CHECK(ldc >= n && ldc >= 1);
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

}  // namespace distca::kernels
