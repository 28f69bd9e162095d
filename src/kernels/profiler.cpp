#include "distca/kernels/profiler.h"
#include "distca/core/stats.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "distca/core/check.h"
#include "distca/core/clock.h"
#include "distca/core/rng.h"
#include "distca/kernels/attention.h"
#include "distca/kernels/blas.h"

namespace distca::kernels {

double problem_memory_bytes(int64_t total_q, int64_t total_kv, int32_t n_heads, int32_t n_kv_heads,
                            int32_t head_dim) {
  const double q_rows = static_cast<double>(total_q) * n_heads, kv_rows = static_cast<double>(total_kv) * n_kv_heads;
  // q, o, d_o, dq and k, v, dk, dv (make_problem), and lse.
  const double floats = 4 * q_rows * head_dim + 4 * kv_rows * head_dim + q_rows;
  return floats * sizeof(float) +
         attention_scratch_bytes(total_q, n_heads, n_kv_heads, head_dim, true, omp_get_max_threads());
}

KernelTiming time_kernels(AttentionProblem& prob, int repeats, double min_seconds) {
  return time_kernels_in_step(prob, repeats, min_seconds, {}).value();  // no sync hooks: cannot fail
}

int profile_repetitions(double warm_seconds, int repeats, double min_seconds) {
  const int most = std::max(1, repeats), fewest = std::min(most, kMinProfileRepeats);
  if (!(warm_seconds > 0)) return most;
  const double wanted = std::ceil((min_seconds - warm_seconds) / warm_seconds);
  return std::clamp(wanted >= most ? most : static_cast<int>(std::max(0.0, wanted)), fewest, most);
}

Result<double> slowest_over_ranks(const ProfileSync& sync, double mine) {
  if (!sync.all_gather) return mine;
  DISTCA_ASSIGN_OR_RETURN(std::vector<double> all, sync.all_gather(mine));
  DISTCA_CHECK(!all.empty());
  return *std::max_element(all.begin(), all.end());
}

Result<KernelTiming> time_kernels_in_step(AttentionProblem& prob, int repeats, double min_seconds,
                                          const ProfileSync& sync, const std::function<double()>& clock,
                                          double min_call_seconds) {
  const std::function<double()> now = clock ? clock : std::function<double()>(monotonic_seconds);
  const AttentionParams p = params_for(prob);
  KernelTiming t;
  t.forward_flops = attention_forward_flops(p);
  t.backward_flops = attention_backward_flops(p);
  if (sync.barrier) DISTCA_RETURN_IF_ERROR(sync.barrier());
  const double w0 = now();
  attention_forward(p);  // warm-up (page faults, BLAS buffers)
  attention_backward(p);
  double warm = now() - w0;
  if (sync.all_gather) {  // every rank runs the slowest rank's count
    DISTCA_ASSIGN_OR_RETURN(std::vector<double> all, sync.all_gather(warm));
    warm = *std::max_element(all.begin(), all.end());
  }
  const int n = profile_repetitions(warm, repeats, min_seconds);
  std::vector<double> fwd, bwd;
  for (int r = 0; r < n; ++r) {
    if (sync.barrier) DISTCA_RETURN_IF_ERROR(sync.barrier());
    const CallTiming f = time_calls([&] { attention_forward(p); }, min_call_seconds, now, now());
    const CallTiming b = time_calls([&] { attention_backward(p); }, min_call_seconds, now, f.end);
    fwd.push_back(f.per_call);
    bwd.push_back(b.per_call);
  }
  DISTCA_ASSIGN_OR_RETURN(t.forward_seconds, slowest_over_ranks(sync, median(fwd)));
  DISTCA_ASSIGN_OR_RETURN(t.backward_seconds, slowest_over_ranks(sync, median(bwd)));
  return t;
}

namespace {
std::pair<int64_t, int64_t> widest(const std::vector<SgemmShape>& shapes) {
  int64_t kmax = 0, nmax = 0;
  for (const SgemmShape& s : shapes) kmax = std::max(kmax, s.k), nmax = std::max(nmax, s.n);
  return {kmax, nmax};
}
}  // namespace

int64_t sgemm_probe_bytes(int64_t rows, const std::vector<SgemmShape>& shapes) {
  const auto [kmax, nmax] = widest(shapes);
  return 4 * (rows * kmax + kmax * nmax + rows * nmax);
}

double measure_sgemm_flops(int64_t rows, const std::vector<SgemmShape>& shapes, uint64_t stream) {
  const auto [kmax, nmax] = widest(shapes);
  Rng rng(99, stream);
  std::vector<float> a(static_cast<size_t>(rows * kmax)), b(static_cast<size_t>(kmax * nmax)), c(static_cast<size_t>(rows * nmax));
  for (auto& x : a) x = static_cast<float>(rng.uniform(-1, 1));
  for (auto& x : b) x = static_cast<float>(rng.uniform(-1, 1));
  double flops = 0, best = 0;
  for (const SgemmShape& s : shapes) flops += 2.0 * static_cast<double>(rows * s.k * s.n);
  for (int pass = 0; pass < 4; ++pass) {  // pass 0 warms up
    const double t0 = monotonic_seconds();
    for (const SgemmShape& s : shapes) {
      gemm<float>(false, false, rows, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.n, 0.0f, c.data(), s.n);
    }
    const double dt = monotonic_seconds() - t0;
    if (pass > 0 && dt > 0) best = std::max(best, flops / dt);
  }
  return best;
}

std::vector<int64_t> power_of_two_lengths(int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (int64_t x = lo; x <= hi; x *= 2) v.push_back(x);
  return v;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(c + 2);
    }
  }
  return "unknown";
}

