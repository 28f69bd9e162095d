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
// time_kernels_in_step (below) in one process: one warm-up, then profile_repetitions timed
// forward + backward runs, their medians.
KernelTiming time_kernels(AttentionProblem& prob, int repeats, double min_seconds);

// The ranks of one profile run measuring together. The kernels layer cannot name a
// communicator, so the caller passes its barrier and all-gather; both empty for one process.
struct ProfileSync {
  std::function<Status()> barrier;                                // every rank, before each timed repetition
  std::function<Result<std::vector<double>>(double)> all_gather;  // every rank's value, in rank order
};

// What a figure timed on every rank at once is worth to a synchronous step: the slowest rank's
// `mine` (each rank's own median over its repetitions, so one disturbed repetition is already
// outvoted). A rank that runs persistently slower than its peers (its core shared with more,
// its CPU quota less well realized) sets the pace of every phase that ends in an exchange, and
// the median over ranks would miss it (docs/simulation-model.md, "Hardware profile"). `mine`
// itself when sync.all_gather is empty (one process). Errors: the all-gather's.
Result<double> slowest_over_ranks(const ProfileSync& sync, double mine);

// Timed repetitions of a profile cell whose warm-up took `warm_seconds`: enough that warm-up
// and repetitions span `min_seconds`, never more than `repeats` and never fewer than
// min(repeats, kMinProfileRepeats), so the median outvotes one disturbed repetition.
inline constexpr int kMinProfileRepeats = 3;
int profile_repetitions(double warm_seconds, int repeats, double min_seconds);

// time_kernels for a profile cell, every rank of `sync` at once and in step: one warm-up (its
// seconds, the slowest rank's, fix the count: profile_repetitions), then each timed repetition
// behind sync.barrier, so no rank measures while another runs something else; the result is
// the slowest rank's median (slowest_over_ranks). Each repetition times the forward, then the
// backward, over at least `min_call_seconds` each (time_calls, core/clock.h: back-to-back
// calls, seconds per call; 0: one call). `clock` (seconds, monotonic_seconds when empty) reads
// the time. Errors: the sync hooks'.
Result<KernelTiming> time_kernels_in_step(AttentionProblem& prob, int repeats, double min_seconds,
                                          const ProfileSync& sync, const std::function<double()>& clock = {},
                                          double min_call_seconds = 0);

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

// `distca profile --min-call-seconds`'s default (ProfileOptions::min_call_seconds).
inline constexpr double kDefaultMinCallSeconds = 0.02;

struct ProfileOptions {
  int32_t n_heads = 1, n_kv_heads = 1, head_dim = 128;
  std::vector<int64_t> q_lens;   // default: powers of two 128 .. 32768
  std::vector<int64_t> kv_lens;  // default: same
  int repeats = 3;
  double min_seconds = 0.5;  // per grid point
  // Each timed repetition's calls span at least this long (time_kernels_in_step): 10 CFS
  // periods of scripts/rank-cap.sh's default 2 ms, so a capped rank's figure is its share.
  double min_call_seconds = kDefaultMinCallSeconds;
  uint64_t seed = 1;
  // The guard (profile_attention_grid): a cell more than guard_tolerance above its neighbours'
  // fit is measured again, at most guard_rounds times (0: no guard).
  double guard_tolerance = 0.15;
  int guard_rounds = 2;
};
std::vector<int64_t> power_of_two_lengths(int64_t lo, int64_t hi);

// The work the guard compares cells by: the task's causal pairs plus kGuardRowPairs per query
// row (a row's fixed cost: softmax normalisation, its tile's diagonal; least-squares fits of
// this kernel's measured tables put it at 40-70 pairs, and with it a clean table's cells sit
// within 1.12x of their neighbours').
inline constexpr double kGuardRowPairs = 64;
double guard_work(int64_t q_len, int64_t kv_len);

// Each measured cell's (q <= kv, seconds > 0) neighbours' fit: the median, over the measured
// cells among the up to 8 around it in the grid, of that cell's seconds scaled by the ratio of
// guard_work; 0 for a cell without a measured neighbour or not measured itself.
std::vector<std::vector<double>> neighbour_fit(const CostTable& t);

// Forward and backward seconds at every grid point with q <= kv, kept apart (their sum is the
// cost table: HardwareProfile::attention_total); tables' hardware: CPU model, OpenMP threads,
// BLAS. `time_cell` measures one cell (every rank of a profile run calls it for the same cells
// in the same order: its result must be the same on every rank). Then the guard: a cell whose
// forward or backward seconds exceed (1 + guard_tolerance) x its neighbour_fit in that table
// is measured again and keeps the lower reading of that pass (other load only ever slows a
// measurement), in rounds, until none is above its fit or guard_rounds have run. `progress`
// (optional) gets a line per cell; `notice` (optional) a line per re-measurement ("attention
// q_len 2048 kv_len 2048 backward: 99.300000 ms, 1.63x its neighbours' fit 60.900000 ms;
// measured again: 61.200000 ms") and one per cell still above its fit after the last round
// ("... after 2 re-measurements: kept").
using CellTimer = std::function<Result<KernelTiming>(int64_t q_len, int64_t kv_len)>;
struct AttentionGrids {
  CostTable forward;
  CostTable backward;
};
using ProfileLog = std::function<void(const std::string&)>;
Result<AttentionGrids> profile_attention_grid(const ProfileOptions& opt, const CellTimer& time_cell,
                                              const ProfileLog& progress, const ProfileLog& notice = {});
// profile_attention_grid with the kernels: each cell a make_problem of one task timed by
// time_kernels_in_step with `sync`.
Result<AttentionGrids> profile_attention_split(const ProfileOptions& opt, const ProfileLog& progress,
                                               const ProfileSync& sync = {}, const ProfileLog& notice = {});

// Times one linear-layer product of a hardware profile (cost/hardware_profile.h, GemmPass) as
// the model runs it: gemm_tiled (kernels/blas.h) on the calling thread's OpenMP team, OpenBLAS
// on one thread, fp32, dense operands with random values from Rng(seed). One warm-up call, then
// `repeats` timed measurements, `sync` (optional) before each, each over at least
// `min_call_seconds` (time_calls: back-to-back calls, seconds per call; 0: one call) on
// `clock` (monotonic_seconds when empty); returns the median seconds per call.
Result<double> time_profile_gemm(const GemmRecord& g, int repeats, const std::function<Status()>& sync,
                                 uint64_t seed, double min_call_seconds = 0, const std::function<double()>& clock = {});
// Bytes time_profile_gemm allocates for g (its three operands).
double profile_gemm_bytes(const GemmRecord& g);

// A short description of this machine: CPU model name (from /proc/cpuinfo), thread count.
std::string cpu_model_name();

}  // namespace distca::kernels
