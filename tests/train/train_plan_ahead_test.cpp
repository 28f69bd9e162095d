// Planning ahead (issue 15): the trainer's StepPlanner makes the same plans on its background
// thread as inline, hands errors and exceptions of the planning thread to the caller as a
// Status, bounds the wait, joins on every exit; and `distca train` with --plan-ahead on gives
// bitwise the losses, gradient norms and parameters of --plan-ahead off in every mode, with
// pipelines, and across a resume.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distca/plan/plan_json.h"
#include "distca/runtime/dispatcher.h"
#include "distca/train/checkpoint.h"
#include "distca/train/config.h"
#include "distca/train/data.h"
#include "distca/train/trainer.h"
#include "train/planner.h"
#include "train_test_util.h"

namespace distca::train {
namespace {

// ---- StepPlanner -------------------------------------------------------------------------

PlanContext context(const TrainConfig& c) {
  PlanContext ctx;
  auto spec = c.model_spec();
  EXPECT_TRUE(spec.ok());
  auto sched = parse_scheduler(c.mode == TrainMode::kCad ? c.scheduler : "colocated");
  EXPECT_TRUE(sched.ok());
  ctx.sspec = *sched;
  ctx.sopt.model = *spec;
  ctx.sopt.dtype_bytes = 4;
  ctx.sopt.tolerance = c.tolerance;
  runtime::AttentionDims dims;
  dims.n_heads = static_cast<int32_t>(spec->n_heads);
  dims.n_kv_heads = static_cast<int32_t>(spec->n_kv_heads);
  dims.head_dim = static_cast<int32_t>(spec->head_dim);
  ctx.sopt.align_rows = runtime::query_tile_rows(dims);
  ctx.pp = c.pp;
  ctx.dp = c.dp();
  ctx.micro_batches = c.micro_batches;
  ctx.pooled_ticks = c.mode == TrainMode::kCad && c.pp > 1;
  return ctx;
}

// Every plan of a unit as text (plan_to_json is deterministic and holds the whole plan).
std::string unit_text(const PlanUnit& u) {
  std::string out = std::to_string(u.step) + "/" + std::to_string(u.index) + ":";
  auto add = [&](const std::optional<NanoPlans>& np) {
    if (!np) {
      out += "none;";
      return;
    }
    out += plan_to_json(np->full).dump() + plan_to_json(np->nano[0]).dump() + plan_to_json(np->nano[1]).dump();
  };
  add(u.micro);
  add(u.forward.plans);
  add(u.backward.plans);
  return out;
}

// The units of steps [first, end) from a planner, in order.
std::vector<std::string> all_units(const TrainConfig& c, int64_t first, int64_t end, int64_t max_ahead) {
  const PlanContext ctx = context(c);
  auto data = DataSource::create(c, 64);
  EXPECT_TRUE(data.ok());
  const DataSource* d = &*data;
  const int64_t M = c.micro_batches;
  std::vector<std::string> out;
  {
    StepPlanner planner([ctx](int64_t s, int64_t i, const std::vector<Batch>& b) { return plan_unit(ctx, s, i, b); },
                        [d, M](int64_t s) { return step_batches(*d, M, s); }, ctx.units_per_step(), first, end, max_ahead,
                        kPlanWaitLimitS);
    EXPECT_EQ(planner.ahead(), max_ahead > 0);
    for (int64_t s = first; s < end; ++s) {
      const std::vector<Batch> batches = step_batches(*d, M, s);
      for (int64_t i = 0; i < ctx.units_per_step(); ++i) {
        double waited = -1;
        auto u = planner.next(s, i, batches, &waited);
        EXPECT_TRUE(u.ok()) << u.status().to_string();
        if (!u.ok()) return out;
        EXPECT_GE(waited, 0);
        out.push_back(unit_text(*u));
      }
    }
  }
  return out;
}

TEST(StepPlanner, AheadMakesTheInlinePlans) {
  TrainConfig c = testing::small_model_config(2);
  c.ranks = 4;
  c.micro_batches = 2;
  c.dist = "uniform:16:512";
  c.max_doc_len = 0;
  const auto inline_units = all_units(c, 3, 6, 0);
  EXPECT_EQ(inline_units.size(), 6u);  // 3 steps x 2 micro-batches
  EXPECT_EQ(all_units(c, 3, 6, 1), inline_units);
  EXPECT_EQ(all_units(c, 3, 6, 2), inline_units);
  // Pooled pipeline ticks (cad, 2 stages x 2 replicas, 2 micro-batches: 1F1B's 2 (M + P - 1)
  // = 6 unit-time slots per step).
  c.pp = 2;
  const auto ticks_inline = all_units(c, 0, 2, 0);
  EXPECT_EQ(ticks_inline.size(), 12u);
  EXPECT_EQ(all_units(c, 0, 2, 1), ticks_inline);
  EXPECT_EQ(all_units(c, 0, 2, 6), ticks_inline);
}

PlanUnit fake_unit(int64_t step, int64_t index) {
  PlanUnit u;
  u.step = step;
  u.index = index;
  return u;
}

const StepPlanner::BatchFn kNoBatches = [](int64_t) { return std::vector<Batch>{}; };

TEST(StepPlanner, AnErrorOnThePlanningThreadReachesTheStep) {
  for (int64_t ahead : {0, 1, 3}) {
    StepPlanner planner(
        [](int64_t s, int64_t i, const std::vector<Batch>&) -> Result<PlanUnit> {
          if (s == 2 && i == 1) return Status::invalid_argument("step 2: no plan for this batch");
          return fake_unit(s, i);
        },
        kNoBatches, 2, 0, 5, ahead, kPlanWaitLimitS);
    double waited = 0;
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t i = 0; i < 2; ++i) ASSERT_TRUE(planner.next(s, i, {}, &waited).ok()) << s << " " << i;
    }
    ASSERT_TRUE(planner.next(2, 0, {}, &waited).ok());
    auto bad = planner.next(2, 1, {}, &waited);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(bad.status().message(), "step 2: no plan for this batch") << "ahead " << ahead;
  }  // the destructor joins the thread, which stopped at the error
}

