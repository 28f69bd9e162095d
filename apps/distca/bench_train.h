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

#include "distca/core/stats.h"
#include "distca/comm/launch.h"
#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/cost/hardware_profile.h"
#include "distca/cost/profiled.h"
#include "distca/data/batch.h"
#include "distca/sim/request.h"
#include "distca/train/config.h"
#include "distca/train/bench.h"
#include "distca/train/trainer.h"

namespace distca::cli::bench_train {

// The benchmark itself lives in the library (train/bench.h); the CLI keeps its flag names.
using TrainBenchFlags = train::BenchOptions;
using Mode = train::BenchMode;
using namespace train;  // bench_spec, make_config, pipeline_modes, RankFigures, ... (train/bench.h)

// The simulator's prediction of one mode (sim::predict_training, sim/request.h: one unit per
// rank, f.pp stages, the batches as micro-batches): hw a measured hardware profile
// (--hardware) or null (then the local-cpu preset's links and the linear layers at
// sgemm_mean); table (--cost-table) or null. `ok` false: the simulator's refusal in `error`;
// sim::to_json gives the report's "sim" object. record_events: also its trace (SimFigures::trace).
using SimFigures = sim::TrainingOutcome;

SimFigures predict(const TrainBenchFlags& f, int64_t ranks, const Mode& mode, double sgemm_mean,
                   const ProfiledCostModel* table, const std::shared_ptr<const HardwareProfile>& hw_profile,
                   const std::vector<Batch>& batches, bool record_events = false);

// Appends the local backend's note and the JSON (--json -: to stdout after the text; FILE: first
// of `files`), writes `files` atomically, then the text to stdout; the exit code.
int write_report(const TrainBenchFlags& f, std::string out, const nlohmann::json& j,
                 std::vector<std::pair<std::string, std::string>> files);

// --pp > 1, flags already checked: runs the pipeline benchmark and prints it; the exit code.
int run_pipeline(const TrainBenchFlags& f);

// Flag checks that need no group, every one before any work (cmd_bench_train.cpp).
Status check_flags(const TrainBenchFlags& f, bool ranks_given);
// The ranks a run will have: --ranks (local) or the launcher's (mpi).
int64_t run_ranks(const TrainBenchFlags& f);
// --hardware's profile, or null without the flag; errors name --hardware.
Result<std::shared_ptr<const HardwareProfile>> load_hardware_flag(const TrainBenchFlags& f);
// --compare, flags as given: checks them, runs the comparison and prints it; the exit code
// (bench_train_compare.cpp).
int run_compare_bench(const TrainBenchFlags& f, bool ranks_given);

}  // namespace distca::cli::bench_train
