// The settings of a training run that its ranks must share, for the launcher's agreement
// (comm/launch.h): every TrainConfig field that shapes a message or a loop count, named as
// the user sets it (the flag, or the TOML key of [model_overrides]).
#pragma once

#include "distca/comm/launch.h"
#include "distca/train/config.h"

namespace distca::train {

// In field order: --model, model_overrides.*, --mode, --scheduler, --tolerance, --overlap, --kv-once,
// --pp, --micro-batches, --plan-ahead, --tp, --tp-overlap, --steps, the optimiser's, --seed, the data's, and
// whether --checkpoint-dir and --trace are set (both add collectives), with
// --checkpoint-every. Not included: --ranks and --backend (the group itself settles them),
// output paths (rank 0 writes them).
comm::Settings run_settings(const TrainConfig& config);

}  // namespace distca::train
