// The validator and the byte accounting against independent references: random batches in
// two layouts, random schedules and the baselines; a brute-force pair count of the plan as a
// kernel would run it; a row-by-row byte recount; and corrupted plans that must be refused.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>
#include <tuple>
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
  EXPECT_EQ(plan.ranks[1].exchange(ExchangeKind::kQ).send_counts.dense(), (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(plan.ranks[0].exchange(ExchangeKind::kOLse).send_counts.dense(), (std::vector<int64_t>{0, 4}));
  expect_pairs_once(plan);
}

// The sparse layout (peer_vector.h) against an independent dense count: for every ordered
// pair of ranks, the rows each exchange moves, recounted row by row from the tasks and the
// batch alone. The dense view equals the recount, and only peers with rows are stored.
TEST(Validate, SparseLayoutMatchesADenseRecount) {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const Batch b = test::random_batch(seed, seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous);
    const auto tasks = test::random_tasks(b, seed + 7);
    const Plan plan = plan_of(b, tasks);
    const auto R = static_cast<size_t>(b.ranks);
    std::map<std::pair<int64_t, int64_t>, int64_t> holder;  // (doc, row) -> rank
    for (size_t r = 0; r < R; ++r) {
      for (const Piece& p : b.per_rank[r]) {
        for (int64_t i = 0; i < p.len; ++i) holder[{p.doc, p.offset + i}] = static_cast<int64_t>(r);
      }
    }
    // q[from][to]: query rows home -> server; kv[from][to]: context rows holder -> server,
    // each (doc, row, server) once.
    std::vector<std::vector<int64_t>> q(R, std::vector<int64_t>(R, 0)), kv = q;
    std::set<std::tuple<int64_t, int64_t, int64_t>> sent;
    for (const TaskPlacement& t : tasks) {
      if (t.home != t.server) q[static_cast<size_t>(t.home)][static_cast<size_t>(t.server)] += t.q_end - t.q_begin;
      for (int64_t row = 0; row < t.q_end; ++row) {
        const int64_t h = holder.at({t.doc, row});
        if (h != t.server && sent.insert({t.doc, row, t.server}).second) ++kv[static_cast<size_t>(h)][static_cast<size_t>(t.server)];
      }
    }
    for (size_t r = 0; r < R; ++r) {
      for (int k = 0; k < kNumExchanges; ++k) {
        const auto kind = static_cast<ExchangeKind>(k);
        const Exchange& e = plan.ranks[r].exchange(kind);
        const auto& ref = (kind == ExchangeKind::kKv || kind == ExchangeKind::kDKv) ? kv : q;
        // q, kv, do go forward along ref; o_lse, dq, dkv go back.
        const bool forward = kind == ExchangeKind::kQ || kind == ExchangeKind::kKv || kind == ExchangeKind::kDO;
        std::vector<int64_t> send(R), recv(R);
        for (size_t p = 0; p < R; ++p) {
          send[p] = forward ? ref[r][p] : ref[p][r];
          recv[p] = forward ? ref[p][r] : ref[r][p];
        }
        ASSERT_EQ(e.send_counts.dense(), send) << "seed " << seed << " rank " << r << " " << exchange_name(kind);
        ASSERT_EQ(e.recv_counts.dense(), recv) << "seed " << seed << " rank " << r << " " << exchange_name(kind);
        for (const auto& [p, c] : e.send_counts.entries()) ASSERT_GT(c, 0) << "a stored peer without rows";
        for (const auto& [p, c] : e.recv_counts.entries()) ASSERT_GT(c, 0) << "a stored peer without rows";
        ASSERT_LE(e.send_blocks.entries().size(), e.send_counts.entries().size());
      }
    }
    ASSERT_TRUE(validate_plan(plan, b, nullptr).ok()) << "seed " << seed;
  }
}

