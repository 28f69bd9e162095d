// Tests of the `local` communicator backend (threads in one process) and the trace recorder.
// References: serial rank-order sums, a reference shuffle built directly from the count
// matrix, and invariants of the failure contract (every rank returns, the error names the
// failed rank).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/comm/local.h"
#include "distca/core/trace.h"
#include "distca/core/rng.h"
#include "comm_test_util.h"

namespace distca::comm {
namespace {

using namespace distca::comm::testing;  // NOLINT(google-build-using-namespace)

template <class T>
void check_all_reduce_bitwise(int n, std::size_t len) {
  SCOPED_TRACE("n=" + std::to_string(n) + " len=" + std::to_string(len));
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(rank_input<T>(77, r, len));
  std::vector<std::vector<T>> results(static_cast<std::size_t>(n));
  Status st = run_local(n, [&](Communicator& comm) {
    std::vector<T> data = inputs[static_cast<std::size_t>(comm.rank())];
    DISTCA_RETURN_IF_ERROR(comm.all_reduce_sum(std::span<T>(data)));
    results[static_cast<std::size_t>(comm.rank())] = std::move(data);
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  const std::vector<T> expected = serial_rank_order_sum(inputs);
  for (int r = 0; r < n; ++r) {
    const auto& got = results[static_cast<std::size_t>(r)];
    ASSERT_EQ(got.size(), len);
    EXPECT_TRUE(same_bits(got, expected)) << "rank " << r;
  }
}

TEST(LocalComm, AllReduceFloatIsBitwiseTheRankOrderSum) {
  for (int n = 1; n <= 8; ++n) {
    for (std::size_t len : {0u, 1u, 3u, 7u, 1000u, 4097u}) check_all_reduce_bitwise<float>(n, len);
  }
}

TEST(LocalComm, AllReduceDoubleIsBitwiseTheRankOrderSum) {
  for (int n : {1, 2, 3, 5, 8}) {
    for (std::size_t len : {0u, 2u, 999u}) check_all_reduce_bitwise<double>(n, len);
  }
}

// Guards the guard: with these inputs the order of additions does change the bits, so the
// bitwise test above would catch a reduction that sums in another order.
TEST(LocalComm, SummationOrderMattersForTheTestInputs) {
  const int n = 8;
  std::vector<std::vector<float>> inputs, reversed;
  for (int r = 0; r < n; ++r) inputs.push_back(rank_input<float>(77, r, 1000));
  reversed.assign(inputs.rbegin(), inputs.rend());
  const auto a = serial_rank_order_sum(inputs);
  const auto b = serial_rank_order_sum(reversed);
  EXPECT_FALSE(same_bits(a, b));
}

TEST(LocalComm, AllToAllVMatchesReferenceShuffle) {
  for (int n = 1; n <= 8; ++n) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      const auto counts = random_counts(seed * 100 + static_cast<uint64_t>(n), n);
      std::atomic<int> checked{0};
      Status st = run_local(n, [&](Communicator& comm) {
        Layout l = make_layout(counts, comm.rank());
        DISTCA_RETURN_IF_ERROR(comm.all_to_all_v(l.args()));
        if (l.recv != l.expected_recv) {
          return Status::internal("recv buffer differs from the reference shuffle");
        }
        ++checked;
        return Status::ok_status();
      });
      ASSERT_TRUE(st.ok()) << "n=" << n << ": " << st.to_string();
      EXPECT_EQ(checked.load(), n);
    }
  }
}

TEST(LocalComm, NonBlockingExchangesCompleteInAnyOrder) {
  for (int n : {1, 2, 3, 4, 7}) {
    const auto c1 = random_counts(11, n);
    const auto c2 = random_counts(12, n);
    Status st = run_local(n, [&](Communicator& comm) {
      Layout a = make_layout(c1, comm.rank());
      Layout b = make_layout(c2, comm.rank());
      DISTCA_ASSIGN_OR_RETURN(auto ea, comm.start_all_to_all_v(a.args()));
      DISTCA_ASSIGN_OR_RETURN(auto eb, comm.start_all_to_all_v(b.args()));
      // Second one first, by polling; then the first one by wait.
      while (!eb->test()) std::this_thread::yield();
      DISTCA_RETURN_IF_ERROR(eb->wait());
      DISTCA_RETURN_IF_ERROR(ea->wait());
      DISTCA_RETURN_IF_ERROR(ea->wait());  // idempotent
      if (a.recv != a.expected_recv || b.recv != b.expected_recv) {
        return Status::internal("non-blocking recv differs from the reference shuffle");
      }
      return Status::ok_status();
    });
    ASSERT_TRUE(st.ok()) << "n=" << n << ": " << st.to_string();
  }
}

TEST(LocalComm, BroadcastAndAllGather) {
  for (int n : {1, 2, 5, 8}) {
    Status st = run_local(n, [&](Communicator& comm) {
      const int root = n - 1;
      std::vector<int> v(37, comm.rank() == root ? 0 : -1);
      if (comm.rank() == root) {
        for (int i = 0; i < 37; ++i) v[static_cast<std::size_t>(i)] = i * i;
      }
      DISTCA_RETURN_IF_ERROR(comm.broadcast_values(std::span<int>(v), root));
      for (int i = 0; i < 37; ++i) {
        if (v[static_cast<std::size_t>(i)] != i * i) return Status::internal("broadcast value");
      }
      DISTCA_ASSIGN_OR_RETURN(auto ranks, comm.all_gather_value(comm.rank() * 10 + 3));
      if (ranks.size() != static_cast<std::size_t>(n)) return Status::internal("gather size");
      for (int p = 0; p < n; ++p) {
        if (ranks[static_cast<std::size_t>(p)] != p * 10 + 3) return Status::internal("gather");
      }
      return comm.barrier();
    });
    ASSERT_TRUE(st.ok()) << "n=" << n << ": " << st.to_string();
  }
}

TEST(LocalComm, RankFailingMidExchangeEndsEveryRankWithItsName) {
  const int n = 4;
  std::mutex mu;
  std::vector<std::string> peer_errors;
  auto body = [&](Communicator& comm) -> Status {
    std::vector<float> x(100, 1.0f);
    for (int step = 0; step < 3; ++step) DISTCA_RETURN_IF_ERROR(comm.all_reduce_sum(x));
    const auto counts = random_counts(5, n);
    Layout l = make_layout(counts, comm.rank());
    DISTCA_ASSIGN_OR_RETURN(auto ex, comm.start_all_to_all_v(l.args()));
    if (comm.rank() == 1) {
      Status cause = Status::internal("injected failure at step 3");
      comm.fail(cause);
      return cause;
    }
    DISTCA_RETURN_IF_ERROR(ex->wait());
    // The exchange itself may complete (rank 1 posted before failing); the next collective
    // cannot.
    return comm.all_reduce_sum(x);
  };
  Status st = run_local(n, [&](Communicator& comm) -> Status {
    Status s = body(comm);
    if (comm.rank() != 1) {
      std::lock_guard<std::mutex> lock(mu);
      peer_errors.push_back(s.ok() ? "OK" : s.message());
    }
    return s;
  });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "rank 1 failed: injected failure at step 3");
  ASSERT_EQ(peer_errors.size(), 3u);
  for (const auto& e : peer_errors) {
    EXPECT_NE(e.find("rank 1 failed: injected failure at step 3"), std::string::npos) << e;
  }
}

TEST(LocalComm, RankReturningErrorWithoutFailKeepsItsCause) {
  // Rank 2 drops an unfinished exchange by returning early: peers are released at once and
  // the job's error is rank 2's own message.
  Status st = run_local(3, [&](Communicator& comm) -> Status {
    std::vector<std::byte> buf(64);
    std::vector<std::size_t> counts(3, 8), displs{0, 8, 16}, rdispls{24, 32, 40};
    AllToAllV a{buf.data(), counts, displs, buf.data(), counts, rdispls};
    if (comm.rank() == 2) {
      DISTCA_ASSIGN_OR_RETURN(auto ex, comm.start_all_to_all_v(a));
      return Status::io_error("cannot read shard 7");  // drops `ex` unfinished
    }
    DISTCA_RETURN_IF_ERROR(comm.all_to_all_v(a));
    return comm.barrier();  // rank 2 never comes
  });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "rank 2 failed: cannot read shard 7");
}

