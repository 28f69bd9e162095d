// How the mpi backend's blocking waits pause between MPI_Testsome rounds that complete nothing
// (WaitPolicy, mpi.h), and an optional per-rank record of those waits (internal to src/comm).
#pragma once

#include <chrono>
#include <cstdint>

#include "distca/comm/mpi.h"

namespace distca::comm::mpi_detail {

// One blocking wait, from construction to destruction, on the thread that waits. idle() after
// each round that completed nothing, progressed() after one that completed a request.
//
// With DISTCA_WAIT_STATS=DIR set, every wait is also recorded (wall and thread CPU time,
// sleeps, and the CPU cgroup's throttling during it and in the work after it, up to the
// thread's next wait); write_wait_stats() writes the totals. Without it, a wait reads no
// clock beyond the policy's own.
class BlockingWait {
 public:
  explicit BlockingWait(WaitPolicy policy);
  ~BlockingWait();
  BlockingWait(const BlockingWait&) = delete;
  BlockingWait& operator=(const BlockingWait&) = delete;

  void progressed() { since_ = std::chrono::steady_clock::now(); }
  // kSpin, or within kWaitSpinUs of the wait's start or last completion: yield. Otherwise
  // sleep an eighth of the time since then, at most kWaitMaxSleepUs, with the thread's timer
  // slack cut to 1 us for the wait (the default 50 us would add that much to every sleep).
  void idle();

 private:
  WaitPolicy policy_;
  std::chrono::steady_clock::time_point since_;
  long old_slack_ns_ = -1;  // >= 0: the thread's timer slack before this wait changed it
  int64_t sleeps_ = 0;
  bool recorded_ = false;   // DISTCA_WAIT_STATS: the start below is valid
  double start_wall_s_ = 0, start_cpu_s_ = 0;
  uint64_t start_throttles_ = 0, start_throttled_ns_ = 0;
};

// DISTCA_WAIT_STATS=DIR: writes DIR/wait-stats.RANK.json (the totals of this process's
// recorded waits and its cgroup's counters; docs/netlab.md, "caps"). Nothing when unset.
// Errors: the file cannot be written (the caller reports them; they change no result).
Status write_wait_stats(int rank);

}  // namespace distca::comm::mpi_detail
