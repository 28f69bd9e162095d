// LocalAttentionExecutor: core attention for one rank whose documents are all local.
//
// Layout it accepts: every document present is wholly on this rank (its pieces start at offset
// 0 and tile [0, doc_len)), and the pieces of one document are adjacent in the local order
// with consecutive offsets (so each document is one contiguous run of local rows, which is
// what a co-located packing of whole documents produces). Documents split across ranks need
// the CA runtime's dispatcher; set_layout refuses them with a Status naming the piece.
//
// Backends (LocalAttentionBackend):
//   kReference: a straightforward causal attention per document (no tiling), with scores,
//     softmax and sums accumulated in double and results rounded to T once. Backward
//     recomputes the probabilities from the q, k, v that forward was given (the model keeps
//     them alive until backward, see attention_executor.h), so nothing is stored. Cost
//     O(sum_d L_d^2 * n_heads * head_dim) on one thread: for tests, tiny models, and as the
//     reference other executors are compared against. Works for T = float and double.
//   kKernel (T = float only): one fused varlen call of the kernels layer's fast path
//     (kernels/attention.h) per layer, one task per document (q_len = kv_len = its length).
//     Keeps the log-sum-exp per layer ((n_heads, n_tokens) floats) for backward and reads the
//     forward's o back through the kept pointer. This is the co-located executor for whole
//     documents.
//
// Determinism: both backends give the same bits for the same inputs whatever the thread
// count (the reference runs one fixed loop order; the kernel guarantees it, kernels/attention.h).
//
// Thread safety: one thread at a time per object (as every executor).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "distca/data/batch.h"
#include "distca/model/attention_executor.h"

namespace distca::model {

enum class LocalAttentionBackend { kReference, kKernel };

template <class T>
class LocalAttentionExecutor final : public BasicAttentionExecutor<T> {
 public:
  // n_heads, n_kv_heads, head_dim positive, n_kv_heads divides n_heads; pieces as above;
  // kKernel only for T = float.
  static Result<LocalAttentionExecutor> create(
      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, std::span<const Piece> pieces,
      LocalAttentionBackend backend = LocalAttentionBackend::kReference);

  // Replaces the layout for the next step (forgets the kept pointers of the previous step).
  Status set_layout(std::span<const Piece> pieces);

  AttentionShape shape() const override { return shape_; }
  Status forward(int layer, const T* q, const T* k, const T* v, T* o) override;
  Status backward(int layer, const T* d_o, T* dq, T* dk, T* dv) override;

  // The contiguous local row ranges [begin, end), one per document, in local order.
  struct Segment {
    int64_t begin = 0;
    int64_t end = 0;
  };
  const std::vector<Segment>& segments() const { return segments_; }
  LocalAttentionBackend backend() const { return backend_; }

 private:
  LocalAttentionExecutor() = default;
  struct Kept {
    const T* q = nullptr;  // (n_tokens, n_heads, head_dim)
    const T* k = nullptr;  // (n_tokens, n_kv_heads, head_dim)
    const T* v = nullptr;  // (n_tokens, n_kv_heads, head_dim)
    const T* o = nullptr;  // (n_tokens, n_heads, head_dim), written by forward
  };
  Status reference_forward(const Kept& kp, T* o);
  Status reference_backward(const Kept& kp, const T* d_o, T* dq, T* dk, T* dv);
  Status kernel_forward(int layer, const Kept& kp, T* o);
  Status kernel_backward(int layer, const Kept& kp, const T* d_o, T* dq, T* dk, T* dv);

  AttentionShape shape_;
  LocalAttentionBackend backend_ = LocalAttentionBackend::kReference;
  std::vector<Segment> segments_;
  std::vector<int32_t> cu_seqlens_;            // (segments + 1) row offsets, kKernel
  int32_t max_seqlen_ = 0;                     // longest document, kKernel
  std::vector<std::vector<float>> lse_;        // [layer] (n_heads, n_tokens), kKernel
  std::vector<Kept> kept_;        // [layer]
  // kReference only:
  std::vector<double> dk_acc_;    // (n_tokens, n_kv_heads, head_dim) backward scratch
  std::vector<double> dv_acc_;    // (n_tokens, n_kv_heads, head_dim) backward scratch
  std::vector<double> scratch_;   // (2 * n_tokens) probabilities and dP of one query row
};

extern template class LocalAttentionExecutor<float>;
extern template class LocalAttentionExecutor<double>;

}  // namespace distca::model
