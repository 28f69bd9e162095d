// The nano-batch split (nano_split.h) over thousands of random batches: the split batch is the
// input's pieces cut and reordered (nano 0 first), every cut on the rule, the short-document
// greedy within its bound; plus hand-made cases with the expected values worked out by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "distca/cost/analytic.h"
#include "distca/data/workload.h"
#include "distca/plan/nano_plan.h"
#include "distca/plan/nano_split.h"
#include "plan_test_util.h"

namespace distca {
namespace {

// Everything the header promises about split_nano_batches(b, T), checked against quantities
// recomputed here from the input batch.
void check_split(const Batch& b, int64_t T, const std::string& what) {
  auto made = split_nano_batches(b, T);
  ASSERT_TRUE(made.ok()) << what << ": " << made.status().to_string();
  const NanoSplit& s = made.value();
  ASSERT_TRUE(s.batch.validate().ok()) << what << ": " << s.batch.validate().to_string();
  ASSERT_EQ(s.batch.ranks, b.ranks) << what;
  ASSERT_EQ(s.batch.tokens_per_rank, b.tokens_per_rank) << what;
  ASSERT_EQ(s.tokens.size(), static_cast<size_t>(b.ranks)) << what;

  // One cut per document, sorted by id, the lookup agreeing.
  std::map<int64_t, int64_t> len;
  for (const auto& rank : b.per_rank) {
    for (const Piece& p : rank) len[p.doc] = p.doc_len;
  }
  ASSERT_EQ(s.cuts.size(), len.size()) << what;
  size_t i = 0;
  for (const auto& [doc, L] : len) {
    ASSERT_EQ(s.cuts[i].first, doc) << what;
    const int64_t c = s.cuts[i++].second;
    ASSERT_EQ(s.cut_of(doc), c) << what;
    if (L >= 2 * T) {
      // On the grid, inside [T, L), and the multiple of T nearest to L / sqrt(2).
      ASSERT_EQ(c % T, 0) << what << " doc " << doc << " L " << L;
      ASSERT_GE(c, T) << what << " doc " << doc;
      ASSERT_LT(c, L) << what << " doc " << doc;
      const long double x = static_cast<long double>(L) / std::sqrt(2.0L);
      for (int64_t other : {c - T, c + T}) {
        if (other < T || other >= L) continue;
        ASSERT_LE(std::fabs(static_cast<long double>(c) - x), std::fabs(static_cast<long double>(other) - x))
            << what << " doc " << doc << " L " << L << " cut " << c;
      }
      const int64_t a = causal_pairs(0, c), rest = causal_pairs(c, L);
      ASSERT_LE(std::llabs(a - rest), T * L) << what << " doc " << doc << " L " << L << " cut " << c;
    } else {
      ASSERT_TRUE(c == 0 || c == L) << what << ": short doc " << doc << " (L " << L << ") cut at " << c;
    }
  }

  // Per rank: the input's pieces cut at the cuts, nano-0 parts first (input order), then
  // nano-1 parts (input order), and tokens[r] counting them.
  std::map<int64_t, int64_t> nano0_rows;  // doc -> rows in nano-0 parts over all ranks
  for (int64_t r = 0; r < b.ranks; ++r) {
    const auto& in = b.per_rank[static_cast<size_t>(r)];
    std::vector<Piece> want;
    for (int x = 0; x < 2; ++x) {
      for (const Piece& p : in) {
        const int64_t c = s.cut_of(p.doc);
        const int64_t lo = x == 0 ? p.offset : std::max(p.offset, c);
        const int64_t hi = x == 0 ? std::min(p.offset + p.len, c) : p.offset + p.len;
        if (hi > lo) want.push_back({p.doc, lo, hi - lo, p.doc_len});
      }
    }
    const auto& got = s.batch.per_rank[static_cast<size_t>(r)];
    ASSERT_EQ(got, want) << what << " rank " << r;
    ASSERT_EQ(s.batch.rank_tokens(r), b.rank_tokens(r)) << what << " rank " << r;
    const auto t = s.tokens[static_cast<size_t>(r)];
    ASSERT_EQ(t[0] + t[1], b.rank_tokens(r)) << what << " rank " << r;
    // Local rows [0, t0) are exactly the nano-0 parts: the pieces before row t0 end at or
    // before their cut, the others start at or after it, and t0 falls on a piece boundary.
    int64_t row = 0;
    for (const Piece& p : got) {
      const int64_t c = s.cut_of(p.doc);
      if (row < t[0]) {
        ASSERT_LE(p.offset + p.len, c) << what << " rank " << r << " doc " << p.doc;
        nano0_rows[p.doc] += p.len;
      } else {
        ASSERT_GE(p.offset, c) << what << " rank " << r << " doc " << p.doc;
      }
      row += p.len;
      ASSERT_TRUE(row <= t[0] || row - p.len >= t[0]) << what << " rank " << r << ": row t0 inside a piece";
    }
  }
  // Each document's nano-0 part is its prefix [0, cut): the split batch tiles [0, L) (validate)
  // and the rows before the cut are all in nano-0 parts.
  for (const auto& [doc, L] : len) EXPECT_EQ(nano0_rows[doc], s.cut_of(doc)) << what << " doc " << doc;

  // The greedy's bound, per rank: |imbalance| <= max(|imbalance of the cut documents alone|,
  // largest pairs a short document decided on this rank adds here) + the pairs of short pieces
  // decided on another rank (a short document that starts on an earlier rank).
  std::map<int64_t, int64_t> first_rank;  // doc -> rank of its piece at offset 0
  for (int64_t r = 0; r < b.ranks; ++r) {
    for (const Piece& p : b.per_rank[static_cast<size_t>(r)]) {
      if (p.offset == 0) first_rank[p.doc] = r;
    }
  }
  for (int64_t r = 0; r < b.ranks; ++r) {
    long double cut_diff = 0, diff = 0, largest_own = 0, foreign = 0;
    std::map<int64_t, long double> own;  // short doc decided here -> its pairs on this rank
    for (const Piece& p : b.per_rank[static_cast<size_t>(r)]) {
      const int64_t c = s.cut_of(p.doc), end = p.offset + p.len, mid = std::clamp(c, p.offset, end);
      const long double d = static_cast<long double>(causal_pairs(p.offset, mid)) - static_cast<long double>(causal_pairs(mid, end));
      diff += d;
      if (p.doc_len >= 2 * T) {
        cut_diff += d;
      } else if (first_rank.at(p.doc) == r) {
        own[p.doc] += static_cast<long double>(causal_pairs(p.offset, end));
      } else {
        foreign += static_cast<long double>(causal_pairs(p.offset, end));
      }
    }
    for (const auto& [doc, w] : own) largest_own = std::max(largest_own, w);
    EXPECT_LE(std::fabs(diff), std::max(std::fabs(cut_diff), largest_own) + foreign)
        << what << " rank " << r << ": imbalance " << static_cast<double>(diff) << ", cut docs alone "
        << static_cast<double>(cut_diff) << ", largest own short " << static_cast<double>(largest_own) << ", foreign "
        << static_cast<double>(foreign);
  }

  // Deterministic: the same input gives the same split.
  auto again = split_nano_batches(b, T);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->batch, s.batch) << what;
  EXPECT_EQ(again->tokens, s.tokens) << what;
  EXPECT_EQ(again->cuts, s.cuts) << what;
}

TEST(NanoSplit, RandomWorkloadBatches) {
  int batches = 0;
  for (const std::string dist : {"uniform:16:3000", "uniform:16:400", "fixed:272", "pretrain", "prolong"}) {
    for (Layout layout : {Layout::kContiguous, Layout::kHeadTail}) {
      for (int64_t ranks = 1; ranks <= 8; ++ranks) {
        WorkloadOptions w;
        w.dist = dist;
        w.ranks = ranks;
        w.tokens_per_rank = 2048;
        w.layout = layout;
        w.batches = 8;
        w.seed = 17 + static_cast<uint64_t>(ranks);
        auto made = make_batches(w);
        ASSERT_TRUE(made.ok()) << made.status().to_string();
        for (size_t k = 0; k < made->size(); ++k) {
          for (int64_t T : {1, 16, 64, 128}) {
            check_split((*made)[k], T, dist + (layout == Layout::kHeadTail ? " head-tail" : " contiguous") + " ranks " + std::to_string(ranks) + " batch " +
                                           std::to_string(k) + " T " + std::to_string(T));
            if (::testing::Test::HasFatalFailure()) return;
            ++batches;
          }
        }
      }
    }
  }
  EXPECT_EQ(batches, 5 * 2 * 8 * 8 * 4);
}

// Scattered pieces (a rank holding several non-adjacent pieces of one document, short
// documents spanning ranks) and tiny lengths.
TEST(NanoSplit, RandomScatteredBatches) {
  for (uint64_t seed = 0; seed < 600; ++seed) {
    for (auto layout : {test::TestLayout::kContiguous, test::TestLayout::kScattered}) {
      const Batch b = test::random_batch(seed, layout, 8, 300);
      for (int64_t T : {1, 16, 64, 128}) {
        check_split(b, T, "seed " + std::to_string(seed) + " T " + std::to_string(T));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(NanoSplit, OneDocumentOf8192RowsAtTile128) {
  const int64_t L = 8192, T = 128;
  const double x = static_cast<double>(L) / std::sqrt(2.0);  // 5792.6
  const int64_t want = std::llround(x / static_cast<double>(T)) * T;
  ASSERT_TRUE(want == 5760 || want == 5888) << want;
  Batch b;
  b.ranks = 1;
  b.tokens_per_rank = L;
  b.per_rank = {{{7, 0, L, L}}};
  auto s = split_nano_batches(b, T);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->cut_of(7), want);
  EXPECT_EQ(nano_cut_long(L, T), want);
  EXPECT_EQ(s->tokens[0][0], want);
  EXPECT_EQ(s->tokens[0][1], L - want);
  const std::vector<Piece> parts = {{7, 0, want, L}, {7, want, L - want, L}};
  EXPECT_EQ(s->batch.per_rank[0], parts);
}

// The batch of GreedyAndOrderByHand and CutFractionByHand.
Batch hand_batch() {
  Batch b;
  b.ranks = 3;
  b.tokens_per_rank = 1324;
  b.per_rank = {{{0, 0, 1024, 1024}, {1, 0, 100, 100}, {2, 0, 200, 200}},
                {{12, 0, 60, 60}, {10, 0, 100, 100}, {11, 0, 64, 64}},
                {{5, 0, 64, 64}, {3, 0, 64, 64}}};
  return b;
}

// Worked by hand, T = 128. Rank 0: long doc 0 (1024 rows), short docs 1 (100) and 2 (200).
// Doc 0: 1024 / sqrt(2) = 724.1, nearest multiple of 128: 768 (44 away; 640 is 84 away).
// Pairs: nano 0 768*769/2 = 295296, nano 1 524800 - 295296 = 229504. Greedy, longest first:
// doc 2 (20100 pairs) to nano 1 (lighter) -> 249604; doc 1 (5050) to nano 1 again.
// Rank 1, in this order: docs 12 (60 rows, 1830 pairs), 10 (100, 5050), 11 (64, 2080). Longest
// first: 10 to nano 0 (tie), 11 to nano 1, 12 to nano 1 (2080 < 5050). (Shortest first would
// put 12 in nano 0.) Rank 2: docs 5 and 3, 64 rows each: ties by id, so doc 3 first, to nano 0
// (tie), then doc 5 to nano 1.
TEST(NanoSplit, GreedyAndOrderByHand) {
  const Batch b = hand_batch();
  auto s = split_nano_batches(b, 128);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->cut_of(0), 768);
  EXPECT_EQ(s->cut_of(1), 0);
  EXPECT_EQ(s->cut_of(2), 0);
  EXPECT_EQ(s->cut_of(10), 100);
  EXPECT_EQ(s->cut_of(11), 0);
  EXPECT_EQ(s->cut_of(12), 0);
  EXPECT_EQ(s->cut_of(3), 64);
  EXPECT_EQ(s->cut_of(5), 0);
  const std::vector<Piece> r0 = {{0, 0, 768, 1024}, {0, 768, 256, 1024}, {1, 0, 100, 100}, {2, 0, 200, 200}};
  const std::vector<Piece> r1 = {{10, 0, 100, 100}, {12, 0, 60, 60}, {11, 0, 64, 64}};
  const std::vector<Piece> r2 = {{3, 0, 64, 64}, {5, 0, 64, 64}};
  EXPECT_EQ(s->batch.per_rank[0], r0);
  EXPECT_EQ(s->batch.per_rank[1], r1);
  EXPECT_EQ(s->batch.per_rank[2], r2);
  EXPECT_EQ(s->tokens[0], (std::array<int64_t, 2>{768, 556}));
  EXPECT_EQ(s->tokens[1], (std::array<int64_t, 2>{100, 124}));
  EXPECT_EQ(s->tokens[2], (std::array<int64_t, 2>{64, 64}));
  // At T = 1 every document of >= 2 rows is cut: 100 / sqrt(2) = 70.7 -> 71.
  auto t1 = split_nano_batches(b, 1);
  ASSERT_TRUE(t1.ok());
  EXPECT_EQ(t1->cut_of(1), 71);
  EXPECT_EQ(t1->cut_of(2), 141);  // 141.4
  EXPECT_EQ(t1->cut_of(0), 724);  // 724.1
}

TEST(NanoSplit, CutsNearTheClampAndLargeLengths) {
  // 2T: 2T / sqrt(2) = 1.41 T -> T. 2T + 1 likewise; the upper clamp never binds for L >= 2T.
  EXPECT_EQ(nano_cut_long(256, 128), 128);
  EXPECT_EQ(nano_cut_long(257, 128), 128);
  EXPECT_EQ(nano_cut_long(2, 1), 1);
  EXPECT_EQ(nano_cut_long(3, 1), 2);  // 2.12
  // Exact at lengths whose squares overflow int64: 2^40 / sqrt(2) = 2^39.5.
  const int64_t L = int64_t{1} << 40;
  const int64_t c = nano_cut_long(L, 1);
  const long double x = static_cast<long double>(L) / std::sqrt(2.0L);
  EXPECT_LE(std::fabs(static_cast<long double>(c) - x), 0.5L);
}

// The link-aware cut, by hand (T = 128, doc 0 of 1024 rows): f L / T = 3.2 -> 384 (f 0.4),
// 4 -> 512 (0.5), 4.5 -> 512 (0.5625, ties down), 4.8 -> 640 (0.6), 7.6 -> 1024 clamped to
// 896 (0.95), and f = 1 the whole document in nano 0. At 512, nano 0 holds 512 * 513 / 2 =
// 131328 pairs of rank 0's long document and nano 1 393472, so both short documents go whole
// to nano 0 (doc 2: 20100 pairs first, then doc 1).
TEST(NanoSplit, CutFractionByHand) {
  const Batch b = hand_batch();
  for (const auto& [f, want] : std::vector<std::pair<double, int64_t>>{
           {0.4, 384}, {0.5, 512}, {0.5625, 512}, {0.6, 640}, {0.95, 896}, {1.0, 1024}}) {
    EXPECT_EQ(nano_cut_fraction(1024, 128, f), want) << f;
    auto s = split_nano_batches(b, 128, f);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(s->cut_of(0), want) << f;
  }
  auto s = split_nano_batches(b, 128, 0.5);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->cut_of(1), 100);
  EXPECT_EQ(s->cut_of(2), 200);
  EXPECT_EQ(s->tokens[0], (std::array<int64_t, 2>{812, 512}));
  // f = 1: nano 1 holds nothing of the long document.
  auto whole = split_nano_batches(b, 128, 1.0);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->batch.per_rank[0].front(), (Piece{0, 0, 1024, 1024}));
  // 0 is the L / sqrt(2) rule, bit for bit.
  auto rule = split_nano_batches(b, 128, 0);
  auto plain = split_nano_batches(b, 128);
  ASSERT_TRUE(rule.ok() && plain.ok());
  EXPECT_EQ(rule->cuts, plain->cuts);
  EXPECT_EQ(rule->batch.per_rank, plain->batch.per_rank);
  for (const double bad : {-0.1, 1.5, std::nan("")}) {
    auto r = split_nano_batches(b, 128, bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("cut fraction"), std::string::npos);
  }
}

TEST(NanoSplit, RefusesBadInput) {
  Batch b;
  b.ranks = 1;
  b.tokens_per_rank = 10;
  b.per_rank = {{{0, 0, 5, 10}}};  // rows [5, 10) missing
  EXPECT_FALSE(split_nano_batches(b, 1).ok());
  b.per_rank = {{{0, 0, 10, 10}}};
  auto bad = split_nano_batches(b, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--align-rows"), std::string::npos) << bad.status().to_string();
}

// schedule_nano_batches (the trainer's and the simulator's planning): ping tasks end at or
// before their document's cut and pong tasks start at or after it; the whole list is the two
// halves in the scheduler's order (each task's ping part first); every document's query rows
// [0, L) are covered exactly once; schedulers that keep the split's pieces need no cut.
TEST(NanoSchedule, TasksAreTheScheduleCutAtTheNanoCut) {
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const Batch b = test::random_batch(seed, test::TestLayout::kScattered, 8, 300);
    for (const char* name : {"cad", "colocated"}) {
      SCOPED_TRACE(std::string(name) + " seed " + std::to_string(seed));
      ScheduleOptions o;
      o.model = test::test_model();
      o.align_rows = 16;
      auto ns = schedule_nano_batches(b, parse_scheduler(name).value(), o);
      ASSERT_TRUE(ns.ok()) << ns.status().to_string();
      std::vector<TaskPlacement> merged;
      size_t i0 = 0, i1 = 0;
      for (const TaskPlacement& t : ns->full) {
        const int64_t cut = ns->split.cut_of(t.doc);
        const bool ping = t.q_end <= cut;
        EXPECT_TRUE(ping || t.q_begin >= cut);
        const auto& list = ns->nano[ping ? 0 : 1];
        size_t& at = ping ? i0 : i1;
        ASSERT_LT(at, list.size());
        EXPECT_EQ(list[at++], t);
      }
      EXPECT_EQ(i0, ns->nano[0].size());
      EXPECT_EQ(i1, ns->nano[1].size());
      std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> rows;
      for (const TaskPlacement& t : ns->full) rows[t.doc].emplace_back(t.q_begin, t.q_end);
      for (auto& [doc, ranges] : rows) {
        std::sort(ranges.begin(), ranges.end());
        int64_t next = 0;
        for (const auto& [a, e] : ranges) {
          EXPECT_EQ(a, next) << "doc " << doc;
          next = e;
        }
      }
      std::map<int64_t, int64_t> doc_len;
      for (const auto& pieces : b.per_rank) {
        for (const Piece& p : pieces) doc_len[p.doc] = p.doc_len;
      }
      EXPECT_EQ(rows.size(), doc_len.size());
      for (const auto& [doc, ranges] : rows) EXPECT_EQ(ranges.back().second, doc_len[doc]) << "doc " << doc;
      EXPECT_EQ(ns->full, ns->scheduled);
    }
  }
}

}  // namespace
}  // namespace distca
