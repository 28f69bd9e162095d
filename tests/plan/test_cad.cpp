// The communication-aware schedulers (`cad`, `cad-symmetric`): contract, validator, balance,
// byte accounting, determinism, bad inputs.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <map>
#include <numeric>

#include "distca/data/workload.h"
#include "distca/plan/cad.h"
#include "distca/plan/plan.h"
#include "distca/plan/traffic.h"
#include "distca/plan/validate.h"
#include "plan_test_util.h"

namespace distca {
namespace {

using test::TestLayout;

ScheduleOptions opts(double tol = 0.05) {
  ScheduleOptions o;
  o.model = test::test_model();
  o.tolerance = tol;
  return o;
}

using Scheduler = Result<Schedule> (*)(const Batch&, const ScheduleOptions&, CadStats*);
const Scheduler kSchedulers[] = {&schedule_cad, &schedule_cad_symmetric};
const char* kNames[] = {"cad", "cad-symmetric"};

// Our own contract check, independent of the validator: tasks inside one piece of their
// home, every document's rows covered exactly once, moved chunks and what stays at home
// >= kMinChunkRows unless the piece is shorter, loads equal the planner's figures.
void check_contract(const Batch& b, const Schedule& s, const CadStats& st, const ScheduleOptions& o) {
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> cover;
  for (const TaskPlacement& t : s.tasks) {
    ASSERT_LT(t.q_begin, t.q_end);
    const Piece* in = nullptr;
    for (const Piece& p : b.per_rank[static_cast<size_t>(t.home)]) {
      if (p.doc == t.doc && p.offset <= t.q_begin && t.q_end <= p.offset + p.len) in = &p;
    }
    ASSERT_NE(in, nullptr) << "task of doc " << t.doc << " not inside one piece of rank " << t.home;
    if (in->len >= kMinChunkRows) {
      ASSERT_GE(t.q_end - t.q_begin, kMinChunkRows) << "doc " << t.doc << " [" << t.q_begin << "," << t.q_end << ")";
    } else {
      ASSERT_EQ(t.q_end - t.q_begin, in->len);  // a short piece moves whole
    }
    cover[t.doc].emplace_back(t.q_begin, t.q_end);
  }
  std::map<int64_t, int64_t> lens;
  for (const auto& rank : b.per_rank) {
    for (const Piece& p : rank) lens[p.doc] = p.doc_len;
  }
  ASSERT_EQ(cover.size(), lens.size());
  for (auto& [doc, runs] : cover) {
    std::sort(runs.begin(), runs.end());
    int64_t pos = 0;
    for (const auto& [x, y] : runs) {
      ASSERT_EQ(x, pos) << "doc " << doc;
      pos = y;
    }
    ASSERT_EQ(pos, lens[doc]);
  }
  const auto loads = server_loads(b.ranks, s.tasks, o.cost);
  const double mx = *std::max_element(loads.begin(), loads.end());
  const double mn = *std::min_element(loads.begin(), loads.end());
  EXPECT_NEAR(mx, st.load_max, 1e-9 * std::max(1.0, mx));
  EXPECT_NEAR(mn, st.load_min, 1e-9 * std::max(1.0, mx));
  // Bytes: the planner's incremental count equals the from-scratch recount.
  const Traffic tr = compute_traffic(DocumentIndex(b), s.tasks, row_bytes(o.model, o.dtype_bytes));
  EXPECT_EQ(tr.bytes.forward(), st.bytes_incremental);
}

TEST(Cad, ContractAndValidatorOnThousandsOfTinyBatches) {
  // Tiny batches (<= 40 tokens per rank): every piece is shorter than 128 rows, so only whole
  // pieces move; scattered layouts put several pieces of one document on one rank.
  int64_t plans = 0;
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    const Batch b = test::random_batch(seed + 900, seed % 2 ? TestLayout::kScattered : TestLayout::kContiguous);
    const ScheduleOptions o = opts(seed % 3 == 0 ? 0.0 : 0.05);
    for (int k = 0; k < 2; ++k) {
      CadStats st;
      auto s = kSchedulers[k](b, o, &st);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      check_contract(b, *s, st, o);
      const SchedulerSpec spec{k == 0 ? SchedulerKind::kCad : SchedulerKind::kCadSymmetric, 1};
      auto plan = build_plan(*s, b, spec, o);
      ASSERT_TRUE(plan.ok()) << plan.status().to_string();
      const Status v = validate_plan(*plan, b, o.cost);
      ASSERT_TRUE(v.ok()) << kNames[k] << " seed " << seed << ": " << v.to_string();
      ++plans;
    }
  }
  EXPECT_EQ(plans, 2000);
}

// Batches large enough that chunks get split: uniform, pretrain and prolong documents, both
// layouts, 2 to 24 ranks, 4K to 32K tokens per rank.
std::vector<Batch> split_batches(uint64_t seed, int64_t count) {
  static const char* kDists[] = {"uniform:100:20000", "pretrain", "prolong", "fixed:3000"};
  std::vector<Batch> out;
  Rng rng(seed);
  for (int64_t i = 0; i < count; ++i) {
    WorkloadOptions w;
    w.dist = kDists[rng.uniform_int(4)];
    w.ranks = 2 + static_cast<int64_t>(rng.uniform_int(23));
    w.tokens_per_rank = 4096 << rng.uniform_int(4);
    w.layout = rng.bernoulli(0.5) ? Layout::kHeadTail : Layout::kContiguous;
    w.seed = seed * 1000 + static_cast<uint64_t>(i);
    auto b = make_batches(w);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    if (b.ok()) out.push_back(b->front());
  }
  return out;
}

// When is the band reachable? A move carries at least a 128-row chunk, worth up to
// 128 * doc_len pairs at the top of the longest document. When that is at most half the
// band's half-width (tol * mean / 2), a donor and a receiver can always meet inside the band.
// (Counter-example otherwise: 4K tokens per rank holding the top of an 8K document: one
// 128-row chunk is 17% of the mean, wider than a +-5% band.)
bool fine_grained(const Batch& b, double tol, int64_t chunk_rows = kMinChunkRows) {
  int64_t max_len = 0;
  double total = 0;
  for (const double l : colocated_loads(b, nullptr)) total += l;
  for (const auto& rank : b.per_rank) {
    for (const Piece& p : rank) max_len = std::max(max_len, p.doc_len);
  }
  return static_cast<double>(chunk_rows * max_len) <= tol * total / static_cast<double>(b.ranks) / 2;
}

TEST(Cad, ContractValidatorAndBalanceOnSplitBatches) {
  const auto batches = split_batches(1, 600);
  int64_t balanced = 0, checked = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    const Batch& b = batches[i];
    const ScheduleOptions o = opts(i % 5 == 0 ? 0.1 : 0.05);
    for (int k = 0; k < 2; ++k) {
      CadStats st;
      auto s = kSchedulers[k](b, o, &st);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      check_contract(b, *s, st, o);
      if (i % 4 == 0) {
        const SchedulerSpec spec{k == 0 ? SchedulerKind::kCad : SchedulerKind::kCadSymmetric, 1};
        auto plan = build_plan(*s, b, spec, o);
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        const Status v = validate_plan(*plan, b, o.cost);
        ASSERT_TRUE(v.ok()) << kNames[k] << " batch " << i << ": " << v.to_string();
      }
      if (k == 0 && fine_grained(b, o.tolerance)) {
        ++checked;
        const auto loads = server_loads(b.ranks, s->tasks, nullptr);
        const double mean = std::accumulate(loads.begin(), loads.end(), 0.0) / static_cast<double>(b.ranks);
        const double mx = *std::max_element(loads.begin(), loads.end());
        const double mn = *std::min_element(loads.begin(), loads.end());
        EXPECT_LE(mx, (1 + o.tolerance) * mean) << "batch " << i << " ranks " << b.ranks;
        EXPECT_GE(mn, (1 - o.tolerance) * mean) << "batch " << i << " ranks " << b.ranks;
        if (st.balanced) ++balanced;
      }
    }
  }
  EXPECT_EQ(balanced, checked);
  EXPECT_GE(checked, 200);  // the condition holds for a good part of the set
}

