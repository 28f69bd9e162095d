// Backend `mpi`: one OpenMPI process per rank (mpirun -np N distca ... --backend mpi).
//
// docs/runtime.md ("Communicator") has the design: an exchange is per-peer MPI_Isend/MPI_Irecv
// pairs on a private duplicate of MPI_COMM_WORLD, point-to-point messages use a second one
// (MPI tags 3t, 3t+1, 3t+2 for a caller's tag t), and the measurements behind the defaults.
//
// Progress: OpenMPI moves large messages only inside MPI calls. MPI_Init_thread asks for
// MPI_THREAD_MULTIPLE; given it, ProgressMode::kThread runs a progress thread per communicator
// (MPI_Testsome rounds backing off while the owner computes), so transfers advance with no help
// from the computing thread; a wait() drives every exchange in flight itself (no wake-up
// latency) while the thread stays parked, and exchanges started between begin_blocking() and
// end_blocking() (blocking group collectives) never reach the thread. Otherwise ProgressMode::kPoll: transfers advance only inside
// test()/wait(), so the runtime calls test() between compute chunks. p2p calls require
// MPI_TAG_UB >= 3 * kP2pTagLimit - 1 (else they fail).
//
// Blocking waits poll MPI_Testsome; between empty rounds they yield or, past 500 us, sleep
// (WaitPolicy; DISTCA_WAIT=spin|sleep, default spin; docs/runtime.md, "Waits").
//
// Every wait is bounded (MpiOptions::timeout_s): barrier, broadcast and the collectives are
// all-to-all-v exchanges (barrier: zero bytes to and from every peer) driven by MPI_Testsome
// loops, so a silent peer is named rather than waited for forever. Not bounded: MPI_Init,
// MPI_Comm_dup at creation and MPI_Finalize at exit (a peer that never starts or never ends).
//
// Errors: the communicator uses MPI_ERRORS_RETURN; every MPI call is checked and a failure
// becomes Status::internal("MPI_Xxx (rank R): <MPI_Error_string>"). Per-peer counts must fit
// in an int (MPI's count type); larger ones are refused with invalid_argument. An exchange
// that fails (a count mismatch, an MPI error while posting or testing) cancels and completes
// its pending requests before it reports, so the caller may free its buffers while it unwinds
// to fail(); a request still live after 5 s ends the job there (abort_job) instead.
//
// Lifetime: MPI is initialised by the first make_mpi_communicator call in the process and
// finalised at process exit, after every communicator is gone (an RAII environment shared by
// the communicators). A communicator and its exchanges belong to the thread that created it;
// every exchange is completed (wait) before its communicator is destroyed.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "distca/comm/communicator.h"
#include "distca/core/trace.h"

