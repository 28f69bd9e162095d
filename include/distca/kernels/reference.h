// The naive attention reference: the obvious formula, one (task, head, query row) at a time,
// with the full score row materialised. It is the yardstick of the fast path's tests and of
// `distca attention --reference`; it is slow (no blocking, no threads) on purpose.
//
// T is the storage AND compute type: double gives the fp64 reference the tests measure errors
// against; float gives the "plain fp32 implementation" whose error sets the tolerance.
// Shapes, masking and GQA are exactly those of attention.h; `shape` supplies cu_seqlens, head
// counts, head_dim, scale and causal (its data pointers are ignored). Backward recomputes the
// softmax from q and k (it does not read O or LSE), so it checks the fast path independently.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include "distca/kernels/attention.h"

namespace distca::kernels {

// o: (total_q, n_heads, head_dim); lse: (n_heads, total_q) (natural log; -inf for a row with
// no visible key, whose O is 0).
template <class T>
void reference_forward(const AttentionParams& shape, const T* q, const T* k, const T* v, T* o,
                       T* lse);

// dq: like q; dk, dv: like k. Overwritten.
template <class T>
void reference_backward(const AttentionParams& shape, const T* q, const T* k, const T* v,
                        const T* d_o, T* dq, T* dk, T* dv);

// The backward as the kernel API defines it (attention.h): it takes the forward's O and LSE
// and computes P = exp(scale * q.k - LSE) and D = rowsum(dO o O) from them, instead of
// recomputing the softmax. With T = float this is the "plain fp32 implementation" of the
// backward on the same inputs the fast path gets (o: like q; lse: (n_heads, total_q)).
template <class T>
void reference_backward_from_lse(const AttentionParams& shape, const T* q, const T* k, const T* v,
                                 const T* o, const T* lse, const T* d_o, T* dq, T* dk, T* dv);

extern template void reference_backward_from_lse<float>(const AttentionParams&, const float*,
                                                        const float*, const float*, const float*,
                                                        const float*, const float*, float*, float*,
                                                        float*);
extern template void reference_forward<float>(const AttentionParams&, const float*, const float*,
                                              const float*, float*, float*);
extern template void reference_forward<double>(const AttentionParams&, const double*, const double*,
                                               const double*, double*, double*);
extern template void reference_backward<float>(const AttentionParams&, const float*, const float*,
                                               const float*, const float*, float*, float*, float*);
extern template void reference_backward<double>(const AttentionParams&, const double*, const double*,
                                                const double*, const double*, double*, double*,
                                                double*);

}  // namespace distca::kernels
