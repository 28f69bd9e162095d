// Per-document context parallelism through collectives (include/distca/train/cp_attention.h).
#include "distca/train/cp_attention.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "distca/kernels/attention.h"

namespace distca::train {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Each document's holders, ascending.
std::map<int64_t, std::vector<int64_t>> holders_of(const Batch& layout) {
  std::map<int64_t, std::set<int64_t>> sets;
  for (int64_t r = 0; r < layout.ranks; ++r) {
    for (const Piece& p : layout.per_rank[static_cast<size_t>(r)]) sets[p.doc].insert(r);
  }
  std::map<int64_t, std::vector<int64_t>> out;
  for (auto& [doc, s] : sets) out[doc].assign(s.begin(), s.end());
  return out;
}

// 0 local (one holder), 1 group (holders in one CP group), 2 wide.
int doc_class(const std::vector<int64_t>& holders, int64_t cp) {
  if (holders.size() == 1) return 0;
  return holders.front() / cp == holders.back() / cp ? 1 : 2;
}

// Rows of each rank's pieces of each class: [class][rank].
std::vector<std::vector<int64_t>> class_rows(const Batch& layout, int64_t cp,
                                             const std::map<int64_t, std::vector<int64_t>>& holders) {
  std::vector<std::vector<int64_t>> rows(3, std::vector<int64_t>(static_cast<size_t>(layout.ranks), 0));
  for (int64_t r = 0; r < layout.ranks; ++r) {
    for (const Piece& p : layout.per_rank[static_cast<size_t>(r)]) {
      rows[static_cast<size_t>(doc_class(holders.at(p.doc), cp))][static_cast<size_t>(r)] += p.len;
    }
  }
  return rows;
}

int64_t sum_over(const std::vector<int64_t>& v, int64_t first, int64_t end) {
  int64_t s = 0;
  for (int64_t i = first; i < end; ++i) s += v[static_cast<size_t>(i)];
  return s;
}

}  // namespace

CpBytes cp_attention_bytes(const Batch& layout, int64_t cp, const runtime::AttentionDims& dims) {
  const auto holders = holders_of(layout);
  const auto rows = class_rows(layout, cp, holders);
  const int64_t row_bytes = 2 * dims.kv_floats() * static_cast<int64_t>(sizeof(float));  // K and V
  CpBytes out;
  out.forward.assign(static_cast<size_t>(layout.ranks), 0);
  out.backward.assign(static_cast<size_t>(layout.ranks), 0);
  const int64_t wide_total = sum_over(rows[2], 0, layout.ranks);
  for (int64_t r = 0; r < layout.ranks; ++r) {
    const int64_t g = r / cp;
    const int64_t group_total = sum_over(rows[1], g * cp, (g + 1) * cp);
    int64_t fwd = 0, bwd = 0;
    const auto u = static_cast<size_t>(r);
    if (group_total > 0) {
      fwd += (cp - 1) * rows[1][u] * row_bytes;
      bwd += (group_total - rows[1][u]) * row_bytes;
    }
    if (wide_total > 0) {
      fwd += (layout.ranks - 1) * rows[2][u] * row_bytes;
      bwd += (wide_total - rows[2][u]) * row_bytes;
    }
    out.forward[u] = fwd;
    out.backward[u] = fwd + bwd;
  }
  return out;
}