TEST(Cad, MovesFewerBytesThanSymmetricInAggregate) {
  // An invariant on the set, not on every batch: the median ratio and the total.
  WorkloadOptions w;
  w.dist = "prolong";
  w.ranks = 32;
  w.tokens_per_rank = 65536;
  w.batches = 24;
  w.seed = 7;
  auto batches = make_batches(w);
  ASSERT_TRUE(batches.ok());
  std::vector<double> ratio;
  int64_t cad_total = 0, sym_total = 0;
  for (const Batch& b : *batches) {
    CadStats a, s;
    ASSERT_TRUE(schedule_cad(b, opts(), &a).ok());
    ASSERT_TRUE(schedule_cad_symmetric(b, opts(), &s).ok());
    ASSERT_TRUE(a.balanced && s.balanced);
    ratio.push_back(static_cast<double>(a.bytes_incremental) / static_cast<double>(s.bytes_incremental));
    cad_total += a.bytes_incremental;
    sym_total += s.bytes_incremental;
  }
  std::sort(ratio.begin(), ratio.end());
  EXPECT_LT(ratio[ratio.size() / 2], 1.0);
  EXPECT_LT(cad_total, sym_total);
}

TEST(Cad, Deterministic) {
  const auto batches = split_batches(3, 20);
  for (const Batch& b : batches) {
    for (int k = 0; k < 2; ++k) {
      CadStats s1, s2;
      const Batch copy = b;
      auto a = kSchedulers[k](b, opts(), &s1);
      auto c = kSchedulers[k](copy, opts(), &s2);
      ASSERT_TRUE(a.ok() && c.ok());
      EXPECT_EQ(a->tasks, c->tasks);
      EXPECT_EQ(s1.bytes_incremental, s2.bytes_incremental);
    }
  }
}

