// The baselines (colocated, wlb, percp:C): every plan valid on random batches (both layouts),
// every pair computed once (brute force), and each baseline's own structure checked against
// hand arithmetic.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "distca/plan/plan.h"
#include "distca/plan/plan_json.h"
#include "distca/plan/validate.h"
#include "plan_test_util.h"

namespace distca {
namespace {

using test::TestLayout;

ScheduleOptions opts() {
  ScheduleOptions o;
  o.model = test::test_model();
  return o;
}

Plan plan_with(const Batch& b, const SchedulerSpec& spec, const ScheduleOptions& o = opts()) {
  Result<Schedule> s = spec.kind == SchedulerKind::kColocated ? schedule_colocated(b, o)
                       : spec.kind == SchedulerKind::kWlb     ? schedule_wlb(b, o)
                                                              : schedule_percp(b, spec.cp_degree, o);
  DISTCA_CHECK_MSG(s.ok(), s.status().to_string());
  auto p = build_plan(*s, b, spec, o);
  DISTCA_CHECK_MSG(p.ok(), p.status().to_string());
  return std::move(p).value();
}

SchedulerSpec colocated() { return {SchedulerKind::kColocated, 1}; }
SchedulerSpec wlb() { return {SchedulerKind::kWlb, 1}; }
SchedulerSpec percp(int64_t c) { return {SchedulerKind::kPerCp, c}; }

void expect_pairs_once(const Plan& plan) {
  auto counts = brute_force_pair_counts(plan);
  ASSERT_TRUE(counts.ok()) << counts.status().to_string();
  for (const auto& [doc, c] : *counts) {
    int64_t L = 0;
    while (L * L < static_cast<int64_t>(c.size())) ++L;
    for (int64_t q = 0; q < L; ++q)
      for (int64_t k = 0; k < L; ++k) ASSERT_EQ(c[static_cast<size_t>(q * L + k)], k <= q ? 1 : 0) << doc;
  }
}

TEST(Baselines, ValidOnThousandsOfRandomBatches) {
  const PairsCostModel pairs;
  int64_t plans = 0;
  for (uint64_t seed = 0; seed < 1200; ++seed) {
    const Batch b = test::random_batch(seed + 5000, seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous);
    ScheduleOptions o = opts();
    if (seed % 3 == 0) o.cost = &pairs;
    if (seed % 4 == 0) o.wlb_mem_cap = 1.0;
    std::vector<SchedulerSpec> specs{colocated(), wlb()};
    for (int64_t c = 1; c <= b.ranks; ++c) if (b.ranks % c == 0) specs.push_back(percp(c));
    for (const SchedulerSpec& spec : specs) {
      const Plan plan = plan_with(b, spec, o);
      const Status st = validate_plan(plan, b, o.cost);
      ASSERT_TRUE(st.ok()) << "seed " << seed << " " << spec.name() << ": " << st.to_string();
      if (seed % 10 == 0) expect_pairs_once(plan);
      ++plans;
    }
  }
  EXPECT_GT(plans, 3000);
}

TEST(Baselines, ColocatedIsOneTaskPerPieceAtHome) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const Batch b = test::random_batch(seed, TestLayout::kScattered);
    const Plan plan = plan_with(b, colocated());
    int64_t pieces = 0;
    for (const auto& r : b.per_rank) pieces += static_cast<int64_t>(r.size());
    EXPECT_EQ(plan.num_tasks(), pieces);
    for (size_t s = 0; s < plan.servers.size(); ++s)
      for (const auto& t : plan.servers[s].tasks) EXPECT_EQ(t.task.home, t.task.server);
    EXPECT_EQ(plan.metrics.loads, plan.metrics.loads_before);
    EXPECT_EQ(plan.metrics.traffic.bytes.q, 0);
    EXPECT_EQ(plan.metrics.traffic.bytes.o_lse, 0);
  }
}

