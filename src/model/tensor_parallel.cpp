#include "distca/model/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "distca/core/check.h"
#include "distca/model/layers.h"
#include "tp_collectives.h"

namespace distca::model {
namespace {

using tp_detail::add_inplace;
using tp_detail::compute_then_scatter;
using tp_detail::gather_parts;
using tp_detail::gather_then;
using tp_detail::scatter_parts;

// Copies the block rows [r0, r0 + rows) x columns [c0, c0 + cols) of a row-major matrix of
// src_cols columns to rows [d_r0, ..) x columns [d_c0, ..) of one of dst_cols columns.
template <class T>
void copy_block(const T* src, int64_t src_cols, int64_t r0, int64_t c0, T* dst, int64_t dst_cols,
                int64_t d_r0, int64_t d_c0, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    std::copy_n(src + (r0 + i) * src_cols + c0, cols, dst + (d_r0 + i) * dst_cols + d_c0);
  }
}

// Moves rank d.rank's share of the tensors [first, end) of the full layout between `full` and
// `shard`, each pointing at the first of those tensors in its layout; to_shard picks the way.
template <class T>
void move_tensors(const ModelSpec& spec, const TpDims& d, T* full, T* shard, bool to_shard,
                  size_t first, size_t end) {
  const std::vector<TensorInfo> fl = param_layout(spec);
  const std::vector<TensorInfo> sl = tp_param_layout(spec, d.tp, d.rank);
  for (size_t i = first; i < end; ++i) {
    const TensorSlice c = tp_tensor_slice(fl[i], d);
    T* f = full + (fl[i].offset - fl[first].offset);
    T* s = shard + (sl[i].offset - sl[first].offset);
    if (to_shard) {
      copy_block<T>(f, fl[i].cols, c.row0, c.col0, s, c.cols, 0, 0, c.rows, c.cols);
    } else {
      copy_block<T>(s, c.cols, 0, 0, f, fl[i].cols, c.row0, c.col0, c.rows, c.cols);
    }
  }
}

// Layer 0's tensors are entries [1, 10) of the layout; every layer has the same shapes.
constexpr size_t kLayerFirst = 1, kLayerEnd = 10;

// The rows of every rank: tp_rows(n, tp, p) (a whole step), or a range's shares.
std::vector<RowRange> even_parts(int64_t n, int tp) {
  std::vector<RowRange> out;
  for (int p = 0; p < tp; ++p) out.push_back(tp_rows(n, tp, p));
  return out;
}
template <class T>
std::vector<RowRange> step_parts(const TpStep<T>& s, int tp) {
  std::vector<RowRange> out;
  for (int p = 0; p < tp; ++p) out.push_back(tp_range_rows(s, tp, p));
  return out;
}

}  // namespace

Status check_tp(const ModelSpec& spec, int64_t tp) {
  if (tp < 1 || spec.n_heads % tp != 0 || spec.n_kv_heads % tp != 0 || tp > spec.ffn ||
      tp > spec.vocab) {
    return Status::invalid_argument(
        "tensor parallel size " + std::to_string(tp) + " must be >= 1 and divide n_heads (" +
        std::to_string(spec.n_heads) + ") and n_kv_heads (" + std::to_string(spec.n_kv_heads) +
        ") and be at most ffn (" + std::to_string(spec.ffn) + ") and vocab (" +
        std::to_string(spec.vocab) + ")");
  }
  return Status::ok_status();
}

TpDims tp_dims(const ModelSpec& spec, int64_t tp, int64_t rank) {
  DISTCA_CHECK(check_tp(spec, tp).ok() && 0 <= rank && rank < tp);
  TpDims d;
  d.tp = tp;
  d.rank = rank;
  d.h = spec.hidden;
  d.hd = spec.head_dim;
  d.heads = spec.n_heads / tp;
  d.kv_heads = spec.n_kv_heads / tp;
  d.head0 = rank * d.heads;
  d.kv_head0 = rank * d.kv_heads;
  d.ffn = even_split(spec.ffn, tp, rank);
  d.vocab = even_split(spec.vocab, tp, rank);
  return d;
}

