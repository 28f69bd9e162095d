// `--tolerance auto` (plan/auto_tolerance.h): parsing, the choice inside its ladder, the
// prediction against a recount from the plan's own figures, determinism, the link's effect,
// refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "distca/data/workload.h"
#include "distca/plan/auto_tolerance.h"
#include "distca/plan/plan.h"
#include "plan_test_util.h"

namespace distca {
namespace {

// Seconds of a task: a fixed cost per call plus one per causal pair (a stand-in for a table).
class LinearSeconds final : public AttentionCostModel {
 public:
  double task_cost(int64_t q_len, int64_t kv_len) const override {
    return 2e-6 + 1e-10 * static_cast<double>(causal_pairs(kv_len - q_len, kv_len));
  }
  std::string unit() const override { return "seconds"; }
};

AutoToleranceModel model(const AttentionCostModel* seconds, double rate, bool overlap = true) {
  AutoToleranceModel m;
  m.seconds = seconds;
  m.inter_host_bytes_per_second = rate;
  m.intra_host_bytes_per_second = rate * 8;
  m.overlap = overlap;
  return m;
}

std::vector<Batch> batches(const char* dist, uint64_t seed) { return test::drawn_batches(dist, 4, 32768, 3, seed); }

ScheduleOptions opts() {
  ScheduleOptions o;
  o.model = test::test_model();
  return o;
}

TEST(AutoTolerance, Parse) {
  EXPECT_FALSE(parse_tolerance("auto")->has_value());
  EXPECT_EQ(parse_tolerance("0.15")->value(), 0.15);
  EXPECT_EQ(parse_tolerance("0")->value(), 0.0);
  EXPECT_EQ(parse_tolerance("1")->value(), 1.0);
  for (const char* bad : {"", "Auto", "x", "0.1x"}) {
    auto t = parse_tolerance(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().message().find("--tolerance must be auto or a number in [0, 1]"), std::string::npos);
  }
  for (const char* bad : {"1.5", "-0.1", "nan", "inf"}) {
    auto t = parse_tolerance(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().message().find("--tolerance must be in [0, 1] (got "), std::string::npos);
  }
}

// The prediction recounted from the plan's reported figures (per-rank bytes sent and
// received, server loads under the seconds model), the choice the default band unless the
// lowest prediction of the ladder (ties: tighter) beats it by the margin, the same bits on a
// second call.
TEST(AutoTolerance, ChoiceIsTheLowestPredictionAndDeterministic) {
  const LinearSeconds seconds;
  for (const char* dist : {"prolong", "pretrain"}) {
    for (const Batch& b : batches(dist, 3)) {
      for (const double rate : {1e8, 1e10}) {
        for (const bool overlap : {true, false}) {
          const AutoToleranceModel m = model(&seconds, rate, overlap);
          auto c = choose_tolerance(b, SchedulerSpec{}, opts(), m);
          ASSERT_TRUE(c.ok()) << c.status().to_string();
          ASSERT_EQ(c->predicted.size(), std::size(kAutoTolerances));
          size_t best = 0;
          for (size_t i = 0; i < c->predicted.size(); ++i) {
            ScheduleOptions o = opts();
            o.tolerance = kAutoTolerances[i];
            auto plan = make_plan(b, SchedulerSpec{}, o);
            ASSERT_TRUE(plan.ok());
            const std::vector<double> loads = server_loads(b.ranks, [&] {
              std::vector<TaskPlacement> t;
              for (const ServerPlan& sp : plan->servers) {
                for (const ServerTask& st : sp.tasks) t.push_back(st.task);
              }
              return t;
            }(), &seconds);
            double want = 0;
            for (int64_t r = 0; r < b.ranks; ++r) {
              const RankBytes& rb = plan->metrics.traffic.per_rank[static_cast<size_t>(r)];
              const double comm = static_cast<double>(std::max(rb.fwd_sent + rb.bwd_sent, rb.fwd_recv + rb.bwd_recv)) / rate;
              const double c_r = loads[static_cast<size_t>(r)];
              want = std::max(want, overlap ? std::max(c_r, comm) : c_r + comm);
            }
            EXPECT_NEAR(c->predicted[i], want, 1e-12 * want) << dist << " tolerance " << kAutoTolerances[i];
            if (c->predicted[i] < c->predicted[best]) best = i;
          }
          const size_t dflt = 2;  // 0.05
          ASSERT_EQ(kAutoTolerances[dflt], 0.05);
          if (!(c->predicted[best] < (1 - kAutoToleranceMargin) * c->predicted[dflt])) best = dflt;
          EXPECT_EQ(c->tolerance, kAutoTolerances[best]);
          EXPECT_EQ(c->predicted_seconds, c->predicted[best]);
          auto again = choose_tolerance(b, SchedulerSpec{}, opts(), m);
          ASSERT_TRUE(again.ok());
          EXPECT_EQ(std::memcmp(&again->tolerance, &c->tolerance, sizeof(double)), 0);
          EXPECT_EQ(again->predicted, c->predicted);
        }
      }
    }
  }
}

// A slow link makes bytes dear: the choice is never a tighter band than on a fast link, and
// on some batch a wider one.
TEST(AutoTolerance, SlowLinkWidensTheBand) {
  const LinearSeconds seconds;
  int wider = 0;
  for (const char* dist : {"prolong", "pretrain"}) {
    for (const Batch& b : batches(dist, 11)) {
      auto fast = choose_tolerance(b, SchedulerSpec{}, opts(), model(&seconds, 1e12));
      auto slow = choose_tolerance(b, SchedulerSpec{}, opts(), model(&seconds, 1e7));
      ASSERT_TRUE(fast.ok() && slow.ok());
      EXPECT_GE(slow->tolerance, fast->tolerance) << dist;
      wider += slow->tolerance > fast->tolerance;
    }
  }
  EXPECT_GT(wider, 0);
}

TEST(AutoTolerance, Refusals) {
  const LinearSeconds seconds;
  const Batch b = batches("prolong", 1).front();
  for (const char* name : {"colocated", "wlb", "percp:2"}) {
    auto c = choose_tolerance(b, *parse_scheduler(name), opts(), model(&seconds, 1e9));
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("needs --scheduler cad or cad-symmetric"), std::string::npos);
  }
  const PairsCostModel pairs;
  EXPECT_FALSE(choose_tolerance(b, SchedulerSpec{}, opts(), model(&pairs, 1e9)).ok());
  EXPECT_FALSE(choose_tolerance(b, SchedulerSpec{}, opts(), model(&seconds, 0)).ok());
  EXPECT_FALSE(choose_tolerance(b, SchedulerSpec{}, opts(), model(nullptr, 1e9)).ok());
  HardwareProfile one_rank;  // no link figures
  std::unique_ptr<AttentionCostModel> table;
  auto m = auto_tolerance_model(one_rank, {}, true, &table);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("link figures"), std::string::npos);
}

}  // namespace
}  // namespace distca
