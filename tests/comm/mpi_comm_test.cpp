// The MPI backend's test program, run under mpirun by CTest (label `mpi`):
//
//   mpirun -np N comm_mpi_test                  the checks below; exit 0 when all pass
//   mpirun -np N comm_mpi_test --inject-failure rank 1 fails in the middle of an exchange
//                                               (CTest expects exit != 0 and its line)
//   mpirun -np N comm_mpi_test --inject-p2p-failure
//                                               rank 1 fails while the others wait for its
//                                               p2p messages (the same CTest check)
//   mpirun -np N comm_mpi_test --stall barrier|exchange|p2p --timeout S
//                                               the last rank stops itself; the others must
//                                               end the job within S s naming it
//   mpirun -np N comm_mpi_test --overlap [--progress thread|poll|none] [--mib M]
//          [--compute-ms T] [--trace FILE]      overlap demonstration: figures + Chrome trace
//
// A failed check ends the whole job through Communicator::fail, so a failure can never leave
// the other ranks blocked in a collective: mpirun exits non-zero with
// "distca: rank R failed: CHECK: WHAT".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm_test_util.h"
#include "distca/comm/communicator.h"
#include "distca/comm/group.h"
#include "distca/comm/local.h"
#include "distca/comm/mpi.h"
#include "distca/core/trace.h"
#include "distca/core/io.h"

namespace distca::comm {
namespace {

using namespace distca::comm::testing;  // NOLINT(google-build-using-namespace)
using Clock = std::chrono::steady_clock;

#define EXPECT_OR_RETURN(cond, what)                                              \
  do {                                                                            \
    if (!(cond)) return Status::internal(std::string("check failed: ") + (what)); \
  } while (0)

Status test_identity(Communicator& comm) {
  DISTCA_ASSIGN_OR_RETURN(auto ranks, comm.all_gather_value(comm.rank()));
  EXPECT_OR_RETURN(ranks.size() == static_cast<std::size_t>(comm.size()), "gather size");
  for (int p = 0; p < comm.size(); ++p) {
    EXPECT_OR_RETURN(ranks[static_cast<std::size_t>(p)] == p, "rank " + std::to_string(p));
  }
  return comm.barrier();
}

// The shared-memory split: ranks on this machine (mpirun's own count, OMPI_COMM_WORLD_LOCAL_SIZE)
// share one host, whose id is their lowest rank. The suite runs on one machine: every id 0.
Status test_host_ids(Communicator& comm) {
  DISTCA_ASSIGN_OR_RETURN(const std::vector<int64_t> ids, comm.host_ids());
  EXPECT_OR_RETURN(ids.size() == static_cast<std::size_t>(comm.size()), "host_ids size");
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const bool one_machine = local != nullptr && std::atoi(local) == comm.size();
  for (const int64_t id : ids) EXPECT_OR_RETURN(!one_machine || id == 0, "host id " + std::to_string(id) + " on one machine");
  return Status::ok_status();
}

// The mpi result equals the serial rank-order sum and the local backend's result, bit for bit.
template <class T>
Status check_all_reduce(Communicator& comm, std::size_t len) {
  const int n = comm.size();
  const std::string what = "all_reduce_sum len=" + std::to_string(len) + " bytes/elem=" +
                           std::to_string(sizeof(T));
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(rank_input<T>(2024, r, len));
  std::vector<T> data = inputs[static_cast<std::size_t>(comm.rank())];
  DISTCA_RETURN_IF_ERROR(comm.all_reduce_sum(std::span<T>(data)));
  const std::vector<T> expected = serial_rank_order_sum(inputs);
  EXPECT_OR_RETURN(same_bits(data, expected),
                   what + ": differs from the serial rank-order sum");

  std::vector<std::vector<T>> local(static_cast<std::size_t>(n));
  DISTCA_RETURN_IF_ERROR(run_local(n, [&](Communicator& lc) {
    std::vector<T> x = inputs[static_cast<std::size_t>(lc.rank())];
    DISTCA_RETURN_IF_ERROR(lc.all_reduce_sum(std::span<T>(x)));
    local[static_cast<std::size_t>(lc.rank())] = std::move(x);
    return Status::ok_status();
  }));
  for (const auto& l : local) {
    EXPECT_OR_RETURN(same_bits(data, l),
                     what + ": mpi and local backends differ");
  }
  return Status::ok_status();
}

Status test_all_reduce(Communicator& comm) {
  for (std::size_t len : {0u, 1u, 3u, 1000u, 100003u}) {
    DISTCA_RETURN_IF_ERROR(check_all_reduce<float>(comm, len));
    DISTCA_RETURN_IF_ERROR(check_all_reduce<double>(comm, len));
  }
  return Status::ok_status();
}

Status test_all_to_all_v(Communicator& comm) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const auto counts = random_counts(seed * 100 + static_cast<uint64_t>(comm.size()), comm.size());
    Layout l = make_layout(counts, comm.rank());
    DISTCA_RETURN_IF_ERROR(comm.all_to_all_v(l.args()));
    EXPECT_OR_RETURN(l.recv == l.expected_recv, "all_to_all_v seed " + std::to_string(seed));
  }
  return Status::ok_status();
}

