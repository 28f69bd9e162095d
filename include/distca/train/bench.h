// The training benchmark (`distca bench train`, docs/benchmarks.md "Training step" and
// "Pipelines (bench train --pp)"): whole steps of the trainer on a fixed skewed batch, every
// mode one run_training call per round, round-robin on one communicator. This header owns
// what the benchmark runs and measures; the CLI parses flags, launches, and prints.
//
// Workload. --pp 1: one batch over every rank; skewed: rank 0 holds documents of long_doc
// tokens, every other rank short_doc ones. --pp P: micro_batches batches over the ranks / P
// replicas, micro-batch m holds one long document per replica when m % 4 == 0 and short ones
// otherwise. uniform: every rank and micro-batch the long documents. The trainer reads
// DataSource::fixed's cycle at batch(step * M + m), so micro-batch m is always the same batch.
//
// Measurement. Step time is rank 0's StepMetrics::seconds (it ends in the barrier before the
// gradient all-reduce, so it is the job's step); the first warmup_steps of every run are
// discarded. Idle of a rank = 1 - busy / step, exposed = comm_s / step, each from the rank's
// own StepMetrics (TrainResult::rank_steps).
//
// Thread safety: the run_* functions are collective (every rank of `comm` calls them, one call
// per rank thread); the rest are pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/comm/communicator.h"
#include "distca/comm/launch.h"
#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/core/trace.h"
#include "distca/cost/step_flops.h"
#include "distca/data/batch.h"
#include "distca/train/config.h"
#include "distca/train/data.h"
#include "distca/train/trainer.h"