TensorSlice tp_tensor_slice(const TensorInfo& full, const TpDims& d) {
  const std::string& n = full.name;
  TensorSlice s{0, full.rows, 0, full.cols};
  if (n == "embedding" || n == "lm_head") {
    s.row0 = d.vocab.begin;
    s.rows = d.vocab.size();
  } else if (n.ends_with(".wq")) {
    s.row0 = d.head0 * d.hd;
    s.rows = d.qd();
  } else if (n.ends_with(".wk") || n.ends_with(".wv")) {
    s.row0 = d.kv_head0 * d.hd;
    s.rows = d.kvd();
  } else if (n.ends_with(".wo")) {
    s.col0 = d.head0 * d.hd;
    s.cols = d.qd();
  } else if (n.ends_with(".w1") || n.ends_with(".w3")) {
    s.row0 = d.ffn.begin;
    s.rows = d.f();
  } else if (n.ends_with(".w2")) {
    s.col0 = d.ffn.begin;
    s.cols = d.f();
  }
  return s;
}

bool tp_sharded(const TensorInfo& t) {
  if (t.name == "embedding" || t.name == "lm_head") return true;
  for (const char* suffix : {".wq", ".wk", ".wv", ".wo", ".w1", ".w3", ".w2"}) {
    if (t.name.ends_with(suffix)) return true;
  }
  return false;
}

std::vector<TensorInfo> tp_param_layout(const ModelSpec& spec, int64_t tp, int64_t rank) {
  const TpDims d = tp_dims(spec, tp, rank);
  std::vector<TensorInfo> out = param_layout(spec);
  int64_t offset = 0;
  for (TensorInfo& t : out) {
    const TensorSlice s = tp_tensor_slice(t, d);
    t.rows = s.rows;
    t.cols = s.cols;
    t.offset = offset;
    offset += t.size();
  }
  return out;
}

template <class T>
TpLayerTensors<T> tp_layer_tensors(const TpDims& d, T* shard) {
  T* p = shard;
  auto take = [&](int64_t count) {
    T* r = p;
    p += count;
    return r;
  };
  TpLayerTensors<T> t;
  t.attn_norm = take(d.h);
  t.wq = take(d.qd() * d.h);
  t.wk = take(d.kvd() * d.h);
  t.wv = take(d.kvd() * d.h);
  t.wo = take(d.h * d.qd());
  t.ffn_norm = take(d.h);
  t.w1 = take(d.f() * d.h);
  t.w3 = take(d.f() * d.h);
  t.w2 = take(d.h * d.f());
  return t;
}

template <class T>
void tp_shard_layer(const ModelSpec& spec, const TpDims& d, const T* full, T* shard) {
  move_tensors<T>(spec, d, const_cast<T*>(full), shard, true, kLayerFirst, kLayerEnd);
}

template <class T>
void tp_unshard_layer(const ModelSpec& spec, const TpDims& d, const T* shard, T* full) {
  move_tensors<T>(spec, d, full, const_cast<T*>(shard), false, kLayerFirst, kLayerEnd);
}

template <class T>
void tp_shard_params(const ModelSpec& spec, const TpDims& d, const T* full, T* shard) {
  move_tensors<T>(spec, d, const_cast<T*>(full), shard, true, 0, param_layout(spec).size());
}

template <class T>
void tp_unshard_params(const ModelSpec& spec, const TpDims& d, const T* shard, T* full) {
  move_tensors<T>(spec, d, full, const_cast<T*>(shard), false, 0, param_layout(spec).size());
}

std::array<RowRange, 2> tp_sp_pieces(int64_t total, int64_t cut, int tp, int rank) {
  DISTCA_CHECK(total >= 0 && tp >= 1 && 0 <= rank && rank < tp);
  if (cut <= 0 || cut >= total) return {tp_rows(total, tp, rank), RowRange{total, total}};
  // [0, cut): the remainder's rows on the last ranks (rank p >= tp - rem gets one more).
  const int64_t base = cut / tp, rem = cut % tp;
  const int64_t begin = rank * base + std::max<int64_t>(0, rank - (tp - rem));
  const int64_t size = base + (rank >= tp - rem ? 1 : 0);
  const RowRange second = tp_rows(total - cut, tp, rank);
  return {RowRange{begin, begin + size}, RowRange{cut + second.begin, cut + second.end}};
}

