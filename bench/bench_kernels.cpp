// Google Benchmark: the attention kernels against an sgemm of the same FLOPs.
//
// One causal task of L query rows over L keys (Llama-3-8B heads scaled down: 8 query heads,
// 2 KV heads, head_dim 128). BM_AttentionForward/Backward report FLOP/s by the pairs count
// (kernels/attention.h); BM_SgemmSameFlops runs one square cblas_sgemm whose 2 n^3 FLOPs equal
// the forward's, so forward FLOP/s over sgemm FLOP/s is the kernel's efficiency against the
// BLAS it is built on. docs/benchmarks.md ("Google Benchmark programs") has a measured run.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "distca/core/rng.h"
#include "distca/kernels/attention.h"

namespace {

constexpr int32_t kHeads = 8, kKvHeads = 2, kHeadDim = 128;

struct Task {
  std::vector<float> q, k, v, o, lse, d_o, dq, dk, dv;
  std::vector<int32_t> cu;
  distca::kernels::AttentionParams p;

  explicit Task(int32_t len) {
    distca::Rng rng(1);
    auto fill = [&](std::vector<float>& x, int64_t n) {
      x.resize(static_cast<size_t>(n));
      for (auto& e : x) e = static_cast<float>(rng.uniform(-1.0, 1.0));
    };
    const int64_t nq = int64_t{len} * kHeads * kHeadDim, nk = int64_t{len} * kKvHeads * kHeadDim;
    fill(q, nq);
    fill(k, nk);
    fill(v, nk);
    fill(d_o, nq);
    o.resize(nq);
    dq.resize(nq);
    dk.resize(nk);
    dv.resize(nk);
    lse.resize(static_cast<size_t>(int64_t{len} * kHeads));
    cu = {0, len};
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.cu_seqlens_q = cu.data();
    p.cu_seqlens_k = cu.data();
    p.n_tasks = 1;
    p.n_heads = kHeads;
    p.n_kv_heads = kKvHeads;
    p.head_dim = kHeadDim;
    p.max_seqlen_q = len;
    p.max_seqlen_k = len;
    p.o = o.data();
    p.lse = lse.data();
    p.d_o = d_o.data();
    p.dq = dq.data();
    p.dk = dk.data();
    p.dv = dv.data();
  }
};

void BM_AttentionForward(benchmark::State& state) {
  Task t(static_cast<int32_t>(state.range(0)));
  if (!distca::kernels::validate(t.p).ok()) {
    state.SkipWithError("invalid attention params");
    return;
  }
  for (auto _ : state) {
    distca::kernels::attention_forward(t.p);
    benchmark::DoNotOptimize(t.o.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(distca::kernels::attention_forward_flops(t.p),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AttentionBackward(benchmark::State& state) {
  Task t(static_cast<int32_t>(state.range(0)));
  if (!distca::kernels::validate(t.p).ok()) {
    state.SkipWithError("invalid attention params");
    return;
  }
  distca::kernels::attention_forward(t.p);
  for (auto _ : state) {
    distca::kernels::attention_backward(t.p);
    benchmark::DoNotOptimize(t.dq.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(distca::kernels::attention_backward_flops(t.p),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// n x n x n sgemm with 2 n^3 = the forward FLOPs of the task of the same argument.
void BM_SgemmSameFlops(benchmark::State& state) {
  Task t(static_cast<int32_t>(state.range(0)));
  const double flops = distca::kernels::attention_forward_flops(t.p);
  const int n = static_cast<int>(std::lround(std::cbrt(flops / 2.0)));
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["n"] = n;
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * n * static_cast<double>(n),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_AttentionForward)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttentionBackward)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SgemmSameFlops)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
