// Data-loader re-packing (plan/chunking.h): wlb_repack and percp_repack against independent
// recomputations of their invariants on random batches (every document exactly once, the cap
// held, the balance objective no worse than the input's packing, head-tail shards), hand
// examples, and the simulator's wlb scheduler being the colocated schedule of the re-pack.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "distca/plan/chunking.h"
#include "distca/plan/schedule.h"
#include "plan_test_util.h"

namespace distca {
namespace {

using test::TestLayout;

// Work of a piece recomputed by summing its causal rows one by one (the chunking sums
// closed forms through task_cost).
double work_of(const Piece& p, double linear) {
  double w = 0;
  for (int64_t pos = p.offset; pos < p.offset + p.len; ++pos) w += static_cast<double>(pos + 1) + linear;
  return w;
}

double objective(const Batch& b, double linear) {
  double mx = 0;
  for (const auto& pieces : b.per_rank) {
    double w = 0;
    for (const Piece& p : pieces) w += work_of(p, linear);
    mx = std::max(mx, w);
  }
  return mx;
}

// Every document of `in` appears in `out` exactly once: same ids, same lengths, its rows
// covered once (no gap, no overlap).
void expect_same_documents(const Batch& in, const Batch& out) {
  std::map<int64_t, int64_t> lens;
  for (const auto& pieces : in.per_rank) for (const Piece& p : pieces) lens[p.doc] = p.doc_len;
  std::map<int64_t, std::vector<int>> covered;
  for (const auto& pieces : out.per_rank) {
    for (const Piece& p : pieces) {
      ASSERT_TRUE(lens.count(p.doc)) << "unknown document " << p.doc;
      ASSERT_EQ(p.doc_len, lens[p.doc]);
      auto& rows = covered[p.doc];
      rows.resize(static_cast<size_t>(p.doc_len), 0);
      for (int64_t i = p.offset; i < p.offset + p.len; ++i) ++rows[static_cast<size_t>(i)];
    }
  }
  ASSERT_EQ(covered.size(), lens.size());
  for (const auto& [doc, rows] : covered) {
    for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], 1) << "document " << doc << " row " << i;
  }
}

int64_t total_tokens(const Batch& b) {
  int64_t t = 0;
  for (int64_t r = 0; r < b.ranks; ++r) t += b.rank_tokens(r);
  return t;
}

TEST(Chunking, WlbInvariantsOnRandomBatches) {
  int64_t sharded = 0, moved = 0;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    const Batch b = test::random_batch(seed + 900, seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous);
    for (double cap : {1.0, 1.2, 2.0}) {
      for (int64_t cp = 1; cp <= b.ranks; ++cp) {
        if (b.ranks % cp != 0) continue;
        ChunkingOptions o;
        o.cap = cap;
        o.cp = cp;
        o.cp_threshold = seed % 3 == 0 ? 0 : 8;
        o.linear_per_token = seed % 4 == 0 ? 0.0 : 6.0;
        auto out = wlb_repack(b, o);
        ASSERT_TRUE(out.ok()) << out.status().to_string();
        ASSERT_TRUE(out->validate().ok());
        expect_same_documents(b, *out);
        // The cap, from its definition: max(ceil(T / R), floor(cap T / R)).
        const int64_t total = total_tokens(b);
        const auto limit = std::max((total + b.ranks - 1) / b.ranks,
                                    static_cast<int64_t>(cap * static_cast<double>(total) / static_cast<double>(b.ranks)));
        bool input_fits = true;
        for (int64_t r = 0; r < b.ranks; ++r) {
          ASSERT_LE(out->rank_tokens(r), limit) << "seed " << seed;
          input_fits = input_fits && b.rank_tokens(r) <= limit;
        }
        if (input_fits) {
          ASSERT_LE(objective(*out, o.linear_per_token), objective(b, o.linear_per_token) * (1 + 1e-12))
              << "seed " << seed << " cap " << cap << " cp " << cp;
        }
        moved += *out == b ? 0 : 1;
        // A rank holds at most two pieces of a document unless the cap forced a split.
        for (const auto& pieces : out->per_rank) {
          std::map<int64_t, int> per_doc;
          for (const Piece& p : pieces) ++per_doc[p.doc];
          for (const auto& [doc, n] : per_doc) {
            if (n == 2) ++sharded;
          }
        }
      }
    }
  }
  EXPECT_GT(moved, 100);   // the re-pack did move documents, not only keep the input
  EXPECT_GT(sharded, 10);  // and sharded some head-tail
}

