// Paper-reproduction sweeps: `distca simulate --sweep NAME --out DIR`.
//
// Each sweep reproduces one figure of the paper (docs/simulation.md puts our numbers beside the
// paper's and explains every difference):
//   fig4b  DP-straggler idle fraction of WLB-style variable-length chunking at 512K
//          (a self-contained FLOPs-only model, framed as ../shared/notes/simulator.md says)
//   fig9   3D comparison (no PP): cad (ping-pong) vs wlb (WLB-ideal, best CP degree), the
//          batch at WLB-ideal's memory limit (batch_rule)
//   fig10  4D comparison: PP added, best (PP, DP, CP) configuration of each strategy, the batch
//          at WLB-ideal's memory limit for each PP degree
//   fig11  ablation: cad signal / ping-pong / single-stream
//   fig12  scheduler tolerance sweep: latency and bytes moved vs tolerance
//
// A sweep writes DIR/<name>.csv (one header row of plainly named columns, then one row per
// configuration) and DIR/<name>.gp (the gnuplot script; `cd DIR && gnuplot <name>.gp` draws
// DIR/<name>.svg: SVG, a terminal every gnuplot build has, including Debian's gnuplot-nox),
// both or neither, atomically (core/io.h). The library never runs gnuplot (it starts no
// processes): `distca simulate --sweep` does, after the files are written.
// Every speedup of fig9 and fig10 has its spread over iterations beside it (p10/p50/p90 of the
// per-iteration throughput ratio), and each strategy's iteration time its p10/p50/p90.
// Full runs here (2 shared cores): fig4b, fig11, fig12 about a second; fig9 under a minute;
// fig10 a few minutes (the memory search runs a handful of WLB-ideal probes per PP degree).
//
// Determinism: the same options (name, batches, seed, quick, cost table, batch rule) give
// byte-identical CSVs.
// Thread safety: run_sweep keeps no global state; concurrent calls with distinct out_dirs are
// safe. It never prints: progress goes through the optional callback only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "distca/core/status.h"
#include "distca/data/batch.h"

