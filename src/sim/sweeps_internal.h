// Shared plumbing of the sweeps (sweeps.cpp: driver, files, fig4b;
// sweeps_compare.cpp: fig9 to fig12 through the simulator). Not a public header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distca/core/status.h"
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

// fig9 .. fig12 (sweeps_compare.cpp). Options are validated and out_dir exists.
Result<SweepSummary> run_fig9(const SweepOptions& options, const SweepProgressFn& progress);
Result<SweepSummary> run_fig10(const SweepOptions& options, const SweepProgressFn& progress);
Result<SweepSummary> run_fig11(const SweepOptions& options, const SweepProgressFn& progress);
Result<SweepSummary> run_fig12(const SweepOptions& options, const SweepProgressFn& progress);

}  // namespace distca::sim::detail