// The step's micro-batches re-packed together (wlb under --pp): every document of every input
// micro-batch exactly once, whole in one output micro-batch, under micro_doc_id; the cap over
// all micro-batches' ranks held; the largest work of any rank of any micro-batch no worse than
// the loader's packing; documents do move between micro-batches. When a document needing a cut
// finds no micro-batch with room, the result is each micro-batch re-packed alone.
TEST(Chunking, WlbAcrossMicroBatchesInvariants) {
  int64_t across = 0, alone = 0, cases = 0;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const Batch first = test::random_batch(seed + 5000, seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous);
    std::vector<Batch> in{first};
    const int64_t M = 2 + static_cast<int64_t>(seed % 3);
    for (uint64_t k = 1; static_cast<int64_t>(in.size()) < M; ++k) {
      Batch b = test::random_batch(seed * 131 + k, TestLayout::kContiguous);
      // The loader's micro-batches: the same ranks and tokens per rank.
      if (b.ranks == first.ranks && b.tokens_per_rank == first.tokens_per_rank) in.push_back(std::move(b));
    }
    const int64_t R = first.ranks;
    for (double cap : {1.0, 1.3}) {
      ChunkingOptions o;
      o.cap = cap;
      o.cp = R % 2 == 0 ? 2 : 1;
      o.cp_threshold = 6;
      o.linear_per_token = seed % 2 ? 0.0 : 4.0;
      auto out = wlb_repack_micro_batches(in, o);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      ASSERT_EQ(static_cast<int64_t>(out->size()), M);
      ++cases;
      // Flatten both sides with the result's ids: micro-batch m's rank r as rank m R + r.
      Batch flat_in, flat_out;
      flat_in.ranks = flat_out.ranks = M * R;
      int64_t total = 0;
      std::map<int64_t, int64_t> origin;  // id -> input micro-batch
      for (int64_t m = 0; m < M; ++m) {
        ASSERT_TRUE((*out)[static_cast<size_t>(m)].validate().ok());
        ASSERT_EQ((*out)[static_cast<size_t>(m)].ranks, R);
        for (int64_t r = 0; r < R; ++r) {
          auto pieces = in[static_cast<size_t>(m)].per_rank[static_cast<size_t>(r)];
          for (Piece& p : pieces) {
            p.doc = p.doc * M + m;
            origin[p.doc] = m;
            total += p.len;
          }
          flat_in.per_rank.push_back(pieces);
          flat_out.per_rank.push_back((*out)[static_cast<size_t>(m)].per_rank[static_cast<size_t>(r)]);
        }
      }
      expect_same_documents(flat_in, flat_out);
      std::map<int64_t, std::set<int64_t>> lands;  // id -> output micro-batches
      for (int64_t r = 0; r < M * R; ++r) {
        for (const Piece& p : flat_out.per_rank[static_cast<size_t>(r)]) lands[p.doc].insert(r / R);
      }
      bool moved = false;
      for (const auto& [id, ms] : lands) {
        ASSERT_EQ(ms.size(), 1u) << "seed " << seed << ": document " << id << " spans micro-batches";
        moved = moved || *ms.begin() != origin[id];
      }
      const int64_t limit = std::max((total + M * R - 1) / (M * R),
                                     static_cast<int64_t>(cap * static_cast<double>(total) / static_cast<double>(M * R)));
      bool holds = true;
      for (int64_t r = 0; r < M * R; ++r) holds = holds && flat_out.rank_tokens(r) <= limit;
      if (!holds) {  // the fallback: each micro-batch alone
        for (int64_t m = 0; m < M; ++m) {
          Batch want = *wlb_repack(in[static_cast<size_t>(m)], o);
          for (auto& pieces : want.per_rank) for (Piece& p : pieces) p.doc = p.doc * M + m;
          ASSERT_EQ((*out)[static_cast<size_t>(m)].per_rank, want.per_rank) << "seed " << seed;
        }
        ++alone;
        continue;
      }
      bool input_fits = true;
      for (int64_t r = 0; r < M * R; ++r) input_fits = input_fits && flat_in.rank_tokens(r) <= limit;
      if (input_fits) {
        ASSERT_LE(objective(flat_out, o.linear_per_token), objective(flat_in, o.linear_per_token) * (1 + 1e-12))
            << "seed " << seed;
      }
      across += moved ? 1 : 0;
    }
  }
  EXPECT_GT(across, cases / 4);  // documents did change micro-batch
  EXPECT_LT(alone, cases / 10);  // and the fallback is the exception
}

