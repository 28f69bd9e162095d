#include "distca/model/llama.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <utility>


#include "distca/core/rng.h"
#include "distca/model/layers.h"
#include "llama_internal.h"

namespace distca::model {
namespace {

constexpr size_t kTensorsPerLayer = 9;

// The indices [begin, end) of a stage's tensors in param_layout.
std::pair<size_t, size_t> stage_tensors(const ModelSpec& spec, StageRange st) {
  const auto layer0 = [](int64_t l) { return 1 + static_cast<size_t>(l) * kTensorsPerLayer; };
  const size_t begin = st.has_embedding() ? 0 : layer0(st.first);
  const size_t end = st.has_head(spec.n_layers) ? layer0(spec.n_layers) + 2 : layer0(st.last);
  return {begin, end};
}

Status check_stage(const ModelSpec& spec, StageRange st) {
  if (st.first < 0 || st.first >= st.last || st.last > spec.n_layers) {
    return Status::invalid_argument("stage: layers [" + std::to_string(st.first) + ", " +
                                    std::to_string(st.last) + ") must satisfy 0 <= first < "
                                    "last <= n_layers (" + std::to_string(spec.n_layers) + ")");
  }
  return Status::ok_status();
}

template <class T>
void add_inplace(T* y, const T* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

}  // namespace

Status LlamaOptions::validate() const {
  if (!(rope_theta > 1.0) || !std::isfinite(rope_theta)) {
    return Status::invalid_argument("rope_theta must be a finite number > 1");
  }
  if (!(rms_eps > 0.0) || !std::isfinite(rms_eps)) {
    return Status::invalid_argument("rms_eps must be a finite positive number");
  }
  if (!(init_std > 0.0) || !std::isfinite(init_std)) {
    return Status::invalid_argument("init_std must be a finite positive number");
  }
  return Status::ok_status();
}

std::vector<TensorInfo> param_layout(const ModelSpec& spec) {
  DISTCA_CHECK(spec.validate().ok());
  const int64_t h = spec.hidden, qd = spec.q_dim(), kvd = spec.kv_dim(), f = spec.ffn;
  std::vector<TensorInfo> out;
  int64_t offset = 0;
  auto add = [&](std::string name, int64_t rows, int64_t cols, bool decay) {
    out.push_back({std::move(name), offset, rows, cols, decay});
    offset += rows * cols;
  };
  add("embedding", spec.vocab, h, true);
  for (int64_t l = 0; l < spec.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "attn_norm", 1, h, false);
    add(p + "wq", qd, h, true);
    add(p + "wk", kvd, h, true);
    add(p + "wv", kvd, h, true);
    add(p + "wo", h, qd, true);
    add(p + "ffn_norm", 1, h, false);
    add(p + "w1", f, h, true);
    add(p + "w3", f, h, true);
    add(p + "w2", h, f, true);
  }
  add("final_norm", 1, h, false);
  add("lm_head", spec.vocab, h, true);
  return out;
}

namespace {
// Parameters of one layer in the layout above: attn_norm, wq, wk, wv, wo, ffn_norm, w1, w3, w2.
// In closed form (as stage_memory's), so that sizing a model never builds its per-layer table.
int64_t layer_params(const ModelSpec& s) {
  const int64_t h = s.hidden, qd = s.q_dim(), kvd = s.kv_dim(), f = s.ffn;
  return h + qd * h + 2 * kvd * h + h * qd + h + 3 * f * h;
}
}  // namespace

int64_t param_count(const ModelSpec& spec) {
  DISTCA_CHECK(spec.validate().ok());
  // embedding, the layers, final_norm, lm_head
  return spec.vocab * spec.hidden + spec.n_layers * layer_params(spec) + spec.hidden + spec.vocab * spec.hidden;
}

RowRange even_split(int64_t total, int64_t parts, int64_t index) {
  DISTCA_CHECK(0 <= index && index < parts && total >= 0);
  const int64_t base = total / parts, extra = total % parts;
  const int64_t first = index * base + std::min(index, extra);
  return {first, first + base + (index < extra ? 1 : 0)};
}

StageRange stage_layers(int64_t n_layers, int64_t p, int64_t s) {
  DISTCA_CHECK(p <= n_layers);
  const RowRange r = even_split(n_layers, p, s);
  return {r.begin, r.end};
}

ModelMemory stage_memory(const ModelSpec& spec, StageRange stage, int64_t slots,
                         int64_t bytes_per_element, int64_t tp) {
  DISTCA_CHECK(check_stage(spec, stage).ok() && slots >= 1);
  const TpDims d = tp_dims(spec, tp, 0);  // rank 0 has the largest ffn share
  const Widths w(spec, d);
  const bool head = stage.has_head(spec.n_layers);
  ModelMemory m;
  // The stage's range of the layout, in closed form: the embedding on the first stage, its
  // layers, final_norm and lm_head on the last.
  const int64_t per_layer = tp == 1 ? layer_params(spec) : d.layer_params();
  const int64_t vocab_rows = d.vocab.size();  // TP: the rank's rows of the embedding and head
  const int64_t params = (stage.has_embedding() ? vocab_rows * spec.hidden : 0) + stage.size() * per_layer +
                         (head ? spec.hidden + vocab_rows * spec.hidden : 0);
  m.param_bytes = params * bytes_per_element;
  // + 1 with the head: the per-token loss; TP + 2 x 8 bytes more: the cross-entropy's per-row
  // maximum and sum (double).
  const int64_t loss_width = head ? (tp == 1 ? 1 : 1 + 16 / bytes_per_element) : 0;
  // The sequence-parallel regions hold a TP rank's rows: 1/T of them per token (rounded up).
  auto share = [tp](int64_t width) { return (width + tp - 1) / tp; };
  m.saved_activation_bytes_per_token =
      (stage.size() * (share(w.layer_sp()) + w.layer_rows()) + share(w.final_sp(head)) + w.final_rows(head) + loss_width) *
      bytes_per_element;
  // TP: the layer functions' temporaries (tensor_parallel.cpp) at their largest, in the
  // feed-forward backward: the gathered d(out) (n, h) and the partial d(xn) (n, h) beside it
  // (the overlapped reduce-scatter computes d(w2) from d(out) while d(xn) travels), the
  // reduce-scatter's receive buffer (about (n, h)) and output (n_r, h), da, dg, du (n, f_r).
  const int64_t tp_temps = tp == 1 ? 0 : 3 * w.h + share(w.h) + 3 * w.f;
  m.scratch_bytes_per_token = (share(w.h) + w.scratch_rows() + tp_temps) * bytes_per_element;
  m.slots = slots;
  return m;
}

ModelMemory model_memory(const ModelSpec& spec, int64_t bytes_per_element, int64_t tp) {
  return stage_memory(spec, {0, spec.n_layers}, 1, bytes_per_element, tp);
}

template <class T>
typename Llama<T>::LayerPtrs Llama<T>::layer_ptrs(T* base, int64_t layer) const {
  // The index of the layer's attn_norm in layout_.
  const size_t first = (has_embedding() ? 1 : 0) +
                       static_cast<size_t>(layer - stage_.first) * kTensorsPerLayer;
  auto at = [&](size_t i) { return base + layout_[first + i].offset; };
  return {at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8)};
}

