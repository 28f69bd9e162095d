// `distca train --mode wlb --hardware FILE`: the chunking's work estimate from a measured
// hardware profile (cost/hardware_profile.h) instead of the analytic FLOP ratio.
//
// Work of a piece of n rows ending at position e, in seconds per layer: the profile's
// attention table (forward + backward of the task, cost/profiled.h ProfiledCostModel over
// HardwareProfile::attention_total) plus n x the linear layers' seconds per token per layer:
// their FLOPs per token (cost/step_flops.h, every layer and the head, over n_layers) at the
// profile's GEMM rate with every rank computing at once (all its products' FLOPs over all their
// concurrent seconds). The table's tasks ran at the profile's heads, so the linear term is
// divided by the model's query width over the profile's (n_heads x head_dim): both terms then
// scale alike.
//
// Thread safety: pure functions; the cost model is immutable.
#pragma once

#include <memory>

#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/cost/cost_model.h"
#include "distca/cost/hardware_profile.h"
#include "distca/plan/chunking.h"

namespace distca::train {

// `options` with cost and linear_per_token from `profile` for `spec`; *table receives the cost
// model options.cost points to (keep it alive as long as the options). Precondition:
// profile.validate() passed.
ChunkingOptions profiled_chunking(const HardwareProfile& profile, const ModelSpec& spec, ChunkingOptions options,
                                  std::shared_ptr<const AttentionCostModel>* table);

// Reads `path` and applies it: errors (invalid_argument, "--hardware: ...") when the file cannot
// be read or is not a valid profile.
Result<ChunkingOptions> load_profiled_chunking(const std::string& path, const ModelSpec& spec,
                                               const ChunkingOptions& options,
                                               std::shared_ptr<const AttentionCostModel>* table);

}  // namespace distca::train