TEST(Baselines, ColocatedContiguousMovesOnlyEarlierContext) {
  // Doc 1 of 10 rows: [0, 6) on rank 0, [6, 10) on rank 1. Rank 1's piece needs rows 0..5.
  const Batch b{2, 6, {{{1, 0, 6, 10}}, {{1, 6, 4, 10}, {2, 0, 2, 2}}}};
  const Plan plan = plan_with(b, colocated());
  const RowBytes rb = row_bytes(test::test_model(), 2);
  EXPECT_EQ(plan.metrics.comm_bytes_total, 6 * rb.kv);
  EXPECT_EQ(plan.metrics.comm_bytes_backward, 6 * rb.kv);
  EXPECT_EQ(plan.metrics.comm_bytes_max_rank, 6 * rb.kv);
  EXPECT_EQ(plan.metrics.loads, (std::vector<double>{21, 55 - 21 + 3}));
}

TEST(Baselines, WlbEvensOutSkewedPacking) {
  // Contiguous packing of 4 docs of 32 then 8 docs of 16 over 4 ranks of 64: the long docs
  // clump on ranks 0-1 (1056 pairs each vs 544). WLB places one long doc per rank, then two
  // short ones each: 528 + 2 * 136 = 800 everywhere.
  Batch b{4, 64, {{}, {}, {}, {}}};
  int64_t id = 0;
  for (int r = 0; r < 2; ++r) for (int i = 0; i < 2; ++i) b.per_rank[static_cast<size_t>(r)].push_back({id++, 0, 32, 32});
  for (int r = 2; r < 4; ++r) for (int i = 0; i < 4; ++i) b.per_rank[static_cast<size_t>(r)].push_back({id++, 0, 16, 16});
  const Plan before = plan_with(b, colocated());
  const Plan after = plan_with(b, wlb());
  ASSERT_TRUE(validate_plan(after, b, nullptr).ok());
  EXPECT_DOUBLE_EQ(before.metrics.load_max_over_mean, 1056.0 / 800.0);
  EXPECT_EQ(after.metrics.loads, (std::vector<double>{800, 800, 800, 800}));
  EXPECT_DOUBLE_EQ(after.metrics.load_max_over_mean, 1.0);
  EXPECT_GE(before.metrics.load_max_over_mean, after.metrics.load_max_over_mean);
  EXPECT_EQ(after.metrics.comm_bytes_total, 0);  // whole documents: nothing moves
}

TEST(Baselines, WlbRespectsTheTokenCap) {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const Batch b = test::random_batch(seed + 77, TestLayout::kContiguous);
    for (double cap : {1.0, 1.2, 2.0}) {
      ScheduleOptions o = opts();
      o.wlb_mem_cap = cap;
      const Plan plan = plan_with(b, wlb(), o);
      int64_t total = 0;
      for (int64_t r = 0; r < b.ranks; ++r) total += b.rank_tokens(r);
      const int64_t limit = std::max((total + b.ranks - 1) / b.ranks,
                                     static_cast<int64_t>(cap * static_cast<double>(total) / static_cast<double>(b.ranks)));
      for (int64_t r = 0; r < b.ranks; ++r) ASSERT_LE(plan.batch.rank_tokens(r), limit) << "seed " << seed;
      ASSERT_LE(plan.metrics.tokens_max_over_mean,
                static_cast<double>(limit) / (static_cast<double>(total) / static_cast<double>(b.ranks)) + 1e-12);
    }
  }
}

TEST(Baselines, WlbSplitsADocumentLargerThanTheCap) {
  // 20 tokens over 2 ranks of 10, cap 1.2: 12 tokens per rank; the document is cut [0, 12)
  // on rank 0 and [12, 20) on rank 1, which then needs 12 rows of K/V from rank 0.
  const Batch b{2, 10, {{{9, 0, 10, 20}}, {{9, 10, 10, 20}}}};
  const Plan plan = plan_with(b, wlb());
  ASSERT_TRUE(validate_plan(plan, b, nullptr).ok());
  EXPECT_EQ(plan.batch.per_rank[0], (std::vector<Piece>{{9, 0, 12, 20}}));
  EXPECT_EQ(plan.batch.per_rank[1], (std::vector<Piece>{{9, 12, 8, 20}}));
  EXPECT_EQ(plan.batch.tokens_per_rank, 12);
  EXPECT_EQ(plan.metrics.traffic.bytes.kv, 12 * row_bytes(test::test_model(), 2).kv);
  EXPECT_DOUBLE_EQ(plan.metrics.tokens_max_over_mean, 1.2);
}

