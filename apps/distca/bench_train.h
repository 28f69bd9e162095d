// `distca bench train`'s pieces shared by its two halves: cmd_bench_train.cpp (data
// parallelism: four modes on one skewed batch) and bench_train_pipeline.cpp (--pp > 1: 1F1B
// against CAD's phase-aligned schedule on micro-batches of skewed attention work).
// docs/benchmarks.md, "Training step" and "Pipelines (bench train --pp)".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/cost/hardware_profile.h"
#include "distca/cost/profiled.h"
#include "distca/data/batch.h"
#include "distca/train/config.h"

namespace distca::cli::bench_train {

struct TrainBenchFlags {
  std::string backend = "local";
  int ranks = 2;                 // local backend only
  int64_t width = 512;           // hidden size
  int64_t layers = 2;            // --pp P without --layers: rounded up to a multiple of P
  int64_t head_dim = 64;         // heads = width / head_dim, kv heads = half of them
  int64_t vocab = 512;           // small: the LM head stays a small share of the linear work
  int64_t tokens = 8192;         // per rank (per micro-batch with --pp)
  int64_t long_doc = 0;          // the long documents (0: one of --tokens-per-rank)
  int64_t short_doc = 512;       // the other documents
  int rounds = 3;
  int64_t steps = 3;             // per mode and round
  int64_t warmup_steps = 1;      // discarded of each run
  double tolerance = 0.05;       // cad scheduler
  double mpi_timeout = 300;
  std::string json;              // FILE or "-"
  std::string trace;             // Chrome trace of the last round's cad pingpong, last step
  int64_t pp = 1;                // pipeline stages
  int64_t micro_batches = 0;     // per replica and step (0: 2 x pp with --pp > 1, else 1)
  std::string cost_table;        // --pp: the simulator's attention seconds (distca profile)
  std::string hardware;          // --pp: the simulator's hardware profile (distca profile --hardware-out)
};

struct Mode {
  const char* name;
  const char* mode;     // TrainConfig::mode
  const char* overlap;  // TrainConfig::overlap
};

double now_s();
double median(std::vector<double> v);
int64_t long_doc(const TrainBenchFlags& f);
ModelSpec bench_spec(const TrainBenchFlags& f);
// The trainer's config of one mode's run (pp and micro_batches from the flags).
train::TrainConfig make_config(const TrainBenchFlags& f, int64_t ranks, const Mode& mode);
int64_t sgemm_rows(const TrainBenchFlags& f);
// sgemm FLOP/s of this thread at the model's linear shapes (the best of three passes).
double measure_sgemm(const TrainBenchFlags& f, int rank);
// One round's sgemm probe on every rank at once (as they train), after a barrier, folded into
// best[rank] (the best round's: other load on a shared host only ever slows it). Collective.
Status probe_sgemm_round(comm::Communicator& comm, const TrainBenchFlags& f, std::vector<double>& best);
// The memory every mode's run needs in this process, against the limit (--max-memory).
Status check_bench_memory(const TrainBenchFlags& f, int64_t ranks, bool lead, const std::vector<Mode>& modes);

// The simulator's prediction of one mode (sim::simulate in-process): one unit per rank,
// f.pp stages, the batches as micro-batches (f.pp = 1: one batch over every rank), fp32, no
// activation checkpointing, stateless cad servers with pipelines (the trainer's), keeping ones
// without. hw: a measured hardware profile (--hardware) or null: then the local-cpu preset's
// links and the linear layers at sgemm_mean (mfu 1); table (--cost-table) or null: attention
// from the profile, else analytic at efficiency 0.5.
struct SimFigures {
  bool ok = false;
  std::string error;
  double step_s = 0;
  std::vector<double> stage_idle;  // [stage] mean over the stage's units
};
SimFigures predict(const TrainBenchFlags& f, int64_t ranks, const Mode& mode, double sgemm_mean,
                   const ProfiledCostModel* table, const std::shared_ptr<const HardwareProfile>& hw_profile,
                   const std::vector<Batch>& batches);

// --pp > 1: the modes timed (colocated 1F1B, cad phase-aligned pingpong and single-stream).
std::vector<Mode> pipeline_modes();
// --pp > 1, flags already checked: runs the pipeline benchmark and prints it; the exit code.
int run_pipeline(const TrainBenchFlags& f);

}  // namespace distca::cli::bench_train
