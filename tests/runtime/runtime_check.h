// Shared by the runtime's local and MPI tests: a random problem (documents with Q/K/V/dO
// drawn per document from the seed, so every rank and every layout sees the same values), the
// whole-document kernel reference (one fused call, one task per document), and the
// comparison of what a rank got from the runtime against it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/rng.h"
#include "distca/data/workload.h"
#include "distca/kernels/attention.h"
#include "distca/kernels/reference.h"
#include "distca/plan/plan.h"
#include "distca/plan/pool.h"
#include "distca/plan/pipeline_schedule.h"
#include "distca/runtime/dispatcher.h"
#include "distca/runtime/pingpong.h"
#include "distca/runtime/tick_runner.h"

namespace distca::runtime::testing {

struct DocData {
  int64_t len = 0;
  int64_t row0 = 0;  // first row in the reference's fused call
};

// Whole-document tensors, rows in document-id order, (rows, heads, d).
struct Problem {
  Batch batch;
  AttentionDims dims;
  std::map<int64_t, DocData> docs;
  int64_t rows = 0;
  std::vector<float> q, k, v, d_o;             // inputs
  std::vector<float> o, lse, dq, dk, dv;       // kernel on whole documents; lse (rows, H)
  std::vector<double> dk64, dv64;              // fp64 reference of dK/dV