Result<CpAttention> CpAttention::create(const Batch& layout, int64_t rank, int64_t cp,
                                        const runtime::AttentionDims& dims, int64_t layers) {
  DISTCA_RETURN_IF_ERROR(layout.validate().with_context("cp attention layout"));
  DISTCA_RETURN_IF_ERROR(dims.validate());
  if (cp < 1 || layout.ranks % cp != 0) return Status::invalid_argument("cp attention: cp must divide the ranks");
  if (rank < 0 || rank >= layout.ranks) return Status::invalid_argument("cp attention: rank outside the layout");
  CpAttention a;
  a.dims_ = dims;
  a.tile_ = runtime::query_tile_rows(dims);
  const auto holders = holders_of(layout);
  const auto rows = class_rows(layout, cp, holders);
  const int64_t g0 = rank / cp * cp;
  // The two gathers: the CP group's members, and every rank.
  const auto set_up = [&](Gather& gt, const std::vector<int64_t>& class_rows_of, int64_t first, int64_t end) {
    for (int64_t p = first; p < end; ++p) gt.rows.push_back(static_cast<size_t>(class_rows_of[static_cast<size_t>(p)]));
    gt.total = sum_over(class_rows_of, first, end);
    gt.first_member = first;
    gt.displ.assign(gt.rows.size(), 0);
    for (size_t i = 1; i < gt.rows.size(); ++i) gt.displ[i] = gt.displ[i - 1] + static_cast<int64_t>(gt.rows[i - 1]);
  };
  set_up(a.group_, rows[1], g0, g0 + cp);
  set_up(a.wide_, rows[2], 0, layout.ranks);
  a.group_active_ = a.group_.total > 0;
  a.wide_active_ = a.wide_.total > 0;
  // Every document position I need: where its K/V row is.
  for (const Piece& p : layout.per_rank[static_cast<size_t>(rank)]) a.where_.try_emplace(p.doc, static_cast<size_t>(p.doc_len));
  for (int64_t r = 0; r < layout.ranks; ++r) {
    int64_t local = 0;
    std::array<int64_t, 3> block{0, 0, 0};
    for (const Piece& p : layout.per_rank[static_cast<size_t>(r)]) {
      const int cls = doc_class(holders.at(p.doc), cp);
      auto it = a.where_.find(p.doc);
      if (r == rank && cls != kLocal) (cls == kGroup ? a.group_ : a.wide_).my_pieces.push_back({local, local + p.len});
      if (it != a.where_.end() && (cls != kLocal || r == rank)) {
        for (int64_t i = 0; i < p.len; ++i) {
          it->second[static_cast<size_t>(p.offset + i)] = {cls, r, (cls == kLocal ? local : block[static_cast<size_t>(cls)]) + i};
        }
      }
      block[static_cast<size_t>(cls)] += p.len;
      local += p.len;
    }
    if (r == rank) a.rows_ = local;
  }
  // My tasks, padded to the query tiles.
  int64_t row = 0;
  a.cu_q_.push_back(0);
  a.cu_k_.push_back(0);
  for (const Piece& p : layout.per_rank[static_cast<size_t>(rank)]) {
    Task t{p.doc, p.offset, p.len, row, p.offset / a.tile_ * a.tile_,
           std::min(p.doc_len, (p.offset + p.len + a.tile_ - 1) / a.tile_ * a.tile_)};
    a.tasks_.push_back(t);
    a.cu_q_.push_back(static_cast<int32_t>(a.cu_q_.back() + (t.qb - t.qa)));
    a.cu_k_.push_back(static_cast<int32_t>(a.cu_k_.back() + t.qb));
    row += p.len;
  }
  a.lse_.assign(static_cast<size_t>(layers), {});
  return a;
}

const float* CpAttention::kv_row(const Source& s, const float* local, bool value) const {
  const int64_t kvf = dims_.kv_floats();
  if (s.cls == kLocal) return local + s.row * kvf;
  const Gather& g = s.cls == kGroup ? group_ : wide_;
  const auto m = static_cast<size_t>(s.member - g.first_member);
  const int64_t base = 2 * g.displ[m] + (value ? static_cast<int64_t>(g.rows[m]) : 0);
  return g.buffer.data() + (base + s.row) * kvf;
}

void CpAttention::span(const std::string& name, const char* category, TimePoint t0, TimePoint t1) const {
  if (trace_ == nullptr) return;
  TraceEvent e{name, category, 0, tid_, trace_->to_us(t0), trace_->to_us(t1)};
  e.args = {{"layer", layer_}};
  trace_->record(std::move(e));
}

