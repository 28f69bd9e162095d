// Shared by the runtime's local and MPI tests: a random problem (documents with Q/K/V/dO
// drawn per document from the seed, so every rank and every layout sees the same values), the
// whole-document kernel reference (one fused call, one task per document), and the
// comparison of what a rank got from the runtime against it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/rng.h"
#include "distca/data/workload.h"
#include "distca/kernels/attention.h"
#include "distca/kernels/reference.h"
#include "distca/plan/plan.h"
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
    std::lock_guard<std::mutex> lock(kernel_mutex());
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
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(a - b)));
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

inline Comparison compare(const Problem& pr, const Batch& batch, int rank, const RankOutputs& got) {
  Comparison c;
  const int64_t qf = pr.dims.q_floats(), kvf = pr.dims.kv_floats(), H = pr.dims.n_heads;
  int64_t l = 0;
  for (const Piece& p : batch.per_rank[static_cast<size_t>(rank)]) {
    for (int64_t i = 0; i < p.len; ++i, ++l) {
      const int64_t r = pr.row_of(p.doc, p.offset + i);
      for (int64_t e = 0; e < qf; ++e) {
        c.o.add(got.o[static_cast<size_t>(l * qf + e)], pr.o[static_cast<size_t>(r * qf + e)]);
        c.dq.add(got.dq[static_cast<size_t>(l * qf + e)], pr.dq[static_cast<size_t>(r * qf + e)]);
      }
      for (int64_t h = 0; h < H; ++h) c.lse.add(got.lse[static_cast<size_t>(l * H + h)], pr.lse[static_cast<size_t>(r * H + h)]);
      for (int64_t e = 0; e < kvf; ++e) {
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
  DISTCA_RETURN_IF_ERROR(d->forward(3, q.data(), k.data(), v.data(), out->o.data(), out->lse.data()));
  DISTCA_RETURN_IF_ERROR(d->backward(3, d_o.data(), out->dq.data(), out->dk.data(), out->dv.data()));
  if (bwd_bytes) *bwd_bytes = d->last_backward_bytes_sent();
  return Status::ok_status();
}

// Runs `layers` layers forward + backward through a TickRunner (same inputs per layer);
// returns the last layer's... every layer's outputs must agree, so outputs of layer 0.
inline Status run_runner(comm::Communicator& comm, const Problem& pr, const NanoPlans& plans, OverlapMode mode,
                         int layers, TraceRecorder* trace, RankOutputs* out, bool* valid,
                         bool stateless = false) {
  const int r = comm.rank();
  const Batch& b = plans.full.batch;  // the split batch: ping's rows first on every rank
  const int64_t qf = pr.dims.q_floats(), kvf = pr.dims.kv_floats();
  const auto q = local_rows(pr, b, r, pr.q, qf), k = local_rows(pr, b, r, pr.k, kvf), v = local_rows(pr, b, r, pr.v, kvf),
             d_o = local_rows(pr, b, r, pr.d_o, qf);
  const int64_t n = static_cast<int64_t>(q.size()) / qf;
  std::vector<RankOutputs> outs(static_cast<size_t>(layers));
  std::vector<LayerForward> fw;
  std::vector<LayerBackward> bw;
  for (auto& x : outs) {
    x.o.assign(q.size(), NAN), x.dq.assign(q.size(), NAN), x.lse.assign(static_cast<size_t>(n * pr.dims.n_heads), NAN);
    x.dk.assign(k.size(), NAN), x.dv.assign(k.size(), NAN);
  }
  for (auto& x : outs) {
    fw.push_back({q.data(), k.data(), v.data(), x.o.data(), x.lse.data()});
    bw.push_back({d_o.data(), x.dq.data(), x.dk.data(), x.dv.data()});
  }
  DISTCA_ASSIGN_OR_RETURN(auto runner, TickRunner::create(comm, plans, pr.dims, mode, trace, stateless));
  int linear_calls = 0;
  LinearFn fn = [&](int, int, bool) { ++linear_calls; };
  DISTCA_RETURN_IF_ERROR(runner->forward(fw, fn));
  DISTCA_RETURN_IF_ERROR(runner->backward(bw, fn));
  if (linear_calls != 4 * (layers + 1)) return Status::internal("linear stand-in called " + std::to_string(linear_calls) + " times");
  *valid = runner->outputs_valid();
  *out = outs[0];
  for (int l = 1; l < layers && *valid; ++l) {
    const auto& x = outs[static_cast<size_t>(l)];
    if (x.o != out->o || x.dq != out->dq || x.dk != out->dk || x.dv != out->dv) {
      return Status::internal("layer " + std::to_string(l) + " differs from layer 0");
    }
  }
  return Status::ok_status();
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

// The forward (O, LSE) and dQ of a row depend only on the row, its keys and its query tile's
// key range, which the dispatcher keeps equal to the whole-document call's only when the
// kernel's tiling lines up; dK/dV partials are summed in another association. So: forward
// and dQ must be bitwise equal or within kFwdTol, dK/dV within kBwdFactor times the kernel's
// own error against fp64.
inline constexpr double kFwdTol = 2e-6;
inline constexpr double kBwdFactor = 2.0;

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

}  // namespace distca::runtime::testing