TEST(LocalComm, ExceptionAndEarlyReturnAreFailuresNotHangs) {
  Status thrown = run_local(3, [&](Communicator& comm) -> Status {
    if (comm.rank() == 0) throw std::runtime_error("boom");
    return comm.barrier();
  });
  EXPECT_EQ(thrown.message(), "rank 0 failed: exception: boom");

  Status early = run_local(3, [&](Communicator& comm) -> Status {
    if (comm.rank() == 2) return Status::ok_status();  // never joins the barrier
    return comm.barrier();
  });
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.message().find("rank 2 failed: returned while rank"), std::string::npos)
      << early.message();

  Status early_exchange = run_local(2, [&](Communicator& comm) -> Status {
    if (comm.rank() == 1) return Status::ok_status();
    std::vector<float> x(10, 1.0f);
    return comm.all_reduce_sum(x);
  });
  ASSERT_FALSE(early_exchange.ok());
  EXPECT_NE(early_exchange.message().find("rank 1 failed: returned while rank 0 waited"),
            std::string::npos)
      << early_exchange.message();
}

TEST(LocalComm, CountMismatchIsAnErrorOnEveryRank) {
  Status st = run_local(2, [&](Communicator& comm) -> Status {
    std::vector<std::byte> send(16), recv(16);
    // Rank 1 sends 8 bytes to rank 0, which expects 4.
    std::vector<std::size_t> sc = comm.rank() == 1 ? std::vector<std::size_t>{8, 0}
                                                   : std::vector<std::size_t>{0, 0};
    std::vector<std::size_t> rc = comm.rank() == 0 ? std::vector<std::size_t>{0, 4}
                                                   : std::vector<std::size_t>{0, 0};
    std::vector<std::size_t> zeros(2, 0);
    return comm.all_to_all_v({send.data(), sc, zeros, recv.data(), rc, zeros});
  });
  EXPECT_EQ(st.message(),
            "rank 0 failed: all_to_all_v: rank 1 sends 8 bytes to rank 0, which expects 4");
}

