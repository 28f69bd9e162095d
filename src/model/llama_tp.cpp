// Llama's tensor-parallel parts (llama.h, "Tensor parallelism"): the sharded initialisation,
// the layer phases through tensor_parallel.h, and the replicated gradients' sum.
#include <algorithm>
#include <cmath>
#include <vector>

#include "distca/core/rng.h"
#include "distca/model/llama.h"
#include "distca/model/tensor_parallel.h"
#include "llama_internal.h"

namespace distca::model {

// Tensor i of the full layout draws its values from Rng(seed, i) at its full size; a TP rank
// keeps its slice, so every T gives the same model.
template <class T>
void Llama<T>::init_params(uint64_t seed, size_t first_tensor) {
  const std::vector<TensorInfo> full = param_layout(spec_);
  const TpDims d = tp_dims(spec_, tp_size(), tp_rank());
  const double residual_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(spec_.n_layers));
  std::vector<T> values;
  for (size_t j = 0; j < layout_.size(); ++j) {
    const size_t i = first_tensor + j;  // the index in the full layout seeds the tensor
    const TensorInfo& t = layout_[j];
    T* p = params_.data() + t.offset;
    if (!t.decay) {  // norm gains
      std::fill(p, p + t.size(), T(1));
      continue;
    }
    const bool residual_out = t.name.ends_with(".wo") || t.name.ends_with(".w2");
    const double std_dev = options_.init_std * (residual_out ? residual_scale : 1.0);
    Rng rng(seed, i);
    values.resize(static_cast<size_t>(full[i].size()));
    for (T& e : values) e = static_cast<T>(std_dev * rng.normal());
    const TensorSlice s = tp_tensor_slice(full[i], d);
    for (int64_t r = 0; r < s.rows; ++r) {
      std::copy_n(values.data() + (s.row0 + r) * full[i].cols + s.col0, s.cols, p + r * s.cols);
    }
  }
}

// Sequence parallelism by the step's rows: a range's rows that fall in the rank's pieces of
// the step (tp_sp_pieces with the step's cut), the same rows tp_range_rows gives the layer
// functions (tp_step), so the owner of a row depends on the cut only, not on the ranges.
template <class T>
RowRange Llama<T>::own_rows(RowRange rows) const {
  if (tp_ == nullptr) return rows;
  TpStep<T> s;  // the rows only
  s.n = rows.size();
  s.total = cur().n;
  s.first = rows.begin;
  s.cut = cur().sp_cut;
  const RowRange r = tp_range_rows(s, tp_->size(), tp_->rank());
  return {rows.begin + r.begin, rows.begin + r.end};
}

template <class T>
int64_t Llama<T>::sp(int64_t row) const {
  if (tp_ == nullptr) return row;
  int64_t before = 0;
  for (const RowRange& own : tp_sp_pieces(cur().n, cur().sp_cut, tp_->size(), tp_->rank())) {
    before += std::clamp(row, own.begin, own.end) - own.begin;
  }
  return before;
}

template <class T>
int64_t Llama<T>::boundary_row_count() const {
  DISTCA_CHECK_MSG(cur().ready, "boundary_row_count without a successful begin_step");
  return sp(cur().n);
}

// The TP functions' view of layer `layer` for the range `rows`: the sequence-parallel buffers
// (x, rstd1, x_mid, rstd2, the output) at the rank's own rows of the range, the gathered and
// head-sharded ones at the range's first row.
template <class T>
TpLayerActs<T> Llama<T>::tp_layer_acts(int layer, RowRange rows) {
  const Widths w = widths_of(*this);
  const LayerActs a = layer_acts(layer);
  const int64_t b = rows.begin, o = sp(own_rows(rows).begin);
  T* next = layer + 1 < stage_.last ? layer_acts(layer + 1).x : final_acts().x;
  return {a.x + o * w.h,     a.rstd1 + o,       a.xn1 + b * w.h,   a.q + b * w.qd,
          a.k + b * w.kvd,   a.v + b * w.kvd,   a.o + b * w.qd,    a.x_mid + o * w.h,
          a.rstd2 + o,       a.xn2 + b * w.h,   a.g + b * w.f,     a.u + b * w.f,
          a.a + b * w.f,     next + o * w.h};
}

template <class T>
TpStep<T> Llama<T>::tp_step(RowRange rows) {
  const FinalActs f = final_acts();
  const int64_t half = spec_.head_dim / 2;
  return {rows.size(), f.rope_cos + rows.begin * half, f.rope_sin + rows.begin * half,
          options_.rms_eps, cur().n, rows.begin, cur().sp_cut, options_.tp_overlap};
}

namespace {
template <class T, class Ptrs>
TpLayerTensors<T> tensors_of(const Ptrs& p) {
  return {p.attn_norm, p.wq, p.wk, p.wv, p.wo, p.ffn_norm, p.w1, p.w3, p.w2};
}
}  // namespace

template <class T>
void Llama<T>::tp_forward_pre(int layer, RowRange rows) {
  if (!tp_status_.ok()) return;
  tp_status_ = tp_attention_in_forward<T>(*tp_, tp_dims(spec_, tp_size(), tp_rank()),
                                          tp_step(rows),
                                          tensors_of<const T>(layer_ptrs(params_.data(), layer)),
                                          tp_layer_acts(layer, rows));
}

template <class T>
void Llama<T>::tp_forward_post(int layer, RowRange rows) {
  if (!tp_status_.ok()) return;
  tp_status_ = tp_attention_out_mlp_forward<T>(
      *tp_, tp_dims(spec_, tp_size(), tp_rank()), tp_step(rows),
      tensors_of<const T>(layer_ptrs(params_.data(), layer)), tp_layer_acts(layer, rows));
}

