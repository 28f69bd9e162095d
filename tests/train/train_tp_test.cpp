// Tensor parallelism in `distca train` (--tp, issue 29): TP 2 against TP 1 at the same data
// parallelism, colocated and cad; checkpoints of a TP run hold the whole model; bad --tp
// settings are refused naming the flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "distca/train/checkpoint.h"
#include "distca/train/config.h"
#include "distca/train/trainer.h"
#include "train_test_util.h"

namespace distca::train {
namespace {

TrainConfig tp_config(int64_t dp, int64_t tp, TrainMode mode) {
  TrainConfig c = testing::small_run_config();
  c.mode = mode;
  c.ranks = dp * tp;
  c.tp = tp;
  return c;
}

TrainResult train(const TrainConfig& c, const TrainHooks& hooks = {}) { return testing::train_local(c, hooks); }

// The largest relative difference of the step losses, and of the final parameters (relative
// to the largest parameter).
struct Diff {
  double loss = 0, params = 0;
};
Diff diff(const TrainResult& a, const TrainResult& b) {
  Diff d;
  EXPECT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size() && i < b.steps.size(); ++i) {
    d.loss = std::max(d.loss, std::abs(a.steps[i].loss - b.steps[i].loss) / b.steps[i].loss);
  }
  EXPECT_EQ(a.final_params.size(), b.final_params.size());
  double scale = 0;
  for (size_t i = 0; i < a.final_params.size() && i < b.final_params.size(); ++i) {
    d.params = std::max(d.params, static_cast<double>(std::abs(a.final_params[i] - b.final_params[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b.final_params[i])));
  }
  d.params /= scale;
  return d;
}

// TP 2 x DP 2 against TP 1 x DP 2 over 20 steps: the same model, data and plans, the sums
// associated differently (docs/model.md, "Tensor parallelism"), so within float rounding.
TEST(TensorParallelTraining, TpTwoMatchesTpOneAtRounding) {
  struct Case {
    TrainMode mode;
    std::optional<runtime::OverlapMode> overlap;
    const char* name;
  };
  for (const Case& k : {Case{TrainMode::kColocated, std::nullopt, "colocated"},
                        Case{TrainMode::kCad, runtime::OverlapMode::kPingPong, "cad pingpong"},
                        Case{TrainMode::kCad, runtime::OverlapMode::kSingleStream, "cad single-stream"}}) {
    TrainConfig c1 = tp_config(2, 1, k.mode), c2 = tp_config(2, 2, k.mode);
    c1.overlap = c2.overlap = k.overlap;
    const TrainResult one = train(c1);
    const TrainResult two = train(c2);
    ASSERT_EQ(two.steps.size(), 20u);
    const Diff d = diff(two, one);
    std::cout << k.name << ": TP 2 x DP 2 vs TP 1 x DP 2 over 20 steps: loss " << d.loss << ", parameters "
              << d.params << "\n";
    EXPECT_LT(d.loss, 1e-6);
    EXPECT_LT(d.params, 1e-5);
    EXPECT_LT(two.steps.back().loss, two.steps.front().loss);  // it trains
  }
}

// With cad, each TP rank exchanges only its heads' rows with the peers at its TP index: every
// row kind (Q, K/V, O + LSE, dO, dQ, dK/dV) is heads x (head_dim or 1) x 4 bytes wide, so at
// TP 2 a rank moves exactly half the bytes of the TP 1 rank that holds the same tokens, on the
// same plan (every TP rank plans the same batch alike).
TEST(TensorParallelTraining, CadExchangeMovesTheRanksHeadSlice) {
  TrainConfig c1 = tp_config(2, 1, TrainMode::kCad);
  c1.steps = 4;
  TrainConfig c2 = tp_config(2, 2, TrainMode::kCad);
  c2.steps = 4;
  const TrainResult one = train(c1);
  const TrainResult two = train(c2);
  ASSERT_EQ(two.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_GT(one.steps[i].bytes_sent, 0) << i;  // the plan moves rows
    EXPECT_EQ(2 * two.steps[i].bytes_sent, one.steps[i].bytes_sent) << i;
  }
}

// A TP run's checkpoint holds the whole model (gathered from the shards): the last one is the
// run's final parameters, and resuming the first (sharded again on load) continues bitwise as
// the uninterrupted run. Another tp changes the fingerprint (its replicas and batches): refused.
TEST(TensorParallelTraining, CheckpointsHoldTheWholeModelAndResumeBitwise) {
  const auto dir = std::filesystem::temp_directory_path() / "distca_tp_resume";
  TrainConfig c = tp_config(1, 2, TrainMode::kColocated);
  c.steps = 6;
  const TrainResult whole = testing::expect_resume_is_bitwise(c, dir);
  const std::string fp = fingerprint(c, *c.model_spec());
  auto last = read_checkpoint((dir / "step-00000006.ckpt").string(), fp);
  ASSERT_TRUE(last.ok()) << last.status().message();
  EXPECT_TRUE(last->params == whole.final_params);
  TrainConfig other = c;
  other.tp = 1;
  other.ranks = 2;
  EXPECT_NE(fingerprint(other, *other.model_spec()), fp);
  std::filesystem::remove_all(dir);
}

TEST(TensorParallelTraining, BadSettingsAreRefusedNamingTheFlag) {
  auto refused = [](TrainConfig c, const std::string& what) {
    const Status st = c.validate();
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_NE(st.message().find("--tp"), std::string::npos) << st.message();
  };
  TrainConfig c = tp_config(1, 2, TrainMode::kColocated);
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
  c.tp = 4;  // 4 does not divide the 2 KV heads
  c.ranks = 4;
  refused(c, "tp 4");
  c.tp = 3;  // nor 3 the ranks
  refused(c, "tp 3");
  c.tp = 0;
  refused(c, "tp 0");
  TrainConfig p = tp_config(1, 2, TrainMode::kColocated);
  p.pp = 2;
  p.ranks = 4;
  p.micro_batches = 2;
  refused(p, "tp with pp");
}

}  // namespace
}  // namespace distca::train
