// End-to-end sanity: a tiny model learns a repeated-pattern task on one rank with AdamW,
// clipping and the schedule, and the loss falls clearly.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "distca/core/rng.h"
#include "distca/model/llama.h"
#include "distca/model/local_attention.h"
#include "distca/model/optimizer.h"
#include "model_test_util.h"

namespace distca::model {
namespace {

TEST(Training, LossFallsOnARepeatedPattern) {
  ModelSpec spec = testing::tiny_spec();
  spec.vocab = 16;
  // Each document repeats a random 6-token motif: after the first repetition the next token is
  // predictable by copying from 6 positions back, which needs attention and RoPE to work.
  const int64_t kMotif = 6, kDocLen = 30, kDocs = 6;
  auto model = Llama<float>::create(spec, kDocs * kDocLen, 1);
  ASSERT_TRUE(model.ok());
  auto opt = AdamW::create(param_count(spec), decay_groups(model->layout()));
  ASSERT_TRUE(opt.ok());
  LrSchedule sched;
  sched.max_lr = 2e-3;
  sched.min_lr = 1e-3;
  sched.warmup_steps = 20;
  sched.total_steps = 400;
  Rng rng(5);
  double first = 0, last = 0;
  for (int64_t step = 0; step < sched.total_steps; ++step) {
    testing::Packed p;
    for (int64_t d = 0; d < kDocs; ++d) {
      const auto motif = testing::random_ids(rng, kMotif, spec.vocab);
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < kDocLen; ++i) ids.push_back(motif[static_cast<size_t>(i % kMotif)]);
      testing::append_doc(p, d, ids);
    }
    auto ex = LocalAttentionExecutor<float>::create(spec.n_heads, spec.n_kv_heads,
                                                    spec.head_dim, p.pieces);
    ASSERT_TRUE(ex.ok());
    // Report only targets after the first motif (the predictable ones).
    std::vector<float> w(p.tokens.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = static_cast<int64_t>(i % kDocLen) >= kMotif ? 1.0f : 0.0f;
    }
    StepInputs in = p.inputs();
    in.report_weights = w;
    model->zero_grads();
    const int64_t count = kDocs * (kDocLen - 1);
    auto r = model->forward_backward(in, *ex, 1.0 / count);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->count, count);
    const double norm = clip_grad_norm(model->grads(), 1.0);
    ASSERT_TRUE(std::isfinite(norm));
    ASSERT_TRUE(opt->step(model->params(), model->grads(), sched.at(step)).ok());
    const double reported = r->report_sum / r->report_weight;
    if (step < 10) first += reported / 10;
    if (step >= sched.total_steps - 10) last += reported / 10;
  }
  // Uniform guessing is ln 16 = 2.77; copying brings the predictable targets near 0. Over
  // seeds 1-3 (model and data) this setting ends at 0.15-0.21 (0.20-0.28 with min_lr 2e-4),
  // so 0.6 leaves a wide margin; the drop happens between steps 100 and 300.
  EXPECT_GT(first, 2.0);
  EXPECT_LT(last, 0.6) << "first " << first;
}

}  // namespace
}  // namespace distca::model