template <class T>
int64_t Llama<T>::layer_elems() const {
  const Widths w = widths_of(*this);
  return w.layer_sp() * sp_rows_ + w.layer_rows() * max_tokens_;
}

template <class T>
typename Llama<T>::LayerActs Llama<T>::layer_acts(int64_t layer) {
  const Widths w = widths_of(*this);
  T* p = acts_.data() + slot_ * slot_elems_ + (layer - stage_.first) * layer_elems();
  auto take = [&](int64_t width, int64_t rows) {
    T* r = p;
    p += width * rows;
    return r;
  };
  const int64_t m = max_tokens_, sp = sp_rows_;
  // The regions in workspace order: field, width, rows (sp: the sequence-parallel ones).
  struct Region {
    T* LayerActs::*field;
    int64_t width, rows;
  };
  LayerActs a;
  for (const Region& r : {Region{&LayerActs::x, w.h, sp}, Region{&LayerActs::rstd1, 1, sp},
                          Region{&LayerActs::xn1, w.h, m}, Region{&LayerActs::q, w.qd, m},
                          Region{&LayerActs::k, w.kvd, m}, Region{&LayerActs::v, w.kvd, m},
                          Region{&LayerActs::o, w.qd, m}, Region{&LayerActs::x_mid, w.h, sp},
                          Region{&LayerActs::rstd2, 1, sp}, Region{&LayerActs::xn2, w.h, m},
                          Region{&LayerActs::g, w.f, m}, Region{&LayerActs::u, w.f, m},
                          Region{&LayerActs::a, w.f, m}}) {
    a.*r.field = take(r.width, r.rows);
  }
  return a;
}