  int64_t row_of(int64_t doc, int64_t pos) const { return docs.at(doc).row0 + pos; }
};

inline Problem make_problem(const Batch& batch, const AttentionDims& dims, uint64_t seed, bool with_fp64) {
  Problem pr;
  pr.batch = batch;
  pr.dims = dims;
  for (const auto& rank : batch.per_rank) {
    for (const Piece& p : rank) pr.docs[p.doc].len = p.doc_len;
  }
  std::vector<int32_t> cu{0};
  for (auto& [id, d] : pr.docs) {
    d.row0 = pr.rows;
    pr.rows += d.len;
    cu.push_back(static_cast<int32_t>(pr.rows));
  }
  const int64_t qf = dims.q_floats(), kvf = dims.kv_floats();
  pr.q.resize(static_cast<size_t>(pr.rows * qf));
  pr.d_o.resize(pr.q.size());
  pr.k.resize(static_cast<size_t>(pr.rows * kvf));
  pr.v.resize(pr.k.size());
  for (const auto& [id, d] : pr.docs) {
    Rng rng(seed, static_cast<uint64_t>(id) + 1);
    for (int64_t i = d.row0 * qf; i < (d.row0 + d.len) * qf; ++i) pr.q[static_cast<size_t>(i)] = static_cast<float>(rng.uniform(-1, 1));
    for (int64_t i = d.row0 * kvf; i < (d.row0 + d.len) * kvf; ++i) pr.k[static_cast<size_t>(i)] = static_cast<float>(rng.uniform(-1, 1));
    for (int64_t i = d.row0 * kvf; i < (d.row0 + d.len) * kvf; ++i) pr.v[static_cast<size_t>(i)] = static_cast<float>(rng.uniform(-1, 1));
    for (int64_t i = d.row0 * qf; i < (d.row0 + d.len) * qf; ++i) pr.d_o[static_cast<size_t>(i)] = static_cast<float>(rng.uniform(-1, 1));
  }
  kernels::AttentionParams p;
  p.q = pr.q.data(), p.k = pr.k.data(), p.v = pr.v.data();
  p.cu_seqlens_q = cu.data(), p.cu_seqlens_k = cu.data();
  p.n_tasks = static_cast<int32_t>(pr.docs.size());
  p.n_heads = dims.n_heads, p.n_kv_heads = dims.n_kv_heads, p.head_dim = dims.head_dim;
  p.causal = true;
  pr.o.resize(pr.q.size());
  std::vector<float> lse_hm(static_cast<size_t>(pr.rows * dims.n_heads));  // (H, rows)
  p.o = pr.o.data(), p.lse = lse_hm.data();
  pr.dq.resize(pr.q.size());
  pr.dk.resize(pr.k.size());
  pr.dv.resize(pr.k.size());
  p.d_o = pr.d_o.data(), p.dq = pr.dq.data(), p.dk = pr.dk.data(), p.dv = pr.dv.data();
  {
    std::lock_guard<std::mutex> lock(kernels::kernel_mutex());
    kernels::attention_forward(p);
    kernels::attention_backward(p);
  }
  pr.lse.resize(lse_hm.size());
  for (int64_t r = 0; r < pr.rows; ++r) {
    for (int64_t h = 0; h < dims.n_heads; ++h) pr.lse[static_cast<size_t>(r * dims.n_heads + h)] = lse_hm[static_cast<size_t>(h * pr.rows + r)];
  }
  if (with_fp64) {
    auto to64 = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
    const auto q64 = to64(pr.q), k64 = to64(pr.k), v64 = to64(pr.v), do64 = to64(pr.d_o);
    std::vector<double> dq64(q64.size());
    pr.dk64.resize(k64.size());
    pr.dv64.resize(k64.size());
    kernels::reference_backward<double>(p, q64.data(), k64.data(), v64.data(), do64.data(), dq64.data(), pr.dk64.data(),
                                        pr.dv64.data());
  }
  return pr;
}

// A rank's token buffer of `x` (whole-document rows of width w) in the layout of `batch`.
inline std::vector<float> local_rows(const Problem& pr, const Batch& batch, int rank, const std::vector<float>& x,
                                     int64_t w) {
  std::vector<float> out;
  for (const Piece& p : batch.per_rank[static_cast<size_t>(rank)]) {
    const int64_t r0 = pr.row_of(p.doc, p.offset);
    out.insert(out.end(), x.begin() + r0 * w, x.begin() + (r0 + p.len) * w);
  }
  return out;
}

// What a rank got, and how it compares.
struct RankOutputs {
  std::vector<float> o, lse, dq, dk, dv;
};

struct Diff {
  double max_abs = 0;
  int64_t unequal = 0;  // elements whose bits (values) differ
  void add(float a, float b) {
    if (a != b && !(std::isnan(a) && std::isnan(b))) ++unequal;
    // A NaN on one side only (a row never written) is an infinite difference, not one that
    // std::max drops.
    const double d = std::isnan(a) != std::isnan(b) ? INFINITY : std::fabs(a - b);
    max_abs = std::max(max_abs, d);
  }
  void merge(const Diff& d) {
    max_abs = std::max(max_abs, d.max_abs);
    unequal += d.unequal;
  }
};

struct Comparison {
  Diff o, lse, dq, dk, dv;
  double dk_err_runtime = 0, dk_err_kernel = 0;  // max |x - fp64| (dK and dV together)
  void merge(const Comparison& c) {
    o.merge(c.o), lse.merge(c.lse), dq.merge(c.dq), dk.merge(c.dk), dv.merge(c.dv);
    dk_err_runtime = std::max(dk_err_runtime, c.dk_err_runtime);
    dk_err_kernel = std::max(dk_err_kernel, c.dk_err_kernel);
  }
};

// `backward` false: O and LSE only (a forward whose gradients are computed elsewhere).
inline Comparison compare(const Problem& pr, const Batch& batch, int rank, const RankOutputs& got,
                          bool backward = true) {
  Comparison c;
  const int64_t qf = pr.dims.q_floats(), kvf = pr.dims.kv_floats(), H = pr.dims.n_heads;
  int64_t l = 0;
  for (const Piece& p : batch.per_rank[static_cast<size_t>(rank)]) {
    for (int64_t i = 0; i < p.len; ++i, ++l) {
      const int64_t r = pr.row_of(p.doc, p.offset + i);
      for (int64_t e = 0; e < qf; ++e) {
        c.o.add(got.o[static_cast<size_t>(l * qf + e)], pr.o[static_cast<size_t>(r * qf + e)]);
        if (backward) c.dq.add(got.dq[static_cast<size_t>(l * qf + e)], pr.dq[static_cast<size_t>(r * qf + e)]);
      }
      for (int64_t h = 0; h < H; ++h) c.lse.add(got.lse[static_cast<size_t>(l * H + h)], pr.lse[static_cast<size_t>(r * H + h)]);
      for (int64_t e = 0; backward && e < kvf; ++e) {
        const size_t g = static_cast<size_t>(l * kvf + e), w = static_cast<size_t>(r * kvf + e);
        c.dk.add(got.dk[g], pr.dk[w]);
        c.dv.add(got.dv[g], pr.dv[w]);
        if (!pr.dk64.empty()) {
          c.dk_err_runtime = std::max({c.dk_err_runtime, std::fabs(got.dk[g] - pr.dk64[w]), std::fabs(got.dv[g] - pr.dv64[w])});
          c.dk_err_kernel = std::max({c.dk_err_kernel, std::fabs(pr.dk[w] - pr.dk64[w]), std::fabs(pr.dv[w] - pr.dv64[w])});
        }
      }
    }
  }
  return c;
}

// Runs one layer forward + backward through a CaDispatcher on `plan` on this rank.
// `options` configures the dispatcher; `bwd_bytes` (optional) receives the bytes it sent in
// backward.
inline Status run_dispatcher(comm::Communicator& comm, const Problem& pr, const Plan& plan, RankOutputs* out,
                             const DispatcherOptions& options = {}, int64_t* bwd_bytes = nullptr) {
  const int r = comm.rank();
  const int64_t qf = pr.dims.q_floats(), kvf = pr.dims.kv_floats();
  const auto q = local_rows(pr, plan.batch, r, pr.q, qf), k = local_rows(pr, plan.batch, r, pr.k, kvf),
             v = local_rows(pr, plan.batch, r, pr.v, kvf), d_o = local_rows(pr, plan.batch, r, pr.d_o, qf);
  const int64_t n = static_cast<int64_t>(q.size()) / qf;
  out->o.assign(q.size(), NAN), out->dq.assign(q.size(), NAN);
  out->lse.assign(static_cast<size_t>(n * pr.dims.n_heads), NAN);
  out->dk.assign(k.size(), NAN), out->dv.assign(k.size(), NAN);
  DISTCA_ASSIGN_OR_RETURN(auto d, CaDispatcher::create(comm, plan, pr.dims, options));
  if (d->n_tokens() != n) return Status::internal("token count mismatch");
  DISTCA_RETURN_IF_ERROR(d->forward(3, q, k, v, out->o, out->lse));
  DISTCA_RETURN_IF_ERROR(d->backward(3, d_o, out->dq, out->dk, out->dv));
  if (bwd_bytes) *bwd_bytes = d->last_backward_bytes_sent();
  return Status::ok_status();
}

// The forward (O, LSE) and dQ of a row depend only on the row, its keys and its query tile's
// key range, which the dispatcher keeps equal to the whole-document call's only when the
// kernel's tiling lines up; dK/dV partials are summed in another association. So: forward
// and dQ must be bitwise equal or within kFwdTol, dK/dV within kBwdFactor times the kernel's
// own error against fp64.
inline constexpr double kFwdTol = 2e-6;
inline constexpr double kBwdFactor = 2.0;

// Layer l's problem over `batch`: its own Q/K/V/dO, drawn from seed + l, so a runner that
// mixes layers up gives another layer's values.
inline std::vector<Problem> layer_problems(const Batch& batch, const AttentionDims& dims, uint64_t seed, int layers,
                                           bool with_fp64) {
  std::vector<Problem> out;
  for (int l = 0; l < layers; ++l) out.push_back(make_problem(batch, dims, seed + static_cast<uint64_t>(l), with_fp64));
  return out;
}

// One micro-batch's layers on this rank in the runner's buffers, and a linear stand-in that
// holds the runner to its contract (runtime/tick_runner.h, "Buffers in flight"). Every buffer
// starts as NaN. linear(x, l, false) reads nano-batch x's rows of O(l - 1) and then writes its
// rows of Q/K/V(l); linear(x, l, true) reads its rows of dQ/dK/dV(l) and then writes dO(l - 1)
// (the head's linear(x, L, true) writes dO(L - 1)). A read must see the whole-document
// kernel's values (O bitwise, gradients within the bounds of check_close): the runner handed
// the rows back only after their exchange finished. A write must land on rows nobody has
// written yet: no exchange can have taken them. Each (nano, layer, direction) is called once,
// forward layers ascending and backward descending per nano-batch. The first violation is
// kept (the runner's thread cannot fail a gtest assertion mid-pass).
class LayerStack {
 public:
  // `layers`: one problem per layer; `layout`: this rank's pieces (the split batch's, ping's
  // rows first); `nano_rows`: ping's and pong's row counts. `check_values`: false in signal
  // mode (outputs meaningless).
  LayerStack(const std::vector<Problem>& layers, const std::vector<Piece>& layout, std::array<int64_t, 2> nano_rows,
             bool check_values)
      : pr_(&layers), layout_(layout), n0_(nano_rows[0]), n_(nano_rows[0] + nano_rows[1]), check_(check_values) {
    const AttentionDims& d = layers.front().dims;
    const size_t q = static_cast<size_t>(n_ * d.q_floats()), kv = static_cast<size_t>(n_ * d.kv_floats());
    for (size_t l = 0; l < layers.size(); ++l) {
      Buffers b;
      b.q.assign(q, NAN), b.o.assign(q, NAN), b.d_o.assign(q, NAN), b.dq.assign(q, NAN);
      b.k.assign(kv, NAN), b.v.assign(kv, NAN), b.dk.assign(kv, NAN), b.dv.assign(kv, NAN);
      b.lse.assign(static_cast<size_t>(n_ * d.n_heads), NAN);
      buf_.push_back(std::move(b));
    }
  }
  LayerStack(const LayerStack&) = delete;
  LayerStack& operator=(const LayerStack&) = delete;

