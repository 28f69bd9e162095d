// The trainer's planner (internal to the train layer; docs/training.md, "Planning ahead").
//
// A step consumes its plans in units, in a fixed order that every rank knows from the config:
//   - per micro-batch (pp 1, or colocated pipelines): one unit per micro-batch, its NanoPlans
//     (plan_nano_batches of the micro-batch's batch), in micro-batch order;
//   - pooled ticks (cad with pp > 1): one unit per tick of one_f_one_b_ticks(P, M),
//     the tick's pooled forward batch and backward batch, each planned (either may be empty).
// A unit is a pure function of (config, step, index) and the data source: every rank computes
// the same plans bit for bit, so the units do not depend on when or on which thread they are
// made.
//
// StepPlanner hands the units out in that order. Inline, next() plans the unit on the caller's
// thread. Ahead, a background thread plans unit after unit, from (first step, 0) to the last
// unit of the run's last step, at most max_ahead units ahead of the caller: it starts a unit
// only while fewer than max_ahead made units wait to be taken, so besides the units the caller
// holds at most max_ahead exist. The trainer passes one step's units: step k + 1 is planned
// while step k computes.
//
// Thread safety: a StepPlanner is used from one thread (its rank's). The background thread
// reads only what the StepPlanner owns (PlanFn and BatchFn, moved in; their captures must be
// immutable while it lives, or owned by them) and hands every unit over under a mutex. The
// data source's const methods and the planner functions (plan_nano_batches, pool_batches)
// are reentrant. The background thread blocks SIGINT, SIGTERM and SIGHUP, so the CLI's
// handlers (core/io.h, install_temp_file_cleanup) run on the rank threads as before.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "distca/core/status.h"
#include "distca/data/batch.h"
#include "distca/plan/auto_tolerance.h"
#include "distca/plan/chunking.h"
#include "distca/plan/pool.h"
#include "distca/plan/schedule.h"
#include "distca/runtime/pingpong.h"
#include "distca/train/data.h"

namespace distca::train {

// One pooled direction of a tick: null when no stage runs that direction in the tick.
struct PlannedDirection {
  std::optional<PooledBatch> pool;
  std::optional<NanoPlans> plans;
};

struct PlanUnit {
  int64_t step = 0, index = 0;
  std::optional<NanoPlans> micro;  // per micro-batch: micro-batch `index`'s plans
  bool kv_once = true;             // the runner sends K/V once per server across the pair
  PlannedDirection forward, backward;       // pooled ticks: tick `index`'s directions
  double seconds = 0;                       // wall time of making it (on whichever thread)
};

// What a rank plans with (copied; immutable afterwards).
struct PlanContext {
  SchedulerSpec sspec;
  ScheduleOptions sopt;
  int64_t pp = 1, dp = 1, micro_batches = 1;
  bool pooled_ticks = false;  // cad with pp > 1
  // --tolerance auto (pp 1): the model choose_tolerance reads and the cost table it points
  // to (immutable, shared with the planning thread); null: sopt.tolerance as it is.
  std::shared_ptr<const AttentionCostModel> auto_table;
  std::shared_ptr<const AutoToleranceModel> auto_model;
  bool tolerance_auto = false;  // auto_model chooses the band (else only --kv-once auto reads it)
  // TrainConfig::kv_once: "on", "off", or "auto" (kv_once_pays on auto_model; on without it).
  std::string kv_once = "on";
  // wlb and percp: each micro-batch's batch is re-laid before it is planned (wlb_repack with
  // `chunking`, or percp_repack over groups of chunking.cp); kColocated/kCad: as loaded. wlb
  // under --pp re-packs the step's micro-batches together (repacks_across_micro_batches).
  TrainMode relayout = TrainMode::kCad;
  ChunkingOptions chunking;
  std::shared_ptr<const AttentionCostModel> chunking_table;  // what chunking.cost points to, or null
  // Units per step: micro_batches, or the ticks of one_f_one_b_ticks(pp, micro_batches).
  int64_t units_per_step() const;
};

// wlb with pp > 1 and several micro-batches: documents move between the step's micro-batches
// (plan/chunking.h, wlb_repack_micro_batches), whose layouts then carry micro_doc_id ids.
bool repacks_across_micro_batches(TrainMode mode, int64_t pp, int64_t micro_batches);

// Micro-batch `index`'s layout its plans are made on: its batch re-laid as ctx.relayout says
// (across the step's micro-batches `batches` when repacks_across_micro_batches).
Result<Batch> laid_out_batch(const PlanContext& ctx, const std::vector<Batch>& batches, int64_t index);

// Unit `index` of step `step` from the step's micro-batch batches ([micro_batches], batch
// m = DataSource::batch(step * micro_batches + m)). Errors carry "step N".
Result<PlanUnit> plan_unit(const PlanContext& ctx, int64_t step, int64_t index, const std::vector<Batch>& batches);

// The step's batches, as plan_unit wants them.
std::vector<Batch> step_batches(const DataSource& data, int64_t micro_batches, int64_t step);

class StepPlanner {
 public:
  using PlanFn = std::function<Result<PlanUnit>(int64_t step, int64_t index, const std::vector<Batch>& batches)>;
  using BatchFn = std::function<std::vector<Batch>(int64_t step)>;

  // Units of steps [first_step, end_step), `units_per_step` each (>= 1). max_ahead >= 1:
  // start the background thread now (it begins with (first_step, 0)) and let it make up to
  // max_ahead units before they are taken; 0: inline. wait_limit_s: the longest next() blocks
  // for a unit before it fails (> 0).
  StepPlanner(PlanFn plan, BatchFn batches, int64_t units_per_step, int64_t first_step, int64_t end_step,
              int64_t max_ahead, double wait_limit_s);
  // Stops the background thread and joins it (after at most the unit it is planning).
  ~StepPlanner();
  StepPlanner(const StepPlanner&) = delete;
  StepPlanner& operator=(const StepPlanner&) = delete;

  // The unit (step, index); calls must follow the order above, one per unit (a call out of
  // order is an internal error). `batches`: the step's batches, used only inline. Ahead: a
  // unit already made is returned at once with *waited = 0; otherwise the call blocks until
  // it is made, at most wait_limit_s (then an internal error naming the step), and *waited is
  // the time blocked. Inline: *waited is the time planning took. An error of the planning
  // function (or an exception it threw, as an internal error) comes back here, for that unit,
  // and the background thread makes no further unit.
  Result<PlanUnit> next(int64_t step, int64_t index, const std::vector<Batch>& batches, double* waited);

  bool ahead() const { return thread_.joinable(); }

 private:
  void run();  // the background thread

  PlanFn plan_;
  BatchFn batches_;
  const int64_t units_per_step_, max_ahead_, first_step_, end_step_;
  const double wait_limit_s_;
  int64_t expect_step_, expect_index_;  // the caller's next unit (caller's thread only)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Result<PlanUnit>> ready_;  // guarded by mu_: units made, not yet taken, in order
  bool stop_ = false;                      // guarded by mu_
  std::thread thread_;
};

}  // namespace distca::train
