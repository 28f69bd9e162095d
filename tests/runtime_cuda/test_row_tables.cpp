// The dispatcher's data movement as tables (runtime_cuda/row_tables.h), on the CPU: a whole
// layer moved by the tables on every rank of real plans (every scheduler, 1-4 ranks, with and
// without tile padding) lands every value where the plan says - checked against encoded
// (doc, pos, column) values, not against the dispatcher's code (forward, and backward's dO / dQ
// path for stateful and stateless servers) - and the dK/dV sums equal an independent
// rank-order reference bit for bit. The fused layout's padding equals the
// dispatcher's own count.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "distca/comm/local.h"
#include "distca/runtime/dispatcher.h"
#include "movement_sim.h"
#include "runtime/runtime_check.h"

namespace distca::runtime::device {
namespace {

using testing::encode;
using testing::HostSpace;
using testing::Sim;
using runtime::testing::random_batch;
using runtime::testing::schedule_options;
using runtime::testing::scheduler_names;

TEST(RowTables, InverseExpandAndStridedCopy) {
  const CopyTable t{{5, 0, 2}, {1, 2, 1}};
  EXPECT_EQ(table_rows(t), 3);
  EXPECT_EQ(inverse(t), (CopyTable{{0, 5, 2}, {2, 1, 1}}));
  EXPECT_EQ(expand_pairs(t), (std::vector<int64_t>{5, 0, 6, 1, 1, 2}));
  // Source (H = 2, rows = 7) head-major like the fused LSE; destination rows of 3 floats
  // with the 2 values at column 1.
  std::vector<float> src(14);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  std::vector<float> dst(9, -1.0f);
  apply_copy(t, src.data(), {1, 0, 7}, dst.data(), {3, 1, 1}, 2);
  EXPECT_EQ(dst, (std::vector<float>{-1, 5, 12, -1, 6, 13, -1, 1, 8}));
}

TEST(RowTables, GatherAddKeepsTheListedOrderPerDestination) {
  const GatherAdd g = make_gather_add({{0, 4}, {1, 2}, {2, 4}, {3, 4}, {4, 2}});
  EXPECT_EQ(g.dst, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(g.offsets, (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(g.src, (std::vector<int64_t>{0, 2, 3, 1, 4}));
  // The order is visible in the bits: (1e8 + 1) - 1e8 vs (1e8 - 1e8) + 1.
  std::vector<float> src{1e8f, 5, 1, -1e8f, 7};
  std::vector<float> dst(5, 0.0f);
  apply_gather_add(g, src.data(), {1, 0, 1}, dst.data(), {1, 0, 1}, 1);
  EXPECT_EQ(dst[4], (0.0f + 1e8f + 1.0f) + -1e8f);  // 0, not 1: the float order of the list
  EXPECT_EQ(dst[2], 12.0f);
}

// Checks one simulated layer against the encodings and the rank-order dK reference.
void check_sim(const Sim& s, bool stateless, const std::string& what) {
  const Plan& plan = *s.plan;
  const DocumentIndex index(plan.batch);
  const int n = static_cast<int>(plan.ranks.size());
  const int64_t qf = s.dims.qf, H = s.dims.n_heads;
  const int64_t kvf = s.dims.kvf;
  // Fused inputs: every task's query rows and context, and zeros in the padding. partial[r]:
  // server r's reference partials of (doc, pos): dK then dV, summed in task order.
  std::vector<std::map<std::pair<int64_t, int64_t>, std::vector<float>>> partial(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const auto& b = s.ranks[static_cast<size_t>(r)];
    const ServerPlan& sp = plan.servers[static_cast<size_t>(r)];
    // dO travels like Q, dQ like O (plan.h): the backward tables are the forward ones.
    auto kind = [](ExchangeKind k) { return static_cast<size_t>(k); };
    EXPECT_EQ(b.tables.pack[kind(ExchangeKind::kDO)], b.tables.pack[kind(ExchangeKind::kQ)]) << what;
    EXPECT_EQ(b.tables.unpack[kind(ExchangeKind::kDQ)], b.tables.unpack[kind(ExchangeKind::kOLse)]) << what;
    int64_t q_nonzero = 0, k_nonzero = 0;
    for (float x : b.fq) q_nonzero += x != 0.0f;
    for (float x : b.fk) k_nonzero += x != 0.0f;
    int64_t q_want = 0, k_want = 0;
    for (size_t i = 0; i < sp.tasks.size(); ++i) {
      const TaskPlacement& tp = sp.tasks[i].task;
      for (int64_t pos = tp.q_begin; pos < tp.q_end; ++pos) {
        const int64_t row = b.fused.q_row[i] + pos - tp.q_begin;
        for (int64_t c = 0; c < qf; ++c) {
          ASSERT_EQ(b.fq[static_cast<size_t>(row * qf + c)], encode(tp.doc, pos, c, 1)) << what << " server " << r;
        }
      }
      q_want += (tp.q_end - tp.q_begin) * qf;
      for (int64_t pos = tp.q_begin; pos < tp.q_end; ++pos) {  // backward's fused dO
        const int64_t row = b.fused.q_row[i] + pos - tp.q_begin;
        for (int64_t c = 0; c < qf; ++c) {
          ASSERT_EQ(b.fdo[static_cast<size_t>(row * qf + c)], encode(tp.doc, pos, c, 6)) << what << " server " << r;
        }
      }
      ASSERT_GE(b.fused.cu_k[i + 1] - b.fused.cu_k[i], tp.q_end) << what;
      for (int64_t j = 0; j < tp.q_end; ++j) {
        const int64_t row = b.fused.cu_k[i] + j;
        for (int64_t c = 0; c < kvf; ++c) {
          ASSERT_EQ(b.fk[static_cast<size_t>(row * kvf + c)], encode(tp.doc, j, c, 2)) << what << " server " << r;
          ASSERT_EQ(b.fv[static_cast<size_t>(row * kvf + c)], encode(tp.doc, j, c, 3)) << what << " server " << r;
        }
        // The reference partial of (doc, j) on this server, in task order.
        auto& acc = partial[static_cast<size_t>(r)][{tp.doc, j}];
        if (acc.empty()) acc.assign(static_cast<size_t>(2 * kvf), 0.0f);
        for (int64_t c = 0; c < kvf; ++c) {
          acc[static_cast<size_t>(c)] += b.fdk[static_cast<size_t>(row * kvf + c)];
          acc[static_cast<size_t>(kvf + c)] += b.fdv[static_cast<size_t>(row * kvf + c)];
        }
      }
      k_want += tp.q_end * kvf;
    }
    EXPECT_EQ(q_nonzero, q_want) << what << " server " << r << ": padding rows must stay zero";
    // A stateless server rebuilds exactly its forward inputs and outputs from the kDO rows.
    if (stateless) {
      EXPECT_EQ(b.fq2, b.fq) << what << " server " << r;
      EXPECT_EQ(b.fo2, b.fo) << what << " server " << r;
      EXPECT_EQ(b.flse2, b.flse) << what << " server " << r;
    }
    EXPECT_EQ(k_nonzero, k_want) << what << " server " << r << ": padding rows must stay zero";
  }
  // Home outputs at every row (the plans cover every document), and dK in rank order.
  for (int r = 0; r < n; ++r) {
    const auto& b = s.ranks[static_cast<size_t>(r)];
    for (int64_t doc : index.doc_ids()) {
      for (const HeldRun& run : index.runs(doc)) {
        if (run.rank != r) continue;
        for (int64_t pos = run.begin; pos < run.end; ++pos) {
          const int64_t l = run.local_row + pos - run.begin;
          for (int64_t c = 0; c < qf; ++c) {
            ASSERT_EQ(b.o[static_cast<size_t>(l * qf + c)], encode(doc, pos, c, 4)) << what << " rank " << r;
          }
          for (int64_t h = 0; h < H; ++h) {
            ASSERT_EQ(b.lse[static_cast<size_t>(l * H + h)], encode(doc, pos, h, 5)) << what << " rank " << r;
          }
          for (int64_t c = 0; c < qf; ++c) {
            ASSERT_EQ(b.dq[static_cast<size_t>(l * qf + c)], encode(doc, pos, c, 7)) << what << " dQ, rank " << r;
          }
          std::vector<float> acc(static_cast<size_t>(2 * kvf), 0.0f);
          auto own = partial[static_cast<size_t>(r)].find({doc, pos});
          if (own != partial[static_cast<size_t>(r)].end()) acc = own->second;
          for (int p = 0; p < n; ++p) {
            if (p == r) continue;
            auto it = partial[static_cast<size_t>(p)].find({doc, pos});
            if (it == partial[static_cast<size_t>(p)].end()) continue;
            for (size_t c = 0; c < acc.size(); ++c) acc[c] += it->second[c];
          }
          const size_t bytes = static_cast<size_t>(kvf) * sizeof(float);
          ASSERT_EQ(std::memcmp(acc.data(), b.dk.data() + l * kvf, bytes), 0) << what << " dK, rank " << r << " doc " << doc << " pos " << pos;
          ASSERT_EQ(std::memcmp(acc.data() + kvf, b.dv.data() + l * kvf, bytes), 0) << what << " dV, rank " << r << " doc " << doc << " pos " << pos;
        }
      }
    }
  }
}

TEST(RowTables, WholeLayerMovementLandsEveryValueForEverySchedulerAndRankCount) {
  const AttentionDims dims{4, 2, 8, 0};
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const Batch batch = random_batch(ranks, 256, 40 + static_cast<uint64_t>(ranks));
    for (const std::string& name : scheduler_names(ranks)) {
      auto plan = make_plan(batch, parse_scheduler(name).value(), schedule_options(dims));
      ASSERT_TRUE(plan.ok()) << plan.status().to_string();
      for (int64_t tile : {int64_t{1}, query_tile_rows(dims)}) {
        for (bool stateless : {false, true}) {
          HostSpace space;
          const Sim s =
              testing::simulate(plan.value(), dims.n_heads, dims.n_kv_heads, dims.head_dim, tile, space, 3, stateless);
          check_sim(s, stateless, std::to_string(ranks) + " ranks, " + name + ", tile " + std::to_string(tile) +
                                      (stateless ? ", stateless" : ""));
        }
      }
    }
  }
}

// fused_layout repeats the dispatcher's tile padding (CaDispatcher::align_tasks): the padded
// rows it counts are the dispatcher's.
TEST(RowTables, FusedLayoutPaddingEqualsTheDispatchers) {
  const AttentionDims dims{4, 2, 8, 0};
  const int ranks = 3;
  const Batch batch = random_batch(ranks, 256, 71);
  for (const std::string& name : scheduler_names(ranks)) {
    auto plan = make_plan(batch, parse_scheduler(name).value(), schedule_options(dims));
    ASSERT_TRUE(plan.ok());
    const DocumentIndex index(plan->batch);
    std::vector<int64_t> got(ranks, -1);
    Status st = comm::run_local(ranks, [&](comm::Communicator& c) -> Status {
      DISTCA_ASSIGN_OR_RETURN(auto d, CaDispatcher::create(c, plan.value(), dims));
      got[static_cast<size_t>(c.rank())] = d->padded_query_rows();
      return Status::ok_status();
    });
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (int r = 0; r < ranks; ++r) {
      auto f = fused_layout(plan.value(), index, r, query_tile_rows(dims));
      ASSERT_TRUE(f.ok());
      EXPECT_EQ(f->pad_rows, got[static_cast<size_t>(r)]) << name << " rank " << r;
      EXPECT_EQ(f->cu_q.size(), plan->servers[static_cast<size_t>(r)].tasks.size() + 1);
    }
  }
}

}  // namespace
}  // namespace distca::runtime::device