double guard_work(int64_t q_len, int64_t kv_len) {
  const double q = static_cast<double>(q_len), kv = static_cast<double>(kv_len);
  return q * (kv - q) + q * (q + 1) / 2 + kGuardRowPairs * q;  // causal pairs + the rows' share
}

std::vector<std::vector<double>> neighbour_fit(const CostTable& t) {
  const auto nq = static_cast<int64_t>(t.q_lens.size()), nk = static_cast<int64_t>(t.kv_lens.size());
  auto measured = [&](int64_t i, int64_t j) {
    return i >= 0 && j >= 0 && i < nq && j < nk && t.q_lens[static_cast<size_t>(i)] <= t.kv_lens[static_cast<size_t>(j)] &&
           t.seconds[static_cast<size_t>(i)][static_cast<size_t>(j)] > 0;
  };
  auto work = [&](int64_t i, int64_t j) { return guard_work(t.q_lens[static_cast<size_t>(i)], t.kv_lens[static_cast<size_t>(j)]); };
  std::vector<std::vector<double>> fit(static_cast<size_t>(nq), std::vector<double>(static_cast<size_t>(nk), 0.0));
  for (int64_t i = 0; i < nq; ++i) {
    for (int64_t j = 0; j < nk; ++j) {
      if (!measured(i, j)) continue;
      std::vector<double> guesses;
      for (int64_t di = -1; di <= 1; ++di) {
        for (int64_t dj = -1; dj <= 1; ++dj) {
          if ((di != 0 || dj != 0) && measured(i + di, j + dj)) {
            guesses.push_back(t.seconds[static_cast<size_t>(i + di)][static_cast<size_t>(j + dj)] * work(i, j) / work(i + di, j + dj));
          }
        }
      }
      fit[static_cast<size_t>(i)][static_cast<size_t>(j)] = median(std::move(guesses));
    }
  }
  return fit;
}

