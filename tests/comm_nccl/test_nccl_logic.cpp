// The NCCL backend's host-side logic (comm_nccl/nccl_logic.h), on every machine: the call
// plan against an independent per-peer walk, the count check and p2p headers over local
// ranks (matched and mismatched), the unique-id bootstrap (success and rank 0's failure on
// every rank), agree_ready, and the bounded wait on a fake clock (no timing).
#include <gtest/gtest.h>

#include <atomic>

#include "comm/comm_test_util.h"
#include "distca/comm/local.h"
#include "distca/comm_nccl/nccl_logic.h"

namespace distca::comm::nccl {
namespace {

using comm::testing::make_layout;
using comm::testing::random_counts;
using Kind = P2pOp::Kind;

TEST(NcclPlan, CallsMatchEveryNonEmptyBlockOnce) {
  for (int n : {1, 2, 3, 5}) {
    const auto counts = random_counts(17 + static_cast<uint64_t>(n), n);
    for (int me = 0; me < n; ++me) {
      auto l = make_layout(counts, me);
      auto ops = plan_all_to_all_v(l.args(), me, n);
      ASSERT_TRUE(ops.ok()) << ops.status().to_string();
      // Independent walk: every (peer, direction) with bytes appears exactly once, with the
      // layout's offsets; nothing else appears.
      std::vector<int> seen_send(static_cast<size_t>(n), 0), seen_recv(static_cast<size_t>(n), 0);
      for (const P2pOp& op : *ops) {
        const auto up = static_cast<size_t>(op.peer);
        ASSERT_GT(op.bytes, 0u);
        if (op.kind == Kind::kSelfCopy) {
          EXPECT_EQ(op.peer, me);
          EXPECT_EQ(op.src_offset, l.send_displs[up]);
          EXPECT_EQ(op.dst_offset, l.recv_displs[up]);
          EXPECT_EQ(op.bytes, l.send_counts[up]);
          ++seen_send[up], ++seen_recv[up];
        } else if (op.kind == Kind::kSend) {
          EXPECT_NE(op.peer, me);
          EXPECT_EQ(op.src_offset, l.send_displs[up]);
          EXPECT_EQ(op.bytes, l.send_counts[up]);
          ++seen_send[up];
        } else {
          EXPECT_NE(op.peer, me);
          EXPECT_EQ(op.dst_offset, l.recv_displs[up]);
          EXPECT_EQ(op.bytes, l.recv_counts[up]);
          ++seen_recv[up];
        }
      }
      for (int p = 0; p < n; ++p) {
        const auto up = static_cast<size_t>(p);
        EXPECT_EQ(seen_send[up], l.send_counts[up] > 0 ? 1 : 0) << "n " << n << " me " << me << " peer " << p;
        EXPECT_EQ(seen_recv[up], l.recv_counts[up] > 0 ? 1 : 0) << "n " << n << " me " << me << " peer " << p;
      }
    }
  }
}

TEST(NcclPlan, OrderIsSelfThenReceivesThenSendsAscending) {
  std::vector<size_t> sc{4, 0, 2, 1}, sd{0, 4, 4, 6}, rc{3, 5, 2, 0}, rd{0, 3, 8, 10};
  std::vector<std::byte> s(8), r(10);
  AllToAllV a{s.data(), sc, sd, r.data(), rc, rd};
  auto ops = plan_all_to_all_v(a, 2, 4);
  ASSERT_TRUE(ops.ok());
  const std::vector<P2pOp> want{{Kind::kSelfCopy, 2, 4, 8, 2},
                                {Kind::kRecv, 0, 0, 0, 3},
                                {Kind::kRecv, 1, 0, 3, 5},
                                {Kind::kSend, 0, 0, 0, 4},
                                {Kind::kSend, 3, 6, 0, 1}};
  EXPECT_EQ(*ops, want);
}

TEST(NcclPlan, RefusesBadShapesAndSelfMismatch) {
  std::vector<size_t> two{1, 1}, zero2{0, 0}, three{0, 0, 0};
  std::vector<std::byte> b(4);
  AllToAllV bad_len{b.data(), three, three, b.data(), three, three};
  EXPECT_EQ(plan_all_to_all_v(bad_len, 0, 2).status().code(), StatusCode::kInvalidArgument);
  std::vector<size_t> sc{2, 1}, rc{1, 1};
  AllToAllV self{b.data(), sc, zero2, b.data(), rc, zero2};
  auto r = plan_all_to_all_v(self, 0, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("sends itself 2 bytes but expects 1"), std::string::npos) << r.status().message();
  EXPECT_FALSE(plan_all_to_all_v(AllToAllV{b.data(), two, zero2, b.data(), two, zero2}, 2, 2).ok());
}

TEST(NcclPlan, RefusesMoreCallsThanOneNcclGroupTakes) {
  // 1025 peers each way: 2048 calls fit; one more peer does not.
  for (int n : {1025, 1026}) {
    const auto un = static_cast<size_t>(n);
    std::vector<size_t> c(un, 1), d(un);
    for (size_t p = 0; p < un; ++p) d[p] = p;
    std::vector<std::byte> s(un), r(un);
    auto ops = plan_all_to_all_v(AllToAllV{s.data(), c, d, r.data(), c, d}, 0, n);
    if (n == 1025) {
      ASSERT_TRUE(ops.ok()) << ops.status().to_string();
      EXPECT_EQ(ops->size(), 2049u);  // the self copy is no NCCL call
    } else {
      ASSERT_FALSE(ops.ok());
      EXPECT_NE(ops.status().message().find("needs 2050 NCCL sends and receives in one group, over NCCL's limit of 2048"),
                std::string::npos)
          << ops.status().message();
    }
  }
}

TEST(NcclPlan, ExtentIsTheLastNonEmptyBlockEnd) {
  std::vector<size_t> c{3, 0, 2}, d{10, 100, 0};
  EXPECT_EQ(extent(c, d), 13u);  // the empty block at 100 does not count
  std::vector<size_t> z{0, 0}, zd{5, 7};
  EXPECT_EQ(extent(z, zd), 0u);
}

TEST(NcclCountCheck, MatchedCountsPassOnEveryRank) {
  const int n = 4;
  const auto counts = random_counts(5, n);
  Status st = run_local(n, [&](Communicator& c) -> Status {
    auto l = make_layout(counts, c.rank());
    DISTCA_ASSIGN_OR_RETURN(auto check, CountCheck::start(c, l.args()));
    DISTCA_RETURN_IF_ERROR(check->finish());
    return check->finish();  // idempotent
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
}

TEST(NcclCountCheck, MismatchNamesBothRanksAndSizes) {
  const int n = 3;
  std::vector<Status> seen(n);
  Status st = run_local(n, [&](Communicator& c) -> Status {
    const auto un = static_cast<size_t>(n);
    std::vector<size_t> sc(un, 4), rc(un, 4), d(un, 0);
    if (c.rank() == 1) sc[2] = 6;  // rank 2 expects 4 from rank 1
    std::vector<std::byte> b(8);
    AllToAllV a{b.data(), sc, d, b.data(), rc, d};
    DISTCA_ASSIGN_OR_RETURN(auto check, CountCheck::start(c, a));
    seen[static_cast<size_t>(c.rank())] = check->finish();
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(seen[0].ok());
  EXPECT_TRUE(seen[1].ok());  // the sender cannot know; the receiver reports
  ASSERT_FALSE(seen[2].ok());
  EXPECT_EQ(seen[2].message(), "all_to_all_v: rank 1 sends 6 bytes to rank 2, which expects 4");
}

TEST(NcclP2pHeaders, CheckWordingAndOrder) {
  // Size mismatch: the mpi backend's wording, from either side.
  Status s = check_p2p_headers(0, true, 1, {10, 0, 7}, {12, 0, 7});
  EXPECT_EQ(s.message(), "p2p: rank 0 sends 10 bytes to rank 1 (tag 7), which expects 12");
  Status r = check_p2p_headers(1, false, 0, {12, 0, 7}, {10, 0, 7});
  EXPECT_EQ(r.message(), s.message());
  // Issue-order mismatch wins: it explains the size mismatch NCCL would produce.
  Status o = check_p2p_headers(1, false, 0, {12, 1, 7}, {10, 0, 7});
  EXPECT_NE(o.message().find("rank 0's message #0 to rank 1 (tag 7) meets rank 1's receive #1"), std::string::npos)
      << o.message();
  EXPECT_TRUE(check_p2p_headers(0, true, 1, {10, 3, 7}, {10, 3, 7}).ok());
}

// Over local ranks: rank 0 sends two messages to rank 1 (tags 1 then 2); rank 1 receives them
// in the same order (fine) or in the swapped order (both sides' checks say so).
TEST(NcclP2pHeaders, SwappedIssueOrderIsDetectedOnBothSides) {
  for (bool swapped : {false, true}) {
    std::vector<std::vector<Status>> seen(2);
    Status st = run_local(2, [&](Communicator& c) -> Status {
      std::vector<std::unique_ptr<P2pHeaderCheck>> checks;
      for (uint64_t k = 0; k < 2; ++k) {
        const int tag = c.rank() == 1 && swapped ? 2 - static_cast<int>(k) : 1 + static_cast<int>(k);
        DISTCA_ASSIGN_OR_RETURN(auto h, P2pHeaderCheck::start(c, c.rank() == 0, 1 - c.rank(), tag,
                                                              {16, k, static_cast<uint64_t>(tag)}));
        checks.push_back(std::move(h));
      }
      for (auto& h : checks) seen[static_cast<size_t>(c.rank())].push_back(h->finish());
      return Status::ok_status();
    });
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (const auto& side : seen) {
      for (const Status& s : side) {
        if (!swapped) {
          EXPECT_TRUE(s.ok()) << s.message();
        } else {
          EXPECT_NE(s.message().find("pairs point-to-point messages per peer in issue order"), std::string::npos)
              << s.message();
        }
      }
    }
  }
}

TEST(NcclP2pHeaders, RefusesTagsOutsideTheBackendRange) {
  Status st = run_local(1, [&](Communicator& c) -> Status {
    auto h = P2pHeaderCheck::start(c, true, 0, kNcclP2pTagLimit, {});
    if (h.ok()) return Status::internal("tag accepted");
    if (h.status().message().find("the nccl backend's p2p tag range") == std::string::npos) return h.status();
    return Status::ok_status();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
}

TEST(NcclBootstrap, EveryRankGetsRankZerosId) {
  std::atomic<int> made{0};
  std::vector<UniqueIdBytes> got(3);
  Status st = run_local(3, [&](Communicator& c) -> Status {
    DISTCA_ASSIGN_OR_RETURN(auto id, share_unique_id(c, [&]() -> Result<UniqueIdBytes> {
      ++made;
      UniqueIdBytes b;
      for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 7 + 3);
      return b;
    }));
    got[static_cast<size_t>(c.rank())] = id;
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(made.load(), 1);  // only rank 0 makes one
  for (const auto& id : got) {
    for (size_t i = 0; i < id.size(); ++i) ASSERT_EQ(id[i], static_cast<std::byte>(i * 7 + 3));
  }
}

TEST(NcclBootstrap, RankZerosFailureReachesEveryRank) {
  std::vector<Status> seen(3);
  Status st = run_local(3, [&](Communicator& c) -> Status {
    auto id = share_unique_id(c, []() -> Result<UniqueIdBytes> { return Status::internal("ncclGetUniqueId: boom"); });
    seen[static_cast<size_t>(c.rank())] = id.status();
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (const Status& s : seen) {
    EXPECT_EQ(s.message(), "nccl: rank 0 could not create the unique id: ncclGetUniqueId: boom");
  }
}

TEST(NcclBootstrap, AgreeReadyReportsTheFirstFailingRankEverywhere) {
  std::vector<Status> seen(4);
  Status st = run_local(4, [&](Communicator& c) -> Status {
    Status mine = c.rank() == 2 ? Status::internal("no CUDA device") : c.rank() == 3 ? Status::internal("other") : Status{};
    seen[static_cast<size_t>(c.rank())] = agree_ready(c, mine);
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (const Status& s : seen) EXPECT_EQ(s.message(), "nccl: rank 2: no CUDA device");
  Status ok = run_local(2, [&](Communicator& c) { return agree_ready(c, Status{}); });
  EXPECT_TRUE(ok.ok()) << ok.to_string();
}

// A fake clock advanced by the pause: the outcome depends on poll counts only.
struct FakeClock {
  double t = 0;
  int polls = 0;
};

TEST(NcclBoundedWait, CompletesTimesOutAndPropagates) {
  FakeClock c;
  auto now = [&] { return c.t; };
  auto pause = [&] { c.t += 1.0; };
  // Done on the 4th poll, within a 10 s bound.
  Status ok = bounded_wait([&]() -> Result<bool> { return ++c.polls >= 4; }, 10, now, pause, "x");
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(c.polls, 4);
  // Never done: gives up once 5 s have passed, after one last poll, naming what.
  c = {};
  Status late = bounded_wait([&]() -> Result<bool> { ++c.polls; return false; }, 5, now, pause, "exchange q #3");
  EXPECT_EQ(late.message(), "no progress for 5 s (nccl timeout): exchange q #3");
  EXPECT_EQ(c.polls, 6);  // t = 0..5
  // Completion seen by the last poll wins over the timeout.
  c = {};
  Status last = bounded_wait([&]() -> Result<bool> { return ++c.polls == 6; }, 5, now, pause, "y");
  EXPECT_TRUE(last.ok()) << last.message();
  // An error is returned at once.
  c = {};
  Status err = bounded_wait([&]() -> Result<bool> { ++c.polls; return Status::internal("cudaEventQuery: bad"); }, 5,
                            now, pause, "z");
  EXPECT_EQ(err.message(), "cudaEventQuery: bad");
  EXPECT_EQ(c.polls, 1);
  // timeout 0: unbounded (stops when done, here after 1000 pauses).
  c = {};
  Status unbounded = bounded_wait([&]() -> Result<bool> { return ++c.polls > 1000; }, 0, now, pause, "w");
  EXPECT_TRUE(unbounded.ok());
}

}  // namespace
}  // namespace distca::comm::nccl