template <class T>
RowRange tp_range_rows(const TpStep<T>& s, int tp, int rank) {
  const std::array<RowRange, 2> pieces = tp_sp_pieces(s.total == 0 ? s.n : s.total, s.cut, tp, rank);
  auto in_range = [&](const RowRange& own) {
    const int64_t begin = std::clamp(own.begin - s.first, int64_t{0}, s.n);
    return RowRange{begin, std::clamp(own.end - s.first, begin, s.n)};
  };
  const RowRange first = in_range(pieces[0]), second = in_range(pieces[1]);
  if (second.size() == 0) return first;
  DISTCA_CHECK_MSG(first.size() == 0, "a TP range across the sequence cut");
  return second;
}

template <class T>
Status tp_all_gather_rows(comm::Communicator& tp, T* all, int64_t n, int64_t width) {
  return gather_parts<T>(tp, all, even_parts(n, tp.size()), width);
}

template <class T>
Status tp_reduce_scatter_rows(comm::Communicator& tp, const T* partial, T* out, int64_t n,
                              int64_t width) {
  return scatter_parts<T>(tp, partial, out, even_parts(n, tp.size()), width);
}

Status tp_all_reduce_replicated(comm::Communicator& tp, std::span<float> grads) {
  return tp.all_reduce_sum(grads);
}

Status tp_all_reduce_replicated(comm::Communicator& tp, std::span<double> grads) {
  return tp.all_reduce_sum(grads);
}

namespace {

// dx (rows, in) (+)= dy (rows, out) @ w (out, in): linear_backward's input gradient alone.
template <class T>
void linear_dx(T* dx, const T* dy, const T* w, int64_t rows, int64_t in, int64_t out, bool accumulate) {
  gemm<T>(false, false, rows, in, out, T(1), dy, w, accumulate ? T(1) : T(0), dx);
}
// dw (out, in) += dy^T (out, n) @ x (n, in): linear_backward's weight gradient alone, over all
// n rows in one product (splitting its inner dimension by rows would change its bits).
template <class T>
void linear_dw(T* dw, const T* dy, const T* x, int64_t n, int64_t in, int64_t out) {
  gemm<T>(true, false, out, in, n, T(1), dy, x, T(1), dw);
}

// RMSNorm of the rank's rows into its rows of the gathered buffer, then the all-gather, with
// rows(r) (the column-parallel products of the rows r) overlapped with it (gather_then).
template <class T, class Rows>
Status norm_gather_then(comm::Communicator& tp, const TpStep<T>& s, const T* x, const T* gain, T* rstd,
                        T* xn_all, int64_t h, Rows&& rows) {
  const RowRange mine = tp_range_rows(s, tp.size(), tp.rank());
  rmsnorm_forward<T>(xn_all + mine.begin * h, rstd, x, gain, mine.size(), h, s.rms_eps);
  return gather_then<T>(tp, xn_all, step_parts(s, tp.size()), h, s.overlap, rows);
}

// out (n_r, h) = residual + reduce_scatter(act (n, in) @ w (h, in)^T), the product computed
// block by block as compute_then_scatter sends it.
template <class T>
Status row_parallel_residual(comm::Communicator& tp, const TpStep<T>& s, const T* act, const T* w,
                             int64_t in, int64_t h, const T* residual, T* out) {
  std::vector<T> partial(static_cast<size_t>(s.n * h));
  auto rows = [&](RowRange r) {
    linear_forward<T>(partial.data() + r.begin * h, act + r.begin * in, w, r.size(), in, h);
  };
  DISTCA_RETURN_IF_ERROR(
      compute_then_scatter<T>(tp, partial.data(), out, step_parts(s, tp.size()), h, s.overlap, rows, [] {}));
  add_inplace<T>(out, residual, tp_range_rows(s, tp.size(), tp.rank()).size() * h);
  return Status::ok_status();
}

// dy (n_r, h) gathered into all (n, h) (the gradient every rank's column slice needs), with
// rows(r) overlapped with it (gather_then).
template <class T, class Rows>
Status gather_grad_then(comm::Communicator& tp, const TpStep<T>& s, const T* dy, int64_t h, std::vector<T>& all,
                        Rows&& rows) {
  all.assign(static_cast<size_t>(s.n * h), T(0));
  const RowRange mine = tp_range_rows(s, tp.size(), tp.rank());
  std::copy_n(dy, mine.size() * h, all.data() + mine.begin * h);
  return gather_then<T>(tp, all.data(), step_parts(s, tp.size()), h, s.overlap, rows);
}

// dxn_all (n, h): rows(r) writes this rank's partial d(normed input) of the rows r; it is
// reduce-scattered as it is written, after() (the weight gradients) runs while the blocks
// travel, then the norm's backward on the rank's rows accumulates into dx (n_r, h) and dgain.
template <class T, class Rows, class After>
Status scatter_norm_backward(comm::Communicator& tp, const TpStep<T>& s, T* dxn_all, Rows&& rows, After&& after,
                             const T* x, const T* rstd, const T* gain, T* dgain, T* dx, int64_t h) {
  const RowRange mine = tp_range_rows(s, tp.size(), tp.rank());
  std::vector<T> dxn(static_cast<size_t>(mine.size() * h));
  DISTCA_RETURN_IF_ERROR(
      compute_then_scatter<T>(tp, dxn_all, dxn.data(), step_parts(s, tp.size()), h, s.overlap, rows, after));
  rmsnorm_backward<T>(dx, dgain, dxn.data(), x, rstd, gain, mine.size(), h);
  return Status::ok_status();
}

}  // namespace