  int layers() const { return static_cast<int>(buf_.size()); }
  std::vector<LayerForward> forward() {
    std::vector<LayerForward> out;
    for (Buffers& b : buf_) out.push_back({b.q.data(), b.k.data(), b.v.data(), b.o.data(), b.lse.data(), n_});
    return out;
  }
  std::vector<LayerBackward> backward() {
    std::vector<LayerBackward> out;
    for (Buffers& b : buf_) out.push_back({b.d_o.data(), b.dq.data(), b.dk.data(), b.dv.data(), n_});
    return out;
  }
  LinearFn linear() {
    return [this](int x, int l, bool backward) { backward ? linear_backward(x, l) : linear_forward(x, l); };
  }
  // OK, or the first contract violation the stand-in saw.
  const Status& status() const { return status_; }
  // Every forward call made (each nano-batch's layers 0..L).
  bool forward_complete() const { return next_fwd_[0] == layers() + 1 && next_fwd_[1] == layers() + 1; }
  // Whether any backward call was made.
  bool backward_started() const { return next_bwd_[0] != -2 || next_bwd_[1] != -2; }
  // Every call made (forward: each nano-batch's layers 0..L; backward: L..0).
  bool complete() const { return forward_complete() && next_bwd_[0] == -1 && next_bwd_[1] == -1; }
  // The forward as if it had run on these rows: Q/K/V the inputs, O and LSE the whole-document
  // kernel's (the rows of a forward that ran laid out otherwise, whose outputs were checked
  // against the same reference there). Only before any call.
  void adopt_reference_forward() {
    const int64_t qf = (*pr_)[0].dims.q_floats(), kvf = (*pr_)[0].dims.kv_floats(), H = (*pr_)[0].dims.n_heads;
    for (int l = 0; l < layers(); ++l) {
      const Problem& p = (*pr_)[static_cast<size_t>(l)];
      Buffers& b = buf_[static_cast<size_t>(l)];
      b.q = reference(p.q, qf), b.k = reference(p.k, kvf), b.v = reference(p.v, kvf);
      b.o = reference(p.o, qf), b.lse = reference(p.lse, H);
    }
    next_fwd_[0] = next_fwd_[1] = layers() + 1;
  }
  RankOutputs outputs(int l) const {
    const Buffers& b = buf_[static_cast<size_t>(l)];
    return {b.o, b.lse, b.dq, b.dk, b.dv};
  }
  const std::vector<Piece>& layout() const { return layout_; }
  // Every layer's outputs against its own whole-document reference, merged (`backward`
  // false: O and LSE only).
  Comparison compare_layers(bool backward = true) const {
    Batch mine;
    mine.per_rank = {layout_};
    Comparison c;
    for (int l = 0; l < layers(); ++l) c.merge(compare((*pr_)[static_cast<size_t>(l)], mine, 0, outputs(l), backward));
    return c;
  }