TEST(PeerVector, ReadsLikeTheDenseVector) {
  PeerVector<int64_t> v(5);
  v.mut(3) = 7;
  v.mut(1) = 2;  // out of order: inserted before 3
  EXPECT_EQ(v.dense(), (std::vector<int64_t>{0, 2, 0, 7, 0}));
  EXPECT_EQ(v[0], 0);
  EXPECT_EQ(v[3], 7);
  ASSERT_EQ(v.entries().size(), 2u);
  EXPECT_EQ(v.entries()[0].first, 1u);
  PeerVector<int64_t> w(5);
  w.mut(1) = 2;
  w.mut(3) = 7;
  w.mut(4) = 0;  // an explicit default equals an unset peer
  EXPECT_TRUE(v == w);
  w.mut(4) = 1;
  EXPECT_FALSE(v == w);
  EXPECT_FALSE(v == PeerVector<int64_t>(4));
  const std::vector<int64_t> dense = v;  // the implicit dense view the runtime uses
  EXPECT_EQ(dense, v.dense());
}

// A corruption of a valid plan and the rule that must refuse it: `expect` is a fragment of
// the validator's message for that rule, so a mutation caught by an unrelated check fails.
// `mutate` returns false when the plan offers nothing to corrupt that way.
struct Mutation {
  std::string name;
  std::string expect;
  std::function<bool(Plan&)> mutate;
};

// Swaps two blocks of one peer of exchange k on both ends: sender and receiver agree, the
// order is not the canonical one (so another runtime rank would misread the rows). False when
// no peer has two different blocks of equal length.
bool swap_two_blocks(Plan& p, ExchangeKind k) {
  for (int64_t s = 0; s < p.batch.ranks; ++s) {
    auto& recv = p.ranks[static_cast<size_t>(s)].exchanges[static_cast<size_t>(k)].recv_blocks;
    for (auto& [h, blocks] : recv.entries_mut()) {
      if (blocks.size() >= 2 && blocks[0].rows() == blocks[1].rows() && blocks[0] != blocks[1]) {
        std::swap(blocks[0], blocks[1]);
        auto& send = p.ranks[h].exchanges[static_cast<size_t>(k)].send_blocks.mut(static_cast<size_t>(s));
        std::swap(send[0], send[1]);
        return true;
      }
    }
  }
  return false;
}

