// The measurements of `distca profile` on this machine: attention on a (q_len, kv_len) grid
// (the cost table `--cost-table` reads; docs/kernels.md, "Cost table") and, for a hardware
// profile, a model's GEMMs, the element-wise work between them and, with several ranks, the
// all-to-all and point-to-point links and tensor parallelism's collectives through the
// trainer's group communicator (docs/simulation-model.md, "Hardware profile").
//
// With a communicator every rank measures at once: attention and each GEMM and element-wise
// figure with every rank computing (a barrier before each timed run; the slowest rank's
// median, kernels::slowest_over_ranks), then the GEMMs and element-wise work with rank 0 alone while the others
// wait in a barrier that sleeps (HardwareProfile::alone_waiters_sleep); the links as the
// slowest rank's seconds per exchange, the median over repetitions; the TP collectives as
// HardwareProfile::tp_collective says.
//
// Thread safety: one call per rank; the ranks of one communicator call together.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "distca/comm/communicator.h"
#include "distca/core/cgroup.h"
#include "distca/core/status.h"
#include "distca/cost/hardware_profile.h"
#include "distca/kernels/profiler.h"

namespace distca::train {

// What one run measures: the attention grid always; with `hardware` the GEMMs and the
// element-wise work at `shape` (skipped for an odd head_dim: RoPE needs pairs) and, with a
// communicator, the links.
struct ProfileRun {
  kernels::ProfileOptions attention;
  ProfileShape shape;
  bool hardware = false;
  int gemm_repeats = 5;   // timed calls per GEMM and element-wise figure (median)
  int link_repeats = 10;  // exchanges per message size (median)
  // Each timed GEMM and element-wise measurement spans at least this long (kernels::time_calls
  // via time_profile_gemm, model::time_elementwise); attention's is attention.min_call_seconds.
  double min_call_seconds = kernels::kDefaultMinCallSeconds;
};

// The CPU quota of the calling process, in cores: the least CFS quota / period over its CPU
// cgroup and that cgroup's ancestors, in the cgroup v2 hierarchy (cpu.max "QUOTA PERIOD") and
// in the v1 hierarchy that carries the cpu controller (cpu.cfs_quota_us / cpu.cfs_period_us),
// found through /proc/self/cgroup and /proc/mounts; 0 when no quota is set or nothing can be
// read (core/cgroup.h finds the groups). `read` returns a file's text (nullopt: unreadable);
// the default reads the file system.
double cgroup_cpu_quota(const ReadText& read = {});

// What the run allocates at most with `ranks` ranks: the largest attention problem, the
// largest GEMM's operands, the element-wise buffers or the link buffers (one at a time).
double profile_run_bytes(const ProfileRun& run, int64_t ranks);

// The profile's machine fields (CPU, cores, BLAS) for `ranks` ranks of `threads` threads, with
// the run's shape and GEMM list, nothing measured yet.
HardwareProfile new_hardware_profile(const ProfileRun& run, int64_t ranks, int threads);

// The whole measurement on this rank (c: null for one process) into `hp` (rank 0's view
// holds the figures). `progress`, when set, is called on rank 0 with a line per step;
// `notice`, when set, on rank 0 with what a person should read after the run (the attention
// guard's re-measurements, kernels::profile_attention_grid).
Status measure_profile(comm::Communicator* c, const ProfileRun& run,
                       const std::function<void(const std::string&)>& progress, HardwareProfile& hp,
                       const std::function<void(const std::string&)>& notice = {});

}  // namespace distca::train