void CpAttention::collective_done(const std::string& name, TimePoint t0, TimePoint t1) {
  waited_ += std::chrono::duration<double>(t1 - t0).count();
  span(name, "comm", t0, t1);
  span(name + " wait", "wait", t0, t1);
}

Status CpAttention::gather(Gather& g, comm::Communicator& comm, const float* k, const float* v, int64_t& bytes,
                           const std::string& name) {
  const int64_t kvf = dims_.kv_floats();
  const auto me = static_cast<size_t>(comm.rank());
  const int64_t mine = static_cast<int64_t>(g.rows[me]);
  std::vector<float> send(static_cast<size_t>(2 * mine * kvf));
  int64_t at = 0;
  for (const float* src : {k, v}) {
    for (const auto& [first, end] : g.my_pieces) {
      std::memcpy(send.data() + at * kvf, src + first * kvf, sizeof(float) * static_cast<size_t>((end - first) * kvf));
      at += end - first;
    }
  }
  std::vector<std::size_t> counts(g.rows.size());
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = g.rows[i] * 2 * static_cast<size_t>(kvf) * sizeof(float);
  g.buffer.assign(static_cast<size_t>(2 * g.total * kvf), 0.0f);
  const auto t0 = Clock::now();
  Status st = comm.all_gather_v(std::as_bytes(std::span<const float>(send)), counts,
                                std::as_writable_bytes(std::span<float>(g.buffer)));
  collective_done(name, t0, Clock::now());
  bytes += static_cast<int64_t>(g.rows.size() - 1) * static_cast<int64_t>(send.size() * sizeof(float));
  return st;
}

Status CpAttention::scatter_back(Gather& g, comm::Communicator& comm, std::vector<float>& partials, float* dk,
                                 float* dv, int64_t& bytes, const std::string& name) {
  const int64_t kvf = dims_.kv_floats();
  const auto me = static_cast<size_t>(comm.rank());
  const int64_t mine = static_cast<int64_t>(g.rows[me]);
  std::vector<std::size_t> counts(g.rows.size());
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = g.rows[i] * 2 * static_cast<size_t>(kvf);
  std::vector<float> out(static_cast<size_t>(2 * mine * kvf));
  const auto t0 = Clock::now();
  Status st = comm.reduce_scatter_sum(partials, counts, out);
  collective_done(name, t0, Clock::now());
  bytes += (g.total - mine) * 2 * kvf * static_cast<int64_t>(sizeof(float));
  DISTCA_RETURN_IF_ERROR(st);
  int64_t at = 0;
  for (float* dst : {dk, dv}) {
    for (const auto& [first, end] : g.my_pieces) {
      std::memcpy(dst + first * kvf, out.data() + at * kvf, sizeof(float) * static_cast<size_t>((end - first) * kvf));
      at += end - first;
    }
  }
  return {};
}

void CpAttention::build_contexts(const float* k, const float* v) {
  const int64_t kvf = dims_.kv_floats();
  const auto bytes = sizeof(float) * static_cast<size_t>(kvf);
  kctx_.assign(static_cast<size_t>(int64_t{cu_k_.back()} * kvf), 0.0f);
  vctx_.assign(kctx_.size(), 0.0f);
  for (size_t t = 0; t < tasks_.size(); ++t) {
    const std::vector<Source>& src = where_.at(tasks_[t].doc);
    float* kd = kctx_.data() + int64_t{cu_k_[t]} * kvf;
    float* vd = vctx_.data() + int64_t{cu_k_[t]} * kvf;
    for (int64_t j = 0; j < tasks_[t].qb; ++j) {
      const Source& s = src[static_cast<size_t>(j)];
      std::memcpy(kd + j * kvf, kv_row(s, k, false), bytes);
      std::memcpy(vd + j * kvf, kv_row(s, v, true), bytes);
    }
  }
}

