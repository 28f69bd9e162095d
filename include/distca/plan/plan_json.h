// JSON forms of a plan (docs/plan-format.md lists every key).
//
//   plan_summary_json   the figures: scheduler, tolerance, dtype, servers, tasks, loads,
//                       comm_bytes_*, allgather_bytes, per_rank rows, plan_seconds
//   plan_to_json        the whole plan: batch, row bytes, per-server tasks with cu_seqlens and
//                       K/V segments, per-rank exchanges with counts, displacements and rows
//   summarize_batches   the summary of several batches' summaries: medians of the figures,
//                       the worst load_max_over_mean, and every batch's own summary
//
// Output is deterministic: the same plan gives the same text byte for byte (plan_to_json has
// no timing in it; plan_seconds is the caller's measurement).
// Thread safety: pure functions.
#pragma once

#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/plan/plan.h"

namespace distca {

nlohmann::json plan_summary_json(const Plan& plan, double plan_seconds);
nlohmann::json plan_to_json(const Plan& plan);
// Precondition: summaries is non-empty, each from plan_summary_json.
nlohmann::json summarize_batches(const std::vector<nlohmann::json>& summaries);

}  // namespace distca
