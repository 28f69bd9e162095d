// The MPI backend's test program, run under mpirun by CTest (label `mpi`):
//
//   mpirun -np N comm_mpi_test                  the checks below; exit 0 when all pass
//   mpirun -np N comm_mpi_test --inject-failure rank 1 fails in the middle of an exchange
//                                               (CTest expects exit != 0 and its line)
//   mpirun -np N comm_mpi_test --stall barrier|exchange --timeout S
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
  DISTCA_RETURN_IF_ERROR(c0.broadcast_values(std::span<int64_t>(&epoch_ticks, 1), 0));
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

// The last rank stops itself (SIGSTOP: alive but silent); the others wait for it in a barrier
// or a non-blocking exchange (the progress thread's path). With timeout_s set they must end
// the job naming that rank instead of waiting forever (expect_stall.cmake).
Status run_stall(MpiCommunicator& comm, const std::string& how) {
  const int silent = comm.size() - 1;
  DISTCA_RETURN_IF_ERROR(comm.barrier());  // everyone is up
  if (comm.rank() == silent) ::raise(SIGSTOP);
  if (how == "barrier") {
    DISTCA_RETURN_IF_ERROR(comm.barrier());
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
  auto poll = make_mpi_communicator(&argc, &argv, {.progress = ProgressMode::kPoll});
  if (!poll.ok()) comm.fail(poll.status());
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
      {"all_reduce", [&] { return test_all_reduce(comm); }},
      {"all_to_all_v", [&] { return test_all_to_all_v(comm); }},
      {"non_blocking", [&] { return test_non_blocking(comm); }},
      {"non_blocking_poll", [&] { return test_non_blocking(**poll); }},
      {"broadcast", [&] { return test_broadcast(comm); }},
      {"count_mismatch", [&] { return test_count_mismatch(comm); }},
      {"overlap_progress_thread",
       [&] {
         if (comm.info().progress != ProgressMode::kThread) return Status::ok_status();
         return test_overlap(comm, "progress thread");
       }},
      {"overlap_poll", [&] { return test_overlap(**poll, "test() polling"); }},
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