 private:
  struct Buffers {
    std::vector<float> q, k, v, o, lse, d_o, dq, dk, dv;
  };
  // Rows [begin, end) of nano-batch x on this rank.
  int64_t begin(int x) const { return x == 0 ? 0 : n0_; }
  int64_t end(int x) const { return x == 0 ? n0_ : n_; }
  void fail(int x, int l, bool backward, const std::string& what) {
    if (status_.ok()) {
      status_ = Status::internal("linear(" + std::to_string(x) + ", " + std::to_string(l) + ", " +
                                 (backward ? "backward" : "forward") + "): " + what);
    }
  }
  // The reference rows of x (whole-document rows of width w) in this rank's layout.
  std::vector<float> reference(const std::vector<float>& all, int64_t w) const {
    std::vector<float> out;
    for (const Piece& p : layout_) {
      const int64_t r0 = (*pr_)[0].row_of(p.doc, p.offset);
      out.insert(out.end(), all.begin() + r0 * w, all.begin() + (r0 + p.len) * w);
    }
    return out;
  }
  // Checks that x's rows of `got` match the reference within `tol` (0: bitwise).
  bool final_rows(int x, const std::vector<float>& got, const std::vector<float>& all, int64_t w, double tol) const {
    const std::vector<float> want = reference(all, w);
    for (int64_t i = begin(x) * w; i < end(x) * w; ++i) {
      const float a = got[static_cast<size_t>(i)], b = want[static_cast<size_t>(i)];
      if (!(tol == 0 ? a == b : std::fabs(a - b) <= tol)) return false;
    }
    return true;
  }
  // Writes x's rows of the reference into `dst`, after checking nobody wrote them.
  bool write_rows(int x, std::vector<float>& dst, const std::vector<float>& all, int64_t w) const {
    const std::vector<float> want = reference(all, w);
    for (int64_t i = begin(x) * w; i < end(x) * w; ++i) {
      if (!std::isnan(dst[static_cast<size_t>(i)])) return false;
      dst[static_cast<size_t>(i)] = want[static_cast<size_t>(i)];
    }
    return true;
  }
  void linear_forward(int x, int l) {
    if (l != next_fwd_[x]) fail(x, l, false, "out of order (expected layer " + std::to_string(next_fwd_[x]) + ")");
    next_fwd_[x] = l + 1;
    const Problem& any = (*pr_)[0];
    const int64_t qf = any.dims.q_floats(), kvf = any.dims.kv_floats();
    if (l > 0 && check_) {
      const Problem& p = (*pr_)[static_cast<size_t>(l - 1)];
      if (!final_rows(x, buf_[static_cast<size_t>(l - 1)].o, p.o, qf, 0)) fail(x, l, false, "O of the layer before is not final");
    }
    if (l < layers()) {
      const Problem& p = (*pr_)[static_cast<size_t>(l)];
      Buffers& b = buf_[static_cast<size_t>(l)];
      if (!write_rows(x, b.q, p.q, qf) || !write_rows(x, b.k, p.k, kvf) || !write_rows(x, b.v, p.v, kvf)) {
        fail(x, l, false, "Q/K/V rows written before");
      }
    }
  }
  void linear_backward(int x, int l) {
    if (next_bwd_[x] == -2) next_bwd_[x] = layers();
    if (l != next_bwd_[x]) fail(x, l, true, "out of order (expected layer " + std::to_string(next_bwd_[x]) + ")");
    next_bwd_[x] = l - 1;
    const Problem& any = (*pr_)[0];
    const int64_t qf = any.dims.q_floats(), kvf = any.dims.kv_floats();
    if (l < layers() && check_) {
      const Problem& p = (*pr_)[static_cast<size_t>(l)];
      const Buffers& b = buf_[static_cast<size_t>(l)];
      if (!final_rows(x, b.dq, p.dq, qf, kFwdTol) || !final_rows(x, b.dk, p.dk, kvf, 1e-5) ||
          !final_rows(x, b.dv, p.dv, kvf, 1e-5)) {
        fail(x, l, true, "dQ/dK/dV of the layer are not final");
      }
    }
    if (l > 0) {
      const Problem& p = (*pr_)[static_cast<size_t>(l - 1)];
      if (!write_rows(x, buf_[static_cast<size_t>(l - 1)].d_o, p.d_o, qf)) fail(x, l, true, "dO rows written before");
    }
  }

