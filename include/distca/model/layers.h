// The context-independent building blocks of the Llama decoder, written plainly (llm.c style):
// matrix products through BLAS, RMSNorm, rotary position embedding, SwiGLU, cross-entropy.
// Each backward is tested against central finite differences (tests/model/test_layers.cpp).
//
// Conventions (docs/model.md):
//   - row-major (C order); `n` is the number of tokens; every buffer's shape is in a comment.
//   - A linear layer's weight is (out, in) as in PyTorch's nn.Linear: y = x @ W^T.
//   - Backward functions ACCUMULATE into parameter gradients (dgain, dW) and, where the name
//     says so, into input gradients; everything else is overwritten. Accumulation lets several
//     micro-batches (or pipeline chunks) add into one gradient buffer.
//   - Per-row reductions run in double and every reduction over tokens runs in token order, so
//     results do not depend on the OpenMP thread count.
//
// T is float (training) or double (gradient checks in tests); both are instantiated in
// src/model/layers.cpp.
//
// Threads: every function here uses the calling thread's OpenMP team (omp_get_max_threads();
// kernels::ScopedComputeThreads sets it) and gives the same bits for any team size: gemm is
// kernels::gemm_tiled (a fixed tile partition, each tile one single-threaded BLAS call), the
// element-wise loops write disjoint outputs, and no reduction depends on the split.
//
// Thread safety: the functions keep no state; concurrent calls on disjoint buffers are fine.
// Callers that run them on several threads at once (ranks as threads) set OpenBLAS to one
// thread around them (kernels/blas.h, gemm_tiled).
#pragma once

#include <cstdint>

namespace distca::model {

// C (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * C, all row-major, dense operands
// (kernels::gemm_tiled: bits independent of the thread count).
// op(A) is A (m, k), or A^T when trans_a (A stored (k, m)); likewise for B.
// Dimensions are checked with DISTCA_CHECK (each, and each operand's element count, must fit
// BLAS's int; m or n of 0 is a no-op): a wrong shape here is a bug in distca, not user input.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          const T* b, T beta, T* c);

// y (n, out) = x (n, in) @ w (out, in)^T
template <class T>
void linear_forward(T* y, const T* x, const T* w, int64_t n, int64_t in, int64_t out);

// dx (n, in) (+)= dy (n, out) @ w (out, in)   [accumulates when accumulate_dx]
// dw (out, in) += dy^T (out, n) @ x (n, in)
template <class T>
void linear_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t n, int64_t in,
                     int64_t out, bool accumulate_dx);

// RMSNorm: rstd[t] = 1 / sqrt(mean_c x[t,c]^2 + eps); y[t,c] = x[t,c] * rstd[t] * gain[c].
// y, x: (n, c); gain: (c); rstd: (n) saved for backward.
template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gain, int64_t n, int64_t c, double eps);

// dx (n, c) += d/dx; dgain (c) += d/dgain. dy, x: (n, c); rstd: (n); gain: (c).
template <class T>
void rmsnorm_backward(T* dx, T* dgain, const T* dy, const T* x, const T* rstd, const T* gain,
                      int64_t n, int64_t c);

// Rotary tables for one step: angle[t, i] = positions[t] * theta^(-2i / head_dim), computed in
// double (positions reach 10^6, where a float angle would lose the low bits).
// cos_t, sin_t: (n, head_dim / 2); positions: (n). Precondition: head_dim even, positions >= 0.
template <class T>
void rope_tables(T* cos_t, T* sin_t, const int32_t* positions, int64_t n, int64_t head_dim,
                 double theta);

// In-place rotation of interleaved pairs (x[2i], x[2i+1]) of every head as the complex number
// x[2i] + i x[2i+1] multiplied by exp(i * sign * angle[t, i]). sign = +1 is the forward RoPE;
// sign = -1 is its backward (the rotation is orthogonal, so the gradient rotates back).
// x: (n, n_heads, head_dim); cos_t, sin_t: (n, head_dim / 2).
template <class T>
void rope_apply(T* x, const T* cos_t, const T* sin_t, int64_t n, int64_t n_heads,
                int64_t head_dim, int sign);

// SwiGLU: a = silu(g) * u, silu(g) = g * sigmoid(g). a, g, u: (n, f).
template <class T>
void swiglu_forward(T* a, const T* g, const T* u, int64_t n, int64_t f);

// dg, du (n, f) overwritten from da (n, f) and the saved g, u (n, f).
template <class T>
void swiglu_backward(T* dg, T* du, const T* da, const T* g, const T* u, int64_t n, int64_t f);

// Cross-entropy of each row of logits against targets; a target of -1 means "no target"
// (the last token of a document): its loss is 0 and it adds no gradient.
// logits: (n, vocab); targets: (n) in [-1, vocab); loss_out: (n) per-token loss (0 where the
// target is -1). Returns the sum over tokens with a target (double, token order).
// Precondition: targets in range (checked by the caller; DISTCA_CHECK here).
template <class T>
double cross_entropy_forward(T* loss_out, const T* logits, const int32_t* targets, int64_t n,
                             int64_t vocab);

// dlogits (n, vocab) = scale * (softmax(logits) - onehot(target)) for rows with a target, 0 for
// rows without. May alias logits (dlogits == logits overwrites them in place).
template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, int64_t n,
                            int64_t vocab, double scale);

}  // namespace distca::model
