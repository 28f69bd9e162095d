// Shared plumbing of the sweeps (sweeps.cpp: driver, files, fig4b; sweeps_compare.cpp: the
// workload, running configurations, fig11 and fig12; sweeps_fig9_10.cpp: fig9 and fig10 with
// their batch rule). Not a public header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distca/core/status.h"
#include "distca/cost/profiled.h"
#include "distca/sim/simulator.h"
#include "distca/sim/sweeps.h"

namespace distca::sim::detail {

// A CSV table: one header row, then rows of already formatted cells (no commas or quotes in
// cells; checked when rendered).
struct CsvTable {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;  // [rows][columns.size()]
  std::string render() const;
};

// Fixed-point with `digits` decimals ("0.190000"); NaN renders as an empty cell (gnuplot
// reads an empty field as missing).
std::string fmt(double v, int digits = 6);
std::string fmt_int(int64_t v);

// Percentile q in [0, 1] of `v` (linear interpolation between order statistics). v non-empty.
double percentile(std::vector<double> v, double q);

// Writes DIR/<name>.csv and DIR/<name>.gp (both or neither) and fills the path fields of
// `summary`. The script must draw from '<name>.csv' (relative: gnuplot runs with DIR as its
// working directory) into `outfile` (set by whoever runs gnuplot; the script defaults it to
// '<name>.svg').
Status write_sweep_outputs(const SweepOptions& options, const CsvTable& table,
                           const std::string& gnuplot_body, SweepSummary& summary);

// Progress helper: calls `fn` (when set).
void report(const SweepProgressFn& fn, int64_t done, int64_t total, const std::string& what);

// ---- the comparison sweeps' machinery (sweeps_compare.cpp) ---------------------------------

inline constexpr int64_t kK = 1024;

// A comparison sweep's workload (sweep_microbatches in sweeps.h).
struct WorkloadSpec {
  std::string dataset;  // "pretrain" | "prolong"
  int64_t max_doc_len = 128 * kK;
  int64_t units = 8;            // units of one pipeline stage (the Batch's ranks)
  int64_t tokens_per_unit = 0;  // per micro-batch
};

// `count` micro-batches of `w`; micro-batch i is the data layer's draw i of the seed.
Result<std::vector<Batch>> draw(const WorkloadSpec& w, int64_t count, uint64_t seed);

// Groups consecutive micro-batches into iterations of m (a remainder is dropped).
std::vector<std::vector<Batch>> group(std::vector<Batch> mbs, int64_t m);

struct RunStats {
  double seconds = 0;           // mean iteration seconds
  double tokens_per_second = 0; // tokens of all iterations / their summed seconds
  double bytes = 0;             // mean bytes moved per iteration (all units, all traffic)
  double ca_bytes = 0;          // mean CA-task bytes per layer (forward + backward, all plans)
  double exposed_comm_fraction = 0;
  double idle_fraction = 0;
  double load_max_over_mean = 0;  // mean over iterations of the worst plan's load ratio
  double peak_memory = 0;         // bytes per GPU, max over iterations
  bool oom = false;               // some iteration does not fit
  int64_t cp = 0, dp = 0;
  // [iterations] each iteration's seconds and tokens, in order (the spread columns). With
  // stop_at_oom, only up to the first iteration that does not fit.
  std::vector<double> iteration_seconds;
  std::vector<double> iteration_tokens;
};

// Simulates each iteration (a group of micro-batches) with `o` and averages. stop_at_oom:
// return at the first iteration that does not fit (oom set; averages over what ran), for the
// memory searches that only ask whether a configuration fits.
Result<RunStats> run(const SimOptions& o, const std::vector<std::vector<Batch>>& iterations,
                     bool stop_at_oom = false);

// a fits and b does not, or both fit alike and a has the higher throughput.
bool better(const RunStats& a, const RunStats& b);

// Powers of two dividing n: 1, 2, 4, ...
std::vector<int64_t> pow2_divisors(int64_t n);

// WLB-ideal: every CP degree, the fastest (by throughput) that fits on every iteration; when
// none fits, the fastest overall, flagged oom.
Result<RunStats> best_wlb(SimOptions o, const std::vector<std::vector<Batch>>& iterations);
// Whether some CP degree of WLB-ideal fits on every iteration (the simulator's OOM flag);
// stops at the first that does.
Result<bool> wlb_fits(SimOptions o, const std::vector<std::vector<Batch>>& iterations);

// CAD (ping-pong) at its best tolerance of `tolerances`: the fastest that fits, else the
// fastest, flagged oom. Servers keep their forward inputs (the runtime's default); where that
// does not fit, stateless servers (the paper's design) are tried too. `tolerance` and
// `stateless` receive the winner's.
Result<RunStats> best_cad(SimOptions o, const std::vector<std::vector<Batch>>& iterations,
                          const std::vector<double>& tolerances, double& tolerance, bool& stateless);

// The sweeps' cluster: h200 nodes, `gpus` GPUs, PP `pp`; attention from `table` when set
// (not owned; outlives the sweep).
Result<SimOptions> base_options(const std::string& model, int64_t gpus, int64_t pp, const ProfiledCostModel* table);

std::string short_model(const std::string& m);  // "8B" | "34B"
std::string kilo(int64_t tokens);               // "128K"
// 1-based column index of `name` in `t` (for gnuplot scripts).
std::string col(const CsvTable& t, const std::string& name);
double ratio(double a, double b);  // a / b, NaN when b <= 0
// {p10, p50, p90} of v (NaN x 3 when v is empty).
std::vector<double> spread(const std::vector<double>& v);

// fig9 .. fig12 (sweeps_fig9_10.cpp, sweeps_compare.cpp). Options are validated and out_dir
// exists; `table` is the loaded --cost-table (nullptr: analytic attention).
Result<SweepSummary> run_fig9(const SweepOptions& options, const SweepProgressFn& progress,
                              const ProfiledCostModel* table);
Result<SweepSummary> run_fig10(const SweepOptions& options, const SweepProgressFn& progress,
                               const ProfiledCostModel* table);
Result<SweepSummary> run_fig11(const SweepOptions& options, const SweepProgressFn& progress,
                               const ProfiledCostModel* table);
Result<SweepSummary> run_fig12(const SweepOptions& options, const SweepProgressFn& progress,
                               const ProfiledCostModel* table);

}  // namespace distca::sim::detail