  const std::vector<Problem>* pr_;
  std::vector<Piece> layout_;
  int64_t n0_ = 0, n_ = 0;
  bool check_ = true;
  std::vector<Buffers> buf_;
  int next_fwd_[2] = {0, 0};
  int next_bwd_[2] = {-2, -2};  // -2: no backward call yet (the first is layer L)
  Status status_;
};

// Runs the layers of `layers` forward, then backward, through one micro-batch's runner on
// `plans`, with LayerStack's checking linear work; `out` gets every layer's outputs.
inline Status run_runner(comm::Communicator& comm, const std::vector<Problem>& layers, const NanoPlans& plans,
                         OverlapMode mode, TraceRecorder* trace, std::vector<RankOutputs>* out, bool* valid,
                         bool stateless = false) {
  const int r = comm.rank();
  const auto& t = plans.split.tokens[static_cast<size_t>(r)];
  LayerStack stack(layers, plans.split.batch.per_rank[static_cast<size_t>(r)], {t[0], t[1]},
                   mode != OverlapMode::kSignal);
  DISTCA_ASSIGN_OR_RETURN(auto runner, TickRunner::create(comm, plans, layers.front().dims, mode, trace, stateless));
  DISTCA_RETURN_IF_ERROR(runner->forward(stack.forward(), stack.linear()));
  DISTCA_RETURN_IF_ERROR(runner->backward(stack.backward(), stack.linear()));
  DISTCA_RETURN_IF_ERROR(stack.status());
  if (!stack.complete()) return Status::internal("the runner skipped linear work");
  *valid = runner->outputs_valid();
  out->clear();
  for (int l = 0; l < stack.layers(); ++l) out->push_back(stack.outputs(l));
  return Status::ok_status();
}

// Every layer's outputs of a rank against its own reference, merged.
inline Comparison compare_layers(const std::vector<Problem>& layers, const Batch& batch, int rank,
                                 const std::vector<RankOutputs>& got) {
  Comparison c;
  for (size_t l = 0; l < layers.size(); ++l) c.merge(compare(layers[l], batch, rank, got[l]));
  return c;
}

inline Batch random_batch(int ranks, int64_t tokens_per_rank, uint64_t seed, Layout layout = Layout::kContiguous) {
  WorkloadOptions w;
  w.dist = "uniform:16:" + std::to_string(2 * tokens_per_rank);
  w.ranks = ranks;
  w.tokens_per_rank = tokens_per_rank;
  w.layout = layout;
  w.seed = seed;
  auto b = make_batches(w);
  DISTCA_CHECK(b.ok());
  return b.value()[0];
}


inline std::string describe(const Comparison& c) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "o %.3g (%lld unequal) lse %.3g (%lld) dq %.3g (%lld) dk %.3g (%lld) dv %.3g (%lld) | dK/dV err vs fp64: runtime %.3g kernel %.3g",
                c.o.max_abs, static_cast<long long>(c.o.unequal), c.lse.max_abs, static_cast<long long>(c.lse.unequal),
                c.dq.max_abs, static_cast<long long>(c.dq.unequal), c.dk.max_abs, static_cast<long long>(c.dk.unequal),
                c.dv.max_abs, static_cast<long long>(c.dv.unequal), c.dk_err_runtime, c.dk_err_kernel);
  return buf;
}


