// Pooled batches: the micro-batches of several pipeline stages put into ONE batch over the
// ranks of the pipeline, so one plan serves the core attention of all of them (CAD's pipelined
// schedule: each direction of a tick is pooled and planned, and the ranks of stages with
// nothing to do in it serve attention too; docs/scheduler.md, "Pooled plans").
//
// Ranks, as the trainer numbers them (src/train/step.h): rank = stage * dp + replica over
// pp * dp ranks. A member (stage s, micro-batch m) is a Batch over dp ranks; its replica r's
// pieces go, in order, onto global rank s * dp + r. The pooled batch has all pp * dp ranks
// (pooled rank == global rank: unit_of and rank_of_unit are the identity) and the ranks of
// idle stages hold no tokens and only serve.
//
// Document ids: pooled id = original id * pp + stage. At most one member per stage (a tick of
// the schedule never runs two micro-batches on one stage), so the id is invertible: stage =
// id % pp (stage_of_doc), original = id / pp, member = the member of that stage.
//
// Load weights: the cost model's figure is forward + backward work. A pool whose members all
// run one direction needs no weight (a uniform factor does not move a balance), so
// PooledBatch::doc_weights() is empty then and the plan is the one of the unweighted batch.
// When forward and backward members are mixed, a forward member's documents weigh 1 and a
// backward member's kAttentionBackwardFactor (cost/analytic.h: backward = 2.5 x forward), so
// the planner balances every server's forward-plus-backward time of this tick.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "distca/core/status.h"
#include "distca/data/batch.h"
#include "distca/plan/pipeline_schedule.h"
#include "distca/plan/schedule.h"

namespace distca {

// One micro-batch of one pipeline stage that takes part in a pooled plan. `batch` must have
// dp ranks and outlive the pool_batches call only (the pool copies its pieces).
struct PoolMember {
  int64_t stage = 0;
  int64_t microbatch = 0;
  bool backward = false;
  const Batch* batch = nullptr;
};

// What a task (or a pooled document) of a plan of the pooled batch belongs to.
struct PoolOrigin {
  int64_t member = -1;  // index into PooledBatch::members
  int64_t stage = 0;
  int64_t microbatch = 0;
  bool backward = false;
  int64_t doc = 0;      // the document's id in the member's own batch
};

struct PooledBatch {
  Batch batch;        // the pooled batch; its ranks are the pooled ranks (see unit_of)
  int64_t pp = 1;
  int64_t dp = 1;
  // The members without their batch pointers, in the order given to pool_batches.
  std::vector<PoolMember> members;
  std::vector<int64_t> member_of_stage;  // [pp] member index, -1 for an idle stage
  std::vector<int64_t> unit_of;          // [pooled rank] global rank (stage * dp + replica)
  std::vector<int64_t> rank_of_unit;     // [pp * dp] pooled rank

  // Pooled rank of replica r of `stage`.
  // Preconditions: 0 <= stage < pp, 0 <= r < dp.
  int64_t rank_of(int64_t stage, int64_t replica) const {
    return rank_of_unit[static_cast<size_t>(stage * dp + replica)];
  }
  // Stage of a pooled rank. Precondition: 0 <= rank < batch.ranks.
  int64_t stage_of_rank(int64_t rank) const { return unit_of[static_cast<size_t>(rank)] / dp; }
  int64_t pooled_doc(int64_t stage, int64_t original) const { return original * pp + stage; }
  int64_t stage_of_doc(int64_t doc) const { return doc % pp; }
  int64_t original_doc(int64_t doc) const { return doc / pp; }
  // The member of a pooled document, -1 when no member has its stage. Precondition: doc >= 0.
  int64_t member_of_doc(int64_t doc) const { return member_of_stage[static_cast<size_t>(doc % pp)]; }
  // The member, stage, micro-batch, direction and original id of pooled document `doc`
  // (member -1 when the id names no member). Precondition: doc >= 0.
  PoolOrigin origin(int64_t doc) const;
  // Of a task of a plan of the pooled batch: origin(task.doc).
  PoolOrigin origin(const TaskPlacement& task) const { return origin(task.doc); }
  // ScheduleOptions::doc_weights for this pool (see the header comment): empty when every
  // member runs one direction; otherwise every pooled document, ascending id.
  std::vector<DocWeight> doc_weights() const;
};

// Pools `members`. Fails (kInvalidArgument, the message names the member) unless pp >= 1,
// dp >= 1, there is at least one member, every member's stage is in [0, pp) and no two share
// one, every batch is non-null, has dp ranks, is valid (Batch::validate) and has document ids
// in [0, (2^62) / pp). tokens_per_rank of the pooled batch is the members' largest.
Result<PooledBatch> pool_batches(std::span<const PoolMember> members, int64_t pp, int64_t dp);

// One direction of a pipeline tick (tick_directions of one_f_one_b_ticks) pooled the way CAD
// plans it, in the trainer and in the simulator alike: op (s, m) is the member of stage s with
// batch micro_batches[m] (dp ranks), over every rank of the pipeline. Errors: those of
// pool_batches; an op whose micro-batch is not in micro_batches.
Result<PooledBatch> pool_tick(const Tick& tick, std::span<const Batch> micro_batches, int64_t pp, int64_t dp);

}  // namespace distca
