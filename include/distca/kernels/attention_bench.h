// The CPU attention benchmark's runs (`distca bench attention`; docs/benchmarks.md): forward
// and backward GFLOP/s of the kernels (pairs-based FLOPs) on single causal tasks, q-row shards
// of one context and a mixed fused batch, each repetition paired with an sgemm run right before
// it on the same threads (the machine's load changes by the second, so each case's ratio to
// sgemm is taken per pair, then the median).
//
// Thread safety: one benchmark per process at a time (it uses the process's OpenMP team).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace distca::kernels {

// sgemm on n x n x n by the kernels' own OpenMP team: OpenBLAS on one thread per 128 x 128
// tile of C, the tiles shared by the team (gemm_tiled). Not OpenBLAS's own thread pool: its
// workers spin-wait for new work for a while after every call (OpenBLAS's thread timeout) and
// would share the cores with the attention call timed right after, whose OpenMP team then
// waits for a core: a 0.1 ms call (one 128 x 128 task) can be timed at a scheduler time slice.
class SgemmBaseline {
 public:
  explicit SgemmBaseline(int64_t n);  // allocates and runs once (warm-up)
  double run();                       // GFLOP/s of one call
  double median_gflops() const;       // of every run() so far

 private:
  int n_;
  std::vector<float> a_, b_, c_;
  std::vector<double> all_;
};

struct AttentionBenchOptions {
  int heads = 4, kv_heads = 1;
  int64_t max_len = 16384;  // longest single task, from 32 doubling
  int64_t context = 8192;   // the shards' context and the mixed batch's rows
  int repeats = 3;
  std::vector<int> head_dims = {64, 128};
};

struct AttentionCase {
  std::string kind;  // single | shard | mixed
  int head_dim = 0;
  int64_t q_len = 0, kv_len = 0, tasks = 0;
  double fwd_gflops = 0, bwd_gflops = 0;  // medians over repetitions
  double fwd_ratio = 0, bwd_ratio = 0;    // medians of per-repetition ratios to the sgemm run beside it
};

// Bytes the largest case's problem needs (one at a time).
double attention_bench_bytes(const AttentionBenchOptions& o);

// Every case per head_dim: single tasks 32 .. max_len, shards of 128 .. context rows of a
// context-key task, and a fused batch of mixed shards as an attention server receives it
// (documents of random length cut into head/tail-like shards of 128 .. 2048 rows at random
// context positions). `progress` (optional) is called after each case.
std::vector<AttentionCase> run_attention_bench(const AttentionBenchOptions& o, SgemmBaseline& gemm,
                                               const std::function<void(const AttentionCase&)>& progress);

// Per head_dim: the worst forward and backward ratio of single tasks of >= 1K rows, and the
// 128-row shard's forward+backward rate over the 4K shard's.
nlohmann::json attention_bench_summary(const AttentionBenchOptions& o, const std::vector<AttentionCase>& cases);

}  // namespace distca::kernels