Status test_non_blocking(Communicator& comm) {
  Layout a = make_layout(random_counts(11, comm.size()), comm.rank());
  Layout b = make_layout(random_counts(12, comm.size()), comm.rank());
  DISTCA_ASSIGN_OR_RETURN(auto ea, comm.start_all_to_all_v(a.args()));
  DISTCA_ASSIGN_OR_RETURN(auto eb, comm.start_all_to_all_v(b.args()));
  while (!eb->test()) {
  }
  DISTCA_RETURN_IF_ERROR(eb->wait());
  DISTCA_RETURN_IF_ERROR(ea->wait());
  EXPECT_OR_RETURN(a.recv == a.expected_recv, "first exchange");
  EXPECT_OR_RETURN(b.recv == b.expected_recv, "second exchange");
  return Status::ok_status();
}

Status test_broadcast(Communicator& comm) {
  const int root = comm.size() - 1;
  std::vector<std::byte> big(3u << 20, std::byte{0});
  if (comm.rank() == root) {
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = payload(root, 0, i);
  }
  DISTCA_RETURN_IF_ERROR(comm.broadcast(big, root));
  for (std::size_t i = 0; i < big.size(); ++i) {
    EXPECT_OR_RETURN(big[i] == payload(root, 0, i), "broadcast byte " + std::to_string(i));
  }
  return Status::ok_status();
}

// A count mismatch (rank 1 sends `sent` bytes to rank 0, which expects `expected`) is an
// error Status on rank 0 naming the peer, not a hang; the group stays usable for the check.
Status check_mismatch(Communicator& comm, std::size_t sent, std::size_t expected,
                      const std::string& needle) {
  const auto n = static_cast<std::size_t>(comm.size());
  std::vector<std::byte> send(16, std::byte{1}), recv(16);
  std::vector<std::size_t> sc(n, 0), rc(n, 0), zeros(n, 0);
  if (comm.rank() == 1) sc[0] = sent;
  if (comm.rank() == 0) rc[1] = expected;
  Status st = comm.all_to_all_v({send.data(), sc, zeros, recv.data(), rc, zeros});
  if (comm.rank() == 0) {
    EXPECT_OR_RETURN(!st.ok() && st.message().find(needle) != std::string::npos,
                     "mismatch " + std::to_string(sent) + "/" + std::to_string(expected) +
                         " gave: " + st.to_string());
  } else {
    DISTCA_RETURN_IF_ERROR(st);
  }
  return comm.barrier();
}

Status test_count_mismatch(Communicator& comm) {
  if (comm.size() < 2) return Status::ok_status();
  DISTCA_RETURN_IF_ERROR(
      check_mismatch(comm, 4, 8, "rank 1 sent 4 bytes to rank 0, which expects 8"));
  return check_mismatch(comm, 8, 4, "receive from rank 1: MPI_Testsome (rank 0)");
}

