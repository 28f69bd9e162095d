// `distca bench simulate --validate`: the simulator against the runtime on this machine
// (issue 17; docs/benchmarks.md, "Simulator validation"). For every configuration of the
// matrix, a hardware profile per rank count (`mpirun -np N distca profile --hardware-out
// DIR/hw-N.json`) and one `mpirun -np N distca bench train --backend mpi --hardware
// DIR/hw-N.json --json DIR/<config>.json` run; then every recorded <config>.json is
// re-predicted from its hw-N.json through bench_train::predict (sim::simulate, so every model
// change is picked up) and compared with the measured step, idle and exposed communication.
// Replay (`--replay DIR`) is the second half alone, on files recorded earlier. With several
// launches of a configuration (`--launches N`: N separate mpiruns, DIR/<config>.json then
// DIR/<config>.launch2.json ...), each row is the launch whose measured step is the median
// of that mode's (a launch's ranks land on cores and neighbours anew; on a shared VM one
// launch's step can sit 15% from the next's with nothing else changed).
//
// Nothing here prints: progress goes to a callback, results come back as values; the CLI
// (cmd_bench_simulate.cpp) prints and writes them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distca/core/status.h"

namespace distca::cli::validate {

// The goals of issue 17: a predicted step within 15% of the measured median, a predicted idle
// fraction within 5 points of the measured one.
inline constexpr double kStepGoal = 0.15;
inline constexpr double kIdleGoal = 0.05;
inline constexpr int64_t kMaxLaunches = 25;

// One configuration: `np` processes, `pp` stages (1: data parallel over every rank), `tp`
// ranks per layer (pp 1: np / tp data-parallel replicas, each one rank's tokens).
struct Config {
  int64_t np = 1;
  int64_t pp = 1;
  std::string workload = "skewed";  // skewed | uniform (bench train --workload)
  int64_t tp = 1;
  // "dp<np>-<workload>", "pp<pp>x<np/pp>-<workload>" or "tp<tp>x<np/tp>-<workload>": the stem
  // of its JSON in DIR.
  std::string name() const;
};

// The matrix: DP 1, 2, 3, 4 (DP 1 skewed only: one rank has nothing to be skewed against) and
// PP 2 (np 2), PP 2 x DP 2 and PP 4 (np 4), TP 2 (np 2) and TP 2 x DP 2 (np 4), each skewed
// and uniform; `quick`: DP 1 and 2, PP 2 and TP 2, skewed only, at a smaller size. `ranks` not empty: only the configurations whose np is
// in it. Full matrix: DP 3 only when 3 is in `ranks` (it is not in the default).
std::vector<Config> matrix(bool quick, const std::vector<int64_t>& ranks);

// The arguments after `distca` of one configuration's bench train run (without --hardware and
// --json) and of the profile for `np` ranks (without --hardware-out); the model and the
// profile's shapes agree.
std::vector<std::string> bench_args(const Config& c, bool quick);
std::vector<std::string> profile_args(bool quick);

// One mode of one configuration, measured beside predicted. Fractions are of the step.
struct Row {
  std::string config, mode;
  int64_t np = 0, pp = 1, tp = 1;
  std::string workload;
  double measured_s = 0, predicted_s = 0, ratio = 0;  // ratio = predicted / measured
  double idle_measured = 0, idle_predicted = 0;       // mean over ranks
  std::vector<double> stage_idle_measured, stage_idle_predicted;  // [stage]; pp > 1 only
  double exposed_measured = 0, exposed_predicted = 0;  // mean over ranks
  // Rank 0's compute split (measured: StepMetrics::linear_s, attention_s; predicted:
  // UnitStats::linear, attention): a step miss reads as compute or as waiting.
  double linear_measured = 0, linear_predicted = 0, attention_measured = 0, attention_predicted = 0;
  bool step_ok = false, idle_ok = false;
  std::string error;  // the simulator's refusal (then no prediction)
  // The launches this row was chosen from (pick_median_launch) and their measured steps'
  // least and largest; one launch: 1, and both are measured_s.
  int64_t launches = 1;
  double measured_min_s = 0, measured_max_s = 0;
};

// The file stem of launch `k` (1-based) of a configuration: name() for the first,
// name() + ".launch<k>" after it.
std::string launch_stem(const Config& c, int64_t k);

// One row per mode from the rows of several launches of one configuration (`launches[k]`:
// launch k's rows, one per mode, in the same mode order in every launch): per mode, the row of
// the launch whose measured step is the median (an even count: the lower of the two middle
// ones; ties: the earlier launch), with `launches`, `measured_min_s` and `measured_max_s` set.
// Errors: invalid_argument when the launches' modes differ (`what` names the configuration).
Result<std::vector<Row>> pick_median_launch(const std::vector<std::vector<Row>>& launches, const std::string& what);

// Every mode of the bench train JSON `bench` (a "distca-bench-train" file; `what` names it in
// errors), re-predicted on the hardware profile at `hw_path` (the profile's ranks must be the
// run's). Errors: invalid_argument naming the file and field.
Result<std::vector<Row>> replay_one(const nlohmann::json& bench, const std::string& what, const std::string& hw_path);

// Every <config>.json in `dir` whose name is a configuration's (any np, pp and workload), in
// matrix order, each with its hw-<np>.json, and its further launches <config>.launch2.json,
// .launch3.json ... up to the first missing one (pick_median_launch). Errors (invalid_argument, naming the file): no
// configuration file, a missing or unreadable profile, a file that is not bench train's JSON.
Result<std::vector<Row>> replay_dir(const std::string& dir);

struct LiveOptions {
  std::string dir;          // exists, a writable directory
  std::string self;         // this distca binary
  std::string mpirun;       // absolute path
  bool as_root = false;     // pass --allow-run-as-root
  bool quick = false;
  int64_t launches = 1;     // bench train runs per configuration, each its own mpirun (1..kMaxLaunches)
  double timeout_s = 600;   // per child run
  std::vector<Config> configs;
  // Called before and after every child run with one line (no newline).
  std::function<void(const std::string&)> progress;
};

// Runs the profiles and the bench train runs of `o.configs` into `o.dir` (each child's output
// in DIR/<name>.log, written as <name>.log.tmp and renamed when the child has ended), then
// replay_dir. A child that fails, or runs past the timeout (its session is ended:
// child_session.h), ends the run with an error naming it and the last line of its output.
// Every child runs in a session of its own that dies with this process: if this process is
// killed (SIGKILL included), a watchdog ends the child's mpirun and ranks and removes the
// unfinished .log.tmp.
Result<std::vector<Row>> run_live(const LiveOptions& o);

// The table, one line per row and a footer with the goals and how many rows meet them.
std::string format_table(const std::vector<Row>& rows);
nlohmann::json rows_json(const std::vector<Row>& rows);

}  // namespace distca::cli::validate
