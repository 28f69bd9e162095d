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
// Deterministic parallel gemm: gemm_tiled cuts C into fixed tiles (kGemmTileRows x
// kGemmTileCols, never a function of the thread count) and computes each tile with one
// single-threaded gemm call, the tiles shared among the calling thread's OpenMP team. Every
// element of C is then computed by the same kernel call on the same operands whatever the team
// size, so the bits are the same for 1, 2 or 64 threads. OpenBLAS's own threading gives no such
// guarantee: on this project's machines (OpenBLAS 0.3.21, Haswell kernels) 2 and 3 threads
// change the bits of every shape the model uses (docs/model.md, "Threads").
//
// Compute threads per rank: compute_threads_per_rank() is the policy (OpenMP threads, BLAS on
// one); ScopedComputeThreads applies it to the calling thread's OpenMP team for a scope.
//
// Thread safety: gemm and gemm_tiled may run concurrently on distinct outputs.
#pragma once

#include <cblas.h>
#include <sched.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <optional>
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

// The fixed tile of gemm_tiled. Changing it changes the bits of every training run (not their
// independence of the thread count): keep it fixed. 128 x 128: single-threaded, the tiles of
// the tiny model's products run at 94% of one whole sgemm call (64 x 128: 90%), and 256 tokens
// still give 2 to 12 tiles per product to share.
inline constexpr int64_t kGemmTileRows = 128;
inline constexpr int64_t kGemmTileCols = 128;

// gemm (same contract and checks) computed tile by tile: C's (kGemmTileRows, kGemmTileCols)
// tiles, in row-major tile order, are handed out one at a time to omp_get_max_threads()
// threads (dynamically, so a thread the OS preempts holds up one tile, not its share; one
// thread when the product is too small to pay for a team: either only changes who computes a
// tile, not how). The bits depend on neither the team size nor OpenBLAS's thread count: the
// tiles run with OpenBLAS on one thread. When OpenBLAS is set to more, the call sets it to one
// for its duration (ScopedBlasThreads), so callers that run gemm_tiled on several threads at
// once (ranks as threads) must set OpenBLAS to one thread around them, as the trainer does.
template <class T>
void gemm_tiled(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const int64_t tile_rows = (m + kGemmTileRows - 1) / kGemmTileRows;
  const int64_t tile_cols = (n + kGemmTileCols - 1) / kGemmTileCols;
  // OpenBLAS on one thread for the call (set back afterwards when it was on more).
  std::optional<ScopedBlasThreads> one;
  if (blas_threads() != 1) one.emplace(1);
  if (tile_rows * tile_cols <= 1 || k == 0) {
    // One tile: the plain call is that tile's call.
    gemm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // The whole operands' checks once; each tile's call checks its own view again.
  DISTCA_CHECK_MSG(fits_blas_int(m) && fits_blas_int(n) && fits_blas_int(k), "gemm dimensions must be in [0, INT_MAX]");
  DISTCA_CHECK(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n);
  DISTCA_CHECK(a != nullptr && b != nullptr && c != nullptr);
  const int64_t tiles = tile_rows * tile_cols;
  // Below about 2^18 multiply-adds a team costs more than it saves.
  [[maybe_unused]] const bool team = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) >= 262144.0;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) if (team)
#endif
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = (t / tile_cols) * kGemmTileRows, j0 = (t % tile_cols) * kGemmTileCols;
    const int64_t mm = std::min(kGemmTileRows, m - i0), nn = std::min(kGemmTileCols, n - j0);
    // op(A) rows i0..: A's rows when stored (m, k), its columns when stored (k, m).
    const T* at = trans_a ? a + i0 : a + i0 * lda;
    // op(B) columns j0..: B's columns when stored (k, n), its rows when stored (n, k).
    const T* bt = trans_b ? b + j0 * ldb : b + j0;
    gemm<T>(trans_a, trans_b, mm, nn, k, alpha, at, lda, bt, ldb, beta, c + i0 * ldc + j0, ldc);
  }
}

// The cores this process may run on (its affinity mask; OpenMP's count where that fails).
inline int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#ifdef _OPENMP
  return std::max(1, omp_get_num_procs());
#else
  return 1;
#endif
}

// The OpenMP threads one rank computes with, when ranks_here ranks (threads of this process,
// or processes on this machine) share usable_cores(): an explicit OMP_NUM_THREADS (its first
// level, as the OpenMP runtime read it) wins, then an explicit OPENBLAS_NUM_THREADS (a user
// who sized BLAS's threads means the linear layers' threads; BLAS itself stays on one),
// otherwise max(1, usable_cores() / ranks_here). The bits of a run do not depend on it.
inline int compute_threads_per_rank(int64_t ranks_here) {
  auto set = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0';
  };
#ifdef _OPENMP
  if (set("OMP_NUM_THREADS")) return std::max(1, omp_get_max_threads());
#endif
  if (set("OPENBLAS_NUM_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(std::getenv("OPENBLAS_NUM_THREADS"), &end, 10);
    if (*end == '\0' && v >= 1 && v <= 4096) return static_cast<int>(v);
  }
  return std::max<int>(1, static_cast<int>(usable_cores() / std::max<int64_t>(1, ranks_here)));
}

// Sets the calling thread's OpenMP team size (omp_set_num_threads, a per-thread setting) for
// the scope and restores the previous value.
class ScopedComputeThreads {
 public:
  explicit ScopedComputeThreads(int threads) {
    DISTCA_CHECK(threads >= 1);
#ifdef _OPENMP
    saved_ = omp_get_max_threads();
    omp_set_num_threads(threads);
#endif
  }
  ~ScopedComputeThreads() {
#ifdef _OPENMP
    omp_set_num_threads(saved_);
#endif
  }
  ScopedComputeThreads(const ScopedComputeThreads&) = delete;
  ScopedComputeThreads& operator=(const ScopedComputeThreads&) = delete;

 private:
  [[maybe_unused]] int saved_ = 1;
};

}  // namespace distca::kernels
