// The trainer's planner: units of plans made inline or ahead on a background thread
// (src/train/planner.h).
#include "planner.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <utility>

#include "distca/plan/auto_tolerance.h"
#include "distca/plan/pipeline_schedule.h"

namespace distca::train {
namespace {

using Clock = std::chrono::steady_clock;

Status plan_direction(const PlanContext& ctx, const Tick& tick, const std::vector<Batch>& batches,
                      const std::string& at, PlannedDirection& d) {
  if (tick.ops.empty()) return {};
  auto pooled = pool_tick(tick, batches, ctx.pp, ctx.dp);
  if (!pooled.ok()) return pooled.status().with_context(at);
  d.pool.emplace(std::move(pooled).value());
  auto planned = plan_nano_batches(d.pool->batch, ctx.sspec, ctx.sopt);
  if (!planned.ok()) return planned.status().with_context(at);
  d.plans.emplace(std::move(planned).value());
  return {};
}

// plan(), with anything it throws as a Status: the background thread must never end the
// process, and the caller reports the error as the step's.
Result<PlanUnit> guarded(const StepPlanner::PlanFn& plan, int64_t step, int64_t index, const std::vector<Batch>& b) {
  const std::string at = "step " + std::to_string(step) + ": planning";
  try {
    return plan(step, index, b);
  } catch (const std::bad_alloc&) {
    return Status::internal(at + ": out of memory");
  } catch (const std::exception& e) {
    return Status::internal(at + ": " + e.what());
  } catch (...) {
    return Status::internal(at + ": unknown exception");
  }
}

}  // namespace

int64_t PlanContext::units_per_step() const {
  if (!pooled_ticks) return micro_batches;
  return static_cast<int64_t>(one_f_one_b_ticks(pp, micro_batches).size());
}

std::vector<Batch> step_batches(const DataSource& data, int64_t micro_batches, int64_t step) {
  std::vector<Batch> out;
  out.reserve(static_cast<size_t>(micro_batches));
  for (int64_t m = 0; m < micro_batches; ++m) out.push_back(data.batch(step * micro_batches + m));
  return out;
}

bool repacks_across_micro_batches(TrainMode mode, int64_t pp, int64_t micro_batches) {
  return mode == TrainMode::kWlb && pp > 1 && micro_batches > 1;
}

Result<Batch> laid_out_batch(const PlanContext& ctx, const std::vector<Batch>& batches, int64_t index) {
  const Batch& batch = batches[static_cast<size_t>(index)];
  if (repacks_across_micro_batches(ctx.relayout, ctx.pp, ctx.micro_batches)) {
    DISTCA_ASSIGN_OR_RETURN(std::vector<Batch> all, wlb_repack_micro_batches(batches, ctx.chunking));
    return std::move(all[static_cast<size_t>(index)]);
  }
  if (ctx.relayout == TrainMode::kWlb) return wlb_repack(batch, ctx.chunking);
  if (ctx.relayout == TrainMode::kPerCp) return percp_repack(batch, ctx.chunking.cp);
  return batch;
}

Result<PlanUnit> plan_unit(const PlanContext& ctx, int64_t step, int64_t index, const std::vector<Batch>& batches) {
  const auto t0 = Clock::now();
  const std::string at = "step " + std::to_string(step);
  PlanUnit u;
  u.step = step;
  u.index = index;
  if (!ctx.pooled_ticks) {
    auto laid = laid_out_batch(ctx, batches, index);
    if (!laid.ok()) return laid.status().with_context(at);
    ScheduleOptions sopt = ctx.sopt;
    double cut_fraction = 0;  // the L / sqrt(2) rule
    if (ctx.auto_model && ctx.tolerance_auto) {
      // Every rank plans the same batch: the same choice everywhere, no collective.
      auto choice = choose_tolerance(*laid, ctx.sspec, sopt, *ctx.auto_model);
      if (!choice.ok()) return choice.status().with_context(at);
      sopt.tolerance = choice->tolerance;
      cut_fraction = choice->cut_fraction;
    }
    auto planned = plan_nano_batches(*laid, ctx.sspec, sopt, cut_fraction);
    if (!planned.ok()) return planned.status().with_context(at);
    u.micro.emplace(std::move(planned).value());
    // Also a pure function of the batch: every rank's runner agrees.
    u.kv_once = ctx.kv_once != "off";
    if (ctx.kv_once == "auto" && ctx.auto_model) {
      u.kv_once = kv_once_pays(*u.micro, *ctx.auto_model, std::max<int64_t>(1, sopt.model.n_layers));
    }
  } else {
    u.kv_once = ctx.kv_once != "off";
    // one_f_one_b_ticks is cheap next to a plan; recomputing it keeps a unit a pure function.
    const std::vector<std::vector<PipeOp>> ticks = one_f_one_b_ticks(ctx.pp, ctx.micro_batches);
    const std::array<Tick, 2> dirs = tick_directions(ticks[static_cast<size_t>(index)]);
    DISTCA_RETURN_IF_ERROR(plan_direction(ctx, dirs[0], batches, at, u.forward));
    DISTCA_RETURN_IF_ERROR(plan_direction(ctx, dirs[1], batches, at, u.backward));
  }
  u.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return u;
}

StepPlanner::StepPlanner(PlanFn plan, BatchFn batches, int64_t units_per_step, int64_t first_step, int64_t end_step,
                         int64_t max_ahead, double wait_limit_s)
    : plan_(std::move(plan)),
      batches_(std::move(batches)),
      units_per_step_(units_per_step),
      max_ahead_(max_ahead),
      first_step_(first_step),
      end_step_(end_step),
      wait_limit_s_(wait_limit_s),
      expect_step_(first_step),
      expect_index_(0) {
  if (max_ahead < 1 || first_step >= end_step) return;
  // The thread inherits the creating thread's signal mask: block the termination signals for
  // it, so a handler never runs on the planning thread, then restore the caller's mask.
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  thread_ = std::thread([this] { run(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

StepPlanner::~StepPlanner() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StepPlanner::run() {
  for (int64_t step = first_step_; step < end_step_; ++step) {
    std::vector<Batch> batches;
    try {
      batches = batches_(step);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.emplace_back(Status::internal("step " + std::to_string(step) + ": loading the batches to plan failed"));
      cv_.notify_all();
      return;
    }
    for (int64_t index = 0; index < units_per_step_; ++index) {
      {
        // At most max_ahead units made and not taken.
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || static_cast<int64_t>(ready_.size()) < max_ahead_; });
        if (stop_) return;
      }
      Result<PlanUnit> unit = guarded(plan_, step, index, batches);
      const bool failed = !unit.ok();
      {
        std::lock_guard<std::mutex> lock(mu_);
        ready_.push_back(std::move(unit));
      }
      cv_.notify_all();
      if (failed) return;  // the caller gets the error and stops asking
    }
  }
}

Result<PlanUnit> StepPlanner::next(int64_t step, int64_t index, const std::vector<Batch>& batches, double* waited) {
  *waited = 0;
  if (step != expect_step_ || index != expect_index_ || step < first_step_ || step >= end_step_) {
    return Status::internal("planner: unit " + std::to_string(index) + " of step " + std::to_string(step) +
                            " asked out of order (expected unit " + std::to_string(expect_index_) + " of step " +
                            std::to_string(expect_step_) + ")");
  }
  if (++expect_index_ == units_per_step_) {
    expect_index_ = 0;
    ++expect_step_;
  }
  if (!thread_.joinable()) {
    Result<PlanUnit> unit = guarded(plan_, step, index, batches);
    if (unit.ok()) *waited = unit->seconds;
    return unit;
  }
  std::optional<Result<PlanUnit>> got;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (ready_.empty()) {
      const auto t0 = Clock::now();
      const bool made = cv_.wait_for(lock, std::chrono::duration<double>(wait_limit_s_),
                                     [this] { return !ready_.empty(); });
      *waited = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!made) {
        char limit[32];
        std::snprintf(limit, sizeof(limit), "%g", wait_limit_s_);
        return Status::internal("step " + std::to_string(step) + ": no plan after " + limit +
                                " s (the planning thread is stuck)");
      }
    }
    got.emplace(std::move(ready_.front()));
    ready_.pop_front();
  }
  cv_.notify_all();
  if (got->ok() && ((*got)->step != step || (*got)->index != index)) {
    return Status::internal("planner: made unit " + std::to_string((*got)->index) + " of step " +
                            std::to_string((*got)->step) + " where unit " + std::to_string(index) + " of step " +
                            std::to_string(step) + " was asked");
  }
  return std::move(*got);
}

}  // namespace distca::train
