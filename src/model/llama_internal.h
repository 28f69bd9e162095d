// Internals of Llama shared by its translation units (llama.cpp, llama_tp.cpp): the per-token
// widths of the workspace and the nested structs that point into it.
#pragma once

#include <cstdint>

#include "distca/model/llama.h"
#include "distca/model/tensor_parallel.h"

namespace distca::model {

// Per-token widths of the saved activations and of the backward scratch (docs/model.md).
struct Widths {
  int64_t h, qd, kvd, f, v, hd;
  bool tp;  // a TP rank: the layer functions of tensor_parallel.h bring their own temporaries
  // A TP rank's widths: its heads' q_dim and kv_dim, its ffn columns and its vocabulary rows
  // (tensor_parallel.h).
  Widths(const ModelSpec& s, const TpDims& d)
      : h(s.hidden), qd(d.qd()), kvd(d.kvd()), f(d.f()), v(d.vocab.size()), hd(s.head_dim), tp(d.tp > 1) {}
  explicit Widths(const ModelSpec& s) : Widths(s, tp_dims(s, 1, 0)) {}
  // x, rstd1, xn1, q, k, v, o, x_mid, rstd2, xn2, g, u, a. Of them x, rstd1, x_mid, rstd2
  // are sequence-parallel (sp: on a TP rank its rows of the step only), the rest per row.
  int64_t layer_sp() const { return 2 * h + 2; }
  int64_t layer_rows() const { return 2 * h + 2 * qd + 2 * kvd + 3 * f; }
  int64_t layer() const { return layer_sp() + layer_rows(); }
  // With the head: x_final, rstd_final (sp), xn_final, logits, rope cos (hd/2), rope sin
  // (hd/2); without: the stage's output x (sp), rope cos, rope sin.
  int64_t final_sp(bool head) const { return head ? h + 1 : h; }
  int64_t final_rows(bool head) const { return head ? h + v + hd : hd; }
  // dx (sp), dxn, dq, dk, dv, d_o, dg, du, da, then the odd layers' dk, dv (phased step); a
  // TP rank has no dxn, dg, du, da.
  int64_t scratch() const { return tp ? h + 2 * qd + 4 * kvd : 2 * h + 2 * qd + 4 * kvd + 3 * f; }
  int64_t scratch_rows() const { return scratch() - h; }
};

// The widths of a model's (TP rank's) workspace.
template <class T>
Widths widths_of(const Llama<T>& m) {
  return Widths(m.spec(), tp_dims(m.spec(), m.tp_size(), m.tp_rank()));
}

// Pointers into params_ or grads_ for one layer; shapes as in llama.h.
template <class T>
struct Llama<T>::LayerPtrs {
  T* attn_norm;  // (h)
  T* wq;         // (qd, h)
  T* wk;         // (kvd, h)
  T* wv;         // (kvd, h)
  T* wo;         // (h, qd)
  T* ffn_norm;   // (h)
  T* w1;         // (f, h)
  T* w3;         // (f, h)
  T* w2;         // (h, f)
};

// One layer's saved activations (first n rows of each region are used; on a TP rank the
// sequence-parallel ones, x, rstd1, x_mid, rstd2, hold its rows of the step from row 0).
template <class T>
struct Llama<T>::LayerActs {
  T* x;      // (n, h) residual stream entering the layer
  T* rstd1;  // (n)
  T* xn1;    // (n, h) attn_norm(x)
  T* q;      // (n, n_heads, head_dim) after RoPE
  T* k;      // (n, n_kv_heads, head_dim) after RoPE
  T* v;      // (n, n_kv_heads, head_dim)
  T* o;      // (n, n_heads, head_dim) core attention output
  T* x_mid;  // (n, h) x + o @ wo^T
  T* rstd2;  // (n)
  T* xn2;    // (n, h) ffn_norm(x_mid)
  T* g;      // (n, f) xn2 @ w1^T (gate, before SiLU)
  T* u;      // (n, f) xn2 @ w3^T (up)
  T* a;      // (n, f) silu(g) * u
};

// The final block and the RoPE tables (first n rows of each region are used; TP: x and rstd
// the rank's rows from row 0).
template <class T>
struct Llama<T>::FinalActs {
  T* x;         // (n, h) residual stream after the stage's last layer (stage_output)
  T* rstd;      // (n)            only with the head (else null)
  T* xn;        // (n, h) final_norm(x)                    idem
  T* logits;    // (n, vocab) (TP: the rank's vocabulary columns); dlogits after
                //   backward_head                                      idem
  T* rope_cos;  // (n, head_dim / 2)
  T* rope_sin;  // (n, head_dim / 2)
};

// Backward's temporaries (first n rows of each region are used; TP: dx the rank's rows).
template <class T>
struct Llama<T>::Scratch {
  T* dx;     // (n, h) gradient of the residual stream
  T* dxn;    // (n, h) gradient of a norm's output
  T* dq;     // (n, n_heads, head_dim)
  T* dk[2];  // (n, n_kv_heads, head_dim) by layer parity
  T* dv[2];  // (n, n_kv_heads, head_dim) by layer parity
  T* d_o;    // (n, n_heads, head_dim)
  T* dg;     // (n, f)
  T* du;     // (n, f)
  T* da;     // (n, f)   dxn, dg, du, da: null on a TP rank
};

}  // namespace distca::model