// The planner maps document ids to slots in order of first appearance (the packer's ids
// 0, 1, ... are used as they are; other ids through a dense table or a sorted list), and
// `cad` reuses its per-thread state from one call to the next. Neither may change a plan:
// relabelled ids give the same tasks under the same relabelling, whatever was planned before.
TEST(Cad, SameTasksWhateverTheDocumentIdsAndThePreviousBatch) {
  const auto batches = split_batches(11, 24);
  ASSERT_FALSE(batches.empty());
  for (size_t i = 0; i < batches.size(); ++i) {
    const Batch& b = batches[i];
    // Three labellings: as packed (ids 0, 1, ... in order), reversed (small, not in order:
    // the dense table), spread far apart (the sorted list).
    int64_t max_id = 0;
    for (const auto& ps : b.per_rank) {
      for (const Piece& p : ps) max_id = std::max(max_id, p.doc);
    }
    auto relabel = [&](int mode, int64_t id) {
      return mode == 0 ? id : mode == 1 ? max_id - id : id * 1000003 + 7;
    };
    std::vector<TaskPlacement> first;
    int64_t first_bytes = 0;
    for (int mode = 0; mode < 3; ++mode) {
      Batch r = b;
      for (auto& ps : r.per_rank) {
        for (Piece& p : ps) p.doc = relabel(mode, p.doc);
      }
      // Something else planned in between (larger or smaller) leaves the reused state behind.
      CadStats other;
      ASSERT_TRUE(schedule_cad(batches[(i + 1 + static_cast<size_t>(mode)) % batches.size()], opts(), &other).ok());
      CadStats st;
      auto s = schedule_cad(r, opts(), &st);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      std::vector<TaskPlacement> tasks = s->tasks;
      std::map<int64_t, int64_t> back;
      for (const auto& ps : b.per_rank) {
        for (const Piece& p : ps) back[relabel(mode, p.doc)] = p.doc;
      }
      for (TaskPlacement& t : tasks) {
        ASSERT_TRUE(back.count(t.doc)) << "unknown document " << t.doc;
        t.doc = back[t.doc];
      }
      if (mode == 0) {
        first = tasks;
        first_bytes = st.bytes_incremental;
      } else {
        EXPECT_EQ(tasks, first) << "batch " << i << " labelling " << mode;
        EXPECT_EQ(st.bytes_incremental, first_bytes);
      }
    }
  }
}