template <class T>
void Llama<T>::tp_backward_post(int layer, RowRange rows) {
  if (!tp_status_.ok()) return;
  const Widths w = widths_of(*this);
  const Scratch s = scratch();
  tp_status_ = tp_attention_out_mlp_backward<T>(
      *tp_, tp_dims(spec_, tp_size(), tp_rank()), tp_step(rows),
      tensors_of<const T>(layer_ptrs(params_.data(), layer)),
      tensors_of<T>(layer_ptrs(grads_.data(), layer)), tp_layer_acts(layer, rows),
      s.dx + sp(own_rows(rows).begin) * w.h, s.d_o + rows.begin * w.qd);
}

template <class T>
void Llama<T>::tp_backward_pre(int layer, RowRange rows) {
  if (!tp_status_.ok()) return;
  const Widths w = widths_of(*this);
  const LayerAttentionIo<T> io = attention_io(layer);
  const int64_t b = rows.begin;
  tp_status_ = tp_attention_in_backward<T>(
      *tp_, tp_dims(spec_, tp_size(), tp_rank()), tp_step(rows),
      tensors_of<const T>(layer_ptrs(params_.data(), layer)),
      tensors_of<T>(layer_ptrs(grads_.data(), layer)), tp_layer_acts(layer, rows),
      io.dq + b * w.qd, io.dk + b * w.kvd, io.dv + b * w.kvd,
      scratch().dx + sp(own_rows(rows).begin) * w.h);
  if (layer != 0 || !tp_status_.ok()) return;
  tp_status_ = tp_embedding_backward<T>(*tp_, tp_dims(spec_, tp_size(), tp_rank()), tp_step(rows),
                                        cur().in.tokens.data() + b,
                                        scratch().dx + sp(own_rows(rows).begin) * w.h,
                                        grads_.data() + layout_[0].offset);
}

// One reduce-scatter per side of the sequence cut (a range may not cross it).
template <class T>
Status Llama<T>::tp_embed() {
  const int64_t n = cur().n, cut = cur().sp_cut;
  const bool has_cut = cut > 0 && cut < n;
  for (const RowRange rows : {RowRange{0, has_cut ? cut : n}, RowRange{has_cut ? cut : n, n}}) {
    if (rows.size() == 0) continue;
    tp_status_ = tp_embedding_forward<T>(
        *tp_, tp_dims(spec_, tp_size(), tp_rank()), tp_step(rows),
        params_.data() + layout_[0].offset, cur().in.tokens.data() + rows.begin,
        layer_acts(0).x + sp(own_rows(rows).begin) * widths_of(*this).h);
    if (!tp_status_.ok()) break;
  }
  return tp_status_;
}

// The final block's buffers for the range `rows`: the rank's own rows of x and rstd, every
// row of the gathered norm output, the logits (its vocabulary columns), the statistics and
// the per-token loss.
template <class T>
TpHeadActs<T> Llama<T>::tp_head_acts(RowRange rows) {
  const Widths w = widths_of(*this);
  const FinalActs f = final_acts();
  const int64_t b = rows.begin, o = sp(own_rows(rows).begin);
  return {f.x + o * w.h, f.rstd + o, f.xn + b * w.h, f.logits + b * w.v,
          stats_.data() + 2 * (slot_ * max_tokens_ + b), loss_.data() + slot_ * max_tokens_ + b};
}

template <class T>
void Llama<T>::tp_forward_head(RowRange rows) {
  const size_t last = layout_.size() - 1;
  tp_status_ = tp_head_forward<T>(*tp_, tp_dims(spec_, tp_size(), tp_rank()), tp_step(rows),
                                  params_.data() + layout_[last - 1].offset,
                                  params_.data() + layout_[last].offset, tp_head_acts(rows),
                                  cur().in.targets.data() + rows.begin);
}

template <class T>
void Llama<T>::tp_backward_head(RowRange rows, double grad_scale) {
  const size_t last = layout_.size() - 1;
  const Widths w = widths_of(*this);
  tp_status_ = tp_head_backward<T>(
      *tp_, tp_dims(spec_, tp_size(), tp_rank()), tp_step(rows),
      params_.data() + layout_[last - 1].offset, params_.data() + layout_[last].offset,
      grads_.data() + layout_[last - 1].offset, grads_.data() + layout_[last].offset,
      tp_head_acts(rows), cur().in.targets.data() + rows.begin, grad_scale,
      scratch().dx + sp(own_rows(rows).begin) * w.h);
}

template <class T>
Status Llama<T>::sync_replicated_grads() {
  if (tp_ == nullptr) return Status::ok_status();
  DISTCA_RETURN_IF_ERROR(tp_status_);
  // One all-reduce over the replicated tensors, packed in layout order.
  std::vector<T> packed;
  for (const TensorInfo& t : layout_) {
    if (!tp_sharded(t)) packed.insert(packed.end(), grads_.begin() + t.offset, grads_.begin() + t.offset + t.size());
  }
  DISTCA_RETURN_IF_ERROR(tp_->all_reduce_sum(std::span<T>(packed)));
  auto it = packed.begin();
  for (const TensorInfo& t : layout_) {
    if (tp_sharded(t)) continue;
    std::copy_n(it, t.size(), grads_.begin() + t.offset);
    it += t.size();
  }
  return Status::ok_status();
}

template class Llama<float>;
template class Llama<double>;

}  // namespace distca::model