// An exchange that fails leaves no receive behind: rank 1's short message fails rank 0's
// exchange while rank 2's message is still on its way; once rank 0 has its error it reuses
// the receive buffer (as a caller unwinding would free it), and rank 2's late bytes must not
// land there. Needs 3 ranks.
Status test_failed_exchange_releases_buffers(Communicator& comm) {
  if (comm.size() < 3) return Status::ok_status();
  const auto n = static_cast<std::size_t>(comm.size());
  constexpr std::size_t kBlock = 8;
  std::vector<std::byte> send(kBlock, std::byte{7}), recv(n * kBlock);
  std::vector<std::size_t> sc(n, 0), rc(n, 0), rd(n, 0), zeros(n, 0);
  if (comm.rank() == 1) sc[0] = kBlock / 2;
  if (comm.rank() >= 2) sc[0] = kBlock;
  if (comm.rank() == 0) {
    for (std::size_t p = 1; p < n; ++p) rc[p] = kBlock, rd[p] = p * kBlock;
  }
  if (comm.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Status st = comm.all_to_all_v({send.data(), sc, zeros, recv.data(), rc, rd});
  if (comm.rank() != 0) {
    DISTCA_RETURN_IF_ERROR(st);
    return comm.barrier();
  }
  EXPECT_OR_RETURN(!st.ok() && st.message().find("rank 1 sent 4 bytes to rank 0, which expects 8") != std::string::npos,
                   "a short message gave: " + st.to_string());
  std::fill(recv.begin(), recv.end(), std::byte{0xab});
  // Rank 2's barrier message follows its data on the same communicator, so by the time the
  // barrier completes a receive still posted would have taken the data.
  DISTCA_RETURN_IF_ERROR(comm.barrier());
  for (std::size_t i = 0; i < recv.size(); ++i) {
    EXPECT_OR_RETURN(recv[i] == std::byte{0xab}, "byte " + std::to_string(i) +
                                                     " of the failed exchange's receive buffer was written after the error");
  }
  return Status::ok_status();
}

// A large exchange (bytes_per_peer to every peer). send/recv: (n * bytes_per_peer), peer-major.
struct BigExchange {
  std::vector<std::size_t> counts, displs;
  std::vector<std::byte> send, recv;
  BigExchange(int n, int me, std::size_t bytes_per_peer)
      : counts(static_cast<std::size_t>(n), bytes_per_peer),
        displs(static_cast<std::size_t>(n)),
        send(static_cast<std::size_t>(n) * bytes_per_peer),
        recv(static_cast<std::size_t>(n) * bytes_per_peer) {
    for (int q = 0; q < n; ++q) {
      const auto uq = static_cast<std::size_t>(q);
      displs[uq] = uq * bytes_per_peer;
      for (std::size_t i = 0; i < bytes_per_peer; i += 4096) {
        send[displs[uq] + i] = payload(me, q, i);
      }
    }
  }
  AllToAllV args() { return {send.data(), counts, displs, recv.data(), counts, displs}; }
  bool correct(int me) const {
    const std::size_t b = counts.empty() ? 0 : counts[0];
    for (std::size_t p = 0; p < counts.size(); ++p) {
      for (std::size_t i = 0; i < b; i += 4096) {
        if (recv[displs[p] + i] != payload(static_cast<int>(p), me, i)) return false;
      }
    }
    return true;
  }
};

// Pure arithmetic, no MPI: one "chunk" of the compute a rank overlaps with an exchange.
double compute_chunk(double x) {
  for (int i = 0; i < 20000; ++i) x = std::sqrt(x * x + 1.0) - 0.5;
  return x;
}

// Structural overlap check: the exchange completes while this thread only computes and reads
// the exchange's completion flag - no MPI call, no wait(). With the progress thread
// (kThread), Exchange::test() is a flag read, so completion proves the thread moved the data.
// With kPoll, test() is the progress call between chunks. The loop bound only guards hangs.
Status test_overlap(MpiCommunicator& comm, const char* label) {
  BigExchange ex(comm.size(), comm.rank(), 8u << 20);
  DISTCA_RETURN_IF_ERROR(comm.barrier());
  DISTCA_ASSIGN_OR_RETURN(auto handle, comm.start_all_to_all_v(ex.args()));
  double x = 1.0;
  bool done = false;
  const auto guard = Clock::now() + std::chrono::seconds(60);
  long chunks = 0;
  while (!done && Clock::now() < guard) {
    x = compute_chunk(x);
    ++chunks;
    done = handle->test();
  }
  EXPECT_OR_RETURN(done, std::string(label) + ": exchange did not complete during compute");
  DISTCA_RETURN_IF_ERROR(handle->wait());
  EXPECT_OR_RETURN(ex.correct(comm.rank()), std::string(label) + ": overlapped exchange data");
  EXPECT_OR_RETURN(std::isfinite(x) && chunks > 0, "compute");
  return comm.barrier();
}

// The progress thread backs off while an exchange cannot complete and its owner computes:
// rank 0 starts an exchange that the other ranks join only after `idle_ms`. Polling every
// poll_interval_us (20 us) it would make thousands of rounds in that time; backing off to
// max_poll_interval_us (1 ms) it makes at most idle_ms plus the few of the ramp. It must
// still poll (a stalled thread would never finish a transfer), and the exchange completes.
Status test_progress_backoff(MpiCommunicator& comm) {
  constexpr int kIdleMs = 250;
  BigExchange ex(comm.size(), comm.rank(), 1u << 16);
  DISTCA_RETURN_IF_ERROR(comm.barrier());
  if (comm.rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(kIdleMs + 50));
  DISTCA_ASSIGN_OR_RETURN(auto h, comm.start_all_to_all_v(ex.args()));
  int64_t rounds = -1;
  if (comm.rank() == 0) {
    const int64_t r0 = comm.progress_rounds();
    std::this_thread::sleep_for(std::chrono::milliseconds(kIdleMs));  // the owner "computes"
    rounds = comm.progress_rounds() - r0;
  }
  DISTCA_RETURN_IF_ERROR(h->wait());
  if (comm.rank() == 0) {
    EXPECT_OR_RETURN(rounds >= 25, "progress thread made only " + std::to_string(rounds) + " rounds in " +
                                       std::to_string(kIdleMs) + " ms");
    EXPECT_OR_RETURN(rounds <= kIdleMs + 40, "progress thread made " + std::to_string(rounds) + " rounds in " +
                                                 std::to_string(kIdleMs) + " ms: no back-off");
  }
  EXPECT_OR_RETURN(ex.correct(comm.rank()), "exchange data after back-off");
  return comm.barrier();
}

// A blocking collective on a group (its exchanges are the parent's p2p messages, started
// inside begin_blocking/end_blocking) is driven by its own waits: the progress thread makes
// no round for it, and the results are the serial rank-order sums. The first exchange
// starts the thread, so a collective that handed its messages to it would count rounds.
Status test_group_collective_owner_driven(MpiCommunicator& comm) {
  BigExchange warm(comm.size(), comm.rank(), 1u << 10);
  DISTCA_ASSIGN_OR_RETURN(auto h, comm.start_all_to_all_v(warm.args()));
  DISTCA_RETURN_IF_ERROR(h->wait());
  std::vector<int> all(static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) all[static_cast<std::size_t>(r)] = r;
  DISTCA_ASSIGN_OR_RETURN(auto group, GroupCommunicator::create(comm, all, 4242));
  const int64_t r0 = comm.progress_rounds();
  for (std::size_t len : {1u, 1000u, 1u << 20}) {  // eager and rendezvous messages
    DISTCA_RETURN_IF_ERROR(check_all_reduce<float>(*group, len));
  }
  const int64_t rounds = comm.progress_rounds() - r0;
  EXPECT_OR_RETURN(rounds == 0, "the progress thread made " + std::to_string(rounds) +
                                    " rounds for blocking group collectives");
  return comm.barrier();
}

// An owner waiting for an exchange drives it itself: rank 0 waits while the other ranks
// join only after `idle_ms`. The progress thread, woken by the start, makes at most a round
// or two before the owner takes over; had it driven the wait (polling every 20 us for a
// waiting owner) it would count hundreds.
Status test_wait_owner_driven(MpiCommunicator& comm) {
  constexpr int kIdleMs = 200;
  BigExchange ex(comm.size(), comm.rank(), 1u << 16);
  DISTCA_RETURN_IF_ERROR(comm.barrier());
  if (comm.rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(kIdleMs));
  const int64_t r0 = comm.progress_rounds();
  DISTCA_ASSIGN_OR_RETURN(auto h, comm.start_all_to_all_v(ex.args()));
  DISTCA_RETURN_IF_ERROR(h->wait());
  const int64_t rounds = comm.progress_rounds() - r0;
  if (comm.rank() == 0) {
    EXPECT_OR_RETURN(rounds <= 5, "the progress thread made " + std::to_string(rounds) + " rounds while rank 0 waited " +
                                      std::to_string(kIdleMs) + " ms");
  }
  EXPECT_OR_RETURN(ex.correct(comm.rank()), "exchange data after an owner-driven wait");
  return comm.barrier();
}

// ---- Point-to-point ----

// Ring: every rank sends to the next and receives from the previous; half start the send
// first. Sizes from empty to past the eager limit (rendezvous), tags from 0 to the largest.
Status test_p2p_ring(Communicator& comm) {
  const int n = comm.size();
  const int me = comm.rank();
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  for (std::size_t bytes : {std::size_t{0}, std::size_t{3}, std::size_t{1000}, std::size_t{4} << 20}) {
    for (int tag : {0, 5, kP2pTagLimit - 1}) {
      const std::string what = "ring bytes=" + std::to_string(bytes) + " tag=" + std::to_string(tag);
      const auto send = p2p_message(me, next, tag, 0, bytes);
      std::vector<std::byte> recv(bytes, kUntouched);
      std::unique_ptr<Exchange> s, r;
      if (me % 2 == 0) {
        DISTCA_ASSIGN_OR_RETURN(s, comm.start_send(send, next, tag));
        DISTCA_ASSIGN_OR_RETURN(r, comm.start_recv(recv, prev, tag));
      } else {
        DISTCA_ASSIGN_OR_RETURN(r, comm.start_recv(recv, prev, tag));
        DISTCA_ASSIGN_OR_RETURN(s, comm.start_send(send, next, tag));
      }
      DISTCA_RETURN_IF_ERROR(s->wait().with_context(what));
      DISTCA_RETURN_IF_ERROR(r->wait().with_context(what));
      EXPECT_OR_RETURN(recv == p2p_message(prev, me, tag, 0, bytes), what);
    }
  }
  return comm.barrier();
}

// K messages per tag on two tags in flight at once, sizes varying with k (one in three past
// the eager limit); the receiver starts tag 2 before tag 1 and waits in reverse order.
Status test_p2p_fifo(Communicator& comm) {
  constexpr int kK = 6;
  auto bytes_of = [](int tag, int k) {
    return static_cast<std::size_t>(k % 3 == 2 ? (1 << 20) + k : 16 + 40 * k + tag);
  };
  const int n = comm.size();
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
  for (auto it = handles.rbegin(); it != handles.rend(); ++it) DISTCA_RETURN_IF_ERROR((*it)->wait());
  r = 0;
  for (int tag : {2, 1}) {
    for (int k = 0; k < kK; ++k, ++r) {
      EXPECT_OR_RETURN(recvs[r] == p2p_message(prev, me, tag, k, bytes_of(tag, k)),
                       "message " + std::to_string(k) + " of tag " + std::to_string(tag) + " out of order");
    }
  }
  return comm.barrier();
}

// Large messages in flight while the ranks run all-reduces and non-blocking all-to-all-v
// exchanges. Run on a fresh communicator, whose exchange sequence tags start at 0 like the
// p2p tags used here: were both on one MPI communicator, they would steal each other's
// messages.
Status test_p2p_interleave(Communicator& comm) {
  const int n = comm.size();
  const int me = comm.rank();
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  const auto counts = random_counts(21, n);
  for (int it = 0; it < 20; ++it) {
    const int tag = it % 4;
    std::vector<float> act(1u << 18), got(1u << 18, -1.0f);
    for (std::size_t i = 0; i < act.size(); ++i) act[i] = static_cast<float>(me * 1000 + it + (i % 4096));
    DISTCA_ASSIGN_OR_RETURN(auto r, comm.start_recv_values(std::span<float>(got), prev, tag, "activations"));
    DISTCA_ASSIGN_OR_RETURN(auto s, comm.start_send_values(std::span<const float>(act), next, tag));
    std::vector<float> x(1001, static_cast<float>(me + it));
    DISTCA_RETURN_IF_ERROR(comm.all_reduce_sum(x));
    const float expected_sum = static_cast<float>(n * (n - 1) / 2 + n * it);
    EXPECT_OR_RETURN(x[1000] == expected_sum, "all_reduce between p2p");
    Layout l = make_layout(counts, me);
    DISTCA_ASSIGN_OR_RETURN(auto ex, comm.start_all_to_all_v(l.args()));
    if (it % 2 == 0) DISTCA_RETURN_IF_ERROR(r->wait());
    DISTCA_RETURN_IF_ERROR(ex->wait());
    DISTCA_RETURN_IF_ERROR(s->wait());
    DISTCA_RETURN_IF_ERROR(r->wait());
    EXPECT_OR_RETURN(l.recv == l.expected_recv, "all_to_all_v between p2p");
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_OR_RETURN(got[i] == static_cast<float>(prev * 1000 + it + (i % 4096)),
                       "p2p between collectives, iteration " + std::to_string(it));
    }
  }
  return comm.barrier();
}

