// The one way a command starts a group of ranks: the ranks agree on their settings, each
// process prepares, then every rank runs.
//
// Settings agreement. Ranks of one job are separate processes under mpirun, each with its own
// command line (mpirun -np 1 A : -np 1 B starts two). A setting that shapes a message (a
// width, an overlap mode) or a loop count (steps, rounds) that differs between ranks makes
// their exchanges disagree in size or number: truncated receives, or a rank waiting for an
// exchange its peer never starts. So before its first exchange every rank describes its
// resolved settings as an ordered list of (name, value) texts and agree_on_settings compares
// them: one all-gather of a 64-bit hash of the whole list when they agree; on a mismatch two
// more bounded all-gathers find and name the first setting that differs, on every rank.
//
// Thread safety: Settings is a plain value. agree_on_settings and launch's rank function run
// on the rank's own thread, as every Communicator call does.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/comm/mpi.h"
#include "distca/core/status.h"

namespace distca::comm {

// An ordered list of (name, value) texts. Names are what the user sets ("--overlap",
// "model_overrides.hidden"); values are exact texts (doubles round-trip: %.17g). Two ranks
// agree when their lists are equal, names, values and order.
class Settings {
 public:
  Settings& add(std::string name, std::string value);
  Settings& add(std::string name, const char* value) { return add(std::move(name), std::string(value)); }
  Settings& add(std::string name, int64_t value) { return add(std::move(name), std::to_string(value)); }
  Settings& add(std::string name, int value) { return add(std::move(name), std::to_string(value)); }
  Settings& add(std::string name, uint64_t value) { return add(std::move(name), std::to_string(value)); }
  Settings& add(std::string name, double value);
  Settings& add(std::string name, bool value) { return add(std::move(name), std::string(value ? "true" : "false")); }

  const std::vector<std::pair<std::string, std::string>>& items() const { return items_; }
  // FNV-1a over every name and value, each prefixed by its length (so ("ab","c") and
  // ("a","bc") differ). The same list gives the same hash on every host.
  uint64_t hash() const;

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

// Every rank of `comm` calls it with its own settings before its first other collective or
// exchange (it is a collective: same order on every rank). OK when every rank's list equals
// rank 0's. Otherwise invalid_argument on every rank, naming the first setting, in list
// order, whose value differs, with rank 0's value and the first other rank's value:
//   "ranks disagree on --overlap: rank 0 has 'signal', rank 1 has 'pingpong'"
// (lists of different names: "ranks disagree on their settings: rank 0 has --steps, rank 1
// has --rounds"; a value of 168 characters or more is cut to 164 and "...", a name of 64 or
// more to 60). Cost when they agree:
// one all-gather of 16 bytes per rank. Bounded like every collective (mpi: MpiOptions::
// timeout_s names a rank that never arrives; local: a failed rank wakes the others).
// Errors: the communicator's own (a failed group, a timeout ends the job).
Status agree_on_settings(Communicator& comm, const Settings& settings);

enum class Backend {
  kLocal,  // the ranks are threads of this process (local.h)
  kMpi,    // this process is one rank of an mpirun job (mpi.h)
};

// Which part of the group this process holds.
struct GroupInfo {
  int rank = 0;  // mpi: this process's rank; local: 0
  int size = 0;  // ranks in the group
  int here = 0;  // ranks this process runs: local: size; mpi: 1
};

struct LaunchOptions {
  Backend backend = Backend::kLocal;
  int ranks = 1;    // local: rank threads (>= 1); mpi: ignored (the MPI world decides)
  MpiOptions mpi;   // mpi only (timeout, progress, trace)
};

// Per process, once the settings agree and before any rank runs: checks that need the group's
// size (a memory estimate, a rank count) and inputs every rank reads. May be empty.
using PrepareFn = std::function<Status(const GroupInfo&)>;
// Per rank, on the rank's thread: the work. `slot` indexes this process's ranks, in
// [0, GroupInfo::here) (local: the rank; mpi: 0), for per-rank outputs.
using RankFn = std::function<Status(Communicator& comm, int slot)>;

// What launch() did in this process.
struct Launched {
  Status status;       // OK, or why this process stops (see launch)
  GroupInfo group;     // size 0 when no group was made
  bool speaks = true;  // this process prints `status`, or the results when OK (one per job)
};

// Makes the group (local: options.ranks threads; mpi: the world communicator, MPI initialised
// on first use), agrees on `settings` (agree_on_settings), runs `prepare` once per process,
// then `run` on every rank. Outcomes, in order:
//   - the group cannot be made (MPI initialisation, bad options): that error; every process
//     speaks (none knows its rank).
//   - settings differ: the agreement's invalid_argument on every process; rank 0 speaks.
//   - prepare fails on some process (mpi: the outcomes are all-gathered, so every rank stops
//     before any rank runs): the lowest failing rank speaks its own error; the others get the
//     same code with "rank R refused" and stay silent. local: prepare's error, spoken.
//   - run fails: local: run_local's "rank R failed: ..." (spoken); mpi: Communicator::fail
//     ends the job ("distca: rank R failed: ..."), so launch does not return.
//   - OK: rank 0 (mpi) or the one local process speaks.
// local: prepare runs in the calling thread before the rank threads start; the threads then
// agree on the one `settings` object (which always holds) before `run`.
// The communicator lives until launch returns; options.mpi.trace must outlive it.
Launched launch(const LaunchOptions& options, const Settings& settings, const PrepareFn& prepare,
                const RankFn& run);

}  // namespace distca::comm