namespace {

std::vector<int64_t> grid_lengths(const std::vector<int64_t>& given) {
  return given.empty() ? power_of_two_lengths(128, 32768) : given;
}

std::string ms(double seconds) { return std::to_string(seconds * 1e3) + " ms"; }

// What the guard found at one cell of one pass's table.
struct Suspect {
  size_t i, j;
  bool backward;
  double seconds, fit;
};

// The cells of g more than `tolerance` above their neighbours' fit, in grid order.
std::vector<Suspect> suspects(const AttentionGrids& g, double tolerance) {
  std::vector<Suspect> out;
  const auto fit_f = neighbour_fit(g.forward), fit_b = neighbour_fit(g.backward);
  for (size_t i = 0; i < g.forward.q_lens.size(); ++i) {
    for (size_t j = 0; j < g.forward.kv_lens.size(); ++j) {
      for (const bool b : {false, true}) {
        const double s = (b ? g.backward : g.forward).seconds[i][j], fit = (b ? fit_b : fit_f)[i][j];
        if (fit > 0 && s > (1 + tolerance) * fit) out.push_back({i, j, b, s, fit});
      }
    }
  }
  return out;
}

std::string describe(const AttentionGrids& g, const Suspect& s) {
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2fx", s.seconds / s.fit);
  return "attention q_len " + std::to_string(g.forward.q_lens[s.i]) + " kv_len " + std::to_string(g.forward.kv_lens[s.j]) +
         (s.backward ? " backward: " : " forward: ") + ms(s.seconds) + ", " + ratio + " its neighbours' fit " + ms(s.fit);
}

// The guard's rounds (profile_attention_grid).
Status guard_grid(const ProfileOptions& opt, const CellTimer& time_cell, const ProfileLog& notice, AttentionGrids& g) {
  for (int round = 0; round < opt.guard_rounds; ++round) {
    const std::vector<Suspect> found = suspects(g, opt.guard_tolerance);
    if (found.empty()) return {};
    KernelTiming again;  // both passes of a cell (adjacent in `found`) share one measurement
    for (size_t k = 0; k < found.size(); ++k) {
      const Suspect& s = found[k];
      if (k == 0 || found[k - 1].i != s.i || found[k - 1].j != s.j) {
        DISTCA_ASSIGN_OR_RETURN(again, time_cell(g.forward.q_lens[s.i], g.forward.kv_lens[s.j]));
      }
      const double fresh = std::max(s.backward ? again.backward_seconds : again.forward_seconds, kMinTaskSeconds);
      double& cell = (s.backward ? g.backward : g.forward).seconds[s.i][s.j];
      cell = std::min(cell, fresh);
      if (notice) notice(describe(g, s) + "; measured again: " + ms(fresh));
    }
  }
  if (notice) {
    for (const Suspect& s : suspects(g, opt.guard_tolerance)) {
      notice(describe(g, s) + " after " + std::to_string(opt.guard_rounds) + " re-measurements: kept");
    }
  }
  return {};
}

}  // namespace

Result<AttentionGrids> profile_attention_grid(const ProfileOptions& opt, const CellTimer& time_cell,
                                              const ProfileLog& progress, const ProfileLog& notice) {
  CostTable table;
  table.n_heads = opt.n_heads;
  table.n_kv_heads = opt.n_kv_heads;
  table.head_dim = opt.head_dim;
  table.q_lens = grid_lengths(opt.q_lens);
  table.kv_lens = grid_lengths(opt.kv_lens);
  table.hardware = {{"cpu", cpu_model_name()},
                    {"threads", omp_get_max_threads()},
                    {"blas", "OpenBLAS (single-threaded per block)"},
                    {"kernel", "distca CPU fast path, fp32"}};
  // Check the grid before spending minutes on it (placeholder times).
  table.seconds.assign(table.q_lens.size(), std::vector<double>(table.kv_lens.size(), 1.0));
  DISTCA_RETURN_IF_ERROR(table.validate("profile grid"));
  AttentionGrids g{table, table};
  for (size_t i = 0; i < table.q_lens.size(); ++i) {
    for (size_t j = 0; j < table.kv_lens.size(); ++j) {
      const int64_t ql = table.q_lens[i], kl = table.kv_lens[j];
      if (ql > kl) {
        g.forward.seconds[i][j] = g.backward.seconds[i][j] = 0;
        continue;
      }
      DISTCA_ASSIGN_OR_RETURN(const KernelTiming t, time_cell(ql, kl));
      // A kernel faster than the table's floor (a nanosecond) still loads.
      g.forward.seconds[i][j] = std::max(t.forward_seconds, kMinTaskSeconds);
      g.backward.seconds[i][j] = std::max(t.backward_seconds, kMinTaskSeconds);
      if (progress) {
        progress("q_len " + std::to_string(ql) + " kv_len " + std::to_string(kl) + ": " +
                 ms(t.forward_seconds + t.backward_seconds));
      }
    }
  }
  DISTCA_RETURN_IF_ERROR(guard_grid(opt, time_cell, notice, g));
  DISTCA_RETURN_IF_ERROR(g.forward.validate("profile (forward)"));
  DISTCA_RETURN_IF_ERROR(g.backward.validate("profile (backward)"));
  return g;
}

