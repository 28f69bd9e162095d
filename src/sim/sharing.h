// Processor sharing of the units on one host's cores (docs/simulation-model.md, "Processor
// sharing"): the host model of a configuration and the fixed-point passes simulate() runs when
// it is oversubscribed. Internal to the sim layer; not installed.
//
// Fluid model: a computing unit of a host progresses at speed(n) x its base rate, n the units
// of its host computing at that moment (itself included). Waiting units take no core (the
// runtime's waits yield theirs: docs/simulation-model.md says why). The engines charge every
// compute interval at the base rates (a hardware profile's concurrent figures, measured with
// every rank of its host computing); Sharing turns each interval into its wall seconds under
// the previous pass's timeline of the other units of its host, and run_shared repeats the
// engine until the timelines stop moving.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "distca/core/status.h"
#include "distca/sim/simulator.h"

namespace distca::sim::detail {

struct Rates;

// Passes at most, and the pass after which an interval's new length is averaged with its
// previous one (damping, a fallback: an oscillation still settles, at the same fixed point;
// undamped passes converge faster where they converge).
inline constexpr int64_t kMaxSharingPasses = 64;
inline constexpr int64_t kUndampedSharingPasses = 32;
// Converged: no interval start or end moved by more than this x the latest end.
inline constexpr double kSharingTolerance = 1e-9;

struct HostModel {
  int64_t units_per_host = 1;  // consecutive unit ids 0 .. n-1 share host 0, n .. 2n-1 host 1, ...
  double cores = 1;            // cores per host
  double demand = 1;           // cores one computing unit keeps busy (G x the profile's threads_per_rank)
  double base_share = 1;       // a unit's share of a core under the base rates (the profile's
                               // min(1, cores / (ranks x threads_per_rank)))
  // Speed of a unit while n units of its host compute, over its base rates:
  // min(1, cores / (n demand)) / base_share.
  double speed(int64_t n) const;
  // Some n in 1..units_per_host has speed(n) != 1 (else sharing changes nothing and is off).
  bool active() const;
};

// The host model of `o`: inactive without a hardware profile; else hosts of the profile's
// run (SimOptions::host_ranks / host_cores override its ranks / sim::profile_cores). Errors
// (kInvalidArgument, naming the field): host_ranks or host_cores negative or above
// kMaxProfileCount, or set without a hardware profile.
Result<HostModel> host_model(const SimOptions& o);

// One fixed-point state: the previous pass's compute intervals of every unit (in the order
// the engine charged them) and the current pass's. Not thread-safe (one simulate() call).
class Sharing {
 public:
  Sharing(const HostModel& host, int64_t units);
  // Unit u's next compute interval of this pass: it starts at `start` and holds `base`
  // seconds of work at the base rates. Returns its wall seconds: in the first pass `base`
  // (every unit of the host computing); later, the exact fluid length under the previous
  // pass's intervals of the host's other units (u's own count 1), damped after
  // kUndampedSharingPasses. base <= 0 is returned as is (and counted, to keep the order).
  double stretch(int64_t u, double start, double base);
  // Closes a pass. True when it matched the previous one within kSharingTolerance (every
  // unit charged the same number of intervals).
  bool end_pass();
  int64_t passes() const { return passes_; }

 private:
  struct Span {
    double start = 0, end = 0;
  };
  double solve(int64_t u, double start, double base) const;
  HostModel host_;
  int64_t units_;
  std::vector<std::vector<Span>> prev_, cur_;  // [unit][k]
  int64_t passes_ = 0;
};

// Runs `engine` (run_baseline or run_cad with its arguments bound) on `rates`: once when the
// host model is inactive; else pass after pass with rates.sharing set, until Sharing::end_pass
// converges or kMaxSharingPasses ran. r is the last pass's result, with sharing_passes and
// sharing_converged set. rates.sharing is null again on return.
Status run_shared(Rates& rates, const std::function<Status(const Rates&, SimResult&)>& engine, SimResult& r);

}  // namespace distca::sim::detail