TEST(Chunking, WlbAcrossMicroBatchesRefusesMismatchedRanks) {
  Batch a = test::random_batch(3, TestLayout::kContiguous);
  Batch b = a;
  b.ranks += 1;
  b.per_rank.push_back({});
  EXPECT_FALSE(wlb_repack_micro_batches({a, b}, ChunkingOptions{}).ok());
  EXPECT_TRUE(wlb_repack_micro_batches({}, ChunkingOptions{})->empty());
}

TEST(Chunking, WlbShardsALongDocumentHeadTailOverItsGroup) {
  // 2 ranks of 16: document 0 (24 rows) on rank 0 and half of rank 1, document 1 (8) after it.
  // cp 2, threshold 10, cap 2: document 0 gets shares 12 + 12, heads of 6 from the front and
  // tails of 6 from the back: rank 0 [0, 6) + [18, 24) (21 + 129 pairs), rank 1 [6, 12) +
  // [12, 18) (57 + 93). Document 1 then goes whole to the least-worked rank (a tie: rank 0).
  // Input objective: rank 1 holds [16, 24) of document 0 and document 1: 164 + 36 = 200;
  // output: 150 + 36 = 186.
  const Batch b{2, 16, {{{0, 0, 16, 24}}, {{0, 16, 8, 24}, {1, 0, 8, 8}}}};
  ChunkingOptions o;
  o.cp = 2;
  o.cp_threshold = 10;
  o.cap = 2;
  auto out = wlb_repack(b, o);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->per_rank[0], (std::vector<Piece>{{0, 0, 6, 24}, {0, 18, 6, 24}, {1, 0, 8, 8}}));
  EXPECT_EQ(out->per_rank[1], (std::vector<Piece>{{0, 6, 6, 24}, {0, 12, 6, 24}}));
  EXPECT_EQ(chunking_rank_work(*out, o), (std::vector<double>{186, 150}));
  EXPECT_EQ(out->tokens_per_rank, 32);
  // Without cp the long document would go whole onto one rank (300 pairs against 36): worse
  // than the input's 200, so the input is kept.
  o.cp = 1;
  out = wlb_repack(b, o);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, b);
}

TEST(Chunking, WlbKeepsTheInputWhenItBalancesBetter) {
  // One document of 32 over 2 ranks of 16: a cap of 2 lets it go whole onto one rank (528
  // pairs against the input's 136 and 392 on its two ranks): the input is kept.
  const Batch b{2, 16, {{{4, 0, 16, 32}}, {{4, 16, 16, 32}}}};
  ChunkingOptions o;
  o.cap = 2;
  auto out = wlb_repack(b, o);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, b);
}

