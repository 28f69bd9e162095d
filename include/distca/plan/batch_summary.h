// The figures `distca workload` reports for packed batches (docs/workloads.md lists the keys):
// each rank's tokens, documents and co-located attention pairs and FLOPs, and the balance the
// planner starts from (attention max/mean before any CA-task moves).
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/specs.h"
#include "distca/data/batch.h"

namespace distca {

// One batch: ranks, tokens_per_rank, documents, tokens, attn_pairs, attn_load_max_over_mean and
// per_rank[{tokens, documents, attn_pairs, attn_flops, linear_flops}] for model `m` (forward
// FLOPs per layer; attention co-located: every piece attends to its own prefix).
nlohmann::json batch_summary_json(const Batch& batch, const ModelSpec& m);

// Several batches' summaries as one object: one summary is itself; for several, documents
// (total), attn_load_max_over_mean (mean of the batches' ratios), attn_load_max_over_mean_max
// (their maximum), ranks and tokens_per_rank when every batch has the same, and batches (the
// summaries).
nlohmann::json batches_summary_json(std::vector<nlohmann::json> summaries);

}  // namespace distca