Result<AttentionGrids> profile_attention_split(const ProfileOptions& opt, const ProfileLog& progress,
                                               const ProfileSync& sync, const ProfileLog& notice) {
  const std::vector<int64_t> qs = grid_lengths(opt.q_lens), kvs = grid_lengths(opt.kv_lens);
  auto time_cell = [&](int64_t ql, int64_t kl) -> Result<KernelTiming> {
    const auto i = static_cast<uint64_t>(std::find(qs.begin(), qs.end(), ql) - qs.begin());
    const auto j = static_cast<uint64_t>(std::find(kvs.begin(), kvs.end(), kl) - kvs.begin());
    AttentionProblem prob = make_problem({{ql, kl}}, opt.n_heads, opt.n_kv_heads, opt.head_dim, opt.seed + i * 1000 + j);
    return time_kernels_in_step(prob, opt.repeats, opt.min_seconds, sync, {}, opt.min_call_seconds);
  };
  return profile_attention_grid(opt, time_cell, progress, notice);
}

double profile_gemm_bytes(const GemmRecord& g) {
  return 4.0 * (static_cast<double>(g.m) * static_cast<double>(g.k) + static_cast<double>(g.k) * static_cast<double>(g.n) +
                static_cast<double>(g.m) * static_cast<double>(g.n));
}

Result<double> time_profile_gemm(const GemmRecord& g, int repeats, const std::function<Status()>& sync, uint64_t seed,
                                 double min_call_seconds, const std::function<double()>& clock) {
  const std::function<double()> now = clock ? clock : std::function<double()>(monotonic_seconds);
  // Operands as model/layers.cpp stores them: forward x (m, k) and w (n, k) (NT); backward
  // data dy (m, k) and w (k, n) (NN); backward weight dy (k, m) and x (k, n) (TN).
  const bool ta = g.pass == GemmPass::kBackwardWeight;
  const bool tb = g.pass == GemmPass::kForward;
  std::vector<float> a(static_cast<size_t>(g.m * g.k)), b(static_cast<size_t>(g.k * g.n)), c(static_cast<size_t>(g.m * g.n));
  Rng rng(seed);
  for (auto& x : a) x = static_cast<float>(rng.uniform(-1.0, 1.0));
  for (auto& x : b) x = static_cast<float>(rng.uniform(-1.0, 1.0));
  const int64_t lda = std::max<int64_t>(1, ta ? g.m : g.k), ldb = std::max<int64_t>(1, tb ? g.k : g.n);
  const int64_t ldc = std::max<int64_t>(1, g.n);
  // backward_weight accumulates into dw (beta 1), as the model does.
  const float beta = g.pass == GemmPass::kBackwardWeight ? 1.0f : 0.0f;
  auto call = [&] {
    gemm_tiled<float>(ta, tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  };
  call();  // warm-up (page faults, OpenBLAS buffers)
  std::vector<double> t;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    if (sync) DISTCA_RETURN_IF_ERROR(sync());
    t.push_back(time_calls(call, min_call_seconds, now, now()).per_call);
  }
  return std::max(median(std::move(t)), kMinTaskSeconds);
}

}  // namespace distca::kernels