std::vector<float> CpAttention::pad(const float* rows, int64_t width) const {
  std::vector<float> out(static_cast<size_t>(int64_t{cu_q_.back()} * width), 0.0f);
  for (size_t t = 0; t < tasks_.size(); ++t) {
    const Task& k = tasks_[t];
    std::memcpy(out.data() + (cu_q_[t] + k.a - k.qa) * width, rows + k.row * width,
                sizeof(float) * static_cast<size_t>(k.n * width));
  }
  return out;
}

void CpAttention::unpad(const std::vector<float>& padded, int64_t width, float* rows) const {
  for (size_t t = 0; t < tasks_.size(); ++t) {
    const Task& k = tasks_[t];
    std::memcpy(rows + k.row * width, padded.data() + (cu_q_[t] + k.a - k.qa) * width,
                sizeof(float) * static_cast<size_t>(k.n * width));
  }
}

std::vector<float> CpAttention::lse_rows(int64_t layer) const {
  const int64_t H = dims_.n_heads, total = cu_q_.back();
  const std::vector<float>& lse = lse_[static_cast<size_t>(layer)];
  std::vector<float> out(static_cast<size_t>(rows_ * H));
  for (size_t t = 0; t < tasks_.size(); ++t) {
    const Task& k = tasks_[t];
    for (int64_t i = 0; i < k.n; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        out[static_cast<size_t>((k.row + i) * H + h)] = lse[static_cast<size_t>(h * total + cu_q_[t] + k.a - k.qa + i)];
      }
    }
  }
  return out;
}

kernels::AttentionParams CpAttention::params(const float* q_padded) const {
  kernels::AttentionParams p;
  p.q = q_padded;
  p.k = kctx_.data();
  p.v = vctx_.data();
  p.cu_seqlens_q = cu_q_.data();
  p.cu_seqlens_k = cu_k_.data();
  p.n_tasks = static_cast<int32_t>(tasks_.size());
  p.n_heads = dims_.n_heads;
  p.n_kv_heads = dims_.n_kv_heads;
  p.head_dim = dims_.head_dim;
  p.softmax_scale = dims_.softmax_scale;
  p.causal = true;
  for (size_t t = 0; t < tasks_.size(); ++t) {
    p.max_seqlen_q = std::max(p.max_seqlen_q, cu_q_[t + 1] - cu_q_[t]);
    p.max_seqlen_k = std::max(p.max_seqlen_k, cu_k_[t + 1] - cu_k_[t]);
  }
  return p;
}

void CpAttention::note_peak(int64_t extra_floats) {
  int64_t floats = static_cast<int64_t>(group_.buffer.size() + wide_.buffer.size() + 2 * kctx_.size()) + extra_floats;
  for (const std::vector<float>& l : lse_) floats += static_cast<int64_t>(l.size());
  peak_bytes_ = std::max(peak_bytes_, floats * static_cast<int64_t>(sizeof(float)));
}

Status CpAttention::gather_all(comm::Communicator& cp_comm, comm::Communicator& dp_comm, const float* k,
                               const float* v, int64_t& bytes) {
  if (group_active_) {
    DISTCA_RETURN_IF_ERROR(gather(group_, cp_comm, k, v, bytes, "cp all-gather kv").with_context("cp all-gather"));
  }
  if (wide_active_) {
    DISTCA_RETURN_IF_ERROR(gather(wide_, dp_comm, k, v, bytes, "cp all-gather kv (dp)").with_context("cp all-gather (dp)"));
  }
  return {};
}