TEST(Baselines, PerCpHeadTailStructure) {
  // 4 ranks, C = 2, 16 tokens per rank: docs of 8 (divisible by 2C = 4), packed contiguously.
  Batch b{4, 16, {{}, {}, {}, {}}};
  for (int64_t r = 0; r < 4; ++r) {
    b.per_rank[static_cast<size_t>(r)].push_back({2 * r, 0, 8, 8});
    b.per_rank[static_cast<size_t>(r)].push_back({2 * r + 1, 0, 8, 8});
  }
  const Plan plan = plan_with(b, percp(2));
  ASSERT_TRUE(validate_plan(plan, b, nullptr).ok());
  // 2C = 4 chunks of 2 rows per document; chunk k on rank g*C + min(k, 2C-1-k).
  std::map<int64_t, std::vector<TaskPlacement>> by_doc;
  for (const auto& s : plan.servers) for (const auto& t : s.tasks) by_doc[t.task.doc].push_back(t.task);
  for (auto& [doc, tasks] : by_doc) {
    ASSERT_EQ(tasks.size(), 4u);
    std::sort(tasks.begin(), tasks.end(), [](auto& a, auto& c) { return a.q_begin < c.q_begin; });
    const int64_t g = (doc / 2) / 2;
    for (int64_t k = 0; k < 4; ++k) {
      EXPECT_EQ(tasks[static_cast<size_t>(k)].q_begin, 2 * k);
      EXPECT_EQ(tasks[static_cast<size_t>(k)].q_end, 2 * k + 2);
      EXPECT_EQ(tasks[static_cast<size_t>(k)].server, g * 2 + std::min<int64_t>(k, 3 - k));
    }
  }
  // Equal docs: equal work on every rank of a group (chunks 0+3 vs 1+2: 3+15 = 7+11 = 18
  // pairs per document, 4 documents per group).
  EXPECT_EQ(plan.metrics.loads, (std::vector<double>{72, 72, 72, 72}));
  // All-gather: every rank receives the other rank's 16 tokens of its group's documents.
  const RowBytes rb = row_bytes(test::test_model(), 2);
  EXPECT_EQ(plan.metrics.allgather.bytes, 4 * 16 * rb.kv);
  // Reported: what CP moves, the all-gather (forward) and the reduce-scatter (backward); the
  // busiest rank sends its 16 rows to its partner and receives the partner's 16.
  EXPECT_EQ(plan.metrics.comm_bytes_total, plan.metrics.allgather.bytes);
  EXPECT_EQ(plan.metrics.comm_bytes_backward, plan.metrics.allgather.bytes);
  EXPECT_EQ(plan.metrics.comm_bytes_max_rank, 2 * 16 * rb.kv);
  EXPECT_LE(plan.metrics.traffic.bytes.kv, plan.metrics.allgather.bytes);
}

TEST(Baselines, PerCpDocumentAcrossGroupsIsServedByBoth) {
  // 4 ranks of 8, C = 2. Doc 1 (16 rows) sits on ranks 1 and 2, across groups {0,1} and
  // {2,3}: all four ranks serve it, 8 chunks of 2 rows, rank i gets chunks i and 7-i.
  const Batch b{4, 8, {{{0, 0, 8, 8}}, {{1, 0, 8, 16}}, {{1, 8, 8, 16}}, {{2, 0, 8, 8}}}};
  const Plan plan = plan_with(b, percp(2));
  ASSERT_TRUE(validate_plan(plan, b, nullptr).ok());
  std::vector<TaskPlacement> doc1;
  for (const auto& s : plan.servers) for (const auto& t : s.tasks) if (t.task.doc == 1) doc1.push_back(t.task);
  std::sort(doc1.begin(), doc1.end(), [](auto& a, auto& c) { return a.q_begin < c.q_begin; });
  ASSERT_EQ(doc1.size(), 8u);
  for (int64_t k = 0; k < 8; ++k) {
    EXPECT_EQ(doc1[static_cast<size_t>(k)].q_begin, 2 * k);
    EXPECT_EQ(doc1[static_cast<size_t>(k)].server, std::min<int64_t>(k, 7 - k));
    EXPECT_EQ(doc1[static_cast<size_t>(k)].home, k < 4 ? 1 : 2);
  }
  // All-gather: docs 0 and 2 (one group each, 8 rows to the partner), doc 1: each of the
  // four ranks receives the 8 or 16 rows it does not hold (16 + 8 + 8 + 16).
  const RowBytes rb = row_bytes(test::test_model(), 2);
  EXPECT_EQ(plan.metrics.allgather.bytes, (8 + 8 + 16 + 8 + 8 + 16) * rb.kv);
}