namespace distca::train {

// What one benchmark runs (the CLI's flags, one field each).
struct BenchOptions {
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
  // --tolerance auto: the cad modes choose the band per batch (plan/auto_tolerance.h) from
  // `hardware` (then also their link and attention figures); pp 1, not --compare.
  bool tolerance_auto = false;
  // The cad modes' TrainConfig::kv_once: on | off | auto (auto needs `hardware`, pp 1).
  std::string kv_once = "on";
  // The cad modes' TrainConfig::ranks_per_host (topology-aware placement and K/V relays; the
  // timeline of --tolerance auto prices each host's link): 0 none.
  int64_t ranks_per_host = 0;
  double mpi_timeout = 300;
  std::string json;              // FILE or "-"
  std::string trace;             // Chrome trace of the last round's cad pingpong, last step
  std::string sim_trace;         // the simulator's Chrome trace of its cad pingpong prediction (needs hardware)
  int64_t pp = 1;                // pipeline stages
  int64_t tp = 1;                // tensor-parallel ranks per layer (--pp 1: ranks = tp x replicas)
  std::string tp_overlap = "on";  // TrainConfig::tp_overlap: on | off
  int64_t micro_batches = 0;     // per replica and step (0: 2 x pp with --pp > 1, else 1)
  std::string cost_table;        // --pp: the simulator's attention seconds (distca profile)
  std::string hardware;          // the simulator's hardware profile (distca profile --hardware-out)
  std::string workload = "skewed";  // skewed | uniform; with --compare pretrain | prolong
  // --compare: every mode of train::compare_modes (train/compare.h) on drawn documents
  // (--workload pretrain or prolong, --seed).
  bool compare = false;
  int64_t seed = 1;
  bool doc_flags_given = false;  // --long-doc or --short-doc given (refused with --compare)
};

// The options that decide what was run and what the simulator is given (model, workload,
// scheduler, pipeline), as the benchmark's JSON records them under "bench_flags", and back
// (replay: `bench simulate --validate --replay`). from_json: a missing or mistyped field is an
// invalid_argument naming it.
nlohmann::json bench_flags_json(const BenchOptions& f);
Result<BenchOptions> bench_flags_from_json(const nlohmann::json& j);
// "format" of the benchmark's JSON, so a replay can tell it from any other file.
inline constexpr const char* kBenchTrainFormat = "distca-bench-train";

struct BenchMode {
  const char* name;
  const char* mode;     // TrainConfig::mode
  const char* overlap;  // TrainConfig::overlap ("" for colocated)
};
// --pp 1: colocated, cad single-stream, cad pingpong, cad signal (this order: kDp* below).
std::vector<BenchMode> data_parallel_modes();
inline constexpr size_t kDpColocated = 0, kDpSingle = 1, kDpPingPong = 2, kDpSignal = 3;
// --pp > 1: colocated 1F1B, cad pingpong, cad single-stream.
std::vector<BenchMode> pipeline_modes();
std::vector<BenchMode> bench_modes(const BenchOptions& f);

int64_t long_doc(const BenchOptions& f);
// Width-scaled `tiny` heads: head_dim fixed, half as many K/V heads (GQA) when the count is
// even; SwiGLU ffn about 8/3 of the width, on a multiple of 64.
ModelSpec bench_spec(const BenchOptions& f);
// The batches of one step as the trainer and the simulator see them: --pp 1 one batch over
// the ranks / tp replicas; --pp P f.micro_batches batches over the ranks / P replicas.
std::vector<Batch> bench_batches(const BenchOptions& f, int64_t ranks);
Batch dp_batch(const BenchOptions& f, int64_t ranks);                         // --pp 1's batch
std::vector<Batch> pipeline_batches(const BenchOptions& f, int64_t replicas);  // --pp P's
// The trainer's config of one mode's run (pp and micro_batches from the options).
TrainConfig make_config(const BenchOptions& f, int64_t ranks, const BenchMode& mode);
// FLOPs of one step (forward + backward; cost/step_flops.h): per rank of one batch, each rank
// counted as one sequence of its tokens and pairs; and summed over every document of `batches`.
std::vector<TrainingFlops> rank_step_flops(const ModelSpec& m, const Batch& batch);
TrainingFlops total_step_flops(const ModelSpec& m, const std::vector<Batch>& batches);

// The sgemm probe's rows (half the tokens, 16..4096).
int64_t sgemm_rows(const BenchOptions& f);
// sgemm FLOP/s of this thread at the model's linear shapes (the best of three passes).
double measure_sgemm(const BenchOptions& f, int rank);
// One round's sgemm probe on every rank at once (as they train), after a barrier, folded into
// best[rank] (the best round's: other load on a shared host only ever slows it). Collective.
Status probe_sgemm_round(comm::Communicator& comm, const BenchOptions& f, std::vector<double>& best);
// The memory every mode's run needs in this process, times `processes_here` (the rank
// processes sharing this machine), against the limit (core/memory.h): out_of_memory naming
// the options when it does not fit.
Status check_bench_memory(const BenchOptions& f, int64_t ranks, bool lead, const std::vector<BenchMode>& modes,
                          int64_t processes_here);
// What the ranks of one benchmark job agree on before they run (comm/launch.h): every option
// that shapes a message or a loop count.
comm::Settings bench_settings(const BenchOptions& f);
// check_bench_memory for the given runs' configs; `extra_per_rank` bytes per rank besides them.
Status check_configs_memory(const BenchOptions& f, int64_t ranks, bool lead, const std::vector<TrainConfig>& configs,
                            double extra_per_rank, int64_t processes_here);

// Median over rounds of a[i] / b[i] (two modes' round medians, paired: they ran back to back,
// so a slow period of a shared host falls on both); rounds with b[i] <= 0 are skipped.
double paired_ratio(const std::vector<double>& a, const std::vector<double>& b);

// Measured per-rank figures of one mode over its timed steps: each [rank][timed step].
struct RankFigures {
  std::vector<std::vector<double>> idle, exposed;
  void add(const TrainResult& result, int64_t warmup_steps);
  std::vector<double> median_idle() const;     // [rank]
  std::vector<double> median_exposed() const;  // [rank]
};

// --pp 1: one mode's figures over every round (rank 0's StepMetrics).
struct DpModeFigures {
  std::vector<double> steps;                  // timed steps of every round, seconds
  std::vector<double> round_median;           // [rounds]
  std::vector<double> linear, attention, comm, wait, optimizer;  // per timed step
  std::vector<double> other;  // the step's rest: planning, inputs, runner set-up
  std::vector<double> tp_comm;    // per timed step: StepMetrics::tp_comm_s (inside comm)
  std::vector<double> imbalance;  // per timed step: StepMetrics::imbalance_after (the plan's load max/mean)
  std::vector<int64_t> peak;                  // [ranks] max over rounds (VmHWM or estimate)
  std::vector<int64_t> buffers;               // [ranks] the trainer's buffer estimate
  int64_t bytes_sent = 0;
  bool outputs_valid = true;
  RankFigures per_rank;
};
struct DpFigures {
  std::vector<DpModeFigures> modes;  // data_parallel_modes()'s order
  std::vector<double> sgemm;         // [ranks] FLOP/s
  bool resident = true;  // peaks are VmHWM (false: /proc/self/clear_refs unwritable, buffer estimates)
  std::vector<TraceEvent> trace;     // f.trace: every rank's events of the traced step
};
// Runs the --pp 1 benchmark on this rank. `process_lead`: this thread measures its process's
// memory (every mpi rank; rank 0's thread of the local backend); `recorder`: the communicator's
// trace recorder (null: the trainer's own). `out` is filled on rank 0 (may be null elsewhere).
Status run_data_parallel_bench(comm::Communicator& comm, const BenchOptions& f, const DataSource& data,
                               bool process_lead, TraceRecorder* recorder, DpFigures* out);

// --pp > 1: one mode's figures over every round.
struct PipeModeFigures {
  std::vector<double> steps;         // timed steps of every round, seconds (rank 0's)
  std::vector<double> round_median;  // [rounds]
  std::vector<std::vector<double>> stage_idle;  // [stage][timed step] mean over the replicas
  std::vector<double> busy_mean;     // [timed step] mean busy over every rank, seconds
  int64_t tokens = 0;                // per step
  RankFigures per_rank;
};
struct PipeFigures {
  std::vector<PipeModeFigures> modes;  // pipeline_modes()'s order
  std::vector<double> sgemm;           // [ranks] FLOP/s
};
// Runs the --pp > 1 benchmark on this rank; `out` is filled on rank 0.
Status run_pipeline_bench(comm::Communicator& comm, const BenchOptions& f, const DataSource& data, PipeFigures* out);

}  // namespace distca::train