template <class T>
typename Llama<T>::FinalActs Llama<T>::final_acts() {
  const Widths w = widths_of(*this);
  FinalActs f;
  f.x = acts_.data() + slot_ * slot_elems_ + stage_.size() * layer_elems();
  if (has_head()) {
    f.rstd = f.x + w.h * sp_rows_;
    f.xn = f.rstd + sp_rows_;
    f.logits = f.xn + w.h * max_tokens_;
    f.rope_cos = f.logits + w.v * max_tokens_;
  } else {
    f.rstd = f.xn = f.logits = nullptr;
    f.rope_cos = f.x + w.h * sp_rows_;
  }
  f.rope_sin = f.rope_cos + (w.hd / 2) * max_tokens_;
  return f;
}

template <class T>
typename Llama<T>::Scratch Llama<T>::scratch() {
  const Widths w = widths_of(*this);
  T* p = scratch_.data();
  auto take = [&](int64_t width) {
    T* r = p;
    p += width * max_tokens_;
    return r;
  };
  Scratch s;
  s.dx = p;
  p += w.h * sp_rows_;
  s.dxn = w.tp ? nullptr : take(w.h);
  s.dq = take(w.qd);
  s.dk[0] = take(w.kvd);
  s.dv[0] = take(w.kvd);
  s.d_o = take(w.qd);
  s.dg = w.tp ? nullptr : take(w.f);
  s.du = w.tp ? nullptr : take(w.f);
  s.da = w.tp ? nullptr : take(w.f);
  // The odd layers' set last, so the even set keeps the offsets of the one-set layout.
  s.dk[1] = take(w.kvd);
  s.dv[1] = take(w.kvd);
  return s;
}

template <class T>
Result<Llama<T>> Llama<T>::create(const ModelSpec& spec, int64_t max_tokens, uint64_t seed,
                                  const LlamaOptions& options, std::optional<StageRange> stage,
                                  int64_t slots, comm::Communicator* tp) {
  DISTCA_RETURN_IF_ERROR(spec.validate());
  if (tp != nullptr) DISTCA_RETURN_IF_ERROR(check_tp(spec, tp->size()));
  if (spec.head_dim % 2 != 0) {
    return Status::invalid_argument("head_dim must be even for rotary embedding (got " +
                                    std::to_string(spec.head_dim) + ")");
  }
  if (max_tokens <= 0) return Status::invalid_argument("max_tokens must be positive");
  DISTCA_RETURN_IF_ERROR(options.validate());
  const StageRange st = stage.value_or(StageRange{0, spec.n_layers});
  DISTCA_RETURN_IF_ERROR(check_stage(spec, st));
  if (slots < 1 || slots > INT_MAX) {
    return Status::invalid_argument("slots must be in [1, INT_MAX] (got " +
                                    std::to_string(slots) + ")");
  }
  // Every matrix product must fit BLAS's 32-bit sizes: the largest operands are the logits
  // (max_tokens, vocab) and the widest activations (max_tokens, max width).
  const int64_t widest = std::max({spec.hidden, spec.q_dim(), spec.kv_dim(), spec.ffn, spec.vocab});
  if (widest > INT_MAX / max_tokens) {
    return Status::invalid_argument("max_tokens (" + std::to_string(max_tokens) +
                                    ") times the widest layer (" + std::to_string(widest) +
                                    ") exceeds the BLAS int range");
  }
  Llama m;
  m.spec_ = spec;
  m.options_ = options;
  m.max_tokens_ = max_tokens;
  m.stage_ = st;
  m.tp_ = tp;
  const std::vector<TensorInfo> full =
      tp == nullptr ? param_layout(spec) : tp_param_layout(spec, tp->size(), tp->rank());
  const auto [first_tensor, end_tensor] = stage_tensors(spec, st);
  m.param_offset_ = full[first_tensor].offset;
  for (size_t i = first_tensor; i < end_tensor; ++i) {
    m.layout_.push_back(full[i]);
    m.layout_.back().offset -= m.param_offset_;
  }
  const int64_t count = m.layout_.back().offset + m.layout_.back().size();
  const Widths w = widths_of(m);
  const bool head = st.has_head(spec.n_layers);
  m.params_.assign(static_cast<size_t>(count), T(0));
  m.grads_.assign(static_cast<size_t>(count), T(0));
  // A TP rank's sequence-parallel rows: at most ceil(max_tokens / T) of a step (tp_rows).
  m.sp_rows_ = tp == nullptr ? max_tokens : (max_tokens + tp->size() - 1) / tp->size();
  m.slot_elems_ = st.size() * m.layer_elems() + w.final_sp(head) * m.sp_rows_ + w.final_rows(head) * max_tokens;
  m.acts_.assign(static_cast<size_t>(slots * m.slot_elems_), T(0));
  m.scratch_.assign(static_cast<size_t>(w.h * m.sp_rows_ + w.scratch_rows() * max_tokens), T(0));
  if (head) m.loss_.assign(static_cast<size_t>(slots * max_tokens), T(0));
  if (head && tp != nullptr) m.stats_.assign(static_cast<size_t>(2 * slots * max_tokens), 0.0);
  m.slot_state_.assign(static_cast<size_t>(slots), SlotState{});

  m.init_params(seed, first_tensor);
  return m;
}

