// What a training run (`distca train`, docs/training.md) does around run_training: the checks
// and reads before step 0, one step's metrics line, and the figures the run reports at the end.
//
// Thread safety: prepare_training is called once per process (its lead creates directories
// and removes stale temporary files); the rest are pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/train/checkpoint.h"
#include "distca/train/config.h"
#include "distca/train/data.h"
#include "distca/train/memory.h"
#include "distca/train/trainer.h"

namespace distca::train {

// Everything checked and read before step 0.
struct PreparedTraining {
  ModelSpec spec;
  std::optional<DataSource> data;
  Checkpoint ckpt;
  bool resume = false;  // ckpt holds the checkpoint of `resume`
  TrainMemoryEstimate memory;
};

// Checks and reads in an order that refuses cheaply first: the config, the outputs (lead
// only: --metrics, --trace, --checkpoint-dir distinct and writable), the inputs without
// reading them, the memory estimate (this process's share times `processes_here`, the rank
// processes mpirun put on this machine; 1 for the local backend), then the data, the
// checkpoint `resume` ("" none) and its contents, and last the checkpoint directory (created,
// lead only) and the stale temporary files of this run's outputs (removed, lead only).
// Errors: invalid_argument / not_found / corrupt / out_of_memory name the flag at fault.
Status prepare_training(const TrainConfig& cfg, const std::string& resume, bool lead, int64_t processes_here,
                        PreparedTraining& p);

// One JSONL line of --metrics (without the newline): every StepMetrics field.
nlohmann::json step_metrics_json(const StepMetrics& m);

// The run's final loss: the mean report loss over the last tenth of the steps (at least one),
// since one step's loss is noisy (batches differ step to step). {0, 0} without steps.
struct FinalLoss {
  double value = 0;
  size_t steps = 0;  // how many steps the mean is over
};
FinalLoss final_loss(const TrainResult& result);

// The longest a step waited for its plan (TrainResult::steps' plan_wait_s).
double max_plan_wait(const TrainResult& result);

}  // namespace distca::train
