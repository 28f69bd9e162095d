// A complete plan costs O(tasks + ranks + blocks), never O(ranks^2): checked without timing,
// by counting what build_plan allocates (this program replaces the global operator new) and
// what the plan holds, on batches of the same per-rank shape at growing rank counts. A dense
// [ranks] array per rank and exchange, a [documents] scratch reset per server or an
// allocation per row would each break these bounds by orders of magnitude at 1024 ranks.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "distca/data/workload.h"
#include "distca/plan/plan.h"
#include "plan_test_util.h"

namespace {
// Single-threaded counters (the tests below run one plan at a time on this thread).
size_t g_allocs = 0;
size_t g_bytes = 0;
}  // namespace

void* operator new(std::size_t n) {
  ++g_allocs;
  g_bytes += n;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// The array forms too: a sanitizer's runtime may provide its own, which would not count.
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace distca {
namespace {

struct Cost {
  size_t allocs = 0, bytes = 0;  // during build_plan
  int64_t tasks = 0, ranks = 0, blocks = 0;
  size_t peer_entries = 0;       // PeerVector entries over every exchange of every rank
};

Cost measure(const Batch& b, const SchedulerSpec& spec) {
  ScheduleOptions o;
  o.model = test::test_model();
  auto s = run_scheduler(spec, b, o);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  Cost c;
  const PlanSize z = plan_size(*s);
  c.tasks = z.tasks;
  c.ranks = b.ranks;
  c.blocks = z.q_blocks + z.kv_blocks;
  const size_t a0 = g_allocs, b0 = g_bytes;
  auto plan = build_plan(*s, b, spec, o);
  c.allocs = g_allocs - a0;
  c.bytes = g_bytes - b0;
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  for (const RankPlan& rp : plan->ranks) {
    for (const Exchange& e : rp.exchanges) {
      c.peer_entries += e.send_counts.entries().size() + e.send_displs.entries().size() +
                        e.recv_counts.entries().size() + e.recv_displs.entries().size() +
                        e.send_blocks.entries().size() + e.recv_blocks.entries().size();
    }
  }
  return c;
}

Batch batch(const char* dist, int64_t ranks) {
  WorkloadOptions w;
  w.dist = dist;
  w.ranks = ranks;
  w.tokens_per_rank = 16384;
  w.seed = 3;
  auto bs = make_batches(w);
  EXPECT_TRUE(bs.ok()) << bs.status().to_string();
  return bs->front();
}

// Bounds per unit, about twice what build_plan needs today (measured: at most 6 allocations
// and 500 bytes per task, block and rank together on these batches): they catch a change in
// complexity, not a few percent.
constexpr double kAllocsPerUnit = 12;
constexpr double kBytesPerUnit = 1200;
constexpr double kBytesPerRank = 8192;  // six exchanges and a server per rank

void check(const Cost& c, const std::string& what) {
  if (std::getenv("DISTCA_TEST_VERBOSE") != nullptr) {
    std::printf("%s: tasks %lld ranks %lld blocks %lld allocs %zu bytes %zu entries %zu\n", what.c_str(),
                static_cast<long long>(c.tasks), static_cast<long long>(c.ranks), static_cast<long long>(c.blocks),
                c.allocs, c.bytes, c.peer_entries);
  }
  const double units = static_cast<double>(c.tasks + c.ranks + c.blocks);
  EXPECT_LE(static_cast<double>(c.allocs), kAllocsPerUnit * units) << what << ": " << c.allocs << " allocations";
  EXPECT_LE(static_cast<double>(c.bytes), kBytesPerUnit * units + kBytesPerRank * static_cast<double>(c.ranks))
      << what << ": " << c.bytes << " bytes";
  // Exact structure: an exchange has one entry per peer it moves rows with in each of its six
  // per-peer vectors, and the 4 q-like and 2 kv-like exchanges hold at most one peer per block
  // on each side.
  EXPECT_LE(c.peer_entries, static_cast<size_t>(6 * 2 * 4 * c.blocks)) << what;
}

TEST(PlanLinear, AllocationsAndBytesLinearInTasksRanksAndBlocks) {
  for (const char* dist : {"pretrain", "prolong"}) {
    for (int64_t ranks : {16, 128, 1024}) {
      const Batch b = batch(dist, ranks);
      for (SchedulerKind k : {SchedulerKind::kCad, SchedulerKind::kColocated}) {
        check(measure(b, SchedulerSpec{k, 1}), std::string(dist) + " " + std::to_string(ranks) + " ranks " +
                                                    SchedulerSpec{k, 1}.name());
      }
    }
  }
}

// Growing the cluster 64x at a fixed per-rank shape grows the cost per unit by little: a
// quadratic term would multiply it by about 64.
TEST(PlanLinear, CostPerUnitFlatFrom16To1024Ranks) {
  for (const char* dist : {"pretrain", "prolong"}) {
    const Cost small = measure(batch(dist, 16), SchedulerSpec{SchedulerKind::kCad, 1});
    const Cost large = measure(batch(dist, 1024), SchedulerSpec{SchedulerKind::kCad, 1});
    auto per_unit = [](const Cost& c, size_t v) {
      return static_cast<double>(v) / static_cast<double>(c.tasks + c.ranks + c.blocks);
    };
    EXPECT_LE(per_unit(large, large.allocs), 1.5 * per_unit(small, small.allocs)) << dist;
    EXPECT_LE(per_unit(large, large.bytes), 1.5 * per_unit(small, small.bytes)) << dist;
  }
}

// A colocated plan of documents that never cross a rank moves nothing: its exchanges hold no
// peer at all, however many ranks.
TEST(PlanLinear, ColocatedPlanHoldsNoPeerEntries) {
  const Cost c = measure(batch("fixed:1024", 1024), SchedulerSpec{SchedulerKind::kColocated, 1});
  EXPECT_EQ(c.tasks, 1024 * 16);
  EXPECT_EQ(c.peer_entries, 0u);
  EXPECT_EQ(c.blocks, 0);
}

}  // namespace
}  // namespace distca

namespace distca {
namespace {

// Up to two segments stay in place (no allocation); beyond, one block that grows by doubling.
// Copies, moves and comparisons behave like the std::vector it replaces.
TEST(PlanLinear, SegmentListKeepsTwoInPlaceAndActsLikeAVector) {
  std::vector<Segment> ref{{false, 0, 4}, {true, 7, 2}};
  for (int64_t i = 0; i < 9; ++i) ref.push_back({i % 2 == 0, 10 * i, i + 1});
  size_t a0 = g_allocs;
  SegmentList a;
  a.push_back(ref[0]);
  a.push_back(ref[1]);
  EXPECT_EQ(g_allocs - a0, 0u);
  for (size_t i = 2; i < ref.size(); ++i) a.push_back(ref[i]);
  EXPECT_EQ(g_allocs - a0, 3u);  // capacities 4, 8, 16
  ASSERT_EQ(a.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(a[i], ref[i]);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), ref.begin(), ref.end()));
  const SegmentList copy = a;
  EXPECT_TRUE(copy == a);
  SegmentList moved = std::move(a);
  EXPECT_TRUE(moved == copy);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): a moved-from list is empty
  SegmentList small{{false, 1, 1}};
  a0 = g_allocs;
  SegmentList small_copy = small;
  SegmentList small_moved = std::move(small_copy);
  EXPECT_EQ(g_allocs - a0, 0u);
  EXPECT_TRUE(small_moved == small);
  EXPECT_FALSE(small_moved == copy);
  small_moved = copy;  // in place -> heap
  EXPECT_TRUE(small_moved == copy);
  small_moved = small;  // heap -> fewer segments, keeps its block
  EXPECT_TRUE(small_moved == small);
  EXPECT_EQ(small_moved.back(), (Segment{false, 1, 1}));
  for (Segment& s : small_moved) s.len = 5;
  EXPECT_EQ(small_moved[0].len, 5);
}

}  // namespace
}  // namespace distca