Status CpAttention::forward(int64_t layer, comm::Communicator& cp_comm, comm::Communicator& dp_comm, const float* q,
                            const float* k, const float* v, float* o) {
  DISTCA_CHECK(layer >= 0 && layer < static_cast<int64_t>(lse_.size()));
  const auto t_call = Clock::now();
  layer_ = layer;
  fwd_bytes_ = 0;
  DISTCA_RETURN_IF_ERROR(gather_all(cp_comm, dp_comm, k, v, fwd_bytes_));
  if (tasks_.empty()) {
    span("cp attention fwd", "cp", t_call, Clock::now());
    return {};
  }
  const int64_t qf = dims_.q_floats();
  auto t0 = Clock::now();
  build_contexts(k, v);
  const std::vector<float> qp = pad(q, qf);
  span("cp assemble", "compute", t0, Clock::now());
  std::vector<float> op(qp.size());
  std::vector<float>& lse = lse_[static_cast<size_t>(layer)];
  lse.assign(static_cast<size_t>(int64_t{dims_.n_heads} * cu_q_.back()), 0.0f);
  kernels::AttentionParams p = params(qp.data());
  p.o = op.data();
  p.lse = lse.data();
  t0 = Clock::now();
  {
    std::lock_guard<std::mutex> lock(kernels::kernel_mutex());
    kernels::attention_forward(p);
  }
  span("attention fwd", "compute", t0, Clock::now());
  unpad(op, qf, o);
  note_peak(static_cast<int64_t>(qp.size() + op.size()));
  span("cp attention fwd", "cp", t_call, Clock::now());
  return {};
}

Status CpAttention::backward(int64_t layer, comm::Communicator& cp_comm, comm::Communicator& dp_comm, const float* q,
                             const float* k, const float* v, const float* o, const float* d_o, float* dq, float* dk,
                             float* dv) {
  DISTCA_CHECK(layer >= 0 && layer < static_cast<int64_t>(lse_.size()));
  const auto t_call = Clock::now();
  layer_ = layer;
  bwd_bytes_ = 0;
  DISTCA_RETURN_IF_ERROR(gather_all(cp_comm, dp_comm, k, v, bwd_bytes_));
  const int64_t qf = dims_.q_floats(), kvf = dims_.kv_floats();
  std::fill(dk, dk + rows_ * kvf, 0.0f);
  std::fill(dv, dv + rows_ * kvf, 0.0f);
  // dK/dV partials of the gathered rows, laid like the gathered buffers.
  std::vector<float> group_part(group_.buffer.size(), 0.0f), wide_part(wide_.buffer.size(), 0.0f);
  if (!tasks_.empty()) {
    auto t0 = Clock::now();
    build_contexts(k, v);
    const std::vector<float> qp = pad(q, qf), dop = pad(d_o, qf);
    std::vector<float> op = pad(o, qf), dqp(qp.size()), dkc(kctx_.size()), dvc(vctx_.size());
    span("cp assemble", "compute", t0, Clock::now());
    kernels::AttentionParams p = params(qp.data());
    p.o = op.data();
    p.lse = lse_[static_cast<size_t>(layer)].data();
    p.d_o = dop.data();
    p.dq = dqp.data();
    p.dk = dkc.data();
    p.dv = dvc.data();
    t0 = Clock::now();
    {
      std::lock_guard<std::mutex> lock(kernels::kernel_mutex());
      kernels::attention_backward(p);
    }
    span("attention bwd", "compute", t0, Clock::now());
    unpad(dqp, qf, dq);
    // Each context row's dK/dV onto its source, task by task (a fixed order).
    for (size_t t = 0; t < tasks_.size(); ++t) {
      const std::vector<Source>& src = where_.at(tasks_[t].doc);
      for (int64_t j = 0; j < tasks_[t].qb; ++j) {
        const Source& s = src[static_cast<size_t>(j)];
        float *kd = nullptr, *vd = nullptr;
        if (s.cls == kLocal) {
          kd = dk + s.row * kvf;
          vd = dv + s.row * kvf;
        } else {
          const Gather& g = s.cls == kGroup ? group_ : wide_;
          std::vector<float>& part = s.cls == kGroup ? group_part : wide_part;
          const auto m = static_cast<size_t>(s.member - g.first_member);
          kd = part.data() + (2 * g.displ[m] + s.row) * kvf;
          vd = kd + static_cast<int64_t>(g.rows[m]) * kvf;
        }
        const float* ks = dkc.data() + (int64_t{cu_k_[t]} + j) * kvf;
        const float* vs = dvc.data() + (int64_t{cu_k_[t]} + j) * kvf;
        for (int64_t e = 0; e < kvf; ++e) {
          kd[e] += ks[e];
          vd[e] += vs[e];
        }
      }
    }
    note_peak(static_cast<int64_t>(4 * qp.size() + 2 * kctx_.size() + group_part.size() + wide_part.size()));
  }
  if (group_active_) {
    DISTCA_RETURN_IF_ERROR(scatter_back(group_, cp_comm, group_part, dk, dv, bwd_bytes_, "cp reduce-scatter dkv")
                               .with_context("cp reduce-scatter"));
  }
  if (wide_active_) {
    DISTCA_RETURN_IF_ERROR(scatter_back(wide_, dp_comm, wide_part, dk, dv, bwd_bytes_, "cp reduce-scatter dkv (dp)")
                               .with_context("cp reduce-scatter (dp)"));
  }
  span("cp attention bwd", "cp", t_call, Clock::now());
  return {};
}