// A rank sends to itself: receive first, then send first (4 MiB: MPI's rendezvous to self).
Status test_p2p_self(Communicator& comm) {
  const int me = comm.rank();
  const std::size_t bytes = 4u << 20;
  const auto a = p2p_message(me, me, 4, 0, bytes);
  const auto b = p2p_message(me, me, 4, 1, bytes);
  std::vector<std::byte> ra(bytes), rb(bytes);
  DISTCA_ASSIGN_OR_RETURN(auto r1, comm.start_recv(ra, me, 4));
  DISTCA_ASSIGN_OR_RETURN(auto s1, comm.start_send(a, me, 4));
  DISTCA_RETURN_IF_ERROR(r1->wait());
  DISTCA_RETURN_IF_ERROR(s1->wait());
  DISTCA_ASSIGN_OR_RETURN(auto s2, comm.start_send(b, me, 4));
  DISTCA_ASSIGN_OR_RETURN(auto r2, comm.start_recv(rb, me, 4));
  DISTCA_RETURN_IF_ERROR(s2->wait());
  DISTCA_RETURN_IF_ERROR(r2->wait());
  EXPECT_OR_RETURN(ra == a && rb == b, "self-send bytes");
  return comm.barrier();
}

// Rank 0 sends `sent` bytes to rank 1, which expects `expected`: both sides' wait() return
// invalid_argument naming both sizes (never a hang or a silent truncation), and a matching
// message afterwards on the same tag goes through.
Status check_p2p_mismatch(Communicator& comm, std::size_t sent, std::size_t expected) {
  const std::string needle = "p2p: rank 0 sends " + std::to_string(sent) + " bytes to rank 1 (tag 3), which expects " +
                             std::to_string(expected);
  std::vector<std::byte> buf(std::max(sent, expected), std::byte{1});
  if (comm.rank() <= 1) {
    Status got;
    if (comm.rank() == 0) {
      DISTCA_ASSIGN_OR_RETURN(auto s, comm.start_send(std::span(buf).first(sent), 1, 3));
      got = s->wait();
    } else {
      DISTCA_ASSIGN_OR_RETURN(auto r, comm.start_recv(std::span(buf).first(expected), 0, 3));
      got = r->wait();
    }
    EXPECT_OR_RETURN(got.code() == StatusCode::kInvalidArgument && got.message() == needle,
                     "mismatch " + std::to_string(sent) + "/" + std::to_string(expected) +
                         " gave: " + got.to_string());
    const auto msg = p2p_message(0, 1, 3, 1, 100);
    std::vector<std::byte> recv(100, kUntouched);
    if (comm.rank() == 0) {
      DISTCA_ASSIGN_OR_RETURN(auto s, comm.start_send(msg, 1, 3));
      DISTCA_RETURN_IF_ERROR(s->wait());
    } else {
      DISTCA_ASSIGN_OR_RETURN(auto r, comm.start_recv(recv, 0, 3));
      DISTCA_RETURN_IF_ERROR(r->wait());
      EXPECT_OR_RETURN(recv == msg, "message after a mismatch");
    }
  }
  return comm.barrier();
}