std::vector<Mutation> mutations() {
  auto ex = [](Plan& p, int64_t r, ExchangeKind k) -> Exchange& {
    return p.ranks[static_cast<size_t>(r)].exchanges[static_cast<size_t>(k)];
  };
  return {
      {"drop a task", "not covered", [](Plan& p) {
         p.servers[1].tasks.pop_back();
         p.servers[1].cu_seqlens_q.pop_back();
         p.servers[1].cu_seqlens_k.pop_back();
         return true;
       }},
      {"duplicate a task on another server", "covered twice", [](Plan& p) {
         ServerTask t = p.servers[1].tasks[0];
         t.task.server = 2;
         p.servers[2].tasks.push_back(t);
         p.servers[2].cu_seqlens_q.push_back(p.servers[2].cu_seqlens_q.back() + static_cast<int32_t>(t.task.q_end - t.task.q_begin));
         p.servers[2].cu_seqlens_k.push_back(p.servers[2].cu_seqlens_k.back() + static_cast<int32_t>(t.task.q_end));
         return true;
       }},
      {"shrink a task", "cu_seqlens disagree", [](Plan& p) {
         auto& t = p.servers[1].tasks[0].task;
         if (t.q_end - t.q_begin > 1) --t.q_end; else ++t.q_end;
         return true;
       }},
      {"wrong home", "not inside one piece held by home", [](Plan& p) {
         auto& t = p.servers[1].tasks[0].task;
         t.home = (t.home + 1) % p.batch.ranks;
         return true;
       }},
      {"wrong cu_seqlens_k", "cu_seqlens disagree", [](Plan& p) {
         p.servers[1].cu_seqlens_k.back() += 1;
         return true;
       }},
      {"wrong send count", "counts differ from the row lists", [ex](Plan& p) {
         for (auto& [peer, c] : ex(p, 0, ExchangeKind::kKv).send_counts.entries_mut()) {
           if (c > 0) { ++c; return true; }
         }
         return false;
       }},
      {"count without rows", "counts differ from the row lists", [ex](Plan& p) {
         // A count for a peer the row lists do not name (only the sparse side knows it).
         auto& e = ex(p, 0, ExchangeKind::kQ);
         for (size_t peer = 1; peer < e.send_counts.size(); ++peer) {
           if (e.send_blocks[peer].empty()) { e.send_counts.mut(peer) = 3; return true; }
         }
         return false;
       }},
      {"sender and receiver disagree", "exchange dq: rank 0 sends to rank", [ex](Plan& p) {
         // Same row count, other rows: only the pairwise comparison can see it.
         for (auto& [peer, blocks] : ex(p, 0, ExchangeKind::kDQ).send_blocks.entries_mut()) {
           if (!blocks.empty()) { blocks[0].begin += 1; blocks[0].end += 1; return true; }
         }
         return false;
       }},
      {"swap two received blocks", "exchange q: rank", [](Plan& p) {
         for (auto& rp : p.ranks) {
           for (auto& [peer, blocks] : rp.exchanges[static_cast<size_t>(ExchangeKind::kQ)].recv_blocks.entries_mut()) {
             if (blocks.size() >= 2 && blocks[0] != blocks[1]) { std::swap(blocks[0], blocks[1]); return true; }
           }
         }
         return false;
       }},
      {"kv segment off by one", "kv segment at context row", [](Plan& p) {
         for (auto& s : p.servers) for (auto& t : s.tasks) for (auto& seg : t.kv) if (seg.received) { ++seg.offset; return true; }
         return false;
       }},
      {"q_offset off by one", "q_offset does not address", [](Plan& p) {
         p.servers[1].tasks[0].q_offset += 1;
         return true;
       }},
      {"comm_bytes_total", "comm_bytes_total", [](Plan& p) { p.metrics.comm_bytes_total += 1; return true; }},
      {"comm_bytes_max_rank", "comm_bytes_max_rank", [](Plan& p) { p.metrics.comm_bytes_max_rank -= 1; return true; }},
      {"a load", "loads differ from a recount", [](Plan& p) { p.metrics.loads[0] += 1; return true; }},
      {"kv traffic", "traffic differs", [](Plan& p) { p.metrics.traffic.bytes.kv += 128; return true; }},
      {"plan batch", "differs from the input batch", [](Plan& p) {
         std::swap(p.batch.per_rank[0], p.batch.per_rank[1]);
         return true;
       }},
      {"self traffic", "a rank sends to itself", [ex](Plan& p) {
         auto& e = ex(p, 0, ExchangeKind::kQ);
         const Piece& first = p.batch.per_rank[0][0];
         const RowBlock blk{first.doc, first.offset, first.offset + 1};
         // Rank 0 is the lowest peer, so its rows sit at displacement 0 on both sides.
         e.send_blocks.mut(0).insert(e.send_blocks.mut(0).begin(), blk);
         e.recv_blocks.mut(0).insert(e.recv_blocks.mut(0).begin(), blk);
         e.send_counts.mut(0) = e.recv_counts.mut(0) = 1;
         for (auto& [peer, d] : e.send_displs.entries_mut()) if (peer > 0) d += 1;
         for (auto& [peer, d] : e.recv_displs.entries_mut()) if (peer > 0) d += 1;
         return true;
       }},
      {"consistent but not canonical order", "kv receive rows are not the canonical ones", [](Plan& p) {
         return swap_two_blocks(p, ExchangeKind::kKv);
       }},
  };
}

// A plan with remote work in every exchange on which every mutation applies.
Plan mutation_base(Batch& b) {
  for (uint64_t seed = 3; seed < 100000; ++seed) {
    b = test::random_batch(seed, TestLayout::kScattered);
    if (b.ranks < 3) continue;
    Plan p = plan_of(b, test::random_tasks(b, seed));
    bool full = p.servers[1].tasks.size() >= 2;
    for (int k = 0; k < kNumExchanges; ++k) full = full && p.ranks[0].exchanges[static_cast<size_t>(k)].send_rows() > 0;
    for (const Mutation& m : mutations()) {
      if (!full) break;
      Plan q = p;
      full = m.mutate(q);
    }
    if (full) return p;
  }
  ADD_FAILURE() << "no seed gives a plan every mutation applies to";
  return {};
}