namespace distca::comm {

enum class ProgressMode {
  kAuto,    // kThread when MPI_THREAD_MULTIPLE is provided, else kPoll
  kThread,  // progress thread; fails with invalid_argument without MPI_THREAD_MULTIPLE
  kPoll,    // progress only inside test()/wait() and other calls on this communicator
};

// How a blocking wait (Exchange::wait(), the blocking all_to_all_v and every collective and
// barrier built on it) spends the time between MPI_Testsome rounds that complete nothing.
// OpenMPI's shared-memory transport gives no way to block until a message arrives, so every
// wait polls; the policy says whether the waiting thread stays runnable while it does.
enum class WaitPolicy {
  kSpin,   // yield between rounds: seen at once, but the thread uses its core (or its CPU cap)
  // Yield between rounds for the first kWaitSpinUs since the wait began or last completed a
  // request (a short wait stays as fast as kSpin), then sleep between rounds for an eighth of
  // the time waited so far, at most kWaitMaxSleepUs: a long wait costs little CPU, and its
  // end is seen at most 12.5% (and 0.5 ms) late.
  kSleep,
};
// The spin window is long because a sleep on the development VM overshoots by 40-90 us
// (timer and idle wake-up): sleeping from 50 us on made 64-byte exchanges 2-3x slower.
inline constexpr int kWaitSpinUs = 500;
inline constexpr int kWaitMaxSleepUs = 500;
// DISTCA_WAIT=spin|sleep selects the policy; unset or empty: kSpin, which keeps uncapped
// latency as it was (sleeping made the profile's 4 MiB exchanges 1.3-1.7x slower, loaded VM;
// docs/runtime.md). scripts/rank-cap.sh sets sleep for its program unless DISTCA_WAIT is set:
// under a CPU cap a spinning wait spends the rank's quota, which a waiting GPU would not.
inline constexpr WaitPolicy kDefaultWaitPolicy = WaitPolicy::kSpin;

// The policy DISTCA_WAIT names (unset or empty: kDefaultWaitPolicy); otherwise
// invalid_argument "DISTCA_WAIT must be spin or sleep (got 'X')".
Result<WaitPolicy> wait_policy_from_env();
const char* wait_policy_name(WaitPolicy policy);

struct MpiOptions {
  ProgressMode progress = ProgressMode::kAuto;
  // Unset: DISTCA_WAIT (wait_policy_from_env; a bad value fails make_mpi_communicator).
  std::optional<WaitPolicy> wait = std::nullopt;
  // Pause of the progress thread between MPI_Testsome rounds while exchanges are in flight:
  // short enough to keep transfers streaming, long enough not to steal a core from compute.
  int poll_interval_us = 20;
  // While rounds complete nothing and the owner is computing, the pause doubles up to this
  // (>= poll_interval_us): fewer wake-ups stealing the compute's core, and a wait() resets it.
  int max_poll_interval_us = 1000;
  // When set, every non-blocking exchange is recorded as an event "all_to_all_v" (or
  // "<AllToAllV::label> transfer" when the caller labelled it; category
  // "comm", tid = rank) from its start to the moment its completion was observed by whoever
  // drives progress (the progress thread, or test()/wait()). Not owned; must outlive the
  // communicator. This is how the overlap of transfers with compute is shown in a trace.
  TraceRecorder* trace = nullptr;
  // Progress timeout (seconds; 0: none): an exchange, barrier or collective in which no
  // message completes for this long - a peer stopped (SIGSTOP), hung, or that far behind -
  // ends the job: "distca: rank R failed: no progress for T s (--mpi-timeout): no data from
  // rank(s) P" and MPI_Abort. Measured from the exchange's start or its latest completed
  // message; a blocking wait restarts the clock when it begins. Non-blocking test() in kPoll
  // mode never times out (the owner may compute between calls). Must exceed the longest
  // compute any rank does between two matching exchanges.
  double timeout_s = 300;
};

// What the MPI library granted; for logs and docs.
struct MpiInfo {
  int thread_level_provided = 0;  // MPI_THREAD_SINGLE..MPI_THREAD_MULTIPLE
  std::string thread_level_name;  // "MPI_THREAD_MULTIPLE", ...
  ProgressMode progress = ProgressMode::kPoll;  // the mode in use (never kAuto)
  std::string library_version;    // MPI_Get_library_version, first line
  WaitPolicy wait = kDefaultWaitPolicy;  // the policy in use
};

class MpiCommunicator : public Communicator {
 public:
  virtual const MpiInfo& info() const = 0;
  // MPI_Testsome rounds the progress thread has made so far (0 in kPoll mode; the owner's
  // rounds inside wait() are not counted): a diagnostic of how often it woke (tests check the
  // back-off and owner-driven waits with it). The owner's thread, like every call.
  virtual int64_t progress_rounds() const = 0;
};

// Initialises MPI (once per process; argc/argv may be null) and returns the world
// communicator. Errors: MPI initialisation failure, kThread without MPI_THREAD_MULTIPLE.
Result<std::unique_ptr<MpiCommunicator>> make_mpi_communicator(int* argc, char*** argv,
                                                               const MpiOptions& options = {});

// Prints "distca: rank R failed: CAUSE" to stderr and calls MPI_Abort(MPI_COMM_WORLD, 1);
// mpirun then terminates every rank and exits non-zero. The one place the comm library
// prints and exits, by design: it is how a failing rank ends an MPI job. Without MPI
// initialised it exits with status 1 after printing. Never returns.
[[noreturn]] void abort_job(int rank, const std::string& cause);

}  // namespace distca::comm