// Status form of the bounds above (for the MPI program, which cannot use gtest's EXPECTs).
inline Status check_close(const Comparison& c) {
  if (c.o.unequal != 0 || c.lse.unequal != 0 || c.o.max_abs > kFwdTol || c.lse.max_abs > kFwdTol || c.dq.max_abs > kFwdTol ||
      c.dk_err_runtime > kBwdFactor * c.dk_err_kernel + 1e-7 || c.dk.max_abs > 1e-5 || c.dv.max_abs > 1e-5) {
    return Status::internal("runtime differs from the whole-document kernel: " + describe(c));
  }
  return Status::ok_status();
}

inline ScheduleOptions schedule_options(const AttentionDims& dims) {
  ScheduleOptions o;
  o.model.name = "runtime-test";
  o.model.n_layers = 1;
  o.model.n_heads = dims.n_heads;
  o.model.n_kv_heads = dims.n_kv_heads;
  o.model.head_dim = dims.head_dim;
  o.model.hidden = dims.n_heads * dims.head_dim;
  o.model.ffn = o.model.hidden;
  o.model.vocab = 256;
  o.dtype_bytes = 4;
  o.tolerance = 0.1;
  return o;
}

inline std::vector<std::string> scheduler_names(int ranks) {
  std::vector<std::string> s = {"colocated", "wlb", "cad", "cad-symmetric"};
  for (int c = 1; c <= ranks; ++c) {
    if (ranks % c == 0) s.push_back("percp:" + std::to_string(c));
  }
  return s;
}