TEST(Validate, RejectsCorruptedPlans) {
  Batch b;
  const Plan base = mutation_base(b);
  ASSERT_TRUE(validate_plan(base, b, nullptr).ok());
  for (const Mutation& m : mutations()) {
    Plan p = base;
    ASSERT_TRUE(m.mutate(p)) << m.name;
    const Status st = validate_plan(p, b, nullptr);
    ASSERT_FALSE(st.ok()) << m.name;
    EXPECT_NE(st.message().find(m.expect), std::string::npos) << m.name << ": refused for another reason: " << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << m.name;
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

// The plan of random tasks on random batch `seed`, with the document ids as generated (dense:
// the validator indexes them by a table) or spread far apart (sparse: by a search).
Plan random_plan(uint64_t seed, bool sparse_ids, Batch& b) {
  b = test::random_batch(seed, seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous);
  if (sparse_ids) {
    for (auto& rank : b.per_rank) for (Piece& p : rank) p.doc = p.doc * 1000003 + 17;
  }
  return plan_of(b, test::random_tasks(b, seed));
}

// An id no document of `b` has: between two ids (`inside`) or above them all.
int64_t absent_doc(const Batch& b, bool inside) {
  std::set<int64_t> ids;
  for (const auto& rank : b.per_rank) for (const Piece& p : rank) ids.insert(p.doc);
  if (!inside) return *ids.rbegin() + 1;
  for (int64_t id = *ids.begin() + 1;; ++id) if (!ids.count(id)) return id;
}

// Corruptions of the task lists and the plan's batch that apply to most plans (`mutate`
// returns false when the plan offers nothing to corrupt that way); each must be refused by
// the rule `expect` names.
std::vector<Mutation> task_mutations() {
  auto first_task = [](Plan& p) -> TaskPlacement* {
    for (auto& s : p.servers) if (!s.tasks.empty()) return &s.tasks[0].task;
    return nullptr;
  };
  auto rename = [](Plan& p, bool inside) {
    const int64_t fresh = absent_doc(p.batch, inside);
    const int64_t doc = p.batch.per_rank[0][0].doc;
    for (auto& rank : p.batch.per_rank) for (Piece& x : rank) if (x.doc == doc) x.doc = fresh;
  };
  return {
      {"task names another server", "names server", [first_task](Plan& p) {
         TaskPlacement* t = first_task(p);
         if (t == nullptr || p.batch.ranks < 2) return false;
         t->server = (t->server + 1) % p.batch.ranks;
         return true;
       }},
      {"document between the batch's ids", "unknown document", [first_task](Plan& p) {
         TaskPlacement* t = first_task(p);
         if (t == nullptr) return false;
         t->doc = absent_doc(p.batch, true);
         return true;
       }},
      {"document above the batch's ids", "unknown document", [first_task](Plan& p) {
         TaskPlacement* t = first_task(p);
         if (t == nullptr) return false;
         t->doc = absent_doc(p.batch, false);
         return true;
       }},
      {"rows past the document", "outside document", [first_task](Plan& p) {
         TaskPlacement* t = first_task(p);
         if (t == nullptr) return false;
         for (const auto& rank : p.batch.per_rank) for (const Piece& x : rank) if (x.doc == t->doc) t->q_end = x.doc_len + 1;
         return true;
       }},
      {"rows across two pieces", "not inside one piece held by home", [](Plan& p) {
         // One row past the end of the task's piece: the next piece's first row.
         for (auto& s : p.servers) {
           for (auto& st : s.tasks) {
             TaskPlacement& t = st.task;
             for (const Piece& x : p.batch.per_rank[static_cast<size_t>(t.home)]) {
               if (x.doc == t.doc && x.offset <= t.q_begin && t.q_end == x.offset + x.len && t.q_end < x.doc_len) {
                 ++t.q_end;
                 return true;
               }
             }
           }
         }
         return false;
       }},
      {"q blocks out of canonical order", "q receive rows are not the canonical ones", [](Plan& p) {
         return swap_two_blocks(p, ExchangeKind::kQ);
       }},
      {"invalid plan batch", "plan: plan batch", [](Plan& p) {
         p.batch.per_rank[0][0].doc_len += 1;
         return true;
       }},
      {"wlb batch of other documents (between ids)", "documents differ from the input's", [rename](Plan& p) {
         p.scheduler.kind = SchedulerKind::kWlb;  // the one scheduler whose batch may differ
         rename(p, true);
         return true;
       }},
      {"wlb batch of other documents (above ids)", "documents differ from the input's", [rename](Plan& p) {
         p.scheduler.kind = SchedulerKind::kWlb;
         rename(p, false);
         return true;
       }},
  };
}

// Every rule of task_mutations() on many plans, with dense and sparse document ids: each
// corruption is refused for its own reason, and each applies to some plan.
TEST(Validate, RejectsCorruptedTasksOnRandomPlans) {
  const auto muts = task_mutations();
  std::vector<int> applied(muts.size(), 0);
  for (uint64_t seed = 0; seed < 300; ++seed) {
    for (bool sparse : {false, true}) {
      Batch b;
      const Plan base = random_plan(seed, sparse, b);
      ASSERT_TRUE(validate_plan(base, b, nullptr).ok()) << "seed " << seed;
      if (b.per_rank[0].empty()) continue;
      for (size_t i = 0; i < muts.size(); ++i) {
        Plan p = base;
        if (!muts[i].mutate(p)) continue;
        ++applied[i];
        const Status st = validate_plan(p, b, nullptr);
        ASSERT_FALSE(st.ok()) << muts[i].name << " seed " << seed;
        ASSERT_NE(st.message().find(muts[i].expect), std::string::npos)
            << muts[i].name << " seed " << seed << ": refused for another reason: " << st.message();
      }
    }
  }
  for (size_t i = 0; i < muts.size(); ++i) EXPECT_GT(applied[i], 10) << muts[i].name << " applied too rarely";
}

// A peer entry set to an empty list or a zero count (PeerVector keeps it) is the same as no
// entry: such a plan is still valid, and still refused when corrupted.
TEST(Validate, ExplicitEmptyPeerEntriesEqualUnsetOnes) {
  for (uint64_t seed = 0; seed < 100; ++seed) {
    Batch b;
    Plan p = random_plan(seed, seed % 3 == 0, b);
    for (auto& rp : p.ranks) {
      for (Exchange& e : rp.exchanges) {
        for (size_t peer = 0; peer < e.send_blocks.size(); peer += 2) {
          e.send_blocks.mut(peer);
          e.recv_blocks.mut(peer);
          if (e.send_counts[peer] == 0) e.send_counts.mut(peer) = 0;
        }
      }
    }
    ASSERT_TRUE(validate_plan(p, b, nullptr).ok()) << "seed " << seed << ": " << validate_plan(p, b, nullptr).to_string();
    p.servers[0].cu_seqlens_q.clear();
    ASSERT_FALSE(validate_plan(p, b, nullptr).ok());
  }
}

// percp's all-gather recount (groups of every document's holders) against the planner's.
TEST(Validate, PercpAllGatherRecount) {
  int checked = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const Batch b = test::random_batch(seed, seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous);
    if (b.ranks % 2 != 0) continue;
    auto plan = make_plan(b, SchedulerSpec{SchedulerKind::kPerCp, 2}, options_for());
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    ASSERT_TRUE(validate_plan(*plan, b, nullptr).ok()) << "seed " << seed;
    if (plan->metrics.allgather.bytes == 0) continue;
    ++checked;
    for (size_t r = 0; r < plan->metrics.allgather.per_rank.size(); ++r) {
      Plan p = *plan;
      p.metrics.allgather.per_rank[r].fwd_recv += 1;
      const Status st = validate_plan(p, b, nullptr);
      ASSERT_FALSE(st.ok());
      EXPECT_NE(st.message().find("all-gather bytes differ"), std::string::npos) << st.message();
    }
  }
  EXPECT_GT(checked, 20);
}

}  // namespace
}  // namespace distca