template <class T>
const TensorInfo& Llama<T>::tensor(const std::string& name) const {
  for (const TensorInfo& t : layout_) {
    if (t.name == name) return t;
  }
  DISTCA_CHECK_MSG(false, "no tensor named " + name);
  return layout_.front();  // unreachable
}

template <class T>
void Llama<T>::zero_grads() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template <class T>
Status Llama<T>::check_inputs(const StepInputs& in, std::span<T> per_token_loss) const {
  const auto n = static_cast<int64_t>(in.tokens.size());
  if (n > max_tokens_) {
    return Status::invalid_argument("tokens: " + std::to_string(n) + " exceed max_tokens " +
                                    std::to_string(max_tokens_));
  }
  if (static_cast<int64_t>(in.positions.size()) != n) {
    return Status::invalid_argument("positions: size differs from tokens");
  }
  if (static_cast<int64_t>(in.targets.size()) != n) {
    return Status::invalid_argument("targets: size differs from tokens");
  }
  if (!in.report_weights.empty() && static_cast<int64_t>(in.report_weights.size()) != n) {
    return Status::invalid_argument("report_weights: size differs from tokens");
  }
  if (!per_token_loss.empty() && static_cast<int64_t>(per_token_loss.size()) != n) {
    return Status::invalid_argument("per_token_loss: size differs from tokens");
  }
  for (int64_t t = 0; t < n; ++t) {
    const auto i = static_cast<size_t>(t);
    if (in.tokens[i] < 0 || in.tokens[i] >= spec_.vocab) {
      return Status::invalid_argument("tokens[" + std::to_string(t) + "] = " +
                                      std::to_string(in.tokens[i]) + " outside [0, vocab " +
                                      std::to_string(spec_.vocab) + ")");
    }
    if (in.positions[i] < 0) {
      return Status::invalid_argument("positions[" + std::to_string(t) + "] is negative");
    }
    if (in.targets[i] < -1 || in.targets[i] >= spec_.vocab) {
      return Status::invalid_argument("targets[" + std::to_string(t) + "] = " +
                                      std::to_string(in.targets[i]) + " outside [-1, vocab " +
                                      std::to_string(spec_.vocab) + ")");
    }
  }
  return Status::ok_status();
}

template <class T>
Status Llama<T>::check_executor(const BasicAttentionExecutor<T>& executor, int64_t n) const {
  const AttentionShape s = executor.shape();
  if (s.n_heads != spec_.n_heads / tp_size() || s.n_kv_heads != spec_.n_kv_heads / tp_size() ||
      s.head_dim != spec_.head_dim) {
    return Status::invalid_argument("attention executor heads (" + std::to_string(s.n_heads) +
                                    ", " + std::to_string(s.n_kv_heads) + ", " +
                                    std::to_string(s.head_dim) + ") differ from the model's (the TP rank's)");
  }
  if (s.n_tokens != n) {
    return Status::invalid_argument("attention executor is set up for " +
                                    std::to_string(s.n_tokens) + " tokens, the step has " +
                                    std::to_string(n));
  }
  return Status::ok_status();
}

