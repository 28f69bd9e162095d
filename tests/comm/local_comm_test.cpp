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

TEST(LocalComm, VariableGatherAndReduceScatterMatchTheirReferences) {
  for (int n = 1; n <= 8; ++n) {
    for (uint64_t seed : {5u, 6u, 7u}) {
      const Status st = run_local(n, [&](Communicator& comm) { return check_variable_collectives(comm, seed * 10 + static_cast<uint64_t>(n)); });
      EXPECT_TRUE(st.ok()) << "n=" << n << ": " << st.to_string();
    }
  }
}

// Guards the reduce-scatter's bitwise check: these inputs sum to other bits in reverse order.
TEST(LocalComm, ReduceScatterInputsAreOrderSensitive) {
  std::vector<std::vector<float>> inputs, reversed;
  for (int r = 0; r < 4; ++r) inputs.push_back(rank_input<float>(57, r, 400));
  reversed.assign(inputs.rbegin(), inputs.rend());
  EXPECT_FALSE(same_bits(serial_rank_order_sum(inputs), serial_rank_order_sum(reversed)));
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
      DISTCA_RETURN_IF_ERROR(comm.broadcast(std::as_writable_bytes(std::span<int>(v)), root));
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

// ---- Point-to-point ----

TEST(LocalComm, P2pRingOfVariousSizesAndTags) {
  for (int n : {1, 2, 3, 4, 7}) {
    for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{1000},
                              std::size_t{4} << 20}) {
      for (int tag : {0, 7, kP2pTagLimit - 1}) {
        Status st = run_local(n, [&](Communicator& comm) -> Status {
          const int me = comm.rank();
          const int next = (me + 1) % n;
          const int prev = (me + n - 1) % n;
          const auto send = p2p_message(me, next, tag, 0, bytes);
          std::vector<std::byte> recv(bytes, kUntouched);
          // Half the ranks start the send first, the others the receive.
          std::unique_ptr<Exchange> s, r;
          if (me % 2 == 0) {
            DISTCA_ASSIGN_OR_RETURN(s, comm.start_send(send, next, tag));
            DISTCA_ASSIGN_OR_RETURN(r, comm.start_recv(recv, prev, tag));
          } else {
            DISTCA_ASSIGN_OR_RETURN(r, comm.start_recv(recv, prev, tag));
            DISTCA_ASSIGN_OR_RETURN(s, comm.start_send(send, next, tag));
          }
          DISTCA_RETURN_IF_ERROR(s->wait());
          DISTCA_RETURN_IF_ERROR(r->wait());
          if (recv != p2p_message(prev, me, tag, 0, bytes)) return Status::internal("ring bytes");
          return Status::ok_status();
        });
        ASSERT_TRUE(st.ok()) << "n=" << n << " bytes=" << bytes << " tag=" << tag << ": "
                             << st.to_string();
      }
    }
  }
}

// K messages per tag on two tags in flight at once, sizes varying with k (a wrong pairing
// would be a size mismatch or wrong bytes); the receiver starts tag 2 before tag 1 and waits
// in reverse order.
TEST(LocalComm, P2pIsFifoPerPeerAndTag) {
  constexpr int kK = 6;
  auto bytes_of = [](int tag, int k) { return static_cast<std::size_t>(16 + 40 * k + tag); };
  for (int n : {2, 3, 4}) {
    Status st = run_local(n, [&](Communicator& comm) -> Status {
      const int me = comm.rank();
      const int next = (me + 1) % n;
      const int prev = (me + n - 1) % n;
      std::vector<std::vector<std::byte>> sends, recvs;
      std::vector<std::unique_ptr<Exchange>> handles;
      for (int k = 0; k < kK; ++k) {
        for (int tag : {1, 2}) sends.push_back(p2p_message(me, next, tag, k, bytes_of(tag, k)));
      }
      for (int tag : {2, 1}) {
        for (int k = 0; k < kK; ++k) recvs.emplace_back(bytes_of(tag, k), kUntouched);
      }
      std::size_t r = 0;
      for (int tag : {2, 1}) {
        for (int k = 0; k < kK; ++k, ++r) {
          DISTCA_ASSIGN_OR_RETURN(auto h, comm.start_recv(recvs[r], prev, tag));
          handles.push_back(std::move(h));
        }
      }
      for (std::size_t i = 0; i < sends.size(); ++i) {
        DISTCA_ASSIGN_OR_RETURN(auto h, comm.start_send(sends[i], next, 1 + static_cast<int>(i % 2)));
        handles.push_back(std::move(h));
      }
      for (auto it = handles.rbegin(); it != handles.rend(); ++it) {
        DISTCA_RETURN_IF_ERROR((*it)->wait());
      }
      r = 0;
      for (int tag : {2, 1}) {
        for (int k = 0; k < kK; ++k, ++r) {
          if (recvs[r] != p2p_message(prev, me, tag, k, bytes_of(tag, k))) {
            return Status::internal("message " + std::to_string(k) + " of tag " +
                                    std::to_string(tag) + " out of order");
          }
        }
      }
      return Status::ok_status();
    });
    ASSERT_TRUE(st.ok()) << "n=" << n << ": " << st.to_string();
  }
}