Status test_p2p_mismatch(Communicator& comm) {
  if (comm.size() < 2) return Status::ok_status();
  DISTCA_RETURN_IF_ERROR(check_p2p_mismatch(comm, 8, 4));
  DISTCA_RETURN_IF_ERROR(check_p2p_mismatch(comm, 4, 8));
  DISTCA_RETURN_IF_ERROR(check_p2p_mismatch(comm, 0, 8));
  DISTCA_RETURN_IF_ERROR(check_p2p_mismatch(comm, 4u << 20, 1u << 20));
  return check_p2p_mismatch(comm, 1u << 20, 4u << 20);
}

Status test_p2p_bad_arguments(Communicator& comm) {
  std::vector<std::byte> buf(4);
  auto bad_peer = comm.start_send(buf, comm.size(), 0);
  EXPECT_OR_RETURN(bad_peer.status().code() == StatusCode::kInvalidArgument &&
                       bad_peer.status().message().find("is not a rank of a group of") != std::string::npos,
                   "bad peer: " + bad_peer.status().to_string());
  auto bad_tag = comm.start_recv(buf, 0, kP2pTagLimit);
  EXPECT_OR_RETURN(bad_tag.status().code() == StatusCode::kInvalidArgument &&
                       bad_tag.status().message().find("tag 1048576 is outside") != std::string::npos,
                   "bad tag: " + bad_tag.status().to_string());
  return Status::ok_status();
}