template <class T>
Status Llama<T>::start_step(const StepInputs& in, std::span<T> per_token_loss,
                            const BasicAttentionExecutor<T>* executor, double grad_scale,
                            int slot, int64_t sp_cut) {
  if (slot < 0 || slot >= slots()) {
    return Status::invalid_argument("slot " + std::to_string(slot) + " outside [0, slots " +
                                    std::to_string(slots()) + ")");
  }
  slot_ = slot;
  SlotState& st = cur();
  st.ready = false;
  const auto n = static_cast<int64_t>(in.tokens.size());
  DISTCA_RETURN_IF_ERROR(check_inputs(in, per_token_loss));
  if (!has_head() && !per_token_loss.empty()) {
    return Status::invalid_argument("per_token_loss: a stage without the head has no loss");
  }
  if (executor != nullptr) DISTCA_RETURN_IF_ERROR(check_executor(*executor, n));
  if (!std::isfinite(grad_scale)) return Status::invalid_argument("grad_scale must be finite");
  st.in = in;
  st.per_token_loss = per_token_loss;
  st.n = n;
  st.sp_cut = tp_ == nullptr ? 0 : sp_cut;
  st.loss = StepLoss{};

  const Widths w = widths_of(*this);
  const FinalActs f = final_acts();
  rope_tables<T>(f.rope_cos, f.rope_sin, in.positions.data(), n, w.hd, options_.rope_theta);
  if (has_embedding() && tp_ != nullptr) {
    DISTCA_RETURN_IF_ERROR(tp_embed());
  } else if (has_embedding()) {
    // Embedding lookup into layer 0's residual input.
    const T* emb = params_.data() + layout_[0].offset;  // (vocab, h)
    T* x0 = layer_acts(0).x;                           // (n, h)
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(emb + in.tokens[static_cast<size_t>(t)] * w.h, w.h, x0 + t * w.h);
    }
  }
  st.ready = true;
  return Status::ok_status();
}

template <class T>
Status Llama<T>::begin_step(const StepInputs& in, std::span<T> per_token_loss, int slot,
                            int64_t sp_cut) {
  return start_step(in, per_token_loss, nullptr, 0.0, slot, sp_cut);
}

template <class T>
void Llama<T>::select_slot(int slot) {
  DISTCA_CHECK(slot >= 0 && slot < slots());
  DISTCA_CHECK_MSG(slot_state_[static_cast<size_t>(slot)].ready,
                   "select_slot of a slot without a successful begin_step");
  slot_ = slot;
}

template <class T>
T* Llama<T>::stage_input() {
  DISTCA_CHECK_MSG(!has_embedding(), "stage_input on the stage with the embedding");
  DISTCA_CHECK_MSG(cur().ready, "stage_input without a successful begin_step");
  return layer_acts(stage_.first).x;
}

template <class T>
const T* Llama<T>::stage_output() {
  DISTCA_CHECK_MSG(!has_head(), "stage_output on the stage with the head");
  DISTCA_CHECK_MSG(cur().ready, "stage_output without a successful begin_step");
  return final_acts().x;
}

template <class T>
T* Llama<T>::stage_output_grad() {
  DISTCA_CHECK_MSG(!has_head(), "stage_output_grad on the stage with the head");
  DISTCA_CHECK_MSG(cur().ready, "stage_output_grad without a successful begin_step");
  return scratch().dx;
}

template <class T>
const T* Llama<T>::stage_input_grad() {
  DISTCA_CHECK_MSG(!has_embedding(), "stage_input_grad on the stage with the embedding");
  DISTCA_CHECK_MSG(cur().ready, "stage_input_grad without a successful begin_step");
  return scratch().dx;
}

template <class T>
LayerAttentionIo<T> Llama<T>::attention_io(int layer) {
  DISTCA_CHECK(layer >= stage_.first && layer < stage_.last);
  const LayerActs a = layer_acts(layer);
  const Scratch s = scratch();
  const int parity = layer % 2;
  return {a.q, a.k, a.v, a.o, s.d_o, s.dq, s.dk[parity], s.dv[parity]};
}

template <class T>
void Llama<T>::check_rows(RowRange rows) const {
  DISTCA_CHECK_MSG(cur().ready, "a phase of a step without a successful begin_step");
  DISTCA_CHECK(rows.begin >= 0 && rows.begin <= rows.end && rows.end <= cur().n);
}

template <class T>
void Llama<T>::check_phase(int layer, RowRange rows) const {
  check_rows(rows);
  DISTCA_CHECK_MSG(layer >= stage_.first && layer < stage_.last, "layer outside the stage");
}

