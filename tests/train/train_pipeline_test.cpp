// Pipeline parallelism in `distca train` (issue 14, colocated 1F1B): P stages compute bitwise
// what one stage computes on the same micro-batches in the same order, with and without data
// parallelism; checkpoints of a pipelined run resume bitwise; bad settings are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "distca/train/checkpoint.h"
#include "distca/train/config.h"
#include "distca/train/trainer.h"
#include "train_test_util.h"

namespace distca::train {
namespace {

TrainConfig pipeline_config(int64_t dp, int64_t pp, int64_t micro_batches) {
  TrainConfig c = testing::small_model_config(4);
  c.mode = TrainMode::kColocated;
  c.ranks = dp * pp;
  c.pp = pp;
  c.micro_batches = micro_batches;
  c.tokens_per_rank = 256;
  c.dist = "uniform:16:512";
  c.max_doc_len = 0;
  c.steps = 6;
  c.warmup = 2;
  return c;
}

TrainResult train(const TrainConfig& c, const TrainHooks& hooks = {}) { return testing::train_local(c, hooks); }

std::vector<double> losses(const TrainResult& r) {
  std::vector<double> out;
  for (const StepMetrics& m : r.steps) out.push_back(m.loss);
  return out;
}

std::vector<double> norms(const TrainResult& r) {
  std::vector<double> out;
  for (const StepMetrics& m : r.steps) out.push_back(m.grad_norm);
  return out;
}

// Every reduction has a fixed order that does not depend on where the layers live: gradients
// accumulate over micro-batches in ascending order on every stage (1F1B runs the backwards in
// micro-batch order), the data-parallel all-reduce is per stage in rank order, the global norm
// sums per-tensor squared norms in layout order.
TEST(Pipeline, StagesComputeBitwiseWhatOneStageComputes) {
  for (int64_t dp : {1, 2}) {
    const TrainResult one = train(pipeline_config(dp, 1, 4));
    ASSERT_EQ(one.steps.size(), 6u);
    for (int64_t pp : {2, 3, 4}) {
      const TrainResult many = train(pipeline_config(dp, pp, 4));
      EXPECT_EQ(losses(many), losses(one)) << "dp " << dp << " pp " << pp;
      EXPECT_EQ(norms(many), norms(one)) << "dp " << dp << " pp " << pp;
      EXPECT_TRUE(many.final_params == one.final_params) << "dp " << dp << " pp " << pp;
    }
  }
}

// More micro-batches than stages, and an uneven split of layers (4 layers on 3 stages: 2, 1, 1).
TEST(Pipeline, ManyMicroBatchesAndUnevenStages) {
  const TrainResult one = train(pipeline_config(1, 1, 7));
  const TrainResult three = train(pipeline_config(1, 3, 7));
  EXPECT_EQ(losses(three), losses(one));
  EXPECT_TRUE(three.final_params == one.final_params);
}

// A checkpoint written by a pipelined run holds the whole model; resuming it (pipelined
// again) continues bitwise as the uninterrupted run.
TEST(Pipeline, ResumeOfAPipelinedRunIsBitwise) {
  const auto dir = std::filesystem::temp_directory_path() / "distca_pipeline_resume";
  testing::expect_resume_is_bitwise(pipeline_config(1, 2, 2), dir);
  std::filesystem::remove_all(dir);
}

// CAD's pipeline: each direction of every tick is one pooled plan over every rank
// (idle stages serve), a micro-batch's backward is planned apart from its forward (stateless
// servers). It computes the function of one stage: where the planner moves pieces, dK/dV
// partials add in another association, so within float rounding (bound stated in the docs).
TEST(Pipeline, CadPipelineComputesTheFunctionOfOneStage) {
  for (int64_t dp : {1, 2}) {
    TrainConfig one_cfg = pipeline_config(dp, 1, 4);
    const TrainResult one = train(one_cfg);
    for (int64_t pp : {2, 4}) {
      TrainConfig c = pipeline_config(dp, pp, 4);
      c.mode = TrainMode::kCad;
      const TrainResult cad = train(c);
      ASSERT_EQ(cad.steps.size(), one.steps.size());
      bool moved = false;
      double worst = 0;
      for (size_t i = 0; i < cad.steps.size(); ++i) {
        worst = std::max(worst, std::abs(cad.steps[i].loss - one.steps[i].loss) / one.steps[i].loss);
        moved |= cad.steps[i].bytes_sent > 0;
      }
      EXPECT_LT(worst, 1e-6) << "dp " << dp << " pp " << pp;
      EXPECT_TRUE(moved) << "dp " << dp << " pp " << pp << ": the pooled plans moved no attention";
      double diff = 0, norm = 0;
      for (size_t i = 0; i < one.final_params.size(); ++i) {
        const double d = double{cad.final_params[i]} - double{one.final_params[i]};
        diff += d * d;
        norm += double{one.final_params[i]} * double{one.final_params[i]};
      }
      EXPECT_LT(std::sqrt(diff / norm), 1e-5) << "dp " << dp << " pp " << pp;
      std::printf("cad pp %lld dp %lld: largest relative loss difference %.2e, parameters %.2e\n",
                  static_cast<long long>(pp), static_cast<long long>(dp), worst, std::sqrt(diff / norm));
      const TrainResult again = train(c);
      EXPECT_TRUE(again.final_params == cad.final_params) << "deterministic";
    }
  }
  // Inside every tick each direction's nano-batches ping-pong by default; single-stream runs
  // each direction's whole pooled plan at once: the same function within rounding.
  TrainConfig c = pipeline_config(2, 2, 4);
  c.mode = TrainMode::kCad;
  const TrainResult pingpong = train(c);
  c.overlap = runtime::OverlapMode::kSingleStream;
  const TrainResult single = train(c);
  for (size_t i = 0; i < single.steps.size(); ++i) {
    EXPECT_NEAR(single.steps[i].loss, pingpong.steps[i].loss, 1e-6 * pingpong.steps[i].loss) << i;
  }
  c.overlap = runtime::OverlapMode::kSignal;
  const TrainResult signal = train(c);
  EXPECT_FALSE(signal.outputs_valid);
}

TEST(Pipeline, BadSettingsAreRefusedNamingTheFlag) {
  struct Case {
    int64_t ranks, pp, micro_batches;
    TrainMode mode;
    std::string needle;
  };
  for (const Case& k : std::vector<Case>{{4, 3, 4, TrainMode::kColocated, "--pp 3 does not divide --ranks 4"},
                                         {4, 2, 1, TrainMode::kColocated, "--micro-batches 1 is fewer than the 2"},
                                         {8, 8, 8, TrainMode::kColocated, "exceed the model's 4 layers"},
                                         {3, 3, 4, TrainMode::kCad, "--pp 3 with --mode cad must divide the model's 4 layers"},
                                         {4, 0, 4, TrainMode::kColocated, "--pp must be in 1..64"},
                                         {2, 1, 0, TrainMode::kColocated, "--micro-batches must be in 1..4096"}}) {
    TrainConfig c = pipeline_config(1, 1, 1);
    c.ranks = k.ranks;
    c.pp = k.pp;
    c.micro_batches = k.micro_batches;
    c.mode = k.mode;
    const Status st = c.validate();
    ASSERT_FALSE(st.ok()) << k.needle;
    EXPECT_NE(st.message().find(k.needle), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace distca::train