// What run_pipeline_ticks saw on this rank (sum it over the ranks).
struct TickStats {
  int64_t forward_rows = 0, backward_rows = 0;  // rows this rank ran in each direction
  int64_t rows_off_stage = 0;     // of them, rows of a direction in which this rank's stage had no op
  int64_t adopted_own = 0;        // backward passes that adopted this rank's own forward buffers
  int64_t adopted_reference = 0;  // backward passes over rows its forward laid out otherwise
  int64_t forward_only = 0;       // forward passes whose rows no backward pass laid out alike
};

// CAD's pipeline ticks, as the trainer runs them: a pipeline of `stages` stages of dp =
// comm.size() / stages replicas (rank = stage * dp + replica), M micro-batches. Every tick of
// one_f_one_b_ticks pools its forwards and its backwards apart (plan/pool.h, every rank in
// each pool), plans each with `scheduler` and runs both in one create_tick pass. Every
// (stage, micro-batch) has its own documents (pooled ids unique over the schedule) and every
// layer its own inputs, drawn per document, so one whole-document reference covers them all.
// A rank runs a direction's rows wherever the plan puts them: a scheduler that keeps the
// layout (cad, colocated) leaves a stage's rows on its ranks (the others only serve, with
// placeholders of 0 rows), wlb re-packs them over every rank of the pool, idle stages' too.
// A backward pass adopts the forward buffers of the forward that laid its rows out alike on
// this rank (the micro-batch's own), else the reference forward of its rows
// (LayerStack::adopt_reference_forward; that forward's outputs were checked where they ran).
// `worst` gets this rank's comparison of every pass's layers with the reference (forward-only
// passes: O and LSE); `outputs` (optional) every pass's layers' outputs in the order the
// passes began; `stats` (optional) what ran where. `kv_once`: create_tick's.
inline Status run_pipeline_ticks(comm::Communicator& comm, int64_t stages, int64_t micro_batches, int layers,
                                 const AttentionDims& dims, OverlapMode mode, const std::string& scheduler,
                                 Comparison* worst, bool kv_once = true,
                                 std::vector<RankOutputs>* outputs = nullptr, TickStats* stats = nullptr) {
  const int rank = comm.rank();
  const int64_t dp = comm.size() / stages, stage = rank / dp;
  DISTCA_ASSIGN_OR_RETURN(SchedulerSpec spec, parse_scheduler(scheduler));
  const ScheduleOptions opt = schedule_options(dims);
  TickStats local;
  TickStats& st = stats != nullptr ? *stats : local;
  constexpr int64_t kDocStride = 1000;  // micro-batch m's document ids start at m * kDocStride
  std::vector<std::vector<Batch>> member(static_cast<size_t>(stages));
  Batch universe;  // every document of the schedule once, under its pooled id
  universe.ranks = 1;
  universe.per_rank.resize(1);
  for (int64_t s = 0; s < stages; ++s) {
    for (int64_t m = 0; m < micro_batches; ++m) {
      Batch b = random_batch(static_cast<int>(dp), 256, 900 + static_cast<uint64_t>(10 * s + m));
      for (auto& pieces : b.per_rank) {
        for (Piece& p : pieces) {
          DISTCA_CHECK(p.doc < kDocStride);
          p.doc += m * kDocStride;
        }
      }
      member[static_cast<size_t>(s)].push_back(std::move(b));
      const PoolMember alone{s, m, false, &member[static_cast<size_t>(s)].back()};
      DISTCA_ASSIGN_OR_RETURN(PooledBatch pool, pool_batches(std::span<const PoolMember>(&alone, 1), stages, dp));
      for (const auto& pieces : pool.batch.per_rank) {
        for (const Piece& p : pieces) {
          if (p.offset == 0) universe.per_rank[0].push_back({p.doc, 0, p.doc_len, p.doc_len});
        }
      }
    }
  }
  const std::vector<Problem> problems = layer_problems(universe, dims, 40, layers, false);
  std::vector<std::unique_ptr<LayerStack>> stacks;  // every pass's, in the order they began
  std::vector<LayerStack*> waiting;                 // forward passes without their backward yet
  std::vector<float> idle(1, 0.0f);
  const LayerForward idle_f{idle.data(), idle.data(), idle.data(), idle.data(), idle.data(), 0};
  const LayerBackward idle_b{idle.data(), idle.data(), idle.data(), idle.data(), 0};
  for (const std::vector<PipeOp>& tick : one_f_one_b_ticks(stages, micro_batches)) {
    std::array<std::vector<PoolMember>, 2> members;
    std::array<bool, 2> busy{false, false};  // this rank's stage has an op in the direction
    for (const PipeOp& op : tick) {
      members[op.backward ? 1 : 0].push_back(
          {op.stage, op.microbatch, op.backward, &member[static_cast<size_t>(op.stage)][static_cast<size_t>(op.microbatch)]});
      if (op.stage == stage) busy[op.backward ? 1 : 0] = true;
    }
    std::array<std::optional<NanoPlans>, 2> plans;
    for (size_t d = 0; d < 2; ++d) {
      if (members[d].empty()) continue;
      DISTCA_ASSIGN_OR_RETURN(PooledBatch pool, pool_batches(members[d], stages, dp));
      DISTCA_ASSIGN_OR_RETURN(NanoPlans np, plan_nano_batches(pool.batch, spec, opt));
      plans[d].emplace(std::move(np));
    }
    DISTCA_ASSIGN_OR_RETURN(auto runner, TickRunner::create_tick(comm, plans[0] ? &*plans[0] : nullptr,
                                                                 plans[1] ? &*plans[1] : nullptr, dims, mode,
                                                                 nullptr, kv_once));
    TickIo io;
    if (plans[0]) io.forward.assign(static_cast<size_t>(layers), idle_f);
    if (plans[1]) {
      io.backward.assign(static_cast<size_t>(layers), idle_b);
      io.adopt.assign(static_cast<size_t>(layers), idle_f);
    }
    for (size_t d = 0; d < 2; ++d) {
      if (!plans[d]) continue;
      const std::vector<Piece>& pieces = plans[d]->split.batch.per_rank[static_cast<size_t>(rank)];
      const auto& t = plans[d]->split.tokens[static_cast<size_t>(rank)];
      if (t[0] + t[1] == 0) continue;
      (d == 0 ? st.forward_rows : st.backward_rows) += t[0] + t[1];
      if (!busy[d]) st.rows_off_stage += t[0] + t[1];
      auto fresh = [&] {
        stacks.push_back(std::make_unique<LayerStack>(problems, pieces, std::array<int64_t, 2>{t[0], t[1]},
                                                      mode != OverlapMode::kSignal));
        return stacks.back().get();
      };
      if (d == 0) {
        waiting.push_back(fresh());
        io.forward = waiting.back()->forward();
        io.linear_forward = waiting.back()->linear();
        continue;
      }
      LayerStack* stack = nullptr;
      const auto own = std::find_if(waiting.begin(), waiting.end(), [&](LayerStack* f) { return f->layout() == pieces; });
      if (own != waiting.end()) {
        stack = *own;
        waiting.erase(own);
        ++st.adopted_own;
      } else {
        stack = fresh();
        stack->adopt_reference_forward();
        ++st.adopted_reference;
      }
      io.backward = stack->backward();
      io.adopt = stack->forward();
      io.linear_backward = stack->linear();
    }
    DISTCA_RETURN_IF_ERROR(runner->run(io));
  }
  st.forward_only = static_cast<int64_t>(waiting.size());
  for (const auto& stack : stacks) {
    DISTCA_RETURN_IF_ERROR(stack->status());
    const bool backward = stack->backward_started();
    if (!stack->forward_complete() || (backward && !stack->complete())) {
      return Status::internal("the runner skipped linear work");
    }
    if (mode != OverlapMode::kSignal) worst->merge(stack->compare_layers(backward));
    for (int l = 0; outputs != nullptr && l < stack->layers(); ++l) outputs->push_back(stack->outputs(l));
  }
  return Status::ok_status();
}

}  // namespace distca::runtime::testing
