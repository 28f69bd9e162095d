// The blocking path's attention (Llama::forward / forward_backward), kept only as the tests'
// independent reference: the trainer runs the phased calls with the runtime's runners instead.
// One executor call per layer in forward and one per layer in backward; the
// LocalAttentionExecutor (local_attention.h) calls the kernel on this process.
//
// Contract between the model and an executor (docs/model.md, "executor contract"):
//
//   Tokens. The model hands the executor this rank's LOCAL tokens in local order: the rank's
//   document pieces concatenated, exactly as the executor was set up for the step (the
//   executor learns the pieces -- document id, offset, length, document length -- from its own
//   construction or per-step setup, not from the model). shape().n_tokens is that count; the
//   model refuses to run when it differs from the number of tokens it was given.
//
//   Function. For every local query row of document d at logical position p and every head,
//   o = softmax(scale * q . k_j) v_j over the keys j of document d at positions 0..p, wherever
//   those keys live (GQA: query head h reads kv head h / (n_heads / n_kv_heads);
//   scale = 1 / sqrt(head_dim)). Tokens of different documents never see each other.
//   q and k arrive AFTER rotary embedding.
//
//   Backward. backward(l, d_o, ...) returns the gradients of sum <d_o, o> taken over ALL ranks
//   that share documents with this one: dq for the local query rows, and dk, dv for the local
//   key/value rows including contributions from queries held elsewhere (the dispatcher sums the
//   partials at each row's home rank). dq, dk, dv are overwritten, not accumulated.
//
//   Order and lifetime. Within one step the model calls forward(0), ..., forward(L-1), then
//   (when it trains) backward(L-1), ..., backward(0); backward(l) always follows forward(l) of
//   the same step, and an evaluation step may call forward only. The q, k, v and o buffers
//   passed to forward(l) stay valid and unchanged until backward(l) returns or the next step's
//   forward(l) starts, so an executor may keep pointers instead of copies. Whatever else it
//   needs for backward (the softmax log-sum-exp, received rows) it keeps itself, keyed by layer.
//   A distributed executor's calls are collective: every rank of its group makes the same
//   sequence of calls.
//
//   Errors. A non-OK Status (a communication failure, a layout the executor cannot serve)
//   aborts the model's step; the model returns it with the layer as context.
//
// Thread safety: an executor is used by one thread at a time (the model's calling thread).
#pragma once

#include <cstdint>

#include "distca/core/status.h"

namespace distca::model {

struct AttentionShape {
  int64_t n_tokens = 0;    // local tokens per step (rows of q, k, v, o)
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // key/value heads; divides n_heads
  int64_t head_dim = 0;
};

// T is float for training; double is used by the model's gradient checks (tests only).
template <class T>
class BasicAttentionExecutor {
 public:
  virtual ~BasicAttentionExecutor() = default;

  // The shape this executor is set up for (the current step's local token count).
  virtual AttentionShape shape() const = 0;

  // q: (n_tokens, n_heads, head_dim), k, v: (n_tokens, n_kv_heads, head_dim), after RoPE;
  // writes o: (n_tokens, n_heads, head_dim).
  virtual Status forward(int layer, const T* q, const T* k, const T* v, T* o) = 0;

  // d_o: (n_tokens, n_heads, head_dim); writes dq: (n_tokens, n_heads, head_dim) and
  // dk, dv: (n_tokens, n_kv_heads, head_dim) (gradients with respect to the post-RoPE q, k).
  virtual Status backward(int layer, const T* d_o, T* dq, T* dk, T* dv) = 0;
};

using AttentionExecutor = BasicAttentionExecutor<float>;

}  // namespace distca::model
