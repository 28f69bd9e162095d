// `distca bench train`'s pieces shared by its two halves: cmd_bench_train.cpp (data
// parallelism: four modes on one skewed batch) and bench_train_pipeline.cpp (--pp > 1: 1F1B
// against CAD's 1F1B ticks with pooled attention on micro-batches of skewed attention work).
// docs/benchmarks.md, "Training step" and "Pipelines (bench train --pp)".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "distca/comm/launch.h"
#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/cost/hardware_profile.h"
#include "distca/cost/profiled.h"
#include "distca/data/batch.h"
#include "distca/sim/request.h"
#include "distca/train/config.h"
#include "distca/train/trainer.h"
#include "stats.h"

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
  std::string hardware;          // the simulator's hardware profile (distca profile --hardware-out)
  // skewed: rank 0 (--pp: micro-batches 0, 4, ...) --long-doc documents, the rest --short-doc
  // ones; uniform: every rank and micro-batch --long-doc documents (nothing to balance).
  std::string workload = "skewed";
  // --compare: every mode of train::compare_modes on drawn documents (--workload pretrain or
  // prolong, --seed; bench_train_compare.cpp).
  bool compare = false;
  int64_t seed = 1;
  bool doc_flags_given = false;  // --long-doc or --short-doc given (refused with --compare)
};

// The flags that decide what was run and what the simulator is given (model, workload,
// scheduler, pipeline), as bench train's JSON records them under "bench_flags", and back
// (replay: `bench simulate --validate --replay`). from_json: a missing or mistyped field is an
// invalid_argument naming it.
nlohmann::json bench_flags_json(const TrainBenchFlags& f);
Result<TrainBenchFlags> bench_flags_from_json(const nlohmann::json& j);
// "format" of bench train's JSON, so a replay can tell it from any other file.
inline constexpr const char* kBenchTrainFormat = "distca-bench-train";

struct Mode {
  const char* name;
  const char* mode;     // TrainConfig::mode
  const char* overlap;  // TrainConfig::overlap
};

using cli::mean_of;  // stats.h
using cli::median;
int64_t long_doc(const TrainBenchFlags& f);
ModelSpec bench_spec(const TrainBenchFlags& f);
// The batches of one step as the trainer and the simulator see them: --pp 1 one batch over
// every rank; --pp P f.micro_batches batches over the ranks / P replicas.
std::vector<Batch> bench_batches(const TrainBenchFlags& f, int64_t ranks);
Batch dp_batch(const TrainBenchFlags& f, int64_t ranks);                         // --pp 1's batch
std::vector<Batch> pipeline_batches(const TrainBenchFlags& f, int64_t replicas);  // --pp P's
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
// The same for the given runs' configs; `extra` bytes per rank besides them (a probe's).
Status check_configs_memory(const TrainBenchFlags& f, int64_t ranks, bool lead, const std::vector<train::TrainConfig>& configs,
                            double extra_per_rank);
// Flag checks that need no group, every one before any work (cmd_bench_train.cpp).
Status check_flags(const TrainBenchFlags& f, bool ranks_given);
// The ranks a run will have: --ranks (local) or the launcher's (mpi).
int64_t run_ranks(const TrainBenchFlags& f);
// --compare, flags as given: checks them, runs the comparison and prints it; the exit code.
int run_compare_bench(const TrainBenchFlags& f, bool ranks_given);

// The simulator's prediction of one mode (sim::predict_training, sim/request.h: one unit per
// rank, f.pp stages, the batches as micro-batches): hw a measured hardware profile
// (--hardware) or null (then the local-cpu preset's links and the linear layers at
// sgemm_mean); table (--cost-table) or null. `ok` false: the simulator's refusal in `error`.
struct SimFigures : sim::TrainingPrediction {
  bool ok = false;
  std::string error;
};
nlohmann::json sim_json(const SimFigures& sim, double measured_s);

// Measured per-rank figures of one mode over its timed steps (TrainResult::rank_steps):
// idle = 1 - (linear + attention) / step time (rank 0's StepMetrics::seconds, the job's step),
// exposed communication = StepMetrics::comm_s / step time (exchanges blocked on, pipeline
// sends and receives, the step's all-reduces; not the barrier behind the slowest rank, which
// is wait_s and counts as idle). Each [rank][timed step].
struct RankFigures {
  std::vector<std::vector<double>> idle, exposed;
  void add(const train::TrainResult& result, int64_t warmup_steps);
  std::vector<double> median_idle() const;     // [rank]
  std::vector<double> median_exposed() const;  // [rank]
};
SimFigures predict(const TrainBenchFlags& f, int64_t ranks, const Mode& mode, double sgemm_mean,
                   const ProfiledCostModel* table, const std::shared_ptr<const HardwareProfile>& hw_profile,
                   const std::vector<Batch>& batches);

// What the ranks of one bench train job agree on before they run (comm/launch.h): every flag
// that shapes a message or a loop count.
comm::Settings bench_settings(const TrainBenchFlags& f);

// --hardware's profile, or null without the flag; errors name --hardware.
Result<std::shared_ptr<const HardwareProfile>> load_hardware_flag(const TrainBenchFlags& f);

// The end of every bench train report: the local backend's note, the JSON (stdout or --json
// FILE) beside `files`, every file written atomically before the text; the exit code.
int finish_report(const TrainBenchFlags& f, std::string out, const nlohmann::json& j,
                  std::vector<std::pair<std::string, std::string>> files = {});

// --pp > 1: the modes timed (colocated 1F1B, cad pingpong and single-stream).
std::vector<Mode> pipeline_modes();
// --pp > 1, flags already checked: runs the pipeline benchmark and prints it; the exit code.
int run_pipeline(const TrainBenchFlags& f);

}  // namespace distca::cli::bench_train
