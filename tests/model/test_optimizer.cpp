// AdamW against a hand-written scalar reference, clipping, and the learning-rate schedule.
#include "distca/model/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "distca/core/rng.h"
#include "model_test_util.h"

namespace distca::model {
namespace {

// One parameter's AdamW (PyTorch formulation), in double.
struct ScalarAdamW {
  double p, m = 0, v = 0;
  void step(double g, int t, double lr, double b1, double b2, double eps, double wd) {
    p -= lr * wd * p;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double mh = m / (1 - std::pow(b1, t));
    const double vh = v / (1 - std::pow(b2, t));
    p -= lr * mh / (std::sqrt(vh) + eps);
  }
};

TEST(AdamW, MatchesScalarReferenceWithDecayGroups) {
  const int64_t n = 10;
  // Elements 0..3 decay, 4..5 do not, 6..9 decay.
  std::vector<ParamGroup> groups = {{0, 4, true}, {4, 2, false}, {6, 4, true}};
  AdamWConfig cfg;
  cfg.beta1 = 0.8;
  cfg.beta2 = 0.9;
  cfg.eps = 1e-6;
  cfg.weight_decay = 0.3;
  auto opt = AdamW::create(n, groups, cfg);
  ASSERT_TRUE(opt.ok()) << opt.status().to_string();
  Rng rng(1);
  std::vector<float> params(n), grads(n);
  std::vector<ScalarAdamW> ref;
  for (auto& p : params) {
    p = static_cast<float>(rng.normal());
    ref.push_back({p});
  }
  const double lrs[] = {0.1, 0.05, 0.02, 0.2, 0.01};
  for (int t = 1; t <= 5; ++t) {
    for (int64_t i = 0; i < n; ++i) {
      grads[i] = static_cast<float>(rng.normal());
      const bool decay = i < 4 || i >= 6;
      ref[i].step(grads[i], t, lrs[t - 1], cfg.beta1, cfg.beta2, cfg.eps,
                  decay ? cfg.weight_decay : 0.0);
    }
    ASSERT_TRUE(opt->step(params, grads, lrs[t - 1]).ok());
    EXPECT_EQ(opt->step_count(), t);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(params[i], ref[i].p, 1e-6) << "step " << t << " elem " << i;
      EXPECT_NEAR(opt->m()[i], ref[i].m, 1e-6);
      EXPECT_NEAR(opt->v()[i], ref[i].v, 1e-6);
    }
  }
}

TEST(AdamW, StateRestoreContinuesTheSameTrajectory) {
  auto a = AdamW::create(3, {{0, 3, true}});
  ASSERT_TRUE(a.ok());
  std::vector<float> p = {1, -2, 3}, g = {0.5f, 0.25f, -1};
  ASSERT_TRUE(a->step(p, g, 0.1).ok());
  auto b = AdamW::create(3, {{0, 3, true}});
  ASSERT_TRUE(b.ok());
  std::copy(a->m().begin(), a->m().end(), b->m().begin());
  std::copy(a->v().begin(), a->v().end(), b->v().begin());
  b->set_step_count(a->step_count());
  std::vector<float> p2 = p;
  ASSERT_TRUE(a->step(p, g, 0.1).ok());
  ASSERT_TRUE(b->step(p2, g, 0.1).ok());
  EXPECT_EQ(p, p2);
}

TEST(AdamW, DecayGroupsFollowTheLayout) {
  const auto layout = param_layout(testing::tiny_spec());
  const auto groups = decay_groups(layout);
  // embedding | attn_norm | wq..wo | ffn_norm | w1..w2 | (layer 1 likewise) | final_norm | head
  ASSERT_EQ(groups.size(), 1u + 4u * 2 + 2);
  EXPECT_TRUE(groups[0].decay);
  EXPECT_FALSE(groups[1].decay);
  EXPECT_EQ(groups[1].size, 32);
  EXPECT_FALSE(groups[groups.size() - 2].decay);
  EXPECT_TRUE(groups.back().decay);
  EXPECT_TRUE(AdamW::create(param_count(testing::tiny_spec()), groups).ok());
}

TEST(AdamW, RefusesBadConfiguration) {
  EXPECT_FALSE(AdamW::create(4, {{0, 3, true}}).ok());                 // gap at the end
  EXPECT_FALSE(AdamW::create(4, {{0, 2, true}, {3, 1, false}}).ok());  // hole
  AdamWConfig bad;
  bad.beta2 = 1.0;
  EXPECT_FALSE(AdamW::create(1, {{0, 1, true}}, bad).ok());
  auto ok = AdamW::create(2, {{0, 2, false}});
  ASSERT_TRUE(ok.ok());
  std::vector<float> p(3), g(2);
  EXPECT_FALSE(ok->step(p, g, 0.1).ok());
  p.resize(2);
  EXPECT_FALSE(ok->step(p, g, -1.0).ok());
  EXPECT_EQ(ok->step_count(), 0);  // refused steps do not count
}

TEST(Clipping, ScalesToMaxNormOnlyWhenAbove) {
  std::vector<float> g = {3, 4};  // norm 5
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 10.0), 5.0);
  EXPECT_EQ(g, (std::vector<float>{3, 4}));
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 1.0), 5.0);
  EXPECT_NEAR(g[0], 0.6f, 1e-7);
  EXPECT_NEAR(g[1], 0.8f, 1e-7);
  EXPECT_NEAR(global_norm(g), 1.0, 1e-7);
  std::vector<float> h = {3, 4};
  EXPECT_DOUBLE_EQ(clip_grad_norm(h, 0.0), 5.0);  // disabled
  EXPECT_EQ(h, (std::vector<float>{3, 4}));
  std::vector<float> bad = {1, NAN};
  EXPECT_TRUE(std::isnan(clip_grad_norm(bad, 1.0)));
  EXPECT_EQ(bad[0], 1.0f);  // untouched
}

TEST(LrSchedule, WarmupThenCosineToFloor) {
  LrSchedule s;
  s.max_lr = 1e-3;
  s.min_lr = 1e-4;
  s.warmup_steps = 10;
  s.total_steps = 110;
  ASSERT_TRUE(s.validate().ok());
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);      // 1/10 of max
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);      // warm-up end
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);     // cosine start
  EXPECT_NEAR(s.at(60), 5.5e-4, 1e-15); // midpoint: (max + min) / 2
  EXPECT_NEAR(s.at(35), 1e-4 + 9e-4 * 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(s.at(110), 1e-4);    // end
  EXPECT_DOUBLE_EQ(s.at(500), 1e-4);
  for (int64_t t = 10; t < 110; ++t) EXPECT_LE(s.at(t + 1), s.at(t));

  LrSchedule bad = s;
  bad.min_lr = 2e-3;
  EXPECT_FALSE(bad.validate().ok());
  bad = s;
  bad.warmup_steps = 200;
  EXPECT_FALSE(bad.validate().ok());
  LrSchedule no_warmup = s;
  no_warmup.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(no_warmup.at(0), 1e-3);
}

}  // namespace
}  // namespace distca::model