// A traced communicator records each p2p exchange under its label ("<label> transfer") or the
// default name, from start to observed completion.
Status test_p2p_trace_labels(int* argc, char*** argv, Communicator& world) {
  TraceRecorder trace;
  DISTCA_ASSIGN_OR_RETURN(auto comm, make_mpi_communicator(argc, argv, {.trace = &trace}));
  const int me = comm->rank();
  const int next = (me + 1) % comm->size();
  const int prev = (me + comm->size() - 1) % comm->size();
  std::vector<int> out(10, me), in(10, -1);
  DISTCA_ASSIGN_OR_RETURN(auto r, comm->start_recv_values(std::span<int>(in), prev, 0, "grad s1"));
  DISTCA_ASSIGN_OR_RETURN(auto s, comm->start_send_values(std::span<const int>(out), next, 0));
  DISTCA_RETURN_IF_ERROR(s->wait());
  DISTCA_RETURN_IF_ERROR(r->wait());
  EXPECT_OR_RETURN(in == std::vector<int>(10, prev), "traced p2p data");
  int labelled = 0, plain = 0;
  for (const auto& e : trace.events()) {
    labelled += e.name == "grad s1 transfer" && e.category == "comm" && e.tid == me && e.end_us >= e.start_us;
    plain += e.name == "p2p send" && e.category == "comm" && e.tid == me && e.end_us >= e.start_us;
  }
  EXPECT_OR_RETURN(labelled == 1 && plain == 1, "trace events: " + std::to_string(labelled) + " labelled, " +
                                                    std::to_string(plain) + " plain");
  DISTCA_RETURN_IF_ERROR(comm->barrier());
  return world.barrier();
}

// Gathers every rank's events to rank 0 (sizes by all_gather, bytes by all_to_all_v).
Result<std::vector<TraceEvent>> gather_events(Communicator& comm,
                                              const std::vector<TraceEvent>& mine) {
  const auto bytes = pack_trace_events(mine);
  DISTCA_ASSIGN_OR_RETURN(auto sizes, comm.all_gather_value(static_cast<uint64_t>(bytes.size())));
  const auto n = static_cast<std::size_t>(comm.size());
  std::vector<std::size_t> send_counts(n, 0), zeros(n, 0), recv_counts(n, 0), recv_displs(n, 0);
  send_counts[0] = bytes.size();
  std::size_t total = 0;
  if (comm.rank() == 0) {
    for (std::size_t p = 0; p < n; ++p) {
      recv_counts[p] = sizes[p];
      recv_displs[p] = total;
      total += sizes[p];
    }
  }
  std::vector<std::byte> all(total);
  DISTCA_RETURN_IF_ERROR(comm.all_to_all_v(
      {bytes.data(), send_counts, zeros, all.data(), recv_counts, recv_displs}));
  if (comm.rank() != 0) return std::vector<TraceEvent>{};
  return unpack_trace_events(all);
}

struct OverlapArgs {
  std::string progress = "thread";  // thread | poll | none
  std::size_t mib = 16;             // per peer
  double compute_ms = 300;
  std::string trace_path;
};

// Demonstration: exchange alone, then exchange started before a fixed compute interval and
// waited for after it. Prints per-rank figures; rank 0 writes the Chrome trace.
Status run_overlap(int* argc, char*** argv, const OverlapArgs& args) {
  MpiOptions opts;
  opts.progress = args.progress == "thread" ? ProgressMode::kThread : ProgressMode::kPoll;
  auto pre = make_mpi_communicator(argc, argv, {.progress = ProgressMode::kPoll});
  if (!pre.ok()) return pre.status();
  MpiCommunicator& c0 = **pre;
  // One epoch for every process of the job: rank 0's steady_clock reading (CLOCK_MONOTONIC is
  // shared by processes of one machine).
  DISTCA_RETURN_IF_ERROR(c0.barrier());
  int64_t epoch_ticks = Clock::now().time_since_epoch().count();
  DISTCA_RETURN_IF_ERROR(c0.broadcast(std::as_writable_bytes(std::span<int64_t>(&epoch_ticks, 1)), 0));
  auto trace = std::make_unique<TraceRecorder>(Clock::time_point(Clock::duration(epoch_ticks)));
  opts.trace = trace.get();
  DISTCA_ASSIGN_OR_RETURN(auto comm, make_mpi_communicator(argc, argv, opts));
  const int me = comm->rank();
  BigExchange ex(comm->size(), me, args.mib << 20);

  // 1. The exchange alone.
  DISTCA_RETURN_IF_ERROR(comm->barrier());
  const double a0 = trace->now_us();
  {
    DISTCA_ASSIGN_OR_RETURN(auto h, comm->start_all_to_all_v(ex.args()));
    DISTCA_RETURN_IF_ERROR(h->wait());
  }
  const double a1 = trace->now_us();
  trace->record({"exchange alone (start..wait)", "phase", 0, me, a0, a1});
  EXPECT_OR_RETURN(ex.correct(me), "exchange alone data");

  // 2. Exchange started, compute for compute_ms, then wait.
  std::fill(ex.recv.begin(), ex.recv.end(), std::byte{0});
  DISTCA_RETURN_IF_ERROR(comm->barrier());
  const double s0 = trace->now_us();
  DISTCA_ASSIGN_OR_RETURN(auto h, comm->start_all_to_all_v(ex.args()));
  const double c_start = trace->now_us();
  double x = 1.0;
  while (trace->now_us() - c_start < args.compute_ms * 1000.0) {
    x = compute_chunk(x);
    if (args.progress == "poll") (void)h->test();
  }
  const double c_end = trace->now_us();
  trace->record({"compute", "compute", 0, me, c_start, c_end});
  DISTCA_RETURN_IF_ERROR(h->wait());
  const double w_end = trace->now_us();
  trace->record({"wait", "comm", 0, me, c_end, w_end});
  EXPECT_OR_RETURN(ex.correct(me) && std::isfinite(x), "overlapped exchange data");

  // The second all_to_all_v event of this rank is the overlapped one.
  double done_us = -1;
  int seen = 0;
  for (const auto& e : trace->events()) {
    if (e.name == "all_to_all_v" && e.tid == me && ++seen == 2) done_us = e.end_us;
  }
  std::printf(
      "rank %d progress=%s mib_per_peer=%zu: exchange alone %.1f ms; with compute: start %.1f "
      "ms, exchange done %.1f ms after start, compute %.1f ms, wait %.2f ms, step %.1f ms\n",
      me, args.progress.c_str(), args.mib, (a1 - a0) / 1000, (c_start - s0) / 1000,
      (done_us - s0) / 1000, (c_end - c_start) / 1000, (w_end - c_end) / 1000, (w_end - s0) / 1000);
  std::fflush(stdout);
  DISTCA_ASSIGN_OR_RETURN(auto all, gather_events(*comm, trace->events()));
  if (me == 0 && !args.trace_path.empty()) {
    DISTCA_RETURN_IF_ERROR(write_file_atomic(args.trace_path, chrome_trace_json(all)));
  }
  return comm->barrier();
}

