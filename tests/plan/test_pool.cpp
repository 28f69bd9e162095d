// Pooled batches of pipeline stages (plan/pool.h): pooling invariants against an independent
// placement rule, plans of pooled batches through the pooled validator, corrupted homes
// caught, the backward load weight, refusals, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "distca/core/rng.h"
#include "distca/cost/analytic.h"
#include "distca/data/workload.h"
#include "distca/plan/cad.h"
#include "distca/plan/plan.h"
#include "distca/plan/pool.h"
#include "distca/plan/validate.h"
#include "plan_test_util.h"

namespace distca {
namespace {

using test::pick;

// A micro-batch of dp ranks: random document lengths packed in order (ids 0, 1, ...), then
// relabelled with sparse ids so the pool's id rule is exercised beyond 0..n-1.
Batch member_batch(uint64_t seed, int64_t dp, int64_t tokens_per_rank) {
  Rng rng(seed, 3);
  std::vector<int64_t> lens;
  for (int64_t used = 0; used < dp * tokens_per_rank;) {
    const int64_t len = pick(rng, 16, tokens_per_rank * 3 / 4);
    lens.push_back(len);
    used += len;
  }
  Batch b = pack_documents(lens, dp, tokens_per_rank, rng.bernoulli(0.5) ? Layout::kHeadTail : Layout::kContiguous);
  for (auto& rank : b.per_rank) {
    for (Piece& p : rank) p.doc = 5 * p.doc + 7;
  }
  return b;
}

struct Case {
  int64_t pp = 1, dp = 1;
  std::vector<Batch> batches;  // one per member
  std::vector<PoolMember> members;
};

// Members on a random non-empty subset of the pp stages, in a random order, with random
// directions and micro-batch indices.
Case random_case(uint64_t seed, int64_t pp, int64_t dp, int64_t tokens_per_rank = 2048) {
  Rng rng(seed, 5);
  Case c;
  c.pp = pp;
  c.dp = dp;
  std::vector<int64_t> stages;
  for (int64_t s = 0; s < pp; ++s) {
    if (rng.bernoulli(0.6)) stages.push_back(s);
  }
  if (stages.empty()) stages.push_back(pick(rng, 0, pp - 1));
  for (size_t i = stages.size(); i > 1; --i) std::swap(stages[i - 1], stages[rng.uniform_int(i)]);
  c.batches.reserve(stages.size());
  for (size_t i = 0; i < stages.size(); ++i) c.batches.push_back(member_batch(seed * 31 + i, dp, tokens_per_rank));
  for (size_t i = 0; i < stages.size(); ++i) {
    c.members.push_back({stages[i], pick(rng, 0, 9), rng.bernoulli(0.5), &c.batches[i]});
  }
  return c;
}

ScheduleOptions opts(const PooledBatch& pooled, double tol = 0.05) {
  ScheduleOptions o;
  o.model = test::test_model();
  o.tolerance = tol;
  o.doc_weights = pooled.doc_weights();
  return o;
}

TEST(Pool, InvariantsAgainstThePlacementRule) {
  for (int64_t pp = 1; pp <= 4; ++pp) {
    for (int64_t dp = 1; dp <= 2; ++dp) {
      for (uint64_t seed = 1; seed <= 6; ++seed) {
        const Case c = random_case(seed * 100 + static_cast<uint64_t>(pp * 10 + dp), pp, dp);
        {
          SCOPED_TRACE("pp " + std::to_string(pp) + " dp " + std::to_string(dp) + " seed " + std::to_string(seed));
          auto pooled = pool_batches(c.members, pp, dp);
          ASSERT_TRUE(pooled.ok()) << pooled.status().to_string();
          const Batch& b = pooled->batch;
          ASSERT_TRUE(b.validate().ok()) << b.validate().to_string();
          std::vector<bool> active(static_cast<size_t>(pp), false);
          int64_t tpr = 1;
          for (const PoolMember& m : c.members) {
            active[static_cast<size_t>(m.stage)] = true;
            tpr = std::max(tpr, m.batch->tokens_per_rank);
          }
          EXPECT_EQ(b.tokens_per_rank, tpr);
          // The rule: pooled rank = global rank = stage * dp + replica, over every rank.
          auto expected_rank = [&](int64_t stage, int64_t r) { return stage * dp + r; };
          ASSERT_EQ(b.ranks, pp * dp);
          std::vector<bool> seen(static_cast<size_t>(b.ranks), false);
          for (size_t i = 0; i < c.members.size(); ++i) {
            const PoolMember& m = c.members[i];
            for (int64_t r = 0; r < dp; ++r) {
              const int64_t pr = expected_rank(m.stage, r);
              EXPECT_EQ(pooled->rank_of(m.stage, r), pr);
              EXPECT_EQ(pooled->stage_of_rank(pr), m.stage);
              seen[static_cast<size_t>(pr)] = true;
              const auto& got = b.per_rank[static_cast<size_t>(pr)];
              const auto& want = m.batch->per_rank[static_cast<size_t>(r)];
              ASSERT_EQ(got.size(), want.size());
              for (size_t k = 0; k < got.size(); ++k) {
                EXPECT_EQ(got[k].offset, want[k].offset);
                EXPECT_EQ(got[k].len, want[k].len);
                EXPECT_EQ(got[k].doc_len, want[k].doc_len);
                EXPECT_EQ(got[k].doc, want[k].doc * pp + m.stage);
                const PoolOrigin o = pooled->origin(got[k].doc);
                EXPECT_EQ(o.member, static_cast<int64_t>(i));
                EXPECT_EQ(o.stage, m.stage);
                EXPECT_EQ(o.microbatch, m.microbatch);
                EXPECT_EQ(o.backward, m.backward);
                EXPECT_EQ(o.doc, want[k].doc);
              }
            }
          }
          for (int64_t r = 0; r < b.ranks; ++r) {
            if (!seen[static_cast<size_t>(r)]) {
              EXPECT_TRUE(b.per_rank[static_cast<size_t>(r)].empty()) << "rank " << r;
            }
          }
          // Idle stages' ranks: in the pool, empty.
          for (int64_t s = 0; s < pp; ++s) {
            if (active[static_cast<size_t>(s)]) continue;
            EXPECT_EQ(pooled->origin(s).member, -1);
            for (int64_t r = 0; r < dp; ++r) EXPECT_EQ(pooled->rank_of(s, r), s * dp + r);
          }
        }
      }
    }
  }
}

TEST(Pool, PlansOfPooledBatchesValidate) {
  const SchedulerSpec specs[] = {{SchedulerKind::kCad, 1}, {SchedulerKind::kCadSymmetric, 1},
                                 {SchedulerKind::kColocated, 1}};
  int64_t moved = 0;
  for (int64_t pp = 1; pp <= 4; ++pp) {
    for (int64_t dp = 1; dp <= 2; ++dp) {
      for (uint64_t seed = 1; seed <= 4; ++seed) {
        const Case c = random_case(seed * 7 + static_cast<uint64_t>(pp * 10 + dp), pp, dp);
        {
          auto pooled = pool_batches(c.members, pp, dp);
          ASSERT_TRUE(pooled.ok()) << pooled.status().to_string();
          for (const SchedulerSpec& spec : specs) {
            SCOPED_TRACE(spec.name() + " pp " + std::to_string(pp) + " dp " + std::to_string(dp) + " seed " +
                         std::to_string(seed));
            const ScheduleOptions o = opts(*pooled);
            auto plan = make_plan(pooled->batch, spec, o);
            ASSERT_TRUE(plan.ok()) << plan.status().to_string();
            const Status v = validate_pooled_plan(*plan, *pooled, nullptr);
            EXPECT_TRUE(v.ok()) << v.to_string();
            for (const ServerPlan& sp : plan->servers) {
              for (const ServerTask& t : sp.tasks) moved += t.task.home != t.task.server ? 1 : 0;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(moved, 0);  // the plans do move attention across stages, not only colocate it
}

// A valid plan over 3 stages of which stage 1 is idle; then homes moved.
TEST(Pool, MovedHomesAreCaught) {
  const int64_t pp = 3, dp = 2;
  const Batch b0 = member_batch(11, dp, 2048), b2 = member_batch(12, dp, 2048);
  const PoolMember members[] = {{0, 0, false, &b0}, {2, 1, true, &b2}};
  auto pooled = pool_batches(members, pp, dp);
  ASSERT_TRUE(pooled.ok());
  auto plan = make_plan(pooled->batch, {SchedulerKind::kCad, 1}, opts(*pooled));
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  ASSERT_TRUE(validate_pooled_plan(*plan, *pooled, nullptr).ok());
  // A task of stage 0 homed on stage 2, and one homed on the idle stage 1.
  for (const auto& [to_rank, what] : {std::pair<int64_t, std::string>{4, "on stage 2"}, {2, "idle stage 1"}}) {
    Plan bad = *plan;
    bool done = false;
    for (ServerPlan& sp : bad.servers) {
      for (ServerTask& t : sp.tasks) {
        if (!done && t.task.doc % pp == 0) {
          t.task.home = to_rank;
          done = true;
        }
      }
    }
    ASSERT_TRUE(done);
    const Status v = validate_pooled_plan(bad, *pooled, nullptr);
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.to_string().find(what), std::string::npos) << v.to_string();
  }
  // A piece of stage 0 put on an idle rank of the pool: the pool itself is caught.
  PooledBatch bad_pool = *pooled;
  bad_pool.batch.per_rank[2].push_back(bad_pool.batch.per_rank[0].back());
  bad_pool.batch.per_rank[0].pop_back();
  const Status v = validate_pooled_plan(*plan, bad_pool, nullptr);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.to_string().find("rank 2 (stage 1)"), std::string::npos) << v.to_string();
  // A member whose stage disagrees with member_of_stage.
  bad_pool = *pooled;
  bad_pool.members[1].stage = 1;
  EXPECT_FALSE(validate_pooled_plan(*plan, bad_pool, nullptr).ok());
}

// Weighted recount of a schedule: per server, sum of weight(doc) x task pairs.
std::vector<double> weighted_loads(const PooledBatch& pooled, const Schedule& s) {
  std::vector<double> loads(static_cast<size_t>(pooled.batch.ranks), 0.0);
  for (const TaskPlacement& t : s.tasks) {
    const double w = pooled.origin(t).backward ? kAttentionBackwardFactor : 1.0;
    loads[static_cast<size_t>(t.server)] += w * static_cast<double>(causal_pairs(t.q_begin, t.q_end));
  }
  return loads;
}

TEST(Pool, BackwardMembersWeighTheBackwardCost) {
  // The same micro-batch forward on stage 0 and backward on stage 1: equal pairs on both
  // stages, so unweighted the stages stay even; weighted, stage 1 carries 2.5x and must shed
  // work to stage 0.
  const int64_t pp = 2, dp = 2;
  const Batch mb = pack_documents({3000, 1500, 3000, 500, 2000, 2000}, dp, 6000, Layout::kContiguous);
  const PoolMember members[] = {{0, 3, false, &mb}, {1, 0, true, &mb}};
  auto pooled = pool_batches(members, pp, dp);
  ASSERT_TRUE(pooled.ok());
  const std::vector<DocWeight> weights = pooled->doc_weights();
  ASSERT_EQ(weights.size(), 12u);
  for (size_t i = 0; i < weights.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(weights[i - 1].doc, weights[i].doc);
    }
    EXPECT_EQ(weights[i].weight, weights[i].doc % pp == 1 ? kAttentionBackwardFactor : 1.0);
  }
  ScheduleOptions plain = opts(*pooled, 0.05);
  plain.doc_weights.clear();
  auto unweighted = schedule_cad(pooled->batch, plain);
  ASSERT_TRUE(unweighted.ok());
  {
    const std::vector<double> l = weighted_loads(*pooled, *unweighted);
    const double mean = (l[0] + l[1] + l[2] + l[3]) / 4;
    EXPECT_GT(std::max(l[2], l[3]), 1.3 * mean);  // unweighted, the backward stage is the straggler
  }

  CadStats st;
  auto weighted = schedule_cad(pooled->batch, opts(*pooled, 0.05), &st);
  ASSERT_TRUE(weighted.ok()) << weighted.status().to_string();
  const std::vector<double> loads = weighted_loads(*pooled, *weighted);
  double total = 0, mx = 0, mn = loads[0];
  for (double l : loads) {
    total += l;
    mx = std::max(mx, l);
    mn = std::min(mn, l);
  }
  // Pairs are conserved under splitting: the weighted total is the weighted document pairs.
  double want_total = 0;
  for (const auto& rank : pooled->batch.per_rank) {
    for (const Piece& p : rank) {
      const double w = pooled->origin(p.doc).backward ? kAttentionBackwardFactor : 1.0;
      want_total += w * static_cast<double>(causal_pairs(p.offset, p.offset + p.len));
    }
  }
  EXPECT_NEAR(total, want_total, 1e-9 * want_total);
  const double mean = total / static_cast<double>(loads.size());
  EXPECT_NEAR(st.mean, mean, 1e-9 * mean);
  EXPECT_NEAR(st.load_max, mx, 1e-9 * mean);
  EXPECT_NEAR(st.load_min, mn, 1e-9 * mean);
  EXPECT_TRUE(st.balanced);
  EXPECT_LE(mx, 1.05 * mean * (1 + 1e-12));
  int64_t from_backward = 0, to_forward = 0;
  for (const TaskPlacement& t : weighted->tasks) {
    EXPECT_EQ(pooled->stage_of_rank(t.home), t.doc % pp);  // homes never move
    if (t.home != t.server && pooled->stage_of_rank(t.home) == 1 && pooled->stage_of_rank(t.server) == 0) {
      ++from_backward;
    }
    if (t.home != t.server && pooled->stage_of_rank(t.home) == 0 && pooled->stage_of_rank(t.server) == 1) {
      ++to_forward;
    }
  }
  EXPECT_GT(from_backward, 0);
  EXPECT_EQ(to_forward, 0);
  // A pool of one direction needs no weights.
  const PoolMember fwd_only[] = {{0, 0, false, &mb}, {1, 1, false, &mb}};
  const PoolMember bwd_only[] = {{0, 0, true, &mb}, {1, 1, true, &mb}};
  EXPECT_TRUE(pool_batches(fwd_only, pp, dp)->doc_weights().empty());
  EXPECT_TRUE(pool_batches(bwd_only, pp, dp)->doc_weights().empty());
}

// Seconds-like costs (not pairs): short shards cost more per pair, so totals change when
// tasks split; the weighted balance is checked by an independent recount.
class ShardCost final : public AttentionCostModel {
 public:
  double task_cost(int64_t q_len, int64_t kv_len) const override {
    if (q_len == 0) return 0.0;
    return 1e-9 * static_cast<double>(causal_pairs(kv_len - q_len, kv_len)) + 2e-6;
  }
  std::string unit() const override { return "seconds"; }
};

TEST(Pool, BackwardWeightWithACostModel) {
  const int64_t pp = 4, dp = 1;
  const Batch mb = pack_documents({5000, 1000, 2000}, dp, 8000, Layout::kContiguous);
  const PoolMember members[] = {{0, 3, true, &mb}, {2, 1, false, &mb}};
  auto pooled = pool_batches(members, pp, dp);
  ASSERT_TRUE(pooled.ok());
  const ShardCost cost;
  ScheduleOptions o = opts(*pooled, 0.05);
  o.cost = &cost;
  CadStats st;
  auto s = schedule_cad(pooled->batch, o, &st);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  std::vector<double> loads(4, 0.0);
  for (const TaskPlacement& t : s->tasks) {
    const double w = pooled->origin(t).backward ? kAttentionBackwardFactor : 1.0;
    loads[static_cast<size_t>(t.server)] += w * cost.task_cost(t.q_end - t.q_begin, t.q_end);
  }
  const double mean = (loads[0] + loads[1] + loads[2] + loads[3]) / 4;
  EXPECT_NEAR(st.mean, mean, 1e-9 * mean);
  EXPECT_TRUE(st.balanced);
  for (double l : loads) EXPECT_LE(l, 1.05 * mean * (1 + 1e-9));
  // The idle stages 1 and 3 serve.
  EXPECT_GT(loads[1], 0);
  EXPECT_GT(loads[3], 0);
  auto plan = make_plan(pooled->batch, {SchedulerKind::kCad, 1}, o);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_TRUE(validate_pooled_plan(*plan, *pooled, &cost).ok());
}

TEST(Pool, Deterministic) {
  const Case c = random_case(77, 4, 2, 4096);
  auto a = pool_batches(c.members, 4, 2);
  auto b = pool_batches(c.members, 4, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->batch, b->batch);
  EXPECT_EQ(a->doc_weights(), b->doc_weights());
  auto pa = schedule_cad(a->batch, opts(*a));
  auto pb = schedule_cad(b->batch, opts(*b));
  ASSERT_TRUE(pa.ok() && pb.ok());
  EXPECT_EQ(pa->tasks, pb->tasks);
}

TEST(Pool, Refusals) {
  const Batch two = member_batch(1, 2, 1024), one = member_batch(2, 1, 1024);
  Batch negative = two;
  negative.per_rank[0][0].doc = -1;
  struct Bad {
    std::vector<PoolMember> members;
    int64_t pp, dp;
    std::string what;
  };
  const Bad cases[] = {
      {{}, 2, 2, "no members"},
      {{{0, 0, false, &two}}, 0, 2, "pp must be"},
      {{{0, 0, false, &two}}, 2, 0, "dp must be"},
      {{{2, 0, false, &two}}, 2, 2, "member 0: stage 2"},
      {{{0, 0, false, &two}, {0, 1, true, &two}}, 2, 2, "member 1: stage 0 already"},
      {{{0, 0, false, nullptr}}, 2, 2, "member 0: no batch"},
      {{{1, 0, false, &two}, {0, 0, false, &one}}, 2, 2, "member 1: batch has 1 ranks"},
      {{{0, 0, false, &negative}}, 2, 2, "member 0"},
  };
  for (const Bad& c : cases) {
    auto r = pool_batches(c.members, c.pp, c.dp);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(r.status().to_string().find(c.what), std::string::npos) << r.status().to_string();
  }
  // Bad weights are refused by the options check and by the planner itself.
  auto pooled = pool_batches(std::vector<PoolMember>{{0, 0, false, &two}}, 1, 2);
  ASSERT_TRUE(pooled.ok());
  for (const std::vector<DocWeight>& w :
       {std::vector<DocWeight>{{7, 1.0}, {7, 2.0}}, {{3, 0.0}}, {{3, std::nan("")}}, {{3, 2 * kMaxDocWeight}}}) {
    ScheduleOptions o = opts(*pooled);
    o.doc_weights = w;
    EXPECT_FALSE(o.validate(pooled->batch, {SchedulerKind::kCad, 1}).ok());
    auto s = schedule_cad(pooled->batch, o);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().to_string().find("doc_weights"), std::string::npos) << s.status().to_string();
  }
}

// pool_tick (the trainer's and the simulator's call) is pool_batches of one member per op, op
// (s, m) holding micro-batch m, over every rank; an op past the micro-batches is refused.
TEST(Pool, PoolTickIsOneMemberPerOpOverEveryRank) {
  const int64_t pp = 3, dp = 2;
  std::vector<Batch> mbs;
  for (uint64_t m = 0; m < 4; ++m) mbs.push_back(member_batch(40 + m, dp, 512));
  const Tick tick{true, {{0, 3, true}, {2, 1, true}}};
  auto got = pool_tick(tick, mbs, pp, dp);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  const std::vector<PoolMember> members = {{0, 3, true, &mbs[3]}, {2, 1, true, &mbs[1]}};
  auto want = pool_batches(members, pp, dp);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(got->batch, want->batch);
  EXPECT_EQ(got->batch.ranks, pp * dp);
  ASSERT_EQ(got->members.size(), 2u);
  EXPECT_EQ(got->members[1].microbatch, 1);
  EXPECT_TRUE(got->members[1].backward);
  const Tick bad{false, {{1, 4, false}}};
  const auto refused = pool_tick(bad, mbs, pp, dp);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "pool: micro-batch 4 of stage 1 is not one of the 4 given");
}

}  // namespace
}  // namespace distca