// In every phase: b is the first row, m the row count, and each buffer is offset by b rows.
template <class T>
void Llama<T>::forward_pre(int layer, RowRange rows) {
  check_phase(layer, rows);
  if (tp_ != nullptr) return tp_forward_pre(layer, rows);
  const Widths w = widths_of(*this);
  const int64_t b = rows.begin, m = rows.size();
  const LayerPtrs p = layer_ptrs(params_.data(), layer);
  const LayerActs a = layer_acts(layer);
  const FinalActs f = final_acts();
  T* q = a.q + b * w.qd;
  T* k = a.k + b * w.kvd;
  T* xn1 = a.xn1 + b * w.h;
  rmsnorm_forward<T>(xn1, a.rstd1 + b, a.x + b * w.h, p.attn_norm, m, w.h, options_.rms_eps);
  linear_forward<T>(q, xn1, p.wq, m, w.h, w.qd);
  linear_forward<T>(k, xn1, p.wk, m, w.h, w.kvd);
  linear_forward<T>(a.v + b * w.kvd, xn1, p.wv, m, w.h, w.kvd);
  const T* cos_t = f.rope_cos + b * (w.hd / 2);
  const T* sin_t = f.rope_sin + b * (w.hd / 2);
  rope_apply<T>(q, cos_t, sin_t, m, spec_.n_heads, w.hd, +1);
  rope_apply<T>(k, cos_t, sin_t, m, spec_.n_kv_heads, w.hd, +1);
}

template <class T>
void Llama<T>::forward_post(int layer, RowRange rows) {
  check_phase(layer, rows);
  if (tp_ != nullptr) return tp_forward_post(layer, rows);
  const Widths w = widths_of(*this);
  const int64_t b = rows.begin, m = rows.size();
  const LayerPtrs p = layer_ptrs(params_.data(), layer);
  const LayerActs a = layer_acts(layer);
  T* x_mid = a.x_mid + b * w.h;
  T* xn2 = a.xn2 + b * w.h;
  T* g = a.g + b * w.f;
  T* u = a.u + b * w.f;
  T* act = a.a + b * w.f;
  linear_forward<T>(x_mid, a.o + b * w.qd, p.wo, m, w.qd, w.h);
  add_inplace<T>(x_mid, a.x + b * w.h, m * w.h);
  rmsnorm_forward<T>(xn2, a.rstd2 + b, x_mid, p.ffn_norm, m, w.h, options_.rms_eps);
  linear_forward<T>(g, xn2, p.w1, m, w.h, w.f);
  linear_forward<T>(u, xn2, p.w3, m, w.h, w.f);
  swiglu_forward<T>(act, g, u, m, w.f);
  T* next = (layer + 1 < stage_.last ? layer_acts(layer + 1).x : final_acts().x) + b * w.h;
  linear_forward<T>(next, act, p.w2, m, w.f, w.h);
  add_inplace<T>(next, x_mid, m * w.h);
}

template <class T>
void Llama<T>::forward_head(RowRange all_rows) {
  check_rows(all_rows);
  if (!tp_status_.ok()) return;
  const RowRange rows = own_rows(all_rows);  // TP: the rank's rows only
  DISTCA_CHECK_MSG(has_head(), "forward_head on a stage without the head");
  const int64_t b = rows.begin, m = rows.size();
  T* loss = loss_.data() + slot_ * max_tokens_;  // (n)
  if (tp_ != nullptr) {
    tp_forward_head(all_rows);
    if (!tp_status_.ok()) return;
  } else {
    const Widths w = widths_of(*this);
    const FinalActs f = final_acts();
    const TensorInfo& final_norm = layout_[layout_.size() - 2];
    const TensorInfo& lm_head = layout_.back();
    T* xn = f.xn + b * w.h;
    T* logits = f.logits + b * w.v;
    rmsnorm_forward<T>(xn, f.rstd + b, f.x + b * w.h, params_.data() + final_norm.offset, m, w.h,
                       options_.rms_eps);
    linear_forward<T>(logits, xn, params_.data() + lm_head.offset, m, w.h, w.v);
    cross_entropy_forward<T>(loss + b, logits, cur().in.targets.data() + b, m, w.v);
  }
  // The rows' sums first (in row order, as cross_entropy_forward's total), then added to the
  // step's: one range [0, n) gives the bits of a single sum over the step.
  SlotState& st = cur();
  StepLoss part;
  for (int64_t t = b; t < rows.end; ++t) {
    const auto i = static_cast<size_t>(t);
    if (st.in.targets[i] < 0) continue;
    part.loss_sum += static_cast<double>(loss[t]);
    ++part.count;
    if (!st.in.report_weights.empty()) {
      part.report_sum += static_cast<double>(st.in.report_weights[i]) * loss[i];
      part.report_weight += st.in.report_weights[i];
    }
  }
  st.loss.loss_sum += part.loss_sum;
  st.loss.count += part.count;
  st.loss.report_sum += part.report_sum;
  st.loss.report_weight += part.report_weight;
  if (!st.per_token_loss.empty()) std::copy_n(loss + b, m, st.per_token_loss.data() + b);
}