TEST(LocalComm, BadArgumentsAreRefused) {
  EXPECT_EQ(run_local(0, [](Communicator&) { return Status::ok_status(); }).code(),
            StatusCode::kInvalidArgument);
  Status st = run_local(2, [&](Communicator& comm) -> Status {
    std::vector<std::size_t> one(1, 0);
    return comm.all_to_all_v({nullptr, one, one, nullptr, one, one});
  });
  EXPECT_NE(st.message().find("send_counts has 1 entries, expected one per rank (2)"),
            std::string::npos)
      << st.message();
}

// Many small collectives back to back: shakes out races in the rendezvous (run under tsan).
TEST(LocalComm, ThousandRoundsOfMixedCollectives) {
  const int n = 4;
  const auto counts = random_counts(9, n);
  Status st = run_local(n, [&](Communicator& comm) -> Status {
    for (int it = 0; it < 1000; ++it) {
      std::vector<float> x(5, static_cast<float>(comm.rank() + it));
      DISTCA_RETURN_IF_ERROR(comm.all_reduce_sum(x));
      // sum over r of (r + it) = 6 + 4 it, exact in float at this size.
      if (x[4] != static_cast<float>(6 + 4 * it)) return Status::internal("sum");
      if (it % 10 == 0) {
        Layout l = make_layout(counts, comm.rank());
        DISTCA_ASSIGN_OR_RETURN(auto ex, comm.start_all_to_all_v(l.args()));
        DISTCA_RETURN_IF_ERROR(comm.barrier());
        DISTCA_RETURN_IF_ERROR(ex->wait());
        if (l.recv != l.expected_recv) return Status::internal("exchange");
      }
    }
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
}

TEST(Trace, ChromeJsonAndPackRoundTrip) {
  TraceRecorder rec;
  rec.record({"compute", "compute", 0, 1, 10.0, 250.5});
  rec.record({"exchange", "comm", 0, 1, 12.0, 99.0});
  const auto events = rec.events();
  const auto json = nlohmann::json::parse(chrome_trace_json(events));
  ASSERT_EQ(json["traceEvents"].size(), 2u);
  EXPECT_EQ(json["traceEvents"][0]["ph"], "X");
  EXPECT_EQ(json["traceEvents"][0]["tid"], 1);
  EXPECT_DOUBLE_EQ(json["traceEvents"][0]["dur"].get<double>(), 240.5);
  EXPECT_EQ(json["traceEvents"][1]["cat"], "comm");

  const auto bytes = pack_trace_events(events);
  auto back = unpack_trace_events(bytes);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].name, "exchange");
  EXPECT_EQ((*back)[1].end_us, 99.0);
  auto truncated = unpack_trace_events(std::span(bytes).first(bytes.size() - 1));
  EXPECT_EQ(truncated.status().code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace distca::comm