template <class T>
Status tp_attention_in_forward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                               const TpLayerTensors<const T>& w, const TpLayerActs<T>& a) {
  const int64_t h = d.h, qd = d.qd(), kvd = d.kvd(), half = d.hd / 2;
  auto qkv = [&](RowRange r) {
    const int64_t b = r.begin, m = r.size();
    linear_forward<T>(a.q + b * qd, a.xn1 + b * h, w.wq, m, h, qd);
    linear_forward<T>(a.k + b * kvd, a.xn1 + b * h, w.wk, m, h, kvd);
    linear_forward<T>(a.v + b * kvd, a.xn1 + b * h, w.wv, m, h, kvd);
    rope_apply<T>(a.q + b * qd, s.rope_cos + b * half, s.rope_sin + b * half, m, d.heads, d.hd, +1);
    rope_apply<T>(a.k + b * kvd, s.rope_cos + b * half, s.rope_sin + b * half, m, d.kv_heads, d.hd, +1);
  };
  return norm_gather_then<T>(tp, s, a.x, w.attn_norm, a.rstd1, a.xn1, h, qkv);
}

template <class T>
Status tp_attention_out_mlp_forward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                                    const TpLayerTensors<const T>& w, const TpLayerActs<T>& a) {
  const int64_t h = d.h, f = d.f();
  DISTCA_RETURN_IF_ERROR(row_parallel_residual<T>(tp, s, a.o, w.wo, d.qd(), h, a.x, a.x_mid));
  auto gate_up = [&](RowRange r) {
    const int64_t b = r.begin, m = r.size();
    linear_forward<T>(a.g + b * f, a.xn2 + b * h, w.w1, m, h, f);
    linear_forward<T>(a.u + b * f, a.xn2 + b * h, w.w3, m, h, f);
    swiglu_forward<T>(a.a + b * f, a.g + b * f, a.u + b * f, m, f);
  };
  DISTCA_RETURN_IF_ERROR(norm_gather_then<T>(tp, s, a.x_mid, w.ffn_norm, a.rstd2, a.xn2, h, gate_up));
  return row_parallel_residual<T>(tp, s, a.a, w.w2, f, h, a.x_mid, a.out);
}

template <class T>
Status tp_attention_out_mlp_backward(comm::Communicator& tp, const TpDims& d,
                                     const TpStep<T>& s, const TpLayerTensors<const T>& w,
                                     const TpLayerTensors<T>& g, const TpLayerActs<T>& a,
                                     T* dx, T* d_o) {
  const int64_t n = s.n, h = d.h, f = d.f();
  std::vector<T> dy_all, dxn_all(static_cast<size_t>(n * h)), da(static_cast<size_t>(n * f)), dg(da.size()),
      du(da.size());
  // Feed-forward block: dx holds d(out); the residual passes it to x_mid unchanged.
  auto down = [&](RowRange r) {
    const int64_t b = r.begin, m = r.size();
    linear_dx<T>(da.data() + b * f, dy_all.data() + b * h, w.w2, m, f, h, false);
    swiglu_backward<T>(dg.data() + b * f, du.data() + b * f, da.data() + b * f, a.g + b * f, a.u + b * f, m, f);
  };
  DISTCA_RETURN_IF_ERROR(gather_grad_then<T>(tp, s, dx, h, dy_all, down));
  auto gate_up = [&](RowRange r) {
    const int64_t b = r.begin, m = r.size();
    linear_dx<T>(dxn_all.data() + b * h, dg.data() + b * f, w.w1, m, h, f, false);
    linear_dx<T>(dxn_all.data() + b * h, du.data() + b * f, w.w3, m, h, f, true);
  };
  auto weights = [&] {
    linear_dw<T>(g.w2, dy_all.data(), a.a, n, f, h);
    linear_dw<T>(g.w1, dg.data(), a.xn2, n, h, f);
    linear_dw<T>(g.w3, du.data(), a.xn2, n, h, f);
  };
  DISTCA_RETURN_IF_ERROR(scatter_norm_backward<T>(tp, s, dxn_all.data(), gate_up, weights, a.x_mid, a.rstd2,
                                                  w.ffn_norm, g.ffn_norm, dx, h));
  // Attention output projection: dx now holds d(x_mid).
  auto out_proj = [&](RowRange r) {
    linear_dx<T>(d_o + r.begin * d.qd(), dy_all.data() + r.begin * h, w.wo, r.size(), d.qd(), h, false);
  };
  DISTCA_RETURN_IF_ERROR(gather_grad_then<T>(tp, s, dx, h, dy_all, out_proj));
  linear_dw<T>(g.wo, dy_all.data(), a.o, n, d.qd(), h);
  return Status::ok_status();
}