TEST(Baselines, PerCpAllGatherIsCMinusOneTimesTheTokens) {
  // When no document crosses a group, each group's all-gather moves (C-1) * group tokens rows.
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Rng rng(seed, 3);
    const int64_t C = 1 + static_cast<int64_t>(rng.uniform_int(4));
    const int64_t groups = 1 + static_cast<int64_t>(rng.uniform_int(3));
    const int64_t T = test::pick(rng, 3, 20);
    Batch b{C * groups, T, std::vector<std::vector<Piece>>(static_cast<size_t>(C * groups))};
    int64_t id = 0, total = 0;
    for (int64_t g = 0; g < groups; ++g) {
      int64_t rank = g * C, room = T;
      for (int64_t left = C * T - test::pick(rng, 0, T); left > 0;) {
        const int64_t L = std::min(left, test::pick(rng, 1, 2 * T));
        for (int64_t pos = 0; pos < L;) {
          if (room == 0) { ++rank; room = T; }
          const int64_t take = std::min(room, L - pos);
          b.per_rank[static_cast<size_t>(rank)].push_back({id, pos, take, L});
          room -= take;
          pos += take;
        }
        ++id;
        left -= L;
        total += L;
      }
    }
    ASSERT_TRUE(b.validate().ok()) << b.validate().to_string();
    const Plan plan = plan_with(b, percp(C));
    ASSERT_TRUE(validate_plan(plan, b, nullptr).ok());
    EXPECT_EQ(plan.metrics.allgather.bytes, (C - 1) * total * row_bytes(test::test_model(), 2).kv) << seed;
  }
}

// The memory estimate's task count equals the tasks schedule_percp really makes.
TEST(Baselines, PerCpTaskCountMatchesTheSchedule) {
  for (uint64_t seed = 0; seed < 400; ++seed) {
    const Batch b = test::random_batch(seed + 300, seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous);
    for (int64_t c = 1; c <= b.ranks; ++c) {
      if (b.ranks % c != 0) continue;
      auto s = schedule_percp(b, c, ScheduleOptions{});
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      ASSERT_EQ(percp_task_count(b, c), static_cast<int64_t>(s->tasks.size())) << "seed " << seed << " C " << c;
    }
  }
}

TEST(Baselines, DeterministicJson) {
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const Batch b = test::random_batch(seed, seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous);
    for (const SchedulerSpec& spec : {colocated(), wlb(), percp(b.ranks)}) {
      const std::string a = plan_to_json(plan_with(b, spec)).dump();
      const std::string c = plan_to_json(plan_with(b, spec)).dump();
      ASSERT_EQ(a, c);
    }
  }
}

TEST(Baselines, SummaryOfBatches) {
  std::vector<nlohmann::json> s;
  for (uint64_t seed = 0; seed < 3; ++seed) {
    const Batch b = test::random_batch(seed, TestLayout::kContiguous);
    s.push_back(plan_summary_json(plan_with(b, colocated()), 0.001 * static_cast<double>(seed + 1)));
  }
  const nlohmann::json m = summarize_batches(s);
  std::vector<double> bytes, loads;
  for (const auto& x : s) {
    bytes.push_back(x["comm_bytes_total"].get<double>());
    loads.push_back(x["load_max_over_mean"].get<double>());
  }
  std::sort(bytes.begin(), bytes.end());
  EXPECT_EQ(m["comm_bytes_total"].get<double>(), bytes[1]);
  EXPECT_EQ(m["load_max_over_mean"].get<double>(), *std::max_element(loads.begin(), loads.end()));
  EXPECT_DOUBLE_EQ(m["plan_seconds"].get<double>(), 0.002);
  EXPECT_EQ(m["per_batch"].size(), 3u);
}

}  // namespace
}  // namespace distca