void CpRunner::linear(const runtime::LinearFn& fn, int nano, int layer, bool backward) {
  const auto t0 = Clock::now();
  fn(nano, layer, backward);
  const auto t1 = Clock::now();
  linear_s_ += std::chrono::duration<double>(t1 - t0).count();
  if (trace_ != nullptr) {
    TraceEvent e{std::string(nano == 0 ? "ping" : "pong") + (backward ? " linear bwd" : " linear"), "compute", 0,
                 tid_, trace_->to_us(t0), trace_->to_us(t1)};
    e.args = {{"nano", nano}, {"layer", layer}};
    trace_->record(std::move(e));
  }
}

Status CpRunner::run(const runtime::TickIo& io) {
  DISTCA_CHECK(io.forward.empty() != io.backward.empty() && io.adopt.empty());
  const auto t0 = Clock::now();
  if (!io.forward.empty()) {
    forward_ = io.forward;
    const int L = static_cast<int>(io.forward.size());
    for (int l = 0; l < L; ++l) {
      for (int x : {0, 1}) linear(io.linear_forward, x, l, false);
      const runtime::LayerForward& f = io.forward[static_cast<size_t>(l)];
      DISTCA_RETURN_IF_ERROR(att_.forward(l, cp_, dp_, f.q, f.k, f.v, f.o).with_context("layer " + std::to_string(l)));
    }
    for (int x : {0, 1}) linear(io.linear_forward, x, L, false);
  } else {
    const int L = static_cast<int>(io.backward.size());
    DISTCA_CHECK(static_cast<int>(forward_.size()) == L);
    for (int x : {1, 0}) linear(io.linear_backward, x, L, true);
    for (int l = L - 1; l >= 0; --l) {
      const runtime::LayerForward& f = forward_[static_cast<size_t>(l)];
      const runtime::LayerBackward& b = io.backward[static_cast<size_t>(l)];
      DISTCA_RETURN_IF_ERROR(att_.backward(l, cp_, dp_, f.q, f.k, f.v, f.o, b.d_o, b.dq, b.dk, b.dv)
                                 .with_context("layer " + std::to_string(l) + " backward"));
      for (int x : {1, 0}) linear(io.linear_backward, x, l, true);
    }
  }
  total_s_ += since(t0);
  return {};
}

runtime::RunnerTimes CpRunner::times() const {
  runtime::RunnerTimes t;
  t.linear = linear_s_;
  t.waited = att_.waited_seconds();
  t.attention = std::max(0.0, total_s_ - linear_s_ - t.waited);
  return t;
}

}  // namespace distca::train
