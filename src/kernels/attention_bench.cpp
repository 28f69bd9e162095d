// The CPU attention benchmark's runs (attention_bench.h).
#include "distca/kernels/attention_bench.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "distca/core/clock.h"
#include "distca/core/rng.h"
#include "distca/core/stats.h"
#include "distca/kernels/blas.h"
#include "distca/kernels/profiler.h"

namespace distca::kernels {

SgemmBaseline::SgemmBaseline(int64_t n)
    : n_(static_cast<int>(n)), a_(static_cast<size_t>(n * n)), b_(a_.size()), c_(a_.size()) {
  Rng rng(7);
  for (auto& x : a_) x = static_cast<float>(rng.uniform(-1, 1));
  for (auto& x : b_) x = static_cast<float>(rng.uniform(-1, 1));
  run();  // warm-up
}

double SgemmBaseline::run() {
  const double t0 = monotonic_seconds();
  gemm_tiled<float>(false, false, n_, n_, n_, 1.0f, a_.data(), n_, b_.data(), n_, 0.0f, c_.data(), n_);
  const double t = monotonic_seconds() - t0;
  const double gf = 2.0 * n_ * static_cast<double>(n_) * n_ / t / 1e9;
  all_.push_back(gf);
  return gf;
}

double SgemmBaseline::median_gflops() const { return median(all_); }

namespace {

AttentionCase run_case(const std::string& kind, const std::vector<std::pair<int64_t, int64_t>>& tasks,
                       const AttentionBenchOptions& o, int head_dim, SgemmBaseline& gemm) {
  AttentionProblem prob = make_problem(tasks, o.heads, o.kv_heads, head_dim, 11);
  std::vector<double> fg, bg, fr, br;
  time_kernels(prob, 1, 0.0);  // warm-up
  const double start = monotonic_seconds();
  for (int r = 0; r < o.repeats; ++r) {
    const double base = gemm.run();
    const KernelTiming t = time_kernels(prob, 1, 0.0);
    fg.push_back(t.forward_flops / t.forward_seconds / 1e9);
    bg.push_back(t.backward_flops / t.backward_seconds / 1e9);
    fr.push_back(fg.back() / base);
    br.push_back(bg.back() / base);
    if (r >= 2 && monotonic_seconds() - start > 20.0) break;  // long cases: three pairs are enough
  }
  AttentionCase c;
  c.kind = kind;
  c.head_dim = head_dim;
  c.tasks = static_cast<int64_t>(tasks.size());
  for (const auto& [q, k] : tasks) {
    c.q_len += q;
    c.kv_len += k;
  }
  c.fwd_gflops = median(fg);
  c.bwd_gflops = median(bg);
  c.fwd_ratio = median(fr);
  c.bwd_ratio = median(br);
  return c;
}

std::vector<std::pair<int64_t, int64_t>> mixed_batch(int64_t context) {
  Rng rng(3);
  std::vector<std::pair<int64_t, int64_t>> t;
  int64_t rows = 0;
  while (rows < context) {
    const int64_t kv = 128 + static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(context - 127)));
    const int64_t q = std::min<int64_t>(kv, 128 << rng.uniform_int(5));
    t.push_back({q, kv});
    rows += q;
  }
  return t;
}

}  // namespace

double attention_bench_bytes(const AttentionBenchOptions& o) {
  int64_t mixed_q = 0, mixed_kv = 0;
  for (const auto& [q, k] : mixed_batch(o.context)) mixed_q += q, mixed_kv += k;
  double need = 0;
  for (int d : o.head_dims) {
    const std::vector<std::pair<int64_t, int64_t>> largest = {{o.max_len, o.max_len}, {o.context, o.context}, {mixed_q, mixed_kv}};
    for (const auto& [q, k] : largest) need = std::max(need, problem_memory_bytes(q, k, o.heads, o.kv_heads, d));
  }
  return need;
}

std::vector<AttentionCase> run_attention_bench(const AttentionBenchOptions& o, SgemmBaseline& gemm,
                                               const std::function<void(const AttentionCase&)>& progress) {
  std::vector<AttentionCase> cases;
  auto note = [&](AttentionCase c) {
    cases.push_back(std::move(c));
    if (progress) progress(cases.back());
  };
  for (int d : o.head_dims) {
    for (int64_t len = 32; len <= o.max_len; len *= 2) note(run_case("single", {{len, len}}, o, d, gemm));
    for (int64_t q = 128; q <= o.context; q *= 2) note(run_case("shard", {{q, o.context}}, o, d, gemm));
    note(run_case("mixed", mixed_batch(o.context), o, d, gemm));
  }
  return cases;
}

nlohmann::json attention_bench_summary(const AttentionBenchOptions& o, const std::vector<AttentionCase>& cases) {
  nlohmann::json summary = nlohmann::json::object();
  for (int d : o.head_dims) {
    double fmin = 1e300, bmin = 1e300, s128 = 0, s4k = 0;
    for (const auto& r : cases) {
      if (r.head_dim != d) continue;
      if (r.kind == "single" && r.q_len >= 1024) {
        fmin = std::min(fmin, r.fwd_ratio);
        bmin = std::min(bmin, r.bwd_ratio);
      }
      // forward+backward throughput relative to sgemm (so load changes between cases cancel)
      const double fb = (r.fwd_ratio > 0 && r.bwd_ratio > 0) ? 3.5 / (1.0 / r.fwd_ratio + 2.5 / r.bwd_ratio) : 0;
      if (r.kind == "shard" && r.q_len == 128) s128 = fb;
      if (r.kind == "shard" && r.q_len == 4096) s4k = fb;
    }
    nlohmann::json s;
    if (fmin < 1e300) {
      s["min_forward_over_sgemm_1k_plus"] = fmin;
      s["min_backward_over_sgemm_1k_plus"] = bmin;
    }
    if (s128 > 0 && s4k > 0) s["shard128_over_shard4k"] = s128 / s4k;
    summary["head_dim_" + std::to_string(d)] = s;
  }
  return summary;
}

}  // namespace distca::kernels
