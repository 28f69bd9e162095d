// Shared by the train layer's tests: the small model they train (fast enough for many steps).
#pragma once

#include <cstdint>

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "distca/train/checkpoint.h"
#include "distca/train/config.h"
#include "distca/train/trainer.h"

namespace distca::train::testing {

// Two runs gave the same numbers: every step's loss and gradient norm, and the final
// parameters, bit for bit (what they sent may differ).
inline void expect_same_numbers(const TrainResult& a, const TrainResult& b, const std::string& what) {
  ASSERT_EQ(a.steps.size(), b.steps.size()) << what;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << what << " step " << i;
    EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << what << " step " << i;
  }
  EXPECT_FALSE(a.final_params.empty()) << what;
  EXPECT_TRUE(a.final_params == b.final_params) << what;
}

// The embedded default with a model of `layers` layers of width 64 (4 heads of 16, 2 K/V
// heads, ffn 128, vocabulary 64).
inline TrainConfig small_model_config(int64_t layers) {
  TrainConfig c;
  c.model_overrides.n_layers = layers;
  c.model_overrides.hidden = 64;
  c.model_overrides.n_heads = 4;
  c.model_overrides.n_kv_heads = 2;
  c.model_overrides.head_dim = 16;
  c.model_overrides.ffn = 128;
  c.model_overrides.vocab = 64;
  return c;
}

// small_model_config(2) on a small workload: 128 tokens per rank of documents uniform in
// 16..256 (no cap), 20 steps with 5 of warm-up; a model small enough for many steps.
inline TrainConfig small_run_config() {
  TrainConfig c = small_model_config(2);
  c.tokens_per_rank = 128;
  c.dist = "uniform:16:256";
  c.max_doc_len = 0;
  c.steps = 20;
  c.warmup = 5;
  return c;
}

// Runs `c` on the local backend, a failure reported as a test failure naming the layout.
inline TrainResult train_local(const TrainConfig& c, const TrainHooks& hooks = {}) {
  TrainResult r;
  const Status st = run_training_local(c, hooks, &r);
  EXPECT_TRUE(st.ok()) << "tp " << c.tp << " pp " << c.pp << " dp " << c.dp() << ": " << st.message();
  return r;
}

// Runs `c` (6 steps) whole, then again writing checkpoints every 3 steps into `dir`, resumes
// the step-3 checkpoint and expects the remaining steps and the final parameters to be the
// whole run's bits. Returns the whole run; `dir` keeps the checkpoints (the caller removes it).
inline TrainResult expect_resume_is_bitwise(TrainConfig c, const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  const TrainResult whole = train_local(c);
  c.checkpoint_dir = dir.string();
  c.checkpoint_every = 3;
  const TrainResult first = train_local(c);
  EXPECT_EQ(first.checkpoints_written, 2);
  auto ckpt = read_checkpoint((dir / "step-00000003.ckpt").string(), fingerprint(c, *c.model_spec()));
  EXPECT_TRUE(ckpt.ok()) << ckpt.status().message();
  if (!ckpt.ok()) return whole;
  TrainHooks hooks;
  hooks.resume = &*ckpt;
  c.checkpoint_dir.clear();
  c.checkpoint_every = 0;
  const TrainResult resumed = train_local(c, hooks);
  EXPECT_EQ(resumed.steps.size(), 3u);
  for (size_t i = 0; i < 3 && i < resumed.steps.size(); ++i) {
    EXPECT_EQ(resumed.steps[i].loss, whole.steps[3 + i].loss) << i;
  }
  EXPECT_TRUE(resumed.final_params == whole.final_params);
  return whole;
}

}  // namespace distca::train::testing
