// `distca bench attention`: forward and backward GFLOP/s of the CPU attention kernels (pairs-
// based FLOPs, docs/architecture.md) against OpenBLAS sgemm measured in the same run on the
// same threads. Figures go to docs/benchmarks.md. With `--device cuda` (a DISTCA_CUDA build on
// a machine with a GPU): TFLOP/s of the CUDA kernels (docs/kernels.md, "CUDA").
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/kernels/attention.h"
#include "distca/kernels/attention_bench.h"
#include "distca/kernels/blas.h"
#include "distca/kernels/profiler.h"
#if DISTCA_HAS_CUDA
#include "distca/kernels_cuda/device.h"
#include "distca/kernels_cuda/probe.h"
#endif

namespace distca::cli::cmd_bench_attention {
namespace {

struct BenchFlags : kernels::AttentionBenchOptions {  // the CPU cases' flags (attention_bench.h)
  bool json = false;
  int64_t sgemm_n = 2048;
  std::string device = "cpu";
  std::string dtype = "bf16";    // --device cuda only
  std::string kernel = "auto";   // --device cuda only
};

int run(const BenchFlags& f) {
  const int threads = omp_get_max_threads();
  const bool progress = stderr_is_terminal() && !f.json;
  kernels::SgemmBaseline gemm(f.sgemm_n);
  const std::vector<kernels::AttentionCase> results =
      kernels::run_attention_bench(f, gemm, [&](const kernels::AttentionCase& r) {
        if (progress) std::fprintf(stderr, "\r%-8s d=%d q=%lld kv=%lld    ", r.kind.c_str(), r.head_dim,
                                   static_cast<long long>(r.q_len), static_cast<long long>(r.kv_len));
      });
  if (progress) std::fprintf(stderr, "\r%60s\r", "");
  const double sgemm = gemm.median_gflops();
  // Summary figures: the worst ratio for single tasks of >= 1K, and shard 128 vs shard 4K.
  const nlohmann::json summary = kernels::attention_bench_summary(f, results);

  if (f.json) {
    nlohmann::json j;
    j["threads"] = threads;
    j["cpu"] = kernels::cpu_model_name();
    j["n_heads"] = f.heads;
    j["n_kv_heads"] = f.kv_heads;
    j["blas_core"] = kernels::blas_core_name();
    j["heap_huge_pages"] = malloc_on_huge_pages();
    j["sgemm_n"] = f.sgemm_n;
    j["sgemm_gflops"] = sgemm;
    j["cases"] = nlohmann::json::array();
    for (const auto& r : results) {
      j["cases"].push_back({{"kind", r.kind}, {"head_dim", r.head_dim}, {"q_len", r.q_len}, {"kv_len", r.kv_len},
                            {"tasks", r.tasks}, {"forward_gflops", r.fwd_gflops}, {"backward_gflops", r.bwd_gflops},
                            {"forward_over_sgemm", r.fwd_ratio},
                            {"backward_over_sgemm", r.bwd_ratio}});
    }
    j["summary"] = summary;
    if (Status st = write_stdout(j.dump(2) + "\n"); !st.ok()) return fail(st);
    return kExitOk;
  }
  std::string report;
  appendf(report, "CPU attention kernels, %d threads, n_heads %d, n_kv_heads %d (%s)\n", threads, f.heads, f.kv_heads,
              kernels::cpu_model_name().c_str());
  appendf(report, "OpenBLAS (%s kernels) sgemm %lld^3, 128 x 128 tiles on the kernels' OpenMP threads: %.1f GFLOP/s "
                  "(median; each case's ratios use the sgemm run beside it); %s\n\n",
              kernels::blas_core_name(), static_cast<long long>(f.sgemm_n), sgemm, heap_pages());
  appendf(report, "%-7s %4s %7s %7s %5s %10s %10s %8s %8s\n", "case", "d", "q_len", "kv_len", "tasks", "fwd GF/s",
              "bwd GF/s", "fwd/gemm", "bwd/gemm");
  for (const auto& r : results) {
    appendf(report, "%-7s %4d %7lld %7lld %5lld %10.1f %10.1f %8.2f %8.2f\n", r.kind.c_str(), r.head_dim,
                static_cast<long long>(r.q_len), static_cast<long long>(r.kv_len), static_cast<long long>(r.tasks),
                r.fwd_gflops, r.bwd_gflops, r.fwd_ratio, r.bwd_ratio);
  }
  appendf(report, "\nsummary: %s\n", summary.dump().c_str());
  if (Status st = write_stdout(report); !st.ok()) return fail(st);
  return kExitOk;
}

#if DISTCA_HAS_CUDA
struct CudaCase {
  std::string kind;
  int head_dim = 0;
  int64_t q_len = 0, kv_len = 0, tasks = 0;
  kernels::CudaTiming t;
  double fwd_tflops() const { return t.forward_flops / t.forward_seconds / 1e12; }
  double bwd_tflops() const { return t.backward_flops / t.backward_seconds / 1e12; }
  // forward + backward together, FLOP-weighted (3.5 = 1 + 2.5)
  double fb_tflops() const { return (t.forward_flops + t.backward_flops) / (t.forward_seconds + t.backward_seconds) / 1e12; }
};

// The cases: long single causal tasks (1K .. --max-len) and, at --context C, batches of q-row
// shards of C-key contexts, n = max(1, C / (2 q)) of them, so every shard batch does about the
// work of one C-token causal task (the fused batch an attention server receives).
std::vector<std::pair<std::string, std::vector<std::pair<int64_t, int64_t>>>> cuda_cases(const BenchFlags& f) {
  std::vector<std::pair<std::string, std::vector<std::pair<int64_t, int64_t>>>> c;
  for (int64_t len = 1024; len <= f.max_len; len *= 2) c.push_back({"single", {{len, len}}});
  for (int64_t q = 128; q < f.context; q *= 2) {
    c.push_back({"shard", std::vector<std::pair<int64_t, int64_t>>(std::max<int64_t>(1, f.context / (2 * q)), {q, f.context})});
  }
  return c;
}

constexpr int64_t kGemmN = 8192;  // the cuBLAS GEMM baseline's size

// Refuses, before running anything, what does not fit the device and shapes the kernels
// refuse: kExitOk, or the exit code.
int check_cuda_cases(const BenchFlags& f, kernels::DType dtype, kernels::CudaKernel kernel,
                     const kernels::CudaDeviceInfo& dev) {
  double need = 0;
  for (int d : f.head_dims) {
    for (const auto& [kind, tasks] : cuda_cases(f)) {
      kernels::CudaProbe pr;
      pr.tasks = tasks;
      pr.n_heads = f.heads, pr.n_kv_heads = f.kv_heads, pr.head_dim = d, pr.dtype = dtype;
      need = std::max(need, kernels::cuda_probe_bytes(pr));
    }
    kernels::AttentionParams p;
    const int32_t cu[2] = {0, 1024};
    p.dtype = dtype, p.n_tasks = 1, p.n_heads = f.heads, p.n_kv_heads = f.kv_heads, p.head_dim = d;
    p.cu_seqlens_q = p.cu_seqlens_k = cu;
    alignas(16) float dummy[4];
    p.q = p.k = p.v = p.d_o = dummy;
    p.o = p.lse = p.dq = p.dk = p.dv = dummy;
    const kernels::CudaAttentionOptions opt{kernel, kernel};
    if (auto plan = kernels::plan_cuda_attention(p, cu, cu, true, opt); !plan.ok()) {
      return fail_input("--kernel " + f.kernel + " --dtype " + f.dtype + " --head-dims " + std::to_string(d) + ": " +
                        plan.status().message());
    }
  }
  if (need > 0.9 * static_cast<double>(dev.global_memory_bytes)) {
    return fail_input("--max-len/--context/--heads: the largest case needs " + std::to_string(need / 1e9) +
                      " GB of device memory; " + dev.name + " has " +
                      std::to_string(static_cast<double>(dev.global_memory_bytes) / 1e9));
  }
  return kExitOk;
}

// Against the H200 goals: the longest single task's forward and backward, and the
// 128-row shard batch against the single task of the same context (forward + backward).
nlohmann::json cuda_summary(const BenchFlags& f, const std::vector<CudaCase>& results, double gemm) {
  nlohmann::json summary = nlohmann::json::object();
  for (int d : f.head_dims) {
    const CudaCase *longest = nullptr, *at_context = nullptr, *shard128 = nullptr;
    for (const auto& r : results) {
      if (r.head_dim != d) continue;
      if (r.kind == "single" && (longest == nullptr || r.q_len > longest->q_len)) longest = &r;
      if (r.kind == "single" && r.q_len == f.context) at_context = &r;
      if (r.kind == "shard" && r.q_len / r.tasks == 128) shard128 = &r;
    }
    nlohmann::json s;
    if (longest != nullptr) {
      s["longest_single_len"] = longest->q_len;
      s["forward_tflops"] = longest->fwd_tflops();
      s["backward_tflops"] = longest->bwd_tflops();
      s["forward_goal_250_met"] = longest->fwd_tflops() >= 250;
      s["backward_goal_180_met"] = longest->bwd_tflops() >= 180;
      s["forward_over_gemm"] = longest->fwd_tflops() / gemm;
      s["backward_over_gemm"] = longest->bwd_tflops() / gemm;
    }
    if (at_context != nullptr && shard128 != nullptr) {
      s["shard128_over_single"] = shard128->fb_tflops() / at_context->fb_tflops();
      s["shard_goal_0_8_met"] = shard128->fb_tflops() / at_context->fb_tflops() >= 0.8;
    }
    summary["head_dim_" + std::to_string(d)] = s;
  }
  return summary;
}

int print_cuda(const BenchFlags& f, const kernels::CudaDeviceInfo& dev, const std::vector<CudaCase>& results,
               double gemm, const nlohmann::json& summary) {
  if (f.json) {
    nlohmann::json j;
    j["device"] = "cuda";
    j["gpu"] = dev.name;
    j["sm"] = std::to_string(dev.sm_major) + std::to_string(dev.sm_minor);
    j["dtype"] = f.dtype;
    j["kernel"] = f.kernel;
    j["n_heads"] = f.heads;
    j["n_kv_heads"] = f.kv_heads;
    j["causal"] = true;
    j["cublas_gemm_n"] = kGemmN;
    j["cublas_gemm_tflops"] = gemm;
    j["cases"] = nlohmann::json::array();
    for (const auto& r : results) {
      j["cases"].push_back({{"kind", r.kind}, {"head_dim", r.head_dim}, {"q_len", r.q_len}, {"kv_len", r.kv_len},
                            {"tasks", r.tasks}, {"forward_tflops", r.fwd_tflops()}, {"backward_tflops", r.bwd_tflops()},
                            {"forward_ms", r.t.forward_seconds * 1e3}, {"backward_ms", r.t.backward_seconds * 1e3},
                            {"forward_over_gemm", r.fwd_tflops() / gemm}, {"backward_over_gemm", r.bwd_tflops() / gemm},
                            {"forward_kernel", kernels::cuda_kernel_name(r.t.forward_kernel)},
                            {"backward_kernel", kernels::cuda_kernel_name(r.t.backward_kernel)}});
    }
    j["summary"] = summary;
    if (Status st = write_stdout(j.dump(2) + "\n"); !st.ok()) return fail(st);
    return kExitOk;
  }
  std::string report;
  appendf(report, "CUDA attention kernels on %s (sm_%d%d), %s, n_heads %d, n_kv_heads %d, causal\n", dev.name.c_str(),
          dev.sm_major, dev.sm_minor, f.dtype.c_str(), f.heads, f.kv_heads);
  appendf(report, "cuBLAS GEMM %lld^3 (%s, fp32 accumulate): %.1f TFLOP/s (median)\n\n", static_cast<long long>(kGemmN),
          f.dtype.c_str(), gemm);
  appendf(report, "%-7s %4s %8s %8s %5s %9s %9s %9s %9s  %s\n", "case", "d", "q_len", "kv_len", "tasks", "fwd TF/s",
          "bwd TF/s", "fwd ms", "bwd ms", "kernels");
  for (const auto& r : results) {
    appendf(report, "%-7s %4d %8lld %8lld %5lld %9.1f %9.1f %9.3f %9.3f  %s/%s\n", r.kind.c_str(), r.head_dim,
            static_cast<long long>(r.q_len), static_cast<long long>(r.kv_len), static_cast<long long>(r.tasks),
            r.fwd_tflops(), r.bwd_tflops(), r.t.forward_seconds * 1e3, r.t.backward_seconds * 1e3,
            kernels::cuda_kernel_name(r.t.forward_kernel), kernels::cuda_kernel_name(r.t.backward_kernel));
  }
  appendf(report, "\nsummary: %s\n", summary.dump().c_str());
  if (Status st = write_stdout(report); !st.ok()) return fail(st);
  return kExitOk;
}

int run_cuda(const BenchFlags& f) {
  Result<kernels::CudaDeviceInfo> dev = kernels::cuda_device_info();
  if (!dev.ok()) return fail_input("--device cuda: " + dev.status().message());
  const kernels::DType dtype = f.dtype == "fp32" ? kernels::DType::kFloat32
                               : f.dtype == "fp16" ? kernels::DType::kFloat16 : kernels::DType::kBFloat16;
  const kernels::CudaKernel kernel = f.kernel == "simple" ? kernels::CudaKernel::kSimple
                                     : f.kernel == "tiled" ? kernels::CudaKernel::kTiled : kernels::CudaKernel::kAuto;
  if (const int code = check_cuda_cases(f, dtype, kernel, *dev); code != kExitOk) return code;
  const bool progress = stderr_is_terminal() && !f.json;
  // The baseline measured in the same run on the same GPU: cuBLAS GEMM in the same dtype.
  Result<double> gemm = kernels::time_cublas_gemm(kGemmN, dtype, std::max(3, f.repeats));
  if (!gemm.ok()) return fail(gemm.status());
  std::vector<CudaCase> results;
  for (int d : f.head_dims) {
    for (const auto& [kind, tasks] : cuda_cases(f)) {
      kernels::CudaProbe pr;
      pr.tasks = tasks;
      pr.n_heads = f.heads, pr.n_kv_heads = f.kv_heads, pr.head_dim = d, pr.dtype = dtype;
      pr.repeats = f.repeats;
      pr.options = {kernel, kernel};
      if (progress) std::fprintf(stderr, "\r%-8s d=%d q=%lld x%zu    ", kind.c_str(), d, static_cast<long long>(tasks[0].first), tasks.size());
      Result<kernels::CudaTiming> t = kernels::time_cuda_attention(pr);
      if (!t.ok()) return fail(t.status());
      CudaCase c;
      c.kind = kind, c.head_dim = d, c.tasks = static_cast<int64_t>(tasks.size()), c.t = *t;
      for (const auto& [q, k] : tasks) c.q_len += q, c.kv_len += k;
      results.push_back(c);
    }
  }
  if (progress) std::fprintf(stderr, "\r%60s\r", "");
  const nlohmann::json summary = cuda_summary(f, results, *gemm);
  return print_cuda(f, *dev, results, *gemm, summary);
}
#else
int run_cuda(const BenchFlags&) {
  return fail_input("--device cuda: this distca was built without CUDA (configure with -DDISTCA_CUDA=ON)");
}
#endif

Runner setup(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  app.add_flag("--json", f->json, "print one JSON object");
  app.add_option("--heads", f->heads, "query heads")->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", f->kv_heads, "key/value heads (divides --heads)")->check(CLI::PositiveNumber);
  app.add_option("--max-len", f->max_len, "longest single task (q_len = kv_len), from 32 doubling")
      ->check(CLI::Range(int64_t{32}, int64_t{1} << 20));
  app.add_option("--context", f->context, "context length of the q-shard cases and of the mixed batch")
      ->check(CLI::Range(int64_t{256}, int64_t{1} << 20));
  app.add_option("--repeats", f->repeats, "timed repetitions per case (median)")->check(CLI::Range(1, 1000));
  app.add_option("--sgemm-n", f->sgemm_n, "size of the square sgemm baseline")->check(CLI::Range(int64_t{64}, int64_t{16384}));
  app.add_option("--head-dims", f->head_dims, "head dimensions to run")->check(CLI::PositiveNumber);
  app.add_option("--device", f->device, "cpu, or cuda (a -DDISTCA_CUDA=ON build with a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", f->dtype, "element type with --device cuda: bf16, fp16 or fp32")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}));
  app.add_option("--kernel", f->kernel, "CUDA kernels with --device cuda: auto, simple or tiled")
      ->check(CLI::IsMember({"auto", "simple", "tiled"}));
  // With --device cuda, defaults the user did not override become the H200 setting:
  // Llama-8B heads (32 query, 8 kv), head_dim 128, a 16K context.
  auto given = [&app](const char* name) { return app.get_option(name)->count() > 0; };
  return [f, given] {
    if (f->device == "cpu" && (given("--dtype") || given("--kernel"))) {
      return fail_input("--dtype and --kernel apply to --device cuda only");
    }
    if (f->device == "cuda") {
      if (!given("--heads")) f->heads = 32;
      if (!given("--kv-heads")) f->kv_heads = 8;
      if (!given("--head-dims")) f->head_dims = {128};
      if (!given("--context")) f->context = 16384;
      if (f->heads % f->kv_heads != 0) return fail_input("--kv-heads must divide --heads");
      return run_cuda(*f);
    }
    if (f->heads % f->kv_heads != 0) return fail_input("--kv-heads must divide --heads");
    if (f->head_dims.empty()) return fail_input("--head-dims: needs at least one value");
    // The largest case's problem (one at a time) and the sgemm baseline's three matrices.
    const double need = kernels::attention_bench_bytes(*f) +
                        3.0 * static_cast<double>(f->sgemm_n) * static_cast<double>(f->sgemm_n) * sizeof(float);
    const int max_d = *std::max_element(f->head_dims.begin(), f->head_dims.end());
    if (Status st = check_memory(need, "--heads " + std::to_string(f->heads) + " --head-dims " + std::to_string(max_d) +
                                           " --max-len " + std::to_string(f->max_len) + " --context " +
                                           std::to_string(f->context) + " --sgemm-n " + std::to_string(f->sgemm_n));
        !st.ok()) {
      return fail_input(st.message());
    }
    return run(*f);
  };
}

}  // namespace

DISTCA_REGISTER_COMMAND(bench_attention, {"attention", "bench",
                                          "Attention kernel GFLOP/s vs OpenBLAS sgemm, same run, same threads", 61,
                                          &setup});

}  // namespace distca::cli::cmd_bench_attention