namespace distca::sim {

// {"fig4b", "fig9", "fig10", "fig11", "fig12"}, in that order.
std::vector<std::string> sweep_names();

struct SweepOptions {
  std::string name;       // one of sweep_names()
  std::string out_dir;    // an existing, writable directory, or a creatable one (one level)
  // Sampled iterations per configuration (the paper averages 30), the same for every strategy;
  // 1 .. 10000. fig10 runs batches / PP iterations of 2 x PP micro-batches, so every PP degree
  // samples the same number of micro-batches.
  int64_t batches = 30;
  uint64_t seed = 42;     // batch b of a configuration uses Rng(seed, b) via the data layer
  // The flag `batches` came from, for messages: the CLI's --sweep-batches, or --batches when
  // the user gave that instead.
  std::string batches_flag = "--sweep-batches";
  bool quick = false;     // fewer configurations (for tests and smoke runs); batches unchanged
  // fig4b only: the workload's --dist (empty: "pretrain", the figure's own). Lets the figure be
  // cross-checked on the reference corpus (file:../shared/data/doclens-pretrain.json).
  std::string dist;
  // fig9 .. fig12: attention seconds from this cost table (load_cost_table_option, cost/options.h:
  // a `distca profile` JSON or the public profiler's CSV) in every configuration of the sweep,
  // for every strategy; empty: the analytic model. Columns `attention` say which.
  std::string cost_table;
  // fig9, fig10: how the batch (sequences of the max document length) is set. "memory-limit"
  // (the default when empty; the paper's rule): the largest batch at which WLB-ideal fits in
  // memory (some CP degree, every sampled iteration; per PP degree in fig10), found by
  // doubling then bisection; CAD runs the same batches. "fixed": a fixed tokens-per-node
  // figure per model and max document length (the framing before the rule).
  std::string batch_rule;
};

// Checks every field before any work: unknown --sweep name, batches out of range (named by
// batches_flag), --dist given to a sweep other than fig4b or not a valid distribution (a
// missing file), --cost-table given to fig4b or not loadable (missing, malformed: the table
// is read here and again by run_sweep), --batch-rule other than fixed / memory-limit or given
// to a sweep other than fig9 / fig10, --out that is a file, unwritable, or whose parent does
// not exist, and, when --out exists, a DIR/<name>.csv, .gp or .svg that could not be written
// (a directory, a dangling link, ...). The message names the flag.
// Creates nothing (run_sweep creates the directory when it is missing).
Status validate_sweep(const SweepOptions& options);

// Progress of a running sweep: configuration `done` of `total` finished, `what` names it
// (e.g. "fig9 8B pretrain 128K 64 GPUs").
struct SweepProgress {
  int64_t done = 0;
  int64_t total = 0;
  std::string what;
};
using SweepProgressFn = std::function<void(const SweepProgress&)>;

struct SweepSummary {
  std::string name;
  std::vector<std::string> csv_paths;     // DIR/<name>.csv
  std::vector<std::string> script_paths;  // DIR/<name>.gp
  // [script_paths.size()] DIR/<name>.svg: what script i draws when gnuplot runs it with DIR as
  // its working directory and `outfile` set to that file name (not written by the library).
  std::vector<std::string> svg_paths;
  // A few headline numbers for the CLI to print, in order, e.g.
  // {"idle_fraction dp=8 cap=1.0", 0.55}.
  std::vector<std::pair<std::string, double>> headline;
};

// Validates, creates out_dir if needed, runs the sweep, writes the files. Errors: invalid
// options (as validate_sweep), a simulator error for a configuration (named), I/O errors
// naming the file.
Result<SweepSummary> run_sweep(const SweepOptions& options, const SweepProgressFn& progress = {});

// ---- the comparison sweeps' workload, exposed for tests ---------------------------------
//
// fig9 .. fig12 draw a batch as `seqs` sequences of max_doc_len tokens (the paper's "batch size
// x MaxDocLen": the data layer's `dataset` recipe with tokens_per_rank = max_doc_len, so
// documents are elongated for max_doc_len and capped at it; ProLong with --long-prob 0.8),
// packed in order and re-cut into `units` equal shares of tokens_per_unit tokens (pieces of
// one document that become adjacent are merged; pieces crossing a new boundary are cut).
// Micro-batch i is draw i of the seed. Requires units * tokens_per_unit to be a positive
// multiple of max_doc_len and tokens_per_unit a multiple of 16 (else kInvalidArgument).
// Every returned Batch validates, with ranks == units.
Result<std::vector<Batch>> sweep_microbatches(const std::string& dataset, int64_t max_doc_len, int64_t units,
                                              int64_t tokens_per_unit, int64_t count, uint64_t seed);

// ---- fig4b's model, exposed for tests (docs/simulation.md, "fig4b") ----------------------
//
// A FLOPs-only model of WLB-LLM's variable-length chunking across DP groups: a fixed cluster of
// 8 node-units of 512K tokens (Pretrain workload of the data layer), DP x CP = 8, documents
// (pieces cut at 512K unit boundaries count as independent documents) placed greedily on DP
// groups under a token cap, each group's cost divided by its CP degree.

// The WLB greedy: lengths sorted longest first (ties: lower index first); each document goes
// to the group with the least work among those whose tokens stay <= token_cap after adding it
// (ties: lower group index); a document that fits nowhere goes to the least-loaded group.
// Work of a document of length L is alpha * L(L+1)/2 + beta * L.
// Preconditions (checked): groups >= 1, lengths > 0, token_cap > 0, alpha >= 0, beta >= 0.
struct WlbGroups {
  std::vector<int64_t> group_of;  // [lengths.size()] the group each document went to
  std::vector<double> work;       // [groups] alpha * pairs + beta * tokens
  std::vector<int64_t> tokens;    // [groups]
};
WlbGroups wlb_greedy_groups(const std::vector<int64_t>& lengths, int64_t groups, double token_cap,
                            double alpha, double beta);

// One row of fig4b: averages over the batches.
struct Fig4bPoint {
  int64_t dp = 0;
  int64_t cp = 0;              // 8 / dp
  double cap = 0;              // c: a group's token cap is c * tokens / dp
  double idle_fraction = 0;    // mean over batches of 1 - mean(work) / max(work)
  double idle_p10 = 0;         // 10th and 90th percentile over batches
  double idle_p90 = 0;
  double token_divergence = 0;       // mean over batches of max(tokens) / mean(tokens)
  double idle_whole_docs_bound = 0;  // mean over batches of 1 - mean / max(mean, largest doc)
  double documents = 0;              // mean documents (pieces) per batch
};
struct Fig4bOptions {
  std::vector<int64_t> dps = {1, 2, 4, 8};  // each divides 8
  std::vector<double> caps = {1.0, 1.2};    // each >= 1
  int64_t batches = 30;
  uint64_t seed = 42;
  std::string model = "llama-8b";  // FLOPs constants (alpha, beta) come from this preset
  std::string dist = "pretrain";   // the workload's --dist (elongated by 512K / 64K = 8)
};
// Rows in (cap, dp) order. Errors name the field (dps, caps, batches, model, --dist).
Result<std::vector<Fig4bPoint>> fig4b_points(const Fig4bOptions& options);

}  // namespace distca::sim
