// Measuring the attention kernels: the timing loop shared by `distca profile` (which writes the
// cost table of cost/profiled.h) and `distca bench attention`.
//
// Thread safety: runs the kernels, which use all OpenMP threads; one at a time per process.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "distca/core/status.h"
#include "distca/cost/hardware_profile.h"
#include "distca/cost/profiled.h"
#include "distca/kernels/attention.h"
#include "distca/kernels/problem.h"  // AttentionProblem, make_problem, params_for

namespace distca::kernels {

// Upper bound, in bytes, of what make_problem allocates for a problem of total_q query rows
// and total_kv key rows, plus the kernels' scratch for it (attention_scratch_bytes with
// omp_get_max_threads()): what running time_kernels on it needs.
double problem_memory_bytes(int64_t total_q, int64_t total_kv, int32_t n_heads, int32_t n_kv_heads,
                            int32_t head_dim);

struct KernelTiming {
  double forward_seconds = 0;   // median over repetitions
  double backward_seconds = 0;  // median over repetitions
  double forward_flops = 0;     // pairs-based (attention.h)
  double backward_flops = 0;
};
// Runs forward then backward `repeats` times (after one warm-up) and reports medians. Stops
// early once `min_seconds` of total time have been spent and at least one timed repetition
// ran (so large problems are not repeated needlessly).
KernelTiming time_kernels(AttentionProblem& prob, int repeats, double min_seconds);

// One product of an sgemm probe: (rows x k) times (k x n), row-major, no transposes.
struct SgemmShape {
  int64_t k = 0, n = 0;
};
// sgemm FLOP/s of the calling thread (OpenBLAS's thread count as the caller set it) over
// `shapes`, each at `rows` rows, run back to back: the best of three timed passes after one
// warm-up pass (other load on a shared host only ever slows a pass). Operands uniform in
// [-1, 1) from Rng(99, stream). Preconditions: rows >= 1, every k, n >= 1, shapes not empty.
double measure_sgemm_flops(int64_t rows, const std::vector<SgemmShape>& shapes, uint64_t stream);
// The bytes measure_sgemm_flops allocates for these shapes.
int64_t sgemm_probe_bytes(int64_t rows, const std::vector<SgemmShape>& shapes);

struct ProfileOptions {
  int32_t n_heads = 1, n_kv_heads = 1, head_dim = 128;
  std::vector<int64_t> q_lens;   // default: powers of two 128 .. 32768
  std::vector<int64_t> kv_lens;  // default: same
  int repeats = 3;
  double min_seconds = 0.5;  // per grid point
  uint64_t seed = 1;
};
std::vector<int64_t> power_of_two_lengths(int64_t lo, int64_t hi);

// Forward and backward seconds at every grid point with q <= kv, kept apart (their sum is the
// cost table: HardwareProfile::attention_total); tables' hardware: CPU model, OpenMP threads,
// BLAS. `progress` (optional) is called after each point. `sync` (optional) runs before each point (ranks of a profile run start
// every point together); an error from it stops the run and is returned.
struct AttentionGrids {
  CostTable forward;
  CostTable backward;
};
Result<AttentionGrids> profile_attention_split(const ProfileOptions& opt,
                                               const std::function<void(const std::string&)>& progress,
                                               const std::function<Status()>& sync = {});

// Times one linear-layer product of a hardware profile (cost/hardware_profile.h, GemmPass) as
// the model runs it: gemm_tiled (kernels/blas.h) on the calling thread's OpenMP team, OpenBLAS
// on one thread, fp32, dense operands with random values from Rng(seed). One warm-up call, then
// `repeats` timed calls, `sync` (optional) before each; returns the median seconds.
Result<double> time_profile_gemm(const GemmRecord& g, int repeats, const std::function<Status()>& sync,
                                 uint64_t seed);
// Bytes time_profile_gemm allocates for g (its three operands).
double profile_gemm_bytes(const GemmRecord& g);

// A short description of this machine: CPU model name (from /proc/cpuinfo), thread count.
std::string cpu_model_name();

}  // namespace distca::kernels
