// The one way distca calls BLAS (OpenBLAS, pthread build): checked row-major gemm and a scoped
// thread-count setting. Every layer that multiplies matrices (kernels, model, train) goes
// through here; nothing else declares or calls cblas_* or openblas_* functions.
//
// Checks: OpenBLAS's cblas returns void and reports a bad argument by printing and carrying on,
// and its dimensions are ints, so every call checks (DISTCA_CHECK) that m, n, k and the leading
// dimensions are in [0, INT_MAX], that the leading dimensions fit the operands, and that no
// operand exceeds INT_MAX elements, before calling.
//
// Threads: OpenBLAS's thread count is process-wide. ScopedBlasThreads sets it for a scope and
// restores the previous value when the scope ends, so a caller never leaves a changed setting
// behind. Scopes on several threads at once must agree on the count (the last restore wins).
//
// Thread safety: gemm may run concurrently on distinct outputs.
#pragma once

#include <cblas.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "distca/core/check.h"

namespace distca::kernels {

inline bool fits_blas_int(int64_t x) { return x >= 0 && x <= INT_MAX; }

// Row-major C (m, n) = alpha * op(A) op(B) + beta * C with leading dimensions lda, ldb, ldc
// (op(A): (m, k), op(B): (k, n)). T is float or double. m or n zero: nothing to do; k zero:
// C = beta * C (A and B may then be null).
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  DISTCA_CHECK_MSG(fits_blas_int(m) && fits_blas_int(n) && fits_blas_int(k), "gemm dimensions must be in [0, INT_MAX]");
  DISTCA_CHECK_MSG(fits_blas_int(lda) && fits_blas_int(ldb) && fits_blas_int(ldc),
                   "gemm leading dimensions must be in [0, INT_MAX]");
  DISTCA_CHECK(lda >= (trans_a ? m : k) && lda >= 1);
  DISTCA_CHECK(ldb >= (trans_b ? k : n) && ldb >= 1);
  DISTCA_CHECK(ldc >= n && ldc >= 1);
  // Row counts times leading dimensions: the elements OpenBLAS may index in each operand.
  DISTCA_CHECK_MSG(fits_blas_int((trans_a ? k : m) * lda) && fits_blas_int((trans_b ? n : k) * ldb) &&
                       fits_blas_int(m * ldc),
                   "gemm operands must have at most INT_MAX elements");
  if (m == 0 || n == 0) return;
  DISTCA_CHECK(c != nullptr);
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    }
    return;
  }
  DISTCA_CHECK(a != nullptr && b != nullptr);
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k),
                alpha, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k),
                alpha, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
  }
}

// OpenBLAS's process-wide thread count.
inline int blas_threads() { return openblas_get_num_threads(); }

// The kernel family OpenBLAS picked for this CPU ("SkylakeX", "Haswell", "Prescott", ...).
inline const char* blas_core_name() { return openblas_get_corename(); }

// Sets OpenBLAS's thread count for the scope; the destructor restores the previous value.
class ScopedBlasThreads {
 public:
  explicit ScopedBlasThreads(int threads) : saved_(openblas_get_num_threads()) {
    DISTCA_CHECK(threads >= 1);
    openblas_set_num_threads(threads);
  }
  ~ScopedBlasThreads() { openblas_set_num_threads(saved_); }
  ScopedBlasThreads(const ScopedBlasThreads&) = delete;
  ScopedBlasThreads& operator=(const ScopedBlasThreads&) = delete;

 private:
  int saved_;
};

}  // namespace distca::kernels
