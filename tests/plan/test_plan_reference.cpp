// build_plan against an independent, naive construction of the same plan, written straight
// from plan.h's definitions with maps and dense [ranks] vectors (quadratic in ranks, fine for
// small batches): every server's tasks, offsets, segments and cu_seqlens and every rank's six
// exchanges must be equal, and the figures equal the shared rules (compute_traffic,
// server_loads). Also: make_plan (which hands its schedule's batch over and checks the batch
// once) equals run_scheduler + build_plan, and the document index and the batch check give
// the same answers whether ids are dense (table look-ups) or sparse (binary search).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "distca/data/workload.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/plan.h"
#include "distca/plan/traffic.h"
#include "distca/plan/validate.h"
#include "plan_test_util.h"

namespace distca {
namespace {

struct Run {
  int64_t begin, end, rank, local;
};

using Dense = std::vector<std::vector<RowBlock>>;  // [peer][blocks]

struct RefRank {
  Dense send[kNumExchanges], recv[kNumExchanges];
};

// The runs of every document from the batch itself (not DocumentIndex), sorted by begin.
std::map<int64_t, std::vector<Run>> runs_of(const Batch& b) {
  std::map<int64_t, std::vector<Run>> out;
  for (int64_t r = 0; r < b.ranks; ++r) {
    int64_t local = 0;
    for (const Piece& p : b.per_rank[static_cast<size_t>(r)]) {
      out[p.doc].push_back({p.offset, p.offset + p.len, r, local});
      local += p.len;
    }
  }
  for (auto& [d, v] : out) std::sort(v.begin(), v.end(), [](const Run& a, const Run& c) { return a.begin < c.begin; });
  return out;
}

int64_t rows(const std::vector<RowBlock>& v) {
  int64_t n = 0;
  for (const RowBlock& b : v) n += b.rows();
  return n;
}

// A dense per-peer direction as the sparse Exchange fields (counts, prefix displacements
// where rows move, 0 elsewhere).
void to_sparse(const Dense& d, PeerVector<std::vector<RowBlock>>& blocks, PeerVector<int64_t>& counts,
               PeerVector<int64_t>& displs) {
  const size_t n = d.size();
  blocks = PeerVector<std::vector<RowBlock>>(n);
  counts = PeerVector<int64_t>(n);
  displs = PeerVector<int64_t>(n);
  int64_t at = 0;
  for (size_t p = 0; p < n; ++p) {
    if (d[p].empty()) continue;
    blocks.mut(p) = d[p];
    counts.mut(p) = rows(d[p]);
    displs.mut(p) = at;
    at += rows(d[p]);
  }
}

struct Reference {
  std::vector<ServerPlan> servers;
  std::vector<RankPlan> ranks;
};

Reference naive_plan(const Schedule& s, const ScheduleOptions& o) {
  const Batch& b = s.batch;
  const auto R = static_cast<size_t>(b.ranks);
  const auto runs = runs_of(b);
  const RowBytes rb = row_bytes(o.model, o.dtype_bytes);
  std::vector<RefRank> rr(R);
  for (auto& x : rr) {
    for (int k = 0; k < kNumExchanges; ++k) x.send[k].assign(R, {}), x.recv[k].assign(R, {});
  }
  Reference ref;
  ref.servers.assign(R, {});
  for (const TaskPlacement& t : s.tasks) ref.servers[static_cast<size_t>(t.server)].tasks.push_back({t, 0, {}});
  const int kq = static_cast<int>(ExchangeKind::kQ), kkv = static_cast<int>(ExchangeKind::kKv);
  for (size_t sv = 0; sv < R; ++sv) {
    auto& tasks = ref.servers[sv].tasks;
    for (const ServerTask& st : tasks) {
      const TaskPlacement& t = st.task;
      if (t.home == static_cast<int64_t>(sv)) continue;
      rr[sv].recv[kq][static_cast<size_t>(t.home)].push_back({t.doc, t.q_begin, t.q_end});
      rr[static_cast<size_t>(t.home)].send[kq][sv].push_back({t.doc, t.q_begin, t.q_end});
    }
    std::vector<int64_t> order;
    std::map<int64_t, int64_t> top;
    for (const ServerTask& st : tasks) {
      if (!top.count(st.task.doc)) order.push_back(st.task.doc);
      top[st.task.doc] = std::max(top[st.task.doc], st.task.q_end);
    }
    for (int64_t doc : order) {
      for (const Run& run : runs.at(doc)) {
        if (run.begin >= top[doc] || run.rank == static_cast<int64_t>(sv)) continue;
        const RowBlock blk{doc, run.begin, std::min(run.end, top[doc])};
        rr[sv].recv[kkv][static_cast<size_t>(run.rank)].push_back(blk);
        rr[static_cast<size_t>(run.rank)].send[kkv][sv].push_back(blk);
      }
    }
  }
  const int64_t row_b[kNumExchanges] = {rb.q, rb.kv, rb.o + rb.lse, rb.o, rb.q, rb.kv};
  ref.ranks.assign(R, {});
  for (size_t r = 0; r < R; ++r) {
    RefRank& x = rr[r];
    const int ko = static_cast<int>(ExchangeKind::kOLse), kdo = static_cast<int>(ExchangeKind::kDO);
    const int kdq = static_cast<int>(ExchangeKind::kDQ), kdkv = static_cast<int>(ExchangeKind::kDKv);
    x.send[ko] = x.recv[kq], x.recv[ko] = x.send[kq];
    x.send[kdq] = x.recv[kq], x.recv[kdq] = x.send[kq];
    x.send[kdo] = x.send[kq], x.recv[kdo] = x.recv[kq];
    x.send[kdkv] = x.recv[kkv], x.recv[kdkv] = x.send[kkv];
    RankPlan& rp = ref.ranks[r];
    rp.tokens = b.rank_tokens(static_cast<int64_t>(r));
    for (int k = 0; k < kNumExchanges; ++k) {
      Exchange& e = rp.exchanges[static_cast<size_t>(k)];
      e.row_bytes = row_b[k];
      to_sparse(x.send[k], e.send_blocks, e.send_counts, e.send_displs);
      to_sparse(x.recv[k], e.recv_blocks, e.recv_counts, e.recv_displs);
    }
  }
  // Task inputs: the row of a received block is found by walking the receive buffer.
  for (size_t sv = 0; sv < R; ++sv) {
    ServerPlan& sp = ref.servers[sv];
    auto find = [&](int kind, int64_t peer, int64_t doc, int64_t begin) {
      int64_t at = 0;
      for (size_t p = 0; p < R; ++p) {
        for (const RowBlock& blk : rr[sv].recv[kind][p]) {
          if (static_cast<int64_t>(p) == peer && blk.doc == doc && blk.begin == begin) return at;
          at += blk.rows();
        }
      }
      ADD_FAILURE() << "block not found";
      return int64_t{-1};
    };
    sp.cu_seqlens_q = {0};
    sp.cu_seqlens_k = {0};
    for (ServerTask& st : sp.tasks) {
      const TaskPlacement& t = st.task;
      for (const Run& run : runs.at(t.doc)) {
        if (t.home == static_cast<int64_t>(sv) && run.begin <= t.q_begin && t.q_begin < run.end) {
          st.q_offset = run.local + (t.q_begin - run.begin);
        }
      }
      if (t.home != static_cast<int64_t>(sv)) st.q_offset = find(kq, t.home, t.doc, t.q_begin);
      for (const Run& run : runs.at(t.doc)) {
        if (run.begin >= t.q_end) break;
        const int64_t len = std::min(run.end, t.q_end) - run.begin;
        const bool recv = run.rank != static_cast<int64_t>(sv);
        const int64_t off = recv ? find(kkv, run.rank, t.doc, run.begin) : run.local;
        if (!st.kv.empty() && st.kv.back().received == recv && st.kv.back().offset + st.kv.back().len == off) {
          st.kv.back().len += len;
        } else {
          st.kv.push_back({recv, off, len});
        }
      }
      sp.cu_seqlens_q.push_back(sp.cu_seqlens_q.back() + static_cast<int32_t>(t.q_end - t.q_begin));
      sp.cu_seqlens_k.push_back(sp.cu_seqlens_k.back() + static_cast<int32_t>(t.q_end));
      sp.load += task_cost(o.cost, t.q_end - t.q_begin, t.q_end);
    }
  }
  return ref;
}

std::vector<SchedulerSpec> specs(int64_t ranks) {
  std::vector<SchedulerSpec> v{{SchedulerKind::kColocated, 1}, {SchedulerKind::kWlb, 1},
                               {SchedulerKind::kCad, 1}, {SchedulerKind::kCadSymmetric, 1}};
  if (ranks % 2 == 0) v.push_back({SchedulerKind::kPerCp, 2});
  return v;
}

void expect_plan_equal(const Plan& a, const Plan& b, const std::string& what) {
  EXPECT_TRUE(a.batch == b.batch) << what;
  EXPECT_TRUE(a.servers == b.servers) << what;
  EXPECT_TRUE(a.ranks == b.ranks) << what;
  EXPECT_TRUE(a.metrics == b.metrics) << what;
}

// The naive plan, the figures by the shared rules, and make_plan == run_scheduler + build_plan.
void check_batch(const Batch& b, const ScheduleOptions& o, const std::string& what) {
  for (const SchedulerSpec& spec : specs(b.ranks)) {
    const std::string w = what + " " + spec.name();
    auto s = run_scheduler(spec, b, o);
    ASSERT_TRUE(s.ok()) << w << ": " << s.status().to_string();
    auto plan = build_plan(*s, b, spec, o);
    ASSERT_TRUE(plan.ok()) << w << ": " << plan.status().to_string();
    const Reference ref = naive_plan(*s, o);
    ASSERT_EQ(plan->servers.size(), ref.servers.size()) << w;
    for (size_t r = 0; r < ref.servers.size(); ++r) {
      ASSERT_TRUE(plan->servers[r] == ref.servers[r]) << w << " server " << r;
      ASSERT_TRUE(plan->ranks[r] == ref.ranks[r]) << w << " rank " << r;
    }
    const Traffic t = compute_traffic(DocumentIndex(s->batch), s->tasks, plan->row_bytes);
    EXPECT_TRUE(plan->metrics.traffic == t) << w;
    EXPECT_EQ(plan->metrics.loads, server_loads(b.ranks, s->tasks, o.cost)) << w;
    EXPECT_TRUE(plan->batch == s->batch) << w;
    auto made = make_plan(b, spec, o);
    ASSERT_TRUE(made.ok()) << w;
    expect_plan_equal(*made, *plan, w + " make_plan");
    const Status v = validate_plan(*plan, b, o.cost);
    EXPECT_TRUE(v.ok()) << w << ": " << v.to_string();
  }
}

// The same batch with document ids spread far apart (the sparse paths of DocumentIndex and
// Batch::validate).
Batch spread_ids(const Batch& b) {
  Batch out = b;
  for (auto& rank : out.per_rank) {
    for (Piece& p : rank) p.doc = p.doc * 1000003 + 17;
  }
  return out;
}

TEST(PlanReference, SmallRandomBatchesMatchTheNaiveConstruction) {
  ScheduleOptions o;
  o.model = test::test_model();
  for (uint64_t seed = 0; seed < 160; ++seed) {
    const Batch b = test::random_batch(seed + 4100, seed % 2 ? test::TestLayout::kScattered
                                                             : test::TestLayout::kContiguous);
    o.tolerance = 0.05 * static_cast<double>(seed % 3);
    o.align_rows = seed % 5 == 0 ? 4 : 1;
    check_batch(b, o, "seed " + std::to_string(seed));
    if (seed % 4 == 0) check_batch(spread_ids(b), o, "spread seed " + std::to_string(seed));
  }
}

TEST(PlanReference, GeneratedWorkloadsMatchTheNaiveConstruction) {
  ScheduleOptions o;
  o.model = test::test_model();
  for (const char* dist : {"prolong", "pretrain"}) {
    for (Layout layout : {Layout::kContiguous, Layout::kHeadTail}) {
      WorkloadOptions w;
      w.dist = dist;
      w.ranks = 16;
      w.tokens_per_rank = 8192;
      w.layout = layout;
      w.batches = 2;
      w.seed = 5;
      auto batches = make_batches(w);
      ASSERT_TRUE(batches.ok()) << batches.status().to_string();
      for (size_t i = 0; i < batches->size(); ++i) {
        check_batch((*batches)[i], o, std::string(dist) + (layout == Layout::kHeadTail ? " head-tail " : " contiguous ") + std::to_string(i));
      }
    }
  }
}

// Dense ids (table) and sparse ids (binary search) index the same runs; ids in the gaps and
// outside the range are unknown.
TEST(PlanReference, DocumentIndexDenseAndSparseIdsAgree) {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const Batch b = test::random_batch(seed + 77, seed % 2 ? test::TestLayout::kScattered : test::TestLayout::kContiguous);
    const Batch sp = spread_ids(b);
    const DocumentIndex di(b), si(sp);
    ASSERT_EQ(di.doc_ids().size(), si.doc_ids().size());
    ASSERT_EQ(di.num_runs(), si.num_runs());
    for (size_t s = 0; s < di.doc_ids().size(); ++s) {
      const int64_t id = di.doc_ids()[s];
      ASSERT_EQ(si.doc_ids()[s], id * 1000003 + 17);
      ASSERT_EQ(di.slot(id), static_cast<int64_t>(s));
      ASSERT_EQ(si.slot(id * 1000003 + 17), static_cast<int64_t>(s));
      EXPECT_EQ(si.slot(id * 1000003 + 18), -1);
      const auto a = di.runs(id), c = si.runs(id * 1000003 + 17);
      ASSERT_TRUE(std::equal(a.begin(), a.end(), c.begin(), c.end())) << seed;
      EXPECT_EQ(di.first_run(static_cast<int64_t>(s)), si.first_run(static_cast<int64_t>(s)));
      for (int64_t pos = 0; pos < di.doc_len(id); ++pos) {
        const HeldRun& r = di.run_at(id, pos);
        EXPECT_TRUE(r.begin <= pos && pos < r.end);
        EXPECT_EQ(di.local_row(r.rank, id, pos), r.local_row + pos - r.begin);
      }
    }
    EXPECT_EQ(di.slot(-5), -1);
    EXPECT_EQ(di.slot(di.doc_ids().back() + 1), -1);
    EXPECT_EQ(di.slot(di.doc_ids().front() - 1), -1);
  }
}

// Batch::validate's two grouping paths (dense ids: counting sort; sparse: a sort) find the same
// first fault, named the same way.
TEST(PlanReference, BatchCheckSameVerdictForDenseAndSparseIds) {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    Batch b = test::random_batch(seed + 555, seed % 2 ? test::TestLayout::kScattered : test::TestLayout::kContiguous);
    ASSERT_TRUE(b.validate().ok());
    Rng rng(seed, 3);
    // One fault in a random piece: a shifted offset, a shorter length or another doc_len.
    auto& rank = b.per_rank[rng.uniform_int(b.per_rank.size())];
    if (rank.empty()) continue;
    Piece& p = rank[rng.uniform_int(rank.size())];
    const int kind = static_cast<int>(seed % 3);
    if (kind == 0 && p.offset > 0) --p.offset;
    if (kind == 0 && p.offset == 0 && p.len > 1) ++p.offset, --p.len;
    if (kind == 1 && p.len > 1) --p.len;
    if (kind == 2) {
      ++p.doc_len;
    }
    const Status dense = b.validate(), sparse = spread_ids(b).validate();
    ASSERT_EQ(dense.ok(), sparse.ok()) << seed;
    if (dense.ok()) continue;
    // The sparse message names the spread id: map it back before comparing.
    std::string msg = sparse.message();
    for (const auto& r : b.per_rank) {
      for (const Piece& q : r) {
        const std::string big = "document " + std::to_string(q.doc * 1000003 + 17) + " ";
        const auto at = msg.find(big);
        if (at != std::string::npos) msg.replace(at, big.size(), "document " + std::to_string(q.doc) + " ");
      }
    }
    EXPECT_EQ(msg, dense.message()) << seed;
  }
}

}  // namespace
}  // namespace distca