// Rank 1 fails while every rank has an exchange in flight; the others then block in wait()
// and a collective that can never complete - only the job abort ends them.
Status run_injected_failure(MpiCommunicator& comm) {
  std::vector<float> x(1000, 1.0f);
  for (int step = 0; step < 3; ++step) DISTCA_RETURN_IF_ERROR(comm.all_reduce_sum(x));
  BigExchange ex(comm.size(), comm.rank(), 1u << 20);
  DISTCA_ASSIGN_OR_RETURN(auto h, comm.start_all_to_all_v(ex.args()));
  if (comm.rank() == 1) comm.fail(Status::internal("injected failure during exchange 3"));
  DISTCA_RETURN_IF_ERROR(h->wait());
  DISTCA_RETURN_IF_ERROR(comm.all_reduce_sum(x));
  return Status::internal("all_reduce completed although rank 1 failed");
}

// Every rank but 1 waits for a message from rank 1 and for rank 1 to take one; rank 1 fails
// instead: only the job abort ends the others' waits.
Status run_injected_p2p_failure(MpiCommunicator& comm) {
  DISTCA_RETURN_IF_ERROR(comm.barrier());
  if (comm.rank() == 1) comm.fail(Status::internal("injected failure during p2p"));
  std::vector<std::byte> in(1u << 20), out(1u << 20);
  DISTCA_ASSIGN_OR_RETURN(auto r, comm.start_recv(in, 1, 7));
  DISTCA_ASSIGN_OR_RETURN(auto s, comm.start_send(out, 1, 8));
  DISTCA_RETURN_IF_ERROR(r->wait());
  DISTCA_RETURN_IF_ERROR(s->wait());
  return Status::internal("p2p completed although rank 1 failed");
}

// The last rank stops itself (SIGSTOP: alive but silent); the others wait for it in a barrier,
// a non-blocking exchange (the progress thread's path) or a p2p receive from it. With timeout_s set they must end
// the job naming that rank instead of waiting forever (expect_stall.cmake).
Status run_stall(MpiCommunicator& comm, const std::string& how) {
  const int silent = comm.size() - 1;
  DISTCA_RETURN_IF_ERROR(comm.barrier());  // everyone is up
  if (comm.rank() == silent) ::raise(SIGSTOP);
  if (how == "barrier") {
    DISTCA_RETURN_IF_ERROR(comm.barrier());
  } else if (how == "p2p") {
    std::vector<std::byte> in(1u << 16);
    DISTCA_ASSIGN_OR_RETURN(auto h, comm.start_recv(in, silent, 3));
    DISTCA_RETURN_IF_ERROR(h->wait());
  } else {
    BigExchange ex(comm.size(), comm.rank(), 1u << 16);
    DISTCA_ASSIGN_OR_RETURN(auto h, comm.start_all_to_all_v(ex.args()));
    DISTCA_RETURN_IF_ERROR(h->wait());
  }
  return Status::internal("the wait ended although rank " + std::to_string(silent) + " is stopped");
}

}  // namespace
}  // namespace distca::comm