TEST(Cad, StartsFromColocatedAndKeepsBalancedBatchesAtHome) {
  // Every rank holds one document of the same length: already balanced, nothing moves.
  Batch b;
  b.ranks = 4;
  b.tokens_per_rank = 1000;
  for (int64_t r = 0; r < 4; ++r) b.per_rank.push_back({{r, 0, 1000, 1000}});
  for (int k = 0; k < 2; ++k) {
    CadStats st;
    auto s = kSchedulers[k](b, opts(), &st);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(st.moves, 0);
    for (const auto& t : s->tasks) EXPECT_EQ(t.home, t.server);
  }
}

// A cost with a per-row overhead (so splitting a task raises the total, like a profiled table
// whose short shards run below peak).
class OverheadCost final : public AttentionCostModel {
 public:
  double task_cost(int64_t q_len, int64_t kv_len) const override {
    return static_cast<double>(task_pairs(q_len, kv_len)) + 2000.0 * static_cast<double>(q_len) +
           (q_len > 0 ? 5e5 : 0.0);
  }
  std::string unit() const override { return "seconds"; }
};

TEST(Cad, BalancesANonPairsCostModel) {
  const OverheadCost cost;
  const auto batches = split_batches(5, 60);
  int64_t checked = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    ScheduleOptions o = opts();
    o.cost = &cost;
    CadStats st;
    auto s = schedule_cad(batches[i], o, &st);
    ASSERT_TRUE(s.ok());
    check_contract(batches[i], *s, st, o);
    const auto loads = server_loads(batches[i].ranks, s->tasks, &cost);
    const double mean = std::accumulate(loads.begin(), loads.end(), 0.0) / static_cast<double>(loads.size());
    if (fine_grained(batches[i], o.tolerance)) {
      ++checked;
      EXPECT_LE(*std::max_element(loads.begin(), loads.end()), 1.05 * mean) << "batch " << i;
      EXPECT_GE(*std::min_element(loads.begin(), loads.end()), 0.95 * mean) << "batch " << i;
    }
    auto plan = build_plan(*s, batches[i], SchedulerSpec{SchedulerKind::kCad, 1}, o);
    ASSERT_TRUE(plan.ok());
    EXPECT_TRUE(validate_plan(*plan, batches[i], &cost).ok());
  }
  EXPECT_GE(checked, 15);
}