template <class T>
Status tp_attention_in_backward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                                const TpLayerTensors<const T>& w, const TpLayerTensors<T>& g,
                                const TpLayerActs<T>& a, T* dq, T* dk, const T* dv, T* dx) {
  const int64_t n = s.n, h = d.h, qd = d.qd(), kvd = d.kvd();
  std::vector<T> dxn_all(static_cast<size_t>(n * h));
  rope_apply<T>(dq, s.rope_cos, s.rope_sin, n, d.heads, d.hd, -1);
  rope_apply<T>(dk, s.rope_cos, s.rope_sin, n, d.kv_heads, d.hd, -1);
  auto qkv = [&](RowRange r) {
    const int64_t b = r.begin, m = r.size();
    linear_dx<T>(dxn_all.data() + b * h, dq + b * qd, w.wq, m, h, qd, false);
    linear_dx<T>(dxn_all.data() + b * h, dk + b * kvd, w.wk, m, h, kvd, true);
    linear_dx<T>(dxn_all.data() + b * h, dv + b * kvd, w.wv, m, h, kvd, true);
  };
  auto weights = [&] {
    linear_dw<T>(g.wq, dq, a.xn1, n, h, qd);
    linear_dw<T>(g.wk, dk, a.xn1, n, h, kvd);
    linear_dw<T>(g.wv, dv, a.xn1, n, h, kvd);
  };
  return scatter_norm_backward<T>(tp, s, dxn_all.data(), qkv, weights, a.x, a.rstd1, w.attn_norm,
                                  g.attn_norm, dx, h);
}

template <class T>
Status tp_embedding_forward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                            const T* emb, const int32_t* tokens, T* x) {
  std::vector<T> partial(static_cast<size_t>(s.n * d.h), T(0));
  for (int64_t t = 0; t < s.n; ++t) {
    const int64_t v = tokens[t];
    if (v >= d.vocab.begin && v < d.vocab.end) {
      std::copy_n(emb + (v - d.vocab.begin) * d.h, d.h, partial.data() + t * d.h);
    }
  }
  return scatter_parts<T>(tp, partial.data(), x, step_parts(s, tp.size()), d.h);
}

template <class T>
Status tp_embedding_backward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                             const int32_t* tokens, const T* dx, T* demb) {
  // Blocking: the rows' gradients are added to demb in row order (a token may repeat), so no
  // row can be added before the rows above it have arrived; nothing else to overlap with.
  std::vector<T> all;
  DISTCA_RETURN_IF_ERROR(gather_grad_then<T>(tp, s, dx, d.h, all, [](RowRange) {}));
  for (int64_t t = 0; t < s.n; ++t) {
    const int64_t v = tokens[t];
    if (v >= d.vocab.begin && v < d.vocab.end) {
      add_inplace<T>(demb + (v - d.vocab.begin) * d.h, all.data() + t * d.h, d.h);
    }
  }
  return Status::ok_status();
}

namespace {
// Every rank's (n, width) doubles, gathered: out (T, n, width) in rank order.
Status gather_row_figures(comm::Communicator& tp, const std::vector<double>& mine,
                          std::vector<double>& out) {
  out.assign(mine.size() * static_cast<size_t>(tp.size()), 0.0);
  return tp.all_gather(std::as_bytes(std::span<const double>(mine)),
                       std::as_writable_bytes(std::span<double>(out)));
}
}  // namespace

