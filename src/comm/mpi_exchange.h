// The mpi backend's exchanges (internal to src/comm; mpi.cpp is the only user): one
// exchange's MPI requests, the rounds that drive them to completion with the timeout and the
// cancellation on error, and the progress thread of a communicator.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "distca/comm/mpi.h"
#include "distca/core/status.h"
#include "distca/core/trace.h"

namespace distca::comm::mpi_detail {

// Turns an MPI return code into a Status naming the call and the rank.
Status mpi_check(int code, const char* call, int rank);

using Clock = std::chrono::steady_clock;

// What a point-to-point exchange adds to ExchangeState. Each side tells the other its size,
// so a mismatch is reported on both sides with both sizes: the sender sends a header (its
// byte count) beside the payload, the receiver sends an ack (the byte count it expects).
// Requests: send = [recv ack, send header, send payload]; receive = [recv header, recv
// payload, send ack]. Everything is posted at start, so neither side waits for the other's
// completion - only for its start and progress.
struct P2pState {
  bool is_send = false;
  int peer = 0;
  int tag = 0;                // the caller's tag
  uint64_t mine = 0;          // this side's byte count (the header's or the ack's content)
  uint64_t theirs = 0;        // the other side's byte count, once received
  bool theirs_known = false;  // the header/ack arrived intact
  Status error;               // first failure of a request; reported once all are complete
};

// One exchange's MPI requests and their outcome. Until `done`, the requests are touched only
// by the thread that drives progress (the progress thread in kThread mode, the owner in
// kPoll mode).
struct ExchangeState {
  int rank = 0;
  std::vector<MPI_Request> requests;   // receives first, then sends; MPI_REQUEST_NULL once complete
  std::vector<int> peer;               // (requests) the peer of request i
  std::size_t n_recv = 0;              // requests [0, n_recv) are receives
  std::vector<int> recv_expected;      // (n_recv) bytes expected from the peer
  std::size_t remaining = 0;           // requests not complete yet
  bool done = false;                   // guarded by the engine's mutex in kThread mode
  Status status;                       // valid once done
  TraceRecorder* trace = nullptr;      // optional: records [start, completion observed]
  std::string trace_name = "all_to_all_v";
  double start_us = 0;
  double timeout_s = 0;                // > 0: no completion for this long ends the job
  WaitPolicy wait = kDefaultWaitPolicy;  // how a kBlock drive pauses between empty rounds
  Clock::time_point last_progress;     // the start, or the latest completed request
  std::optional<P2pState> p2p;         // set for start_send / start_recv
};

enum class Drive {
  kTest,      // one round, no timeout (the owner polls between compute chunks)
  kProgress,  // one round, timeout enforced (the progress thread)
  kBlock,     // rounds until complete, timeout enforced from the start of the wait
};

// Cancels the requests of `st` still pending and completes them (ending the job if one stays
// live), then returns `error`: no request reads or writes the caller's buffers afterwards.
Status settle(ExchangeState& st, const Status& error);

// MPI_Testsome rounds over st's requests as `how` says; nullopt while incomplete, else the
// outcome, with no request left in flight on an error (settle).
std::optional<Status> drive(ExchangeState& st, Drive how);

// Set by abort_job: the progress threads stop calling MPI while MPI_Abort tears it down.
extern std::atomic<bool> g_aborting;

// The progress thread of one communicator (kThread mode): MPI_Testsome over every exchange
// in flight while its owner computes; parked on the condition variable when there is none.
// The pause between rounds starts at poll_interval and doubles, up to max_poll_interval,
// while rounds complete nothing: every round wakes a thread that takes a core from the
// rank's compute (on 2 cores, 20 us rounds through a long kernel call slowed the other
// rank's attention by 15%, docs/runtime.md). A new exchange or a completion resets it.
//
// An owner that waits drives progress itself (wait): it has nothing else to do, so its
// MPI_Testsome loop sees the completion at once, where handing it to the thread cost a
// wake-up (~25 us of CPU each on the 2-core VM) per short pause; the thread stays parked
// meanwhile and only one thread at a time ever drives the engine's exchanges.
class ProgressEngine {
 public:
  ProgressEngine(int poll_interval_us, int max_poll_interval_us, WaitPolicy wait);
  ~ProgressEngine();  // joins the thread; every exchange added must be done by then

  void add(std::shared_ptr<ExchangeState> st);
  int64_t rounds() const { return rounds_.load(std::memory_order_relaxed); }
  bool is_done(const ExchangeState& st);
  // Rounds over every exchange in flight on the caller's thread until `st` is done, once the
  // thread has finished the round it may be in, pausing between empty rounds as the engine's
  // WaitPolicy says (BlockingWait). Timeouts as in the thread's rounds.
  Status wait(const ExchangeState& st);

 private:
  using Finished = std::vector<std::pair<ExchangeState*, Status>>;

  // One round over `batch` (unlocked): the exchanges that completed, with their results.
  static Finished drive_batch(const std::vector<std::shared_ptr<ExchangeState>>& batch);
  // Marks `finished` done and out of active_ (locked).
  void complete(const Finished& finished);
  void loop();

  const std::chrono::microseconds poll_interval_;
  const std::chrono::microseconds max_poll_interval_;
  const WaitPolicy wait_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t events_ = 0;        // exchanges added: each resets the pause
  bool owner_driving_ = false;  // an owner is in wait(): the thread makes no round
  bool in_round_ = false;       // the thread is in a round (unlocked)
  std::atomic<int64_t> rounds_{0};
  std::vector<std::shared_ptr<ExchangeState>> active_;
  std::thread thread_;  // last: starts after every other member exists
};

}  // namespace distca::comm::mpi_detail