template <class T>
void Llama<T>::backward_head(RowRange all_rows, double grad_scale) {
  check_rows(all_rows);
  if (!tp_status_.ok()) return;
  DISTCA_CHECK_MSG(has_head(), "backward_head on a stage without the head");
  DISTCA_CHECK(std::isfinite(grad_scale));
  if (tp_ != nullptr) return tp_backward_head(all_rows, grad_scale);
  const RowRange rows = all_rows;
  const Widths w = widths_of(*this);
  const int64_t b = rows.begin, m = rows.size();
  const FinalActs f = final_acts();
  const Scratch s = scratch();
  const TensorInfo& final_norm = layout_[layout_.size() - 2];
  const TensorInfo& lm_head = layout_.back();
  T* logits = f.logits + b * w.v;
  T* dxn = s.dxn + b * w.h;
  T* dx = s.dx + b * w.h;
  // Loss -> logits (in place) -> final norm.
  cross_entropy_backward<T>(logits, logits, cur().in.targets.data() + b, m, w.v, grad_scale);
  linear_backward<T>(dxn, grads_.data() + lm_head.offset, logits, f.xn + b * w.h,
                     params_.data() + lm_head.offset, m, w.h, w.v, false);
  std::fill_n(dx, m * w.h, T(0));
  rmsnorm_backward<T>(dx, grads_.data() + final_norm.offset, dxn, f.x + b * w.h, f.rstd + b,
                      params_.data() + final_norm.offset, m, w.h);
}

template <class T>
void Llama<T>::backward_post(int layer, RowRange rows) {
  check_phase(layer, rows);
  if (tp_ != nullptr) return tp_backward_post(layer, rows);
  const Widths w = widths_of(*this);
  const int64_t b = rows.begin, m = rows.size();
  const LayerPtrs p = layer_ptrs(params_.data(), layer);
  const LayerPtrs gp = layer_ptrs(grads_.data(), layer);
  const LayerActs a = layer_acts(layer);
  const Scratch s = scratch();
  T* dx = s.dx + b * w.h;
  T* dxn = s.dxn + b * w.h;
  T* da = s.da + b * w.f;
  T* dg = s.dg + b * w.f;
  T* du = s.du + b * w.f;
  const T* xn2 = a.xn2 + b * w.h;
  // dx holds d(layer output); the residual passes it to x_mid unchanged.
  linear_backward<T>(da, gp.w2, dx, a.a + b * w.f, p.w2, m, w.f, w.h, false);
  swiglu_backward<T>(dg, du, da, a.g + b * w.f, a.u + b * w.f, m, w.f);
  linear_backward<T>(dxn, gp.w1, dg, xn2, p.w1, m, w.h, w.f, false);
  linear_backward<T>(dxn, gp.w3, du, xn2, p.w3, m, w.h, w.f, true);
  rmsnorm_backward<T>(dx, gp.ffn_norm, dxn, a.x_mid + b * w.h, a.rstd2 + b, p.ffn_norm, m, w.h);
  // dx now holds d(x_mid); the residual passes it to x unchanged.
  linear_backward<T>(s.d_o + b * w.qd, gp.wo, dx, a.o + b * w.qd, p.wo, m, w.qd, w.h, false);
}

