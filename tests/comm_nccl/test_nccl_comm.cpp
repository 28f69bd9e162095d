// The NCCL backend itself (comm_nccl/nccl.h), with local ranks as the bootstrap. Without a GPU:
// bad options are refused before any collective, and a machine without a device gives every
// rank the same one-line error (these run everywhere). With one GPU: one rank, every exchange
// and reduction against the bootstrap's bits (nccl_checks.h). With two or more GPUs: two ranks
// as threads, one GPU each (NCCL refuses two ranks on one GPU). Tests that need a GPU skip with
// "no CUDA device" / "needs 2 GPUs".
#include <gtest/gtest.h>

#include "distca/comm/local.h"
#include "nccl_checks.h"

namespace distca::comm {
namespace {

TEST(NcclComm, BadOptionsAreRefusedBeforeAnyCollective) {
  Status st = run_local(1, [](Communicator& c) -> Status {
    NcclOptions o;
    o.timeout_s = -1;
    auto r = make_nccl_communicator(c, o);
    if (r.ok() || r.status().code() != StatusCode::kInvalidArgument ||
        r.status().message().find("timeout_s") == std::string::npos) {
      return Status::internal("expected the timeout_s refusal, got " + r.status().to_string());
    }
    o = {};
    o.device = -2;
    r = make_nccl_communicator(c, o);
    if (r.ok() || r.status().message().find("device must be >= 0") == std::string::npos) {
      return Status::internal("expected the device refusal, got " + r.status().to_string());
    }
    return Status::ok_status();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
}

TEST(NcclComm, NoDeviceIsTheSameOneLineErrorOnEveryRank) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: this checks the machine without one";
  std::vector<Status> seen(3);
  Status st = run_local(3, [&](Communicator& c) -> Status {
    seen[static_cast<size_t>(c.rank())] = make_nccl_communicator(c).status();
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (const Status& s : seen) {
    EXPECT_EQ(s.message(), "nccl: rank 0: no CUDA device (cudaGetDeviceCount found none)");
  }
}

void run_checks(int ranks) {
  Status st = run_local(ranks, [](Communicator& boot) -> Status {
    NcclOptions o;
    o.timeout_s = 60;
    DISTCA_ASSIGN_OR_RETURN(auto nc, make_nccl_communicator(boot, o));
    if (nc->backend() != "nccl") return Status::internal("backend name");
    // A caller tag beyond the backend's range is refused at start (verify mode's header tags).
    std::vector<std::byte> b(1);
    auto bad = nc->start_send(std::span<const std::byte>(b), 0, comm::nccl::kNcclP2pTagLimit);
    if (bad.ok()) return Status::internal("tag beyond the nccl range accepted");
    return testing::check_nccl(boot, *nc);
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
}

TEST(NcclComm, OneRankMatchesTheBootstrapBitwise) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device";
  run_checks(1);
}

TEST(NcclComm, TwoRanksOnTwoGpusMatchTheBootstrapBitwise) {
  const int n = cuda_device_count();
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one GPU); " << n << " visible";
  run_checks(2);
}

}  // namespace
}  // namespace distca::comm
