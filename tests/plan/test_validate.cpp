// The validator and the byte accounting against independent references: random batches in
// two layouts, random schedules and the baselines; a brute-force pair count of the plan as a
// kernel would run it; a row-by-row byte recount; and corrupted plans that must be refused.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "distca/plan/plan.h"
#include "distca/plan/traffic.h"
#include "distca/plan/validate.h"
#include "plan_test_util.h"

namespace distca {
namespace {

using test::TestLayout;

ScheduleOptions options_for(int64_t dtype_bytes = 2) {
  ScheduleOptions o;
  o.model = test::test_model();
  o.dtype_bytes = dtype_bytes;
  return o;
}

// Every (query, key) pair of every document computed exactly once, as the kernel would run
// the plan (keys and queries identified through the plan's buffers).
void expect_pairs_once(const Plan& plan) {
  auto counts = brute_force_pair_counts(plan);
  ASSERT_TRUE(counts.ok()) << counts.status().to_string();
  for (const auto& [doc, c] : *counts) {
    int64_t L = 0;
    while (L * L < static_cast<int64_t>(c.size())) ++L;
    for (int64_t q = 0; q < L; ++q) {
      for (int64_t k = 0; k < L; ++k) {
        ASSERT_EQ(c[static_cast<size_t>(q * L + k)], k <= q ? 1 : 0) << "doc " << doc << " q " << q << " k " << k;
      }
    }
  }
}

Plan plan_of(const Batch& b, std::vector<TaskPlacement> tasks, SchedulerSpec spec = {},
             const ScheduleOptions& o = options_for()) {
  auto p = build_plan(Schedule{std::move(tasks), b}, b, spec, o);
  DISTCA_CHECK_MSG(p.ok(), p.status().to_string());
  return std::move(p).value();
}

TEST(Validate, RandomSchedulesOnRandomBatches) {
  for (uint64_t seed = 0; seed < 1500; ++seed) {
    const auto layout = seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous;
    const Batch b = test::random_batch(seed, layout);
    ASSERT_TRUE(b.validate().ok()) << b.validate().to_string();
    const auto tasks = test::random_tasks(b, seed);
    const Plan plan = plan_of(b, tasks);
    const Status st = validate_plan(plan, b, nullptr);
    ASSERT_TRUE(st.ok()) << "seed " << seed << ": " << st.to_string();
    if (seed % 5 == 0) expect_pairs_once(plan);
  }
}

TEST(Validate, BytesMatchRowByRowRecount) {
  for (uint64_t seed = 0; seed < 400; ++seed) {
    const Batch b = test::random_batch(seed, seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous);
    const auto tasks = test::random_tasks(b, seed + 99);
    for (int64_t dtype : {2, 4}) {
      const RowBytes rb = row_bytes(test::test_model(), dtype);
      const Traffic t = compute_traffic(DocumentIndex(b), tasks, rb);
      const auto naive = test::naive_bytes(b, tasks, rb);
      ASSERT_EQ(t.bytes.forward(), naive.fwd) << "seed " << seed;
      ASSERT_EQ(t.bytes.backward(), naive.bwd) << "seed " << seed;
      for (int64_t r = 0; r < b.ranks; ++r) ASSERT_EQ(t.per_rank[static_cast<size_t>(r)].fwd(), naive.fwd_rank[static_cast<size_t>(r)]);
      // The plan reports the same figures for a non-percp schedule.
      const Plan plan = plan_of(b, tasks, {}, options_for(dtype));
      ASSERT_EQ(plan.metrics.comm_bytes_total, naive.fwd);
      ASSERT_EQ(plan.metrics.comm_bytes_backward, naive.bwd);
      ASSERT_EQ(plan.metrics.comm_bytes_max_rank,
                *std::max_element(naive.fwd_rank.begin(), naive.fwd_rank.end()));
    }
  }
}

TEST(DocumentIndex, MatchesARowByRowMap) {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const Batch b = test::random_batch(seed, seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous);
    const DocumentIndex index(b);
    std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> where;  // (doc,row) -> (rank, local)
    for (int64_t r = 0; r < b.ranks; ++r) {
      int64_t local = 0;
      for (const Piece& p : b.per_rank[static_cast<size_t>(r)])
        for (int64_t i = 0; i < p.len; ++i) where[{p.doc, p.offset + i}] = {r, local++};
    }
    ASSERT_EQ(static_cast<int64_t>(index.doc_ids().size()), b.num_documents());
    Rng rng(seed, 5);
    for (int trial = 0; trial < 50; ++trial) {
      const int64_t doc = index.doc_ids()[rng.uniform_int(index.doc_ids().size())];
      const int64_t L = index.doc_len(doc);
      int64_t lo = test::pick(rng, 0, L), hi = test::pick(rng, 0, L);
      if (lo > hi) std::swap(lo, hi);
      const int64_t rank = test::pick(rng, 0, b.ranks - 1);
      int64_t held = 0;
      for (int64_t i = lo; i < hi; ++i) held += where.at({doc, i}).first == rank;
      ASSERT_EQ(index.rows_held_by(doc, lo, hi, rank), held);
      ASSERT_EQ(index.rows_not_held_by(doc, lo, hi, rank), hi - lo - held);
      const int64_t pos = test::pick(rng, 0, L - 1);
      const auto [owner, local] = where.at({doc, pos});
      ASSERT_EQ(index.run_at(doc, pos).rank, owner);
      ASSERT_EQ(index.local_row(owner, doc, pos), local);
      ASSERT_EQ(index.local_row((owner + 1) % b.ranks, doc, pos), b.ranks == 1 ? local : -1);
    }
    EXPECT_FALSE(index.contains(-5));
  }
}

TEST(Validate, HandWorkedBytes) {
  // Rank 0 holds doc 5 rows [0, 4), rank 1 rows [4, 8). Tasks: rows [4, 6) and [6, 8) of
  // doc 5 (home 1) both served on rank 0; rank 0's rows [0,4) served at home.
  Batch b{2, 4, {{{5, 0, 4, 8}}, {{5, 4, 4, 8}}}};
  ModelSpec m = test::test_model();  // q row 4*16*2 = 128 B, kv row 2*2*16*2 = 128 B, lse 16 B
  ScheduleOptions o = options_for(2);
  const RowBytes rb = row_bytes(m, 2);
  ASSERT_EQ(rb.q, 128);
  ASSERT_EQ(rb.kv, 128);
  ASSERT_EQ(rb.lse, 16);
  const Plan plan = plan_of(b, {{5, 0, 4, 0, 0}, {5, 4, 6, 1, 0}, {5, 6, 8, 1, 0}});
  ASSERT_TRUE(validate_plan(plan, b, nullptr).ok());
  // Q: 4 rows out; O+LSE: 4 rows back; K/V: rows [4, 6) from rank 1 (row 6, 7 are queries of
  // the second task, its context [0, 8) needs rows 4..7: all four held by rank 1, sent once).
  EXPECT_EQ(plan.metrics.traffic.bytes.q, 4 * 128);
  EXPECT_EQ(plan.metrics.traffic.bytes.o_lse, 4 * (128 + 16));
  EXPECT_EQ(plan.metrics.traffic.bytes.kv, 4 * 128);
  EXPECT_EQ(plan.metrics.comm_bytes_total, 4 * 128 + 4 * 144 + 4 * 128);
  EXPECT_EQ(plan.metrics.comm_bytes_backward, 4 * 128 + 4 * 128 + 4 * 128);
  // Server 0's second task: context [0, 6) = local rows 0..3, then received kv rows 0..1.
  const ServerTask& t1 = plan.servers[0].tasks[1];
  ASSERT_EQ(t1.kv.size(), 2u);
  EXPECT_EQ(t1.kv[0], (Segment{false, 0, 4}));
  EXPECT_EQ(t1.kv[1], (Segment{true, 0, 2}));
  EXPECT_EQ(plan.servers[0].tasks[2].kv[1], (Segment{true, 0, 4}));
  EXPECT_EQ(plan.servers[0].cu_seqlens_q, (std::vector<int32_t>{0, 4, 6, 8}));
  EXPECT_EQ(plan.servers[0].cu_seqlens_k, (std::vector<int32_t>{0, 4, 10, 18}));
  EXPECT_EQ(plan.ranks[1].exchange(ExchangeKind::kKv).send_blocks[0], (std::vector<RowBlock>{{5, 4, 8}}));
  EXPECT_EQ(plan.ranks[1].exchange(ExchangeKind::kQ).send_counts, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(plan.ranks[0].exchange(ExchangeKind::kOLse).send_counts, (std::vector<int64_t>{0, 4}));
  expect_pairs_once(plan);
}

// A plan with remote work in every exchange, for the mutation tests.
Plan mutation_base(Batch& b) {
  for (uint64_t seed = 3;; ++seed) {
    b = test::random_batch(seed, TestLayout::kScattered);
    if (b.ranks < 3) continue;
    Plan p = plan_of(b, test::random_tasks(b, seed));
    bool full = true;
    for (int k = 0; k < kNumExchanges; ++k) full = full && p.ranks[0].exchanges[static_cast<size_t>(k)].send_rows() > 0;
    if (full && p.servers[1].tasks.size() >= 2) return p;
  }
}

TEST(Validate, RejectsCorruptedPlans) {
  Batch b;
  const Plan base = mutation_base(b);
  ASSERT_TRUE(validate_plan(base, b, nullptr).ok());
  const std::vector<std::pair<std::string, std::function<void(Plan&)>>> mutations = {
      {"drop a task", [](Plan& p) {
         p.servers[1].tasks.pop_back();
         p.servers[1].cu_seqlens_q.pop_back();
         p.servers[1].cu_seqlens_k.pop_back();
       }},
      {"duplicate a task on another server", [](Plan& p) {
         ServerTask t = p.servers[1].tasks[0];
         t.task.server = 2;
         p.servers[2].tasks.push_back(t);
         p.servers[2].cu_seqlens_q.push_back(p.servers[2].cu_seqlens_q.back() + static_cast<int32_t>(t.task.q_end - t.task.q_begin));
         p.servers[2].cu_seqlens_k.push_back(p.servers[2].cu_seqlens_k.back() + static_cast<int32_t>(t.task.q_end));
       }},
      {"shrink a task", [](Plan& p) {
         auto& t = p.servers[1].tasks[0].task;
         if (t.q_end - t.q_begin > 1) --t.q_end; else ++t.q_end;
       }},
      {"wrong home", [](Plan& p) { auto& t = p.servers[1].tasks[0].task; t.home = (t.home + 1) % p.batch.ranks; }},
      {"wrong cu_seqlens_k", [](Plan& p) { p.servers[1].cu_seqlens_k.back() += 1; }},
      {"wrong send count", [](Plan& p) {
         auto& e = p.ranks[0].exchanges[static_cast<size_t>(ExchangeKind::kKv)];
         for (auto& c : e.send_counts) if (c > 0) { ++c; break; }
       }},
      {"sender and receiver disagree", [](Plan& p) {
         auto& e = p.ranks[0].exchanges[static_cast<size_t>(ExchangeKind::kDQ)];
         // Same row count, other rows: only the pairwise comparison can see it.
         for (auto& blocks : e.send_blocks) if (!blocks.empty()) { blocks[0].begin += 1; blocks[0].end += 1; break; }
       }},
      {"swap two received blocks", [](Plan& p) {
         for (auto& rp : p.ranks) {
           for (auto& blocks : rp.exchanges[static_cast<size_t>(ExchangeKind::kQ)].recv_blocks) {
             if (blocks.size() >= 2 && blocks[0] != blocks[1]) { std::swap(blocks[0], blocks[1]); return; }
           }
         }
         p.ranks[0].exchanges[0].row_bytes += 1;  // no such pair: still corrupt the plan
       }},
      {"kv segment off by one", [](Plan& p) {
         for (auto& s : p.servers) for (auto& t : s.tasks) for (auto& seg : t.kv) if (seg.received) { ++seg.offset; return; }
       }},
      {"q_offset off by one", [](Plan& p) { p.servers[1].tasks[0].q_offset += 1; }},
      {"comm_bytes_total", [](Plan& p) { p.metrics.comm_bytes_total += 1; }},
      {"comm_bytes_max_rank", [](Plan& p) { p.metrics.comm_bytes_max_rank -= 1; }},
      {"a load", [](Plan& p) { p.metrics.loads[0] += 1; }},
      {"kv traffic", [](Plan& p) { p.metrics.traffic.bytes.kv += 128; }},
      {"plan batch", [](Plan& p) { std::swap(p.batch.per_rank[0], p.batch.per_rank[1]); }},
      {"self traffic", [](Plan& p) {
         auto& e = p.ranks[0].exchanges[static_cast<size_t>(ExchangeKind::kQ)];
         const RowBlock blk{p.batch.per_rank[0][0].doc, p.batch.per_rank[0][0].offset, p.batch.per_rank[0][0].offset + 1};
         e.send_blocks[0].push_back(blk);
         e.recv_blocks[0].push_back(blk);
         e.send_counts[0] = e.recv_counts[0] = 1;
       }},
      {"consistent but not canonical order", [](Plan& p) {
         // Swap two blocks of one peer on both ends: sender and receiver agree, the order
         // is not the canonical one (so another runtime rank would misread the rows).
         for (int64_t s = 0; s < p.batch.ranks; ++s) {
           auto& recv = p.ranks[static_cast<size_t>(s)].exchanges[static_cast<size_t>(ExchangeKind::kKv)].recv_blocks;
           for (size_t h = 0; h < recv.size(); ++h) {
             if (recv[h].size() >= 2 && recv[h][0].rows() == recv[h][1].rows()) {
               std::swap(recv[h][0], recv[h][1]);
               auto& send = p.ranks[h].exchanges[static_cast<size_t>(ExchangeKind::kKv)].send_blocks[static_cast<size_t>(s)];
               std::swap(send[0], send[1]);
               return;
             }
           }
         }
         p.metrics.loads[1] = -1;  // no such pair: still corrupt the plan
       }},
  };
  for (const auto& [name, mutate] : mutations) {
    Plan p = base;
    mutate(p);
    const Status st = validate_plan(p, b, nullptr);
    EXPECT_FALSE(st.ok()) << name;
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << name;
  }
}

TEST(Validate, RejectsMalformedTasksAtBuild) {
  Batch b{2, 4, {{{5, 0, 4, 8}}, {{5, 4, 4, 8}}}};
  ScheduleOptions o = options_for();
  // Query rows spanning two pieces.
  auto p = build_plan(Schedule{{{5, 0, 8, 0, 0}}, b}, b, {}, o);
  EXPECT_FALSE(p.ok());
  // Unknown document.
  EXPECT_FALSE(build_plan(Schedule{{{6, 0, 1, 0, 0}}, b}, b, {}, o).ok());
  // Server out of range.
  EXPECT_FALSE(build_plan(Schedule{{{5, 0, 4, 0, 2}}, b}, b, {}, o).ok());
  // Coverage gaps are the validator's business: a plan missing rows builds but is refused.
  auto gap = build_plan(Schedule{{{5, 0, 4, 0, 0}}, b}, b, {}, o);
  ASSERT_TRUE(gap.ok());
  const Status st = validate_plan(*gap, b, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not covered"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace distca