// ScheduleOptions::align_rows: every cut cad makes inside a piece lies on the grid; the ends
// of pieces (where packing put them) are the only off-grid task boundaries. The band is still
// reached where a grid step of rows is fine enough, and align_rows 1 is the unaligned planner.
TEST(Cad, AlignedCutsStayOnTheGridAndStillBalance) {
  const auto batches = split_batches(5, 160);
  int64_t checked = 0, cuts = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    const Batch& b = batches[i];
    const int64_t align = int64_t{16} << (i % 5);  // 16 .. 256
    ScheduleOptions o = opts();
    o.align_rows = align;
    CadStats st;
    auto s = schedule_cad(b, o, &st);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    check_contract(b, *s, st, o);
    std::set<std::pair<int64_t, int64_t>> piece_ends;  // (doc, row): piece starts and ends
    for (const auto& rank : b.per_rank) {
      for (const Piece& p : rank) {
        piece_ends.emplace(p.doc, p.offset);
        piece_ends.emplace(p.doc, p.offset + p.len);
      }
    }
    for (const TaskPlacement& t : s->tasks) {
      for (const int64_t row : {t.q_begin, t.q_end}) {
        if (piece_ends.count({t.doc, row})) continue;
        ++cuts;
        ASSERT_EQ(row % align, 0) << "batch " << i << " doc " << t.doc << " cut at " << row << ", align " << align;
      }
    }
    if (fine_grained(b, o.tolerance, std::max(kMinChunkRows, align))) {
      ++checked;
      EXPECT_TRUE(st.balanced) << "batch " << i << " align " << align;
    }
    ScheduleOptions one = opts();
    one.align_rows = 1;
    auto u = schedule_cad(b, one, nullptr);
    auto d = schedule_cad(b, opts(), nullptr);
    ASSERT_TRUE(u.ok() && d.ok());
    EXPECT_EQ(u->tasks, d->tasks);  // 1 is the default
  }
  EXPECT_GE(cuts, 500);  // the grid was exercised
  EXPECT_GE(checked, 40);
  // The skewed case of `distca bench step`: one 16K document against sixteen 1K ones. The
  // only cut lands on the 256-row grid and the band still holds.
  Batch skew;
  skew.ranks = 2;
  skew.tokens_per_rank = 16384;
  skew.per_rank.resize(2);
  skew.per_rank[0].push_back({0, 0, 16384, 16384});
  for (int64_t d = 1; d <= 16; ++d) skew.per_rank[1].push_back({d, 0, 1024, 1024});
  ScheduleOptions o = opts();
  o.align_rows = 256;
  CadStats st;
  auto s = schedule_cad(skew, o, &st);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(st.balanced);
  for (const TaskPlacement& t : s->tasks) {
    if (t.doc == 0) {
      EXPECT_EQ(t.q_begin % 256, 0);
      EXPECT_TRUE(t.q_end == 16384 || t.q_end % 256 == 0);
    }
  }
}

TEST(Cad, ToleranceSweepNeverBreaksTheBand) {
  const auto batches = split_batches(9, 12);
  for (double tol : {0.0, 0.02, 0.15, 0.3}) {
    for (const Batch& b : batches) {
      CadStats st;
      auto s = schedule_cad(b, opts(tol), &st);
      ASSERT_TRUE(s.ok());
      // A move never lifts a server above hi nor drops one below lo, so whatever could not be
      // balanced stays where the colocated start had it: the band is never overshot by moves.
      const auto before = colocated_loads(b, nullptr);
      const double mx0 = *std::max_element(before.begin(), before.end());
      EXPECT_LE(st.load_max, std::max(mx0, (1 + tol) * st.mean) * (1 + 1e-12));
      if (tol > 0 && fine_grained(b, tol)) {
        EXPECT_TRUE(st.balanced) << "tol " << tol;
      }
    }
  }
}

// Coarse batches (4096 tokens per rank, documents up to a rank's tokens, cuts on the 128-row
// query-tile grid: `bench train --compare` at DP 4): one chunk at the top of a long document
// is up to 20% of the mean, so a band-0 greedy from the colocated start, every move capped at
// the mean, stopped at a worst batch of 1.12 max/mean, worse than tolerance 0.05's 1.04. The
// tightening candidate (docs/scheduler.md) makes a narrower tolerance either reach its band or
// end no less balanced than 0.05 on every batch, and tolerances up to 0.01 reach 1.02.
TEST(Cad, NarrowToleranceBalancesCoarseBatchesAtLeastAsWellAsWide) {
  auto batches = make_batches(
      {.dist = "pretrain", .ranks = 4, .tokens_per_rank = 4096, .max_doc_len = 4096, .batches = 20, .seed = 1});
  ASSERT_TRUE(batches.ok());
  double worst_narrow = 0;
  for (const Batch& b : *batches) {
    ScheduleOptions wide = opts(0.05);
    wide.align_rows = 128;
    CadStats ws;
    ASSERT_TRUE(schedule_cad(b, wide, &ws).ok());
    for (const double tol : {0.0, 0.01, 0.02}) {
      ScheduleOptions o = opts(tol);
      o.align_rows = 128;
      CadStats st;
      auto s = schedule_cad(b, o, &st);
      ASSERT_TRUE(s.ok());
      check_contract(b, *s, st, o);  // the replayed winner's loads and bytes are the planner's
      // Inside its own band, or no less balanced than 0.05 where granularity forbids the band.
      EXPECT_LE(st.load_max, std::max(ws.load_max, (1 + tol) * st.mean) * (1 + 1e-12)) << "tolerance " << tol;
      if (tol <= 0.01) worst_narrow = std::max(worst_narrow, st.load_max / st.mean);
    }
  }
  EXPECT_LE(worst_narrow, 1.02);
}