TEST(StepPlanner, AnExceptionOnThePlanningThreadBecomesAStatus) {
  for (int64_t ahead : {0, 1, 3}) {
    StepPlanner planner(
        [](int64_t s, int64_t i, const std::vector<Batch>&) -> Result<PlanUnit> {
          if (s == 1) throw std::runtime_error("boom");
          return fake_unit(s, i);
        },
        kNoBatches, 1, 0, 3, ahead, kPlanWaitLimitS);
    double waited = 0;
    ASSERT_TRUE(planner.next(0, 0, {}, &waited).ok());
    auto bad = planner.next(1, 0, {}, &waited);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
    EXPECT_EQ(bad.status().message(), "step 1: planning: boom") << "ahead " << ahead;
  }
}

TEST(StepPlanner, UnitsOutOfOrderAreRefused) {
  StepPlanner planner([](int64_t s, int64_t i, const std::vector<Batch>&) -> Result<PlanUnit> { return fake_unit(s, i); },
                      kNoBatches, 2, 4, 6, 1, kPlanWaitLimitS);
  double waited = 0;
  auto skipped = planner.next(4, 1, {}, &waited);
  ASSERT_FALSE(skipped.ok());
  EXPECT_NE(skipped.status().message().find("out of order (expected unit 0 of step 4)"), std::string::npos)
      << skipped.status().message();
  EXPECT_TRUE(planner.next(4, 0, {}, &waited).ok());
}

// A planner that never finishes its unit until released: the step's wait ends at the limit
// with an error naming the step (the outcome does not depend on timing: the unit cannot be
// made before the release), and the destructor joins once the unit ends.
TEST(StepPlanner, TheWaitIsBounded) {
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  std::atomic<int> started{0};
  {
    StepPlanner planner(
        [&](int64_t s, int64_t i, const std::vector<Batch>&) -> Result<PlanUnit> {
          ++started;
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return released; });
          return fake_unit(s, i);
        },
        kNoBatches, 1, 0, 10, 1, 0.05);
    double waited = 0;
    auto late = planner.next(0, 0, {}, &waited);
    ASSERT_FALSE(late.ok());
    EXPECT_EQ(late.status().message(), "step 0: no plan after 0.05 s (the planning thread is stuck)");
    EXPECT_GE(waited, 0.05);
    {
      std::lock_guard<std::mutex> lock(mu);
      released = true;
    }
    cv.notify_all();
  }  // joins: the thread finishes unit 0, then sees the stop instead of planning unit 1
  EXPECT_EQ(started.load(), 1);
}

// Nothing taken: the thread makes max_ahead units and stops there; the run fails (or ends)
// while it waits for them to be taken, and the destructor stops and joins it without planning
// the rest of the run.
TEST(StepPlanner, MakesAtMostMaxAheadUnitsAndStopsOnDestruction) {
  std::mutex mu;
  std::condition_variable cv;
  int made = 0;
  {
    StepPlanner planner(
        [&](int64_t s, int64_t i, const std::vector<Batch>&) -> Result<PlanUnit> {
          {
            std::lock_guard<std::mutex> lock(mu);
            ++made;
          }
          cv.notify_all();
          return fake_unit(s, i);
        },
        kNoBatches, 2, 0, 1000000, 3, kPlanWaitLimitS);
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return made >= 3; });
  }
  EXPECT_EQ(made, 3);
}

// ---- the trainer ---------------------------------------------------------------------------

TrainResult train(TrainConfig c, const std::string& plan_ahead, const TrainHooks& hooks = {}) {
  c.plan_ahead = plan_ahead;
  TrainResult r;
  const Status st = run_training_local(c, hooks, &r);
  EXPECT_TRUE(st.ok()) << plan_ahead << ": " << st.to_string();
  return r;
}

