// The plan validator: an independent check of any plan, from the plan and the input batch
// alone (it never trusts a scheduler's or the plan builder's bookkeeping).
//
// validate_plan checks, in this order, and returns the first failure as one line:
//   batch      the plan's batch is valid and has the input's documents (same ids and
//              lengths); for every scheduler but wlb it equals the input batch
//   tasks      each task names a document, 0 <= q_begin < q_end <= doc_len, home and server
//              are ranks, its query rows lie inside ONE piece held by home, and it sits in
//              the task list of its server
//   coverage   every document's query rows [0, doc_len) are covered exactly once (a task
//              [a, b) with context [0, b) computes exactly the causal pairs of rows a..b-1, so
//              this is "every causal (query, key) pair exactly once")
//   work       sum of task pairs == sum of document pairs
//   cu_seqlens prefix sums of q_len and q_end, starting at 0, int32 without overflow
//   inputs     q_offset and every kv segment address the right rows: local rows that hold
//              the named document rows, received rows whose RowBlock identity is the row
//   layouts    per exchange (sparse per peer, plan.h): counts == rows of the blocks for every
//              peer either names, displs are prefix sums where rows move and 0 elsewhere, no
//              self traffic, sender's send list == receiver's receive list for every pair
//              either side names, and the lists equal the canonical ones rebuilt from the
//              tasks (plan.h)
//   figures    loads, tokens, traffic, all-gather and the reported comm_bytes_* recomputed
//              from scratch equal the plan's metrics exactly
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "distca/core/status.h"
#include "distca/data/batch.h"
#include "distca/plan/plan.h"
#include "distca/plan/pool.h"

namespace distca {

// `cost` must be the model the plan was built with (nullptr: causal pairs).
Status validate_plan(const Plan& plan, const Batch& input, const AttentionCostModel* cost);

// A plan of a pooled batch (plan/pool.h). First the pool itself: its rank maps invert each
// other and are stage-major, member_of_stage matches the members, every rank of an active
// stage is in the pool, and every piece on a rank is a document of that rank's stage's member
// (so an idle stage's ranks hold nothing). Then every task's home rank lies on its
// document's stage (the stage whose micro-batch it is) and no home is on an idle stage. Then
// validate_plan(plan, pool.batch, cost). Servers may be any rank. Only schedulers that leave tokens in
// place (all but wlb) can pass the home check.
Status validate_pooled_plan(const Plan& plan, const PooledBatch& pool, const AttentionCostModel* cost);

// Brute force, for tests on small batches: runs every server's fused call symbolically with
// the kernel's own semantics (task t's query row i, identified through q_offset, sees K/V
// rows 0 .. kv_len - q_len + i of its assembled context, identified through its kv segments
// and the receive blocks) and counts how often each (query, key) pair of each document is
// computed. Result: doc id -> counts[q * doc_len + k]. A valid plan gives 1 for k <= q and 0
// otherwise. Fails if a segment or offset points outside a buffer.
Result<std::map<int64_t, std::vector<int32_t>>> brute_force_pair_counts(const Plan& plan);

}  // namespace distca