template <class T>
void Llama<T>::backward_pre(int layer, RowRange rows) {
  check_phase(layer, rows);
  if (tp_ != nullptr) return tp_backward_pre(layer, rows);
  const Widths w = widths_of(*this);
  const int64_t b = rows.begin, m = rows.size();
  const LayerPtrs p = layer_ptrs(params_.data(), layer);
  const LayerPtrs gp = layer_ptrs(grads_.data(), layer);
  const LayerActs a = layer_acts(layer);
  const FinalActs f = final_acts();
  const LayerAttentionIo<T> io = attention_io(layer);
  const Scratch s = scratch();
  T* dq = io.dq + b * w.qd;
  T* dk = io.dk + b * w.kvd;
  T* dx = s.dx + b * w.h;
  T* dxn = s.dxn + b * w.h;
  const T* xn1 = a.xn1 + b * w.h;
  const T* cos_t = f.rope_cos + b * (w.hd / 2);
  const T* sin_t = f.rope_sin + b * (w.hd / 2);
  rope_apply<T>(dq, cos_t, sin_t, m, spec_.n_heads, w.hd, -1);
  rope_apply<T>(dk, cos_t, sin_t, m, spec_.n_kv_heads, w.hd, -1);
  linear_backward<T>(dxn, gp.wq, dq, xn1, p.wq, m, w.h, w.qd, false);
  linear_backward<T>(dxn, gp.wk, dk, xn1, p.wk, m, w.h, w.kvd, true);
  linear_backward<T>(dxn, gp.wv, io.dv + b * w.kvd, xn1, p.wv, m, w.h, w.kvd, true);
  rmsnorm_backward<T>(dx, gp.attn_norm, dxn, a.x + b * w.h, a.rstd1 + b, p.attn_norm, m, w.h);
  // dx now holds d(layer input); layer 0 is only on the stage with the embedding.
  if (layer == 0) add_embedding_grads(rows);
}

template <class T>
void Llama<T>::add_embedding_grads(RowRange rows) {
  // In row order, so repeated tokens add up in a fixed order.
  const Widths w = widths_of(*this);
  const T* dx = scratch().dx;
  T* demb = grads_.data() + layout_[0].offset;  // (vocab, h)
  for (int64_t t = rows.begin; t < rows.end; ++t) {
    add_inplace<T>(demb + cur().in.tokens[static_cast<size_t>(t)] * w.h, dx + t * w.h, w.h);
  }
}

template <class T>
Status Llama<T>::check_whole(const char* call) const {
  if (has_embedding() && has_head()) return Status::ok_status();
  return Status::invalid_argument(std::string(call) + " runs the whole model; a pipeline stage "
                                  "(layers [" + std::to_string(stage_.first) + ", " +
                                  std::to_string(stage_.last) + ")) runs the phased step");
}

// The blocking step: the phases on the single range [0, n), the executor on attention_io's
// buffers (so its bits are those of any one-range phased run).
template <class T>
Status Llama<T>::run_forward(BasicAttentionExecutor<T>& executor) {
  const RowRange all{0, cur().n};
  for (int l = 0; l < spec_.n_layers; ++l) {
    forward_pre(l, all);
    const LayerAttentionIo<T> io = attention_io(l);
    const Status st = executor.forward(l, io.q, io.k, io.v, io.o);
    if (!st.ok()) return st.with_context("attention forward, layer " + std::to_string(l));
    forward_post(l, all);
  }
  forward_head(all);
  return tp_status_;
}

template <class T>
Status Llama<T>::run_backward(BasicAttentionExecutor<T>& executor, double grad_scale) {
  const RowRange all{0, cur().n};
  backward_head(all, grad_scale);
  for (int l = spec_.n_layers - 1; l >= 0; --l) {
    backward_post(l, all);
    const LayerAttentionIo<T> io = attention_io(l);
    const Status st = executor.backward(l, io.d_o, io.dq, io.dk, io.dv);
    if (!st.ok()) return st.with_context("attention backward, layer " + std::to_string(l));
    backward_pre(l, all);
  }
  return tp_status_;
}

template <class T>
Result<StepLoss> Llama<T>::forward(const StepInputs& in, BasicAttentionExecutor<T>& executor,
                                   std::span<T> per_token_loss) {
  DISTCA_RETURN_IF_ERROR(check_whole("forward"));
  DISTCA_RETURN_IF_ERROR(start_step(in, per_token_loss, &executor, 0.0, 0));
  // No early return for n = 0: a distributed executor's calls are collective, so a rank with
  // no tokens still takes part in every layer.
  DISTCA_RETURN_IF_ERROR(run_forward(executor));
  return step_loss();
}

template <class T>
Result<StepLoss> Llama<T>::forward_backward(const StepInputs& in,
                                            BasicAttentionExecutor<T>& executor,
                                            double grad_scale, std::span<T> per_token_loss) {
  DISTCA_RETURN_IF_ERROR(check_whole("forward_backward"));
  DISTCA_RETURN_IF_ERROR(start_step(in, per_token_loss, &executor, grad_scale, 0));
  DISTCA_RETURN_IF_ERROR(run_forward(executor));
  const StepLoss loss = step_loss();
  DISTCA_RETURN_IF_ERROR(run_backward(executor, grad_scale));
  return loss;
}

template class Llama<float>;
template class Llama<double>;

}  // namespace distca::model