// Messages in flight while the ranks run all-reduces and non-blocking all-to-all-v
// exchanges; many rounds, to shake out races in the rendezvous (run under tsan). Typed
// helpers on floats.
TEST(LocalComm, P2pInterleavesWithCollectives) {
  const int n = 4;
  const auto counts = random_counts(21, n);
  Status st = run_local(n, [&](Communicator& comm) -> Status {
    const int me = comm.rank();
    const int next = (me + 1) % n;
    const int prev = (me + n - 1) % n;
    for (int it = 0; it < 200; ++it) {
      std::vector<float> act(257), got(257, -1.0f);
      for (std::size_t i = 0; i < act.size(); ++i) act[i] = static_cast<float>(me * 1000 + it + i);
      DISTCA_ASSIGN_OR_RETURN(auto r, comm.start_recv_values(std::span<float>(got), prev, it % 3));
      DISTCA_ASSIGN_OR_RETURN(auto s, comm.start_send_values(std::span<const float>(act), next, it % 3));
      std::vector<float> x(7, static_cast<float>(me + it));
      DISTCA_RETURN_IF_ERROR(comm.all_reduce_sum(x));
      if (x[6] != static_cast<float>(6 + 4 * it)) return Status::internal("sum");
      Layout l = make_layout(counts, me);
      DISTCA_ASSIGN_OR_RETURN(auto ex, comm.start_all_to_all_v(l.args()));
      if (it % 2 == 0) DISTCA_RETURN_IF_ERROR(r->wait());
      DISTCA_RETURN_IF_ERROR(ex->wait());
      DISTCA_RETURN_IF_ERROR(s->wait());
      DISTCA_RETURN_IF_ERROR(r->wait());
      if (l.recv != l.expected_recv) return Status::internal("exchange");
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (got[i] != static_cast<float>(prev * 1000 + it + i)) return Status::internal("p2p");
      }
    }
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
}

TEST(LocalComm, P2pSelfSend) {
  Status st = run_local(2, [&](Communicator& comm) -> Status {
    const int me = comm.rank();
    const auto a = p2p_message(me, me, 4, 0, 3000);
    const auto b = p2p_message(me, me, 4, 1, 3000);
    std::vector<std::byte> ra(3000), rb(3000);
    // Receive posted first, then send; then send first, waited before its receive starts.
    DISTCA_ASSIGN_OR_RETURN(auto r1, comm.start_recv(ra, me, 4));
    DISTCA_ASSIGN_OR_RETURN(auto s1, comm.start_send(a, me, 4));
    DISTCA_RETURN_IF_ERROR(r1->wait());
    DISTCA_RETURN_IF_ERROR(s1->wait());
    DISTCA_ASSIGN_OR_RETURN(auto s2, comm.start_send(b, me, 4));
    if (s2->test()) return Status::internal("a send completed before its receive was posted");
    DISTCA_ASSIGN_OR_RETURN(auto r2, comm.start_recv(rb, me, 4));
    DISTCA_RETURN_IF_ERROR(s2->wait());
    DISTCA_RETURN_IF_ERROR(r2->wait());
    if (ra != a || rb != b) return Status::internal("self-send bytes");
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
}

TEST(LocalComm, P2pSizeMismatchIsReportedOnBothSides) {
  std::mutex mu;
  std::vector<std::string> errors(2);
  Status st = run_local(2, [&](Communicator& comm) -> Status {
    std::vector<std::byte> buf(8, std::byte{1});
    Status got;
    if (comm.rank() == 0) {
      DISTCA_ASSIGN_OR_RETURN(auto s, comm.start_send(buf, 1, 3));
      got = s->wait();
    } else {
      DISTCA_ASSIGN_OR_RETURN(auto r, comm.start_recv(std::span(buf).first(4), 0, 3));
      got = r->wait();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      errors[static_cast<std::size_t>(comm.rank())] =
          got.code() == StatusCode::kInvalidArgument ? got.message() : got.to_string();
    }
    // Nothing was copied; the group is still usable.
    std::vector<std::byte> recv(8, kUntouched);
    DISTCA_ASSIGN_OR_RETURN(auto r, comm.start_recv(recv, 1 - comm.rank(), 3));
    DISTCA_ASSIGN_OR_RETURN(auto s, comm.start_send(buf, 1 - comm.rank(), 3));
    DISTCA_RETURN_IF_ERROR(s->wait());
    DISTCA_RETURN_IF_ERROR(r->wait());
    if (recv != buf) return Status::internal("message after the mismatch");
    return comm.barrier();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (const auto& e : errors) {
    EXPECT_EQ(e, "p2p: rank 0 sends 8 bytes to rank 1 (tag 3), which expects 4");
  }
}

// Rank 1 fails while rank 0 waits for its message and rank 2 for it to take one: both waits,
// and every later start and wait, end with rank 1's cause. A message completed before the
// failure but waited for after it reports the failure too.
TEST(LocalComm, P2pFailedRankEndsPendingWaitsWithItsName) {
  std::mutex mu;
  std::vector<std::string> errors;
  Status st = run_local(3, [&](Communicator& comm) -> Status {
    std::vector<std::byte> buf(1u << 16, std::byte{2}), other(16);
    Status got;
    if (comm.rank() == 1) {
      std::vector<std::byte> small(16);
      DISTCA_ASSIGN_OR_RETURN(auto done, comm.start_recv(small, 0, 9));
      DISTCA_RETURN_IF_ERROR(comm.barrier());
      Status cause = Status::internal("injected p2p failure");
      comm.fail(cause);
      (void)done->wait();
      return cause;
    }
    std::unique_ptr<Exchange> pending, completed;
    if (comm.rank() == 0) {
      DISTCA_ASSIGN_OR_RETURN(completed, comm.start_send(std::span(buf).first(16), 1, 9));
      DISTCA_ASSIGN_OR_RETURN(pending, comm.start_recv(buf, 1, 5));
    } else {
      DISTCA_ASSIGN_OR_RETURN(pending, comm.start_send(buf, 1, 5));
    }
    DISTCA_RETURN_IF_ERROR(comm.barrier());
    got = pending->wait();
    std::lock_guard<std::mutex> lock(mu);
    errors.push_back(got.message());
    if (completed) errors.push_back(completed->wait().message());
    auto later = comm.start_recv(other, 2 - comm.rank(), 1);
    errors.push_back(later.ok() ? "later start OK" : later.status().message());
    return got;
  });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "rank 1 failed: injected p2p failure");
  ASSERT_EQ(errors.size(), 5u);
  for (const auto& e : errors) EXPECT_EQ(e, "rank 1 failed: injected p2p failure");
}

TEST(LocalComm, P2pPeerReturningFirstIsAFailureNotAHang) {
  Status st = run_local(2, [&](Communicator& comm) -> Status {
    if (comm.rank() == 1) return Status::ok_status();  // never sends
    std::vector<std::byte> buf(10);
    DISTCA_ASSIGN_OR_RETURN(auto r, comm.start_recv(buf, 1, 5));
    return r->wait();
  });
  EXPECT_EQ(st.message(),
            "rank 1 failed: returned while rank 0 waited for it in a p2p receive (tag 5)");

  Status dropped = run_local(2, [&](Communicator& comm) -> Status {
    std::vector<std::byte> buf(10);
    if (comm.rank() == 1) {
      DISTCA_ASSIGN_OR_RETURN(auto s, comm.start_send(buf, 0, 2));
      return Status::io_error("cannot read shard 3");  // drops `s` unfinished
    }
    DISTCA_RETURN_IF_ERROR(comm.barrier());
    return comm.barrier();
  });
  EXPECT_EQ(dropped.message(), "rank 1 failed: cannot read shard 3");
}

TEST(LocalComm, P2pBadArgumentsFailTheGroup) {
  auto run = [](int peer, int tag) {
    return run_local(2, [=](Communicator& comm) -> Status {
      std::vector<std::byte> buf(4);
      if (comm.rank() == 0) return comm.start_send(buf, peer, tag).status();
      return comm.barrier();  // rank 0's error must release this wait
    });
  };
  EXPECT_EQ(run(2, 0).message(),
            "rank 0 failed: start_send (rank 0): peer 2 is not a rank of a group of 2");
  EXPECT_EQ(run(-1, 0).message(),
            "rank 0 failed: start_send (rank 0): peer -1 is not a rank of a group of 2");
  EXPECT_EQ(run(1, -1).message(),
            "rank 0 failed: start_send (rank 0): tag -1 is outside [0, 1048576)");
  EXPECT_EQ(run(1, kP2pTagLimit).message(),
            "rank 0 failed: start_send (rank 0): tag 1048576 is outside [0, 1048576)");
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
