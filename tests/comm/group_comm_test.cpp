// GroupCommunicator (comm/group.h) on the local backend: groups of a parent's ranks run
// collectives among themselves, bitwise as a parent of the same size would, while other
// groups of the same parent run theirs at the same time; bad groups and mismatched counts are
// errors, not hangs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/comm/group.h"
#include "distca/comm/local.h"
#include "distca/core/rng.h"
#include "comm_test_util.h"

namespace distca::comm {
namespace {

std::vector<float> inputs(int rank, size_t n) {
  // Values over many orders of magnitude, so another summation order gives other bits.
  Rng rng(7, static_cast<uint64_t>(rank));
  std::vector<float> x(n);
  for (auto& e : x) e = static_cast<float>(rng.normal() * std::pow(10.0, rng.uniform(-4, 4)));
  return x;
}

// Parent of 6 ranks split into groups {0,1,2}, {3,4} and {5} (stage-major, like a pipeline's
// data-parallel groups); each group all-reduces its members' inputs, which must equal the
// rank-order sum over the members (the base class's algorithm on a group of that size).
TEST(GroupComm, DisjointGroupsAllReduceTheirMembersBitwise) {
  const std::vector<std::vector<int>> groups = {{0, 1, 2}, {3, 4}, {5}};
  const size_t n = 1000;
  std::vector<std::vector<float>> got(6);
  const Status st = run_local(6, [&](Communicator& c) -> Status {
    const std::vector<int>* mine = nullptr;
    for (const auto& g : groups) {
      for (int r : g) if (r == c.rank()) mine = &g;
    }
    DISTCA_ASSIGN_OR_RETURN(auto group, GroupCommunicator::create(c, *mine, 1 << 19));
    EXPECT_EQ(group->size(), static_cast<int>(mine->size()));
    EXPECT_EQ((*mine)[static_cast<size_t>(group->rank())], c.rank());
    std::vector<float> x = inputs(c.rank(), n);
    for (int round = 0; round < 3; ++round) {
      DISTCA_RETURN_IF_ERROR(group->barrier());
      std::vector<float> y = x;
      DISTCA_RETURN_IF_ERROR(group->all_reduce_sum(std::span<float>(y)));
      if (round == 0) got[static_cast<size_t>(c.rank())] = y;
    }
    return c.barrier();
  });
  ASSERT_TRUE(st.ok()) << st.message();
  for (const auto& g : groups) {
    std::vector<std::vector<float>> contributions;
    for (int r : g) contributions.push_back(inputs(r, n));
    const std::vector<float> want = serial_rank_order_sum(contributions);
    for (int r : g) EXPECT_TRUE(got[static_cast<size_t>(r)] == want) << "rank " << r;
  }
}

// The variable collectives on groups of a parent of 5 ranks ({0, 2, 4} and {1, 3}): the
// references of comm_test_util.h hold on each group.
TEST(GroupComm, VariableGatherAndReduceScatterOnGroups) {
  const Status st = run_local(5, [&](Communicator& c) -> Status {
    std::vector<int> mine;
    for (int r = c.rank() % 2; r < 5; r += 2) mine.push_back(r);
    DISTCA_ASSIGN_OR_RETURN(auto group, GroupCommunicator::create(c, mine, 1 << 19));
    for (uint64_t seed : {1u, 2u, 3u}) DISTCA_RETURN_IF_ERROR(testing::check_variable_collectives(*group, seed));
    return c.barrier();
  });
  EXPECT_TRUE(st.ok()) << st.message();
}

// A group's exchanges and the parent's collectives interleave (a stage's dispatcher while the
// whole job all-reduces its losses), and a member's count mismatch is an error on both sides.
TEST(GroupComm, InterleavesWithTheParentAndReportsMismatches) {
  const Status st = run_local(4, [&](Communicator& c) -> Status {
    const std::vector<int> members = c.rank() < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    DISTCA_ASSIGN_OR_RETURN(auto group, GroupCommunicator::create(c, members, 5));
    std::vector<double> total = {1.0};
    for (int round = 0; round < 20; ++round) {
      std::vector<double> v = {static_cast<double>(c.rank())};
      DISTCA_RETURN_IF_ERROR(group->all_reduce_sum(std::span<double>(v)));
      EXPECT_EQ(v[0], c.rank() < 2 ? 1.0 : 5.0);
      DISTCA_RETURN_IF_ERROR(c.all_reduce_sum(std::span<double>(total)));
    }
    EXPECT_EQ(total[0], std::pow(4.0, 20));
    // Member 0 sends 8 bytes to member 1, which expects 4.
    std::vector<std::byte> send(8), recv(8);
    const int g = group->rank();
    std::vector<size_t> sc = {0, g == 0 ? size_t{8} : size_t{0}}, sd = {0, 0};
    std::vector<size_t> rc = {g == 1 ? size_t{4} : size_t{0}, 0}, rd = {0, 0};
    const Status bad = group->all_to_all_v({send.data(), sc, sd, recv.data(), rc, rd});
    EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad.message();
    EXPECT_NE(bad.message().find("expects"), std::string::npos) << bad.message();
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.message();
}

TEST(GroupComm, BadGroupsAreRefused) {
  const Status st = run_local(3, [&](Communicator& c) -> Status {
    EXPECT_FALSE(GroupCommunicator::create(c, {}, 0).ok());
    EXPECT_FALSE(GroupCommunicator::create(c, {0, 1, 2, 3}, 0).ok());  // rank 3 outside
    EXPECT_FALSE(GroupCommunicator::create(c, {2, 1, 0}, 0).ok());     // not ascending
    EXPECT_FALSE(GroupCommunicator::create(c, {0, 1, 2}, -1).ok());
    EXPECT_FALSE(GroupCommunicator::create(c, {0, 1, 2}, kP2pTagLimit).ok());
    const std::vector<int> others = c.rank() == 0 ? std::vector<int>{1, 2} : std::vector<int>{0};
    EXPECT_FALSE(GroupCommunicator::create(c, others, 0).ok());  // the caller is not a member
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.message();
}

}  // namespace
}  // namespace distca::comm