int main(int argc, char** argv) {
  using namespace distca;        // NOLINT(google-build-using-namespace)
  using namespace distca::comm;  // NOLINT(google-build-using-namespace)
  std::string mode = "suite";
  OverlapArgs oa;
  std::string stall;  // barrier | exchange
  double timeout_s = 300;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "comm_mpi_test: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--inject-failure") mode = "fail";
    else if (a == "--inject-p2p-failure") mode = "fail_p2p";
    else if (a == "--overlap") mode = "overlap";
    else if (a == "--progress") oa.progress = next();
    else if (a == "--mib") oa.mib = std::stoul(next());
    else if (a == "--compute-ms") oa.compute_ms = std::stod(next());
    else if (a == "--trace") oa.trace_path = next();
    else if (a == "--stall") stall = next();
    else if (a == "--timeout") timeout_s = std::stod(next());
    else {
      std::fprintf(stderr, "comm_mpi_test: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (oa.progress != "thread" && oa.progress != "poll" && oa.progress != "none") {
    std::fprintf(stderr, "comm_mpi_test: --progress must be thread, poll or none\n");
    return 2;
  }
  if (mode == "overlap") {
    Status st = run_overlap(&argc, &argv, oa);
    if (!st.ok()) abort_job(-1, st.message());
    return 0;
  }

  if (!stall.empty()) {
    auto c = make_mpi_communicator(&argc, &argv, {.timeout_s = timeout_s});
    if (!c.ok()) abort_job(-1, c.status().message());
    (*c)->fail(run_stall(**c, stall));
  }
  auto made = make_mpi_communicator(&argc, &argv);
  if (!made.ok()) abort_job(-1, made.status().message());
  MpiCommunicator& comm = **made;
  if (mode == "fail") {
    Status st = run_injected_failure(comm);
    comm.fail(st);
  }
  if (mode == "fail_p2p") comm.fail(run_injected_p2p_failure(comm));
  auto poll = make_mpi_communicator(&argc, &argv, {.progress = ProgressMode::kPoll});
  if (!poll.ok()) comm.fail(poll.status());
  // Fresh communicators (exchange sequence numbers from 0) for the p2p interleaving check.
  auto fresh = make_mpi_communicator(&argc, &argv);
  if (!fresh.ok()) comm.fail(fresh.status());
  auto fresh_poll = make_mpi_communicator(&argc, &argv, {.progress = ProgressMode::kPoll});
  if (!fresh_poll.ok()) comm.fail(fresh_poll.status());
  if (comm.rank() == 0) {
    std::printf("comm_mpi_test: %d ranks, %s, %s, progress %s\n", comm.size(),
                comm.info().library_version.c_str(), comm.info().thread_level_name.c_str(),
                comm.info().progress == ProgressMode::kThread ? "thread" : "poll");
  }
  struct Case {
    const char* name;
    std::function<Status()> fn;
  };
  const std::vector<Case> cases = {
      {"identity", [&] { return test_identity(comm); }},
      {"host_ids", [&] { return test_host_ids(comm); }},
      {"host_ids_poll", [&] { return test_host_ids(**poll); }},
      {"all_reduce", [&] { return test_all_reduce(comm); }},
      {"all_to_all_v", [&] { return test_all_to_all_v(comm); }},
      {"variable_collectives", [&] { return check_variable_collectives(comm, 99); }},
      {"variable_collectives_poll", [&] { return check_variable_collectives(**poll, 98); }},
      {"non_blocking", [&] { return test_non_blocking(comm); }},
      {"non_blocking_poll", [&] { return test_non_blocking(**poll); }},
      {"broadcast", [&] { return test_broadcast(comm); }},
      {"count_mismatch", [&] { return test_count_mismatch(comm); }},
      {"failed_exchange_releases_buffers", [&] { return test_failed_exchange_releases_buffers(comm); }},
      {"overlap_progress_thread",
       [&] {
         if (comm.info().progress != ProgressMode::kThread) return Status::ok_status();
         return test_overlap(comm, "progress thread");
       }},
      {"overlap_poll", [&] { return test_overlap(**poll, "test() polling"); }},
      {"p2p_ring", [&] { return test_p2p_ring(comm); }},
      {"p2p_ring_poll", [&] { return test_p2p_ring(**poll); }},
      {"p2p_fifo", [&] { return test_p2p_fifo(comm); }},
      {"p2p_fifo_poll", [&] { return test_p2p_fifo(**poll); }},
      {"p2p_interleave", [&] { return test_p2p_interleave(**fresh); }},
      {"p2p_interleave_poll", [&] { return test_p2p_interleave(**fresh_poll); }},
      {"p2p_self", [&] { return test_p2p_self(comm); }},
      {"p2p_self_poll", [&] { return test_p2p_self(**poll); }},
      {"p2p_mismatch", [&] { return test_p2p_mismatch(comm); }},
      {"p2p_mismatch_poll", [&] { return test_p2p_mismatch(**poll); }},
      {"p2p_bad_arguments", [&] { return test_p2p_bad_arguments(comm); }},
      {"p2p_trace_labels", [&] { return test_p2p_trace_labels(&argc, &argv, comm); }},
      {"group_collective_owner_driven",
       [&] {
         if (comm.info().progress != ProgressMode::kThread) return Status::ok_status();
         return test_group_collective_owner_driven(comm);
       }},
      {"wait_owner_driven",
       [&] {
         if (comm.info().progress != ProgressMode::kThread) return Status::ok_status();
         return test_wait_owner_driven(comm);
       }},
      {"progress_backoff",
       [&] {
         if (comm.info().progress != ProgressMode::kThread) return Status::ok_status();
         return test_progress_backoff(comm);
       }},
  };
  for (const auto& c : cases) {
    Status st = c.fn();
    if (!st.ok()) comm.fail(st.with_context(c.name));
    if (comm.rank() == 0) std::printf("comm_mpi_test: ok %s\n", c.name);
  }
  if (comm.rank() == 0) std::printf("comm_mpi_test: all checks passed\n");
  return 0;
}