TEST(Cad, RefusesBadInputs) {
  const Batch good = test::random_batch(3, TestLayout::kContiguous);
  for (int k = 0; k < 2; ++k) {
    ScheduleOptions o = opts();
    o.tolerance = -0.1;
    auto r = kSchedulers[k](good, o, nullptr);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("--tolerance"), std::string::npos);
    o = opts();
    o.tolerance = std::nan("");
    EXPECT_FALSE(kSchedulers[k](good, o, nullptr).ok());
    o = opts();
    o.align_rows = 0;
    EXPECT_NE(kSchedulers[k](good, o, nullptr).status().message().find("--align-rows"), std::string::npos);
    o = opts();
    o.dtype_bytes = 3;
    EXPECT_NE(kSchedulers[k](good, o, nullptr).status().message().find("--dtype"), std::string::npos);
    o = opts();
    o.model.n_kv_heads = 3;
    EXPECT_NE(kSchedulers[k](good, o, nullptr).status().message().find("--model"), std::string::npos);

    Batch gap;
    gap.ranks = 2;
    gap.tokens_per_rank = 10;
    gap.per_rank = {{{7, 0, 4, 10}}, {{7, 5, 5, 10}}};
    auto g = kSchedulers[k](gap, opts(), nullptr);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("document 7"), std::string::npos) << g.status().message();
    Batch overlap = gap;
    overlap.per_rank[1][0] = {7, 3, 7, 10};
    EXPECT_FALSE(kSchedulers[k](overlap, opts(), nullptr).ok());
    Batch incons = gap;
    incons.per_rank[1][0] = {7, 4, 6, 11};
    EXPECT_FALSE(kSchedulers[k](incons, opts(), nullptr).ok());
    Batch full = gap;
    full.per_rank[1][0] = {7, 4, 6, 10};
    full.tokens_per_rank = 5;
    EXPECT_FALSE(kSchedulers[k](full, opts(), nullptr).ok());
    Batch ranks = gap;
    ranks.ranks = 3;
    EXPECT_FALSE(kSchedulers[k](ranks, opts(), nullptr).ok());
  }
  // The dispatcher reaches both.
  EXPECT_TRUE(run_scheduler(SchedulerSpec{SchedulerKind::kCad, 1}, good, opts()).ok());
  EXPECT_TRUE(run_scheduler(SchedulerSpec{SchedulerKind::kCadSymmetric, 1}, good, opts()).ok());
}

TEST(Cad, BenchPlanRefusesBadInputBeforeAnyWork) {
  const std::string out = (std::filesystem::temp_directory_path() / "distca_test_bench_plan.json").string();
  std::filesystem::remove(out);
  for (const std::string args : {"--batches 0", "--tolerance 2", "--layout zigzag", "--model nope"}) {
    const std::string cmd = std::string(DISTCA_CLI) + " bench plan " + args + " --json " + out + " 2>/dev/null";
    const int rc = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(rc)) << cmd;
    EXPECT_EQ(WEXITSTATUS(rc), 2) << cmd;
    EXPECT_FALSE(std::filesystem::exists(out)) << cmd;
  }
}

}  // namespace
}  // namespace distca