template <class T>
Status tp_vocab_cross_entropy_forward(comm::Communicator& tp, const TpDims& d, int64_t n,
                                      const T* logits, const int32_t* targets, T* loss,
                                      double* stats) {
  const int64_t vr = d.vocab.size();
  const auto un = static_cast<size_t>(n);
  // Round 1: the maximum over the whole vocabulary (max is exact in any order).
  std::vector<double> mine(un), all;
  for (int64_t t = 0; t < n; ++t) {
    double mx = -HUGE_VAL;
    for (int64_t j = 0; j < vr; ++j) mx = std::max(mx, static_cast<double>(logits[t * vr + j]));
    mine[static_cast<size_t>(t)] = mx;
  }
  DISTCA_RETURN_IF_ERROR(gather_row_figures(tp, mine, all));
  std::vector<double> mx(un, -HUGE_VAL);
  for (size_t p = 0; p < static_cast<size_t>(tp.size()); ++p) {
    for (size_t t = 0; t < un; ++t) mx[t] = std::max(mx[t], all[p * un + t]);
  }
  // Round 2: per row the sum of exp(logit - max) over the rank's columns and the target's
  // logit where the rank holds it (0 elsewhere), summed over ranks in rank order.
  mine.assign(2 * un, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const auto i = static_cast<size_t>(t);
    double sum = 0;
    for (int64_t j = 0; j < vr; ++j) sum += std::exp(static_cast<double>(logits[t * vr + j]) - mx[i]);
    mine[2 * i] = sum;
    const int64_t target = targets[t];
    DISTCA_CHECK(target >= -1);
    if (target >= d.vocab.begin && target < d.vocab.end) {
      mine[2 * i + 1] = static_cast<double>(logits[t * vr + target - d.vocab.begin]);
    }
  }
  DISTCA_RETURN_IF_ERROR(gather_row_figures(tp, mine, all));
  for (size_t t = 0; t < un; ++t) {
    double sum = all[2 * t], target = all[2 * t + 1];
    for (size_t p = 1; p < static_cast<size_t>(tp.size()); ++p) {
      sum += all[p * 2 * un + 2 * t];
      target += all[p * 2 * un + 2 * t + 1];
    }
    stats[2 * t] = mx[t];
    stats[2 * t + 1] = sum;
    loss[t] = targets[t] < 0 ? T(0) : static_cast<T>(mx[t] + std::log(sum) - target);
  }
  return Status::ok_status();
}

template <class T>
void tp_vocab_cross_entropy_backward(const TpDims& d, int64_t n, T* dlogits, const T* logits,
                                     const double* stats, const int32_t* targets, double scale) {
  const int64_t vr = d.vocab.size();
  for (int64_t t = 0; t < n; ++t) {
    const T* lt = logits + t * vr;
    T* dt = dlogits + t * vr;
    if (targets[t] < 0) {
      std::fill_n(dt, vr, T(0));
      continue;
    }
    const double mx = stats[2 * t], inv = 1.0 / stats[2 * t + 1];
    const int64_t target = targets[t] - d.vocab.begin;  // outside [0, vr) where another rank holds it
    for (int64_t j = 0; j < vr; ++j) {
      const double p = std::exp(static_cast<double>(lt[j]) - mx) * inv;
      dt[j] = static_cast<T>(scale * (p - (j == target ? 1.0 : 0.0)));
    }
  }
}

template <class T>
Status tp_head_forward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                       const T* final_norm, const T* lm_head, const TpHeadActs<T>& a,
                       const int32_t* targets) {
  const int64_t h = d.h, vr = d.vocab.size();
  auto logits = [&](RowRange r) {
    linear_forward<T>(a.logits + r.begin * vr, a.xn + r.begin * h, lm_head, r.size(), h, vr);
  };
  DISTCA_RETURN_IF_ERROR(norm_gather_then<T>(tp, s, a.x, final_norm, a.rstd, a.xn, h, logits));
  return tp_vocab_cross_entropy_forward<T>(tp, d, s.n, a.logits, targets, a.loss, a.stats);
}