TEST(Chunking, DefaultThresholdIsTwoChunksPerRankOfOneTile) {
  ChunkingOptions o;
  o.cp = 4;
  o.tile_rows = 16;
  EXPECT_EQ(cp_shard_threshold(o), 127);
  o.cp_threshold = 300;
  EXPECT_EQ(cp_shard_threshold(o), 300);
}

TEST(Chunking, OptionsAreRefusedNamingTheFlag) {
  const Batch b{2, 8, {{{0, 0, 8, 8}}, {{1, 0, 8, 8}}}};
  ChunkingOptions o;
  o.cap = 0.5;
  EXPECT_EQ(wlb_repack(b, o).status().message(), "--wlb-cap must be >= 1 (got 0.5)");
  o.cap = 1.2;
  o.cp = 3;
  EXPECT_EQ(wlb_repack(b, o).status().message(), "--cp 3 must divide the 2 data-parallel ranks");
  EXPECT_FALSE(percp_repack(b, 3).ok());
}

TEST(Chunking, PerCpShardsEveryDocumentOverItsGroup) {
  int64_t checked = 0;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const Batch b = test::random_batch(seed + 4400, seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous);
    for (int64_t cp = 2; cp <= b.ranks; ++cp) {
      if (b.ranks % cp != 0) continue;
      auto out = percp_repack(b, cp);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      expect_same_documents(b, *out);
      for (int64_t g = 0; g < b.ranks / cp; ++g) {
        int64_t in = 0, lo = INT64_MAX, hi = 0;
        for (int64_t r = g * cp; r < (g + 1) * cp; ++r) {
          in += b.rank_tokens(r);
          lo = std::min(lo, out->rank_tokens(r));
          hi = std::max(hi, out->rank_tokens(r));
        }
        int64_t outs = 0;
        for (int64_t r = g * cp; r < (g + 1) * cp; ++r) outs += out->rank_tokens(r);
        ASSERT_EQ(outs, in) << "a group keeps its tokens";
        ASSERT_LE(hi - lo, 1) << "seed " << seed;
      }
      for (int64_t r = 0; r < b.ranks; ++r) ASSERT_LE(out->rank_tokens(r), out->tokens_per_rank);
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
  // Hand example: 2 ranks of 8 full of document 7 (16 rows): shares 8 + 8, heads of 4: rank 0
  // [0, 4) + [12, 16), rank 1 [4, 8) + [8, 12).
  const Batch b{2, 8, {{{7, 0, 8, 16}}, {{7, 8, 8, 16}}}};
  auto out = percp_repack(b, 2);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->per_rank[0], (std::vector<Piece>{{7, 0, 4, 16}, {7, 12, 4, 16}}));
  EXPECT_EQ(out->per_rank[1], (std::vector<Piece>{{7, 4, 4, 16}, {7, 8, 4, 16}}));
}

// The simulator's wlb scheduler and the trainer's --mode wlb share one function.
TEST(Chunking, WlbSchedulerIsTheColocatedScheduleOfTheRepack) {
  for (uint64_t seed = 0; seed < 100; ++seed) {
    const Batch b = test::random_batch(seed + 31, TestLayout::kContiguous);
    ScheduleOptions so;
    so.model = test::test_model();
    so.wlb_mem_cap = 1.2;
    so.wlb_cp = b.ranks % 2 == 0 ? 2 : 1;
    so.wlb_cp_threshold = 6;
    auto s = schedule_wlb(b, so);
    ASSERT_TRUE(s.ok());
    ChunkingOptions o;
    o.cap = 1.2;
    o.cp = so.wlb_cp;
    o.cp_threshold = 6;
    auto repacked = wlb_repack(b, o);
    ASSERT_TRUE(repacked.ok());
    EXPECT_EQ(s->batch, *repacked);
    auto colocated = schedule_colocated(*repacked, so);
    ASSERT_TRUE(colocated.ok());
    EXPECT_EQ(s->tasks, colocated->tasks);
  }
}

}  // namespace
}  // namespace distca