void expect_bitwise(const TrainResult& a, const TrainResult& b, const std::string& what) {
  testing::expect_same_numbers(a, b, what);
  ASSERT_EQ(a.steps.size(), b.steps.size()) << what;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].step, b.steps[i].step) << what;
    EXPECT_EQ(a.steps[i].report_loss, b.steps[i].report_loss) << what << " step " << i;
    EXPECT_EQ(a.steps[i].imbalance_after, b.steps[i].imbalance_after) << what << " step " << i;
    EXPECT_EQ(a.steps[i].bytes_sent, b.steps[i].bytes_sent) << what << " step " << i;
  }
}

TrainConfig base_config() {
  TrainConfig c = testing::small_model_config(2);
  c.steps = 3;
  c.warmup = 2;
  c.dist = "uniform:16:512";
  c.max_doc_len = 0;
  return c;
}

TEST(PlanAhead, GivesTheBitsOfInlinePlanning) {
  struct Case {
    std::string what, mode, overlap;
    int64_t ranks, pp, micro_batches;
  };
  const Case cases[] = {
      {"cad pingpong, 3 ranks", "cad", "", 3, 1, 1},
      {"cad single-stream, 2 ranks", "cad", "single-stream", 2, 1, 1},
      {"colocated, 2 ranks", "colocated", "", 2, 1, 1},
      {"cad, 3 micro-batches", "cad", "", 2, 1, 3},
      {"colocated 1F1B, 2 stages", "colocated", "", 2, 2, 3},
      {"cad pooled ticks, 2 stages x 2", "cad", "", 4, 2, 2},
  };
  for (const Case& k : cases) {
    TrainConfig c = base_config();
    c.mode = parse_train_mode(k.mode).value();
    if (!k.overlap.empty()) c.overlap = runtime::parse_overlap_mode(k.overlap).value();
    c.ranks = k.ranks;
    c.pp = k.pp;
    c.micro_batches = k.micro_batches;
    const TrainResult off = train(c, "off");
    const TrainResult on = train(c, "on");
    expect_bitwise(on, off, k.what);
    // Inline, every plan is made while the step waits; ahead, the plans are the same work.
    EXPECT_GT(off.plan_s, 0) << k.what;
    EXPECT_EQ(off.plan_wait_s, off.plan_s) << k.what;
    EXPECT_GT(on.plan_s, 0) << k.what;
    EXPECT_GE(on.plan_wait_s, 0) << k.what;
  }
}

// Resuming with planning ahead starts the planning thread at the checkpoint's step.
TEST(PlanAhead, ResumeIsBitwiseTheUninterruptedInlineRun) {
  const auto dir = std::filesystem::temp_directory_path() / "distca_plan_ahead_resume_test";
  std::filesystem::remove_all(dir);
  TrainConfig c = base_config();
  c.steps = 6;
  const TrainResult straight = train(c, "off");
  c.checkpoint_dir = dir.string();
  c.checkpoint_every = 3;
  const TrainResult first = train(c, "on");
  ASSERT_EQ(first.checkpoints_written, 2);
  auto spec = c.model_spec();
  ASSERT_TRUE(spec.ok());
  auto ck = read_checkpoint((dir / "step-00000003.ckpt").string(), fingerprint(c, *spec));
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  TrainConfig c2 = c;
  c2.checkpoint_dir = (dir / "resumed").string();
  TrainHooks hooks;
  hooks.resume = &*ck;
  const TrainResult resumed = train(c2, "on", hooks);
  ASSERT_EQ(resumed.steps.size(), 3u);
  TrainResult tail = straight;
  tail.steps.erase(tail.steps.begin(), tail.steps.begin() + 3);
  expect_bitwise(resumed, tail, "resumed");
  std::filesystem::remove_all(dir);
}

// A step that fails while the planning thread runs ahead ends the run with the step's error:
// no hang, the thread is joined.
TEST(PlanAhead, AFailedStepEndsTheRunWithItsError) {
  TrainConfig c = base_config();
  c.steps = 50;
  c.lr = 1e30;  // the first update overflows; a later step's gradient norm is not finite
  c.warmup = 0;
  c.clip = 0;
  c.plan_ahead = "on";
  TrainResult r;
  const Status st = run_training_local(c, {}, &r);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("gradient norm is not finite"), std::string::npos) << st.to_string();
}

TEST(PlanAhead, BadValueIsRefusedNamingTheFlag) {
  TrainConfig c = base_config();
  c.plan_ahead = "yes";
  const Status st = c.validate();
  EXPECT_EQ(st.message(), "--plan-ahead must be on or off (got 'yes')");
  TrainConfig t;
  ASSERT_TRUE(apply_toml_text("plan_ahead = \"off\"\n", "test.toml", t).ok());
  EXPECT_EQ(t.plan_ahead, "off");
  EXPECT_TRUE(t.validate().ok());
}

}  // namespace
}  // namespace distca::train