template <class T>
Status tp_head_backward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                        const T* final_norm, const T* lm_head, T* g_final_norm, T* g_lm_head,
                        const TpHeadActs<T>& a, const int32_t* targets, double scale, T* dx) {
  tp_vocab_cross_entropy_backward<T>(d, s.n, a.logits, a.logits, a.stats, targets, scale);
  const int64_t h = d.h, vr = d.vocab.size();
  std::vector<T> dxn_all(static_cast<size_t>(s.n * h));
  auto rows = [&](RowRange r) {
    linear_dx<T>(dxn_all.data() + r.begin * h, a.logits + r.begin * vr, lm_head, r.size(), h, vr, false);
  };
  auto weights = [&] { linear_dw<T>(g_lm_head, a.logits, a.xn, s.n, h, vr); };
  std::fill_n(dx, tp_range_rows(s, tp.size(), tp.rank()).size() * h, T(0));
  return scatter_norm_backward<T>(tp, s, dxn_all.data(), rows, weights, a.x, a.rstd, final_norm, g_final_norm,
                                  dx, h);
}

#define DISTCA_MODEL_INSTANTIATE_TP(T)                                                         \
  template TpLayerTensors<T> tp_layer_tensors<T>(const TpDims&, T*);                          \
  template TpLayerTensors<const T> tp_layer_tensors<const T>(const TpDims&, const T*);        \
  template void tp_shard_layer<T>(const ModelSpec&, const TpDims&, const T*, T*);             \
  template void tp_unshard_layer<T>(const ModelSpec&, const TpDims&, const T*, T*);           \
  template void tp_shard_params<T>(const ModelSpec&, const TpDims&, const T*, T*);            \
  template void tp_unshard_params<T>(const ModelSpec&, const TpDims&, const T*, T*);          \
  template Status tp_all_gather_rows<T>(comm::Communicator&, T*, int64_t, int64_t);           \
  template Status tp_reduce_scatter_rows<T>(comm::Communicator&, const T*, T*, int64_t,       \
                                            int64_t);                                         \
  template Status tp_attention_in_forward<T>(comm::Communicator&, const TpDims&,              \
                                             const TpStep<T>&, const TpLayerTensors<const T>&, \
                                             const TpLayerActs<T>&);                          \
  template Status tp_attention_out_mlp_forward<T>(comm::Communicator&, const TpDims&,         \
                                                  const TpStep<T>&,                           \
                                                  const TpLayerTensors<const T>&,             \
                                                  const TpLayerActs<T>&);                     \
  template Status tp_attention_out_mlp_backward<T>(                                           \
      comm::Communicator&, const TpDims&, const TpStep<T>&, const TpLayerTensors<const T>&,   \
      const TpLayerTensors<T>&, const TpLayerActs<T>&, T*, T*);                               \
  template Status tp_attention_in_backward<T>(                                                \
      comm::Communicator&, const TpDims&, const TpStep<T>&, const TpLayerTensors<const T>&,   \
      const TpLayerTensors<T>&, const TpLayerActs<T>&, T*, T*, const T*, T*);                 \
  template RowRange tp_range_rows<T>(const TpStep<T>&, int, int);                             \
  template Status tp_embedding_forward<T>(comm::Communicator&, const TpDims&, const TpStep<T>&, \
                                          const T*, const int32_t*, T*);                      \
  template Status tp_embedding_backward<T>(comm::Communicator&, const TpDims&,                \
                                           const TpStep<T>&, const int32_t*, const T*, T*);   \
  template Status tp_vocab_cross_entropy_forward<T>(comm::Communicator&, const TpDims&,       \
                                                    int64_t, const T*, const int32_t*, T*,    \
                                                    double*);                                 \
  template void tp_vocab_cross_entropy_backward<T>(const TpDims&, int64_t, T*, const T*,      \
                                                   const double*, const int32_t*, double);    \
  template Status tp_head_forward<T>(comm::Communicator&, const TpDims&, const TpStep<T>&,    \
                                     const T*, const T*, const TpHeadActs<T>&,                \
                                     const int32_t*);                                         \
  template Status tp_head_backward<T>(comm::Communicator&, const TpDims&, const TpStep<T>&,   \
                                      const T*, const T*, T*, T*, const TpHeadActs<T>&,       \
                                      const int32_t*, double, T*);

DISTCA_MODEL_INSTANTIATE_TP(float)
DISTCA_MODEL_INSTANTIATE_TP(double)
#undef DISTCA_MODEL_INSTANTIATE_TP

}  // namespace distca::model
