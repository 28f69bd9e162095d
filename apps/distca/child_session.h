// A child program (mpirun and the ranks it starts) that cannot outlive the distca process that
// started it, whatever ends that process: `bench simulate --validate`'s profile and bench train
// runs. docs/development.md, "Child processes".
//
// The child runs in a session of its own (setsid), so everything it starts shares its session
// id even where it makes process groups of its own (Open MPI puts every rank in its own group).
// Ending it ends the session: SIGTERM to every process of the session, SIGKILL to what is left
// after a grace period.
//
// If the caller dies without ending it (SIGKILL included), a watchdog does: a small process
// forked before the child, in a session of its own, holds one end of a socket pair whose other
// end only the caller and the not-yet-executed child hold (close-on-exec). The child sends its
// pid before exec; end of file without the caller's "released" message means the caller is
// gone: the watchdog ends the child's session and removes the child's unfinished log. The
// child also has PR_SET_PDEATHSIG (SIGKILL), and exits if its parent is already gone when it
// checks, so it never starts ranks for a dead caller.
//
// Not thread-safe: one run_in_session at a time per process (the watchdog and the child are
// forked from the calling thread; between fork and exec only async-signal-safe calls run).
#pragma once

#include <string>
#include <vector>

#include "distca/core/status.h"

namespace distca::cli {

struct ChildEnd {
  int status = 0;             // waitpid status of the child (when it ended by itself)
  bool timed_out = false;     // ran past the timeout; its session was ended
  bool interrupted = false;   // `*stop` became non-zero; its session was ended
};

// Runs argv[0] (an absolute path) with argv, stdin /dev/null, stdout and stderr into `log`
// (created or truncated), OMP_NUM_THREADS=1 and the rest of this environment; waits at most
// timeout_s or until `*stop` (set by a signal handler) is non-zero, then ends its session
// (grace 5 s). When it ends by itself, whatever of its session is left is killed. A caller
// that dies first: the watchdog ends the session and removes `log`.
Result<ChildEnd> run_in_session(const std::vector<std::string>& argv, const std::string& log, double timeout_s,
                                const volatile int* stop);

// Every process of session `sid` but zombies: SIGTERM, then SIGKILL to those left after
// grace_s (polled every 50 ms). Async-signal-safe (raw /proc reads, no allocation).
void end_session(int sid, double grace_s);

}  // namespace distca::cli
