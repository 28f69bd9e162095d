// Google Benchmark: the cad planner (schedule_cad) at a few cluster sizes.
//
// One batch per size from make_batches (prolong lengths, 128K tokens per rank, seed 42),
// Llama-3-8B shapes, bf16, tolerance 0.05, the causal-pairs cost: what `distca plan` does for
// one batch. The batch is drawn once outside the timed loop. Counters: moves and iterations of
// the planner (CadStats) and its final load max/mean, so a faster but worse plan shows.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "distca/core/specs.h"
#include "distca/data/workload.h"
#include "distca/plan/cad.h"

namespace {

void BM_ScheduleCad(benchmark::State& state) {
  distca::WorkloadOptions w;
  w.dist = "prolong";
  w.ranks = state.range(0);
  w.tokens_per_rank = 128 * 1024;
  w.seed = 42;
  auto batches = distca::make_batches(w);
  auto model = distca::model_preset("llama-8b");
  if (!batches.ok() || !model.ok()) {
    state.SkipWithError("cannot draw the batch");
    return;
  }
  distca::ScheduleOptions o;
  o.model = *model;
  o.dtype_bytes = 2;
  o.tolerance = 0.05;
  distca::CadStats stats;
  for (auto _ : state) {
    auto plan = distca::schedule_cad(batches->front(), o, &stats);
    if (!plan.ok()) {
      state.SkipWithError(plan.status().message().c_str());
      return;
    }
    benchmark::DoNotOptimize(plan);
  }
  state.counters["moves"] = static_cast<double>(stats.moves);
  state.counters["iterations"] = static_cast<double>(stats.iterations);
  state.counters["max/mean"] = stats.mean > 0 ? stats.load_max / stats.mean : 0.0;
}

}  // namespace

BENCHMARK(BM_ScheduleCad)->Arg(8)->Arg(64)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
