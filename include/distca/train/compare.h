// One training configuration in every mode, paired round by round on the same steps: what
// `distca bench train --compare` runs (docs/benchmarks.md, "Comparing the modes").
//
// A comparison is a list of mode entries (CompareMode). Each round runs every entry once, in
// list order, as one train::run_training of the same config but the mode, on one
// communicator: every entry trains the same steps 0 .. steps-1 of one DataSource, so the
// same documents (each step's order-free input checksum, StepMetrics::input_checksum, is
// recorded per entry and checked against the data's own, data_checksums). Entries of one
// `group` are one contender at several settings (a baseline at each context-parallel degree
// that fits): the report names the group's fastest. The speedup column is the reference
// entry's (cad pingpong's) over each entry, the median over rounds of the two round medians'
// ratio (back to back in one round, so a slow period of a shared host falls on both).
//
// Peak memory per rank, two measures: `accounted` is the trainer's accounting of each rank's
// buffers at their high-water mark (TrainResult::accounted_peak_bytes), on every backend;
// `resident` is each rank process's VmHWM, reset before every run (core/memory.h), measured only
// when the ranks are processes (mpi): threads of one process share one mark.
//
// Thread safety: run_compare is collective (every rank of `comm`, from its own thread, with the
// same options); the other functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/comm/communicator.h"
#include "distca/core/status.h"
#include "distca/runtime/overlap_mode.h"
#include "distca/train/config.h"
#include "distca/train/data.h"
#include "distca/train/trainer.h"

namespace distca::train {

struct CompareMode {
  std::string label;  // "cad pingpong"; unique in a comparison
  std::string group;  // entries of one group are one contender (its fastest is reported)
  TrainMode mode = TrainMode::kColocated;
  std::optional<runtime::OverlapMode> overlap;  // cad: how its exchanges run
  int64_t cp = 1;          // context-parallel degree of a mode that has one; 1: none
  bool reference = false;  // the entry the speedups are of (exactly one)
};

// The entries of a comparison whose replicas number `dp` (ranks / pp): colocated (plain
// packing); wlb (WLB-LLM's chunking) at every CP degree C dividing dp, under one group whose
// fastest is reported; percp at every C >= 2 dividing dp, under another; cad single-stream;
// cad pingpong (the reference).
std::vector<CompareMode> compare_modes(int64_t dp);

// `base` run as `m`: its mode and overlap (none unless cad). Errors: a CP degree other than 1,
// which no mode of this trainer takes.
Result<TrainConfig> compare_config(const TrainConfig& base, const CompareMode& m);

struct CompareOptions {
  TrainConfig base;  // every setting but the mode (steps, tokens, pp, micro_batches, data ...)
  std::vector<CompareMode> modes;
  int rounds = 3;
  int64_t warmup_steps = 1;  // first steps of every run not timed (< base.steps)
  bool resident = false;     // the ranks are processes: measure each one's VmHWM
  // Checks the list (labels unique, exactly one reference, every entry's config valid) and
  // the counts; the message names the flag.
  Status validate() const;
};

// One entry's measurements over every round (rank 0).
struct CompareRun {
  std::vector<double> step_s;          // timed steps of every round, rank 0's StepMetrics::seconds
  std::vector<double> round_median_s;  // [round]
  // [rank][timed step of every round]: 1 - (linear + attention) / step, comm_s / step, and
  // attention_comm_s / step (the part of comm_s the runners waited for attention's
  // communication: the dispatcher's exchanges, or wlb's and percp's CP collectives, whose
  // trace wait spans add up to it).
  std::vector<std::vector<double>> rank_idle, rank_exposed, rank_attention_exposed;
  // [rank][timed step of every round]: each rank's own StepMetrics (its seconds, linear,
  // attention, optimizer, comm, attention_comm, wait, plan and plan_wait times), so a step's
  // time reads per rank as compute, idle behind the slowest rank, exposed exchange and overhead.
  std::vector<std::vector<StepMetrics>> rank_metrics;
  std::vector<double> attention_bytes;  // [timed step] every rank's exchange bytes, every layer
  std::vector<int64_t> accounted_peak;  // [rank] max over rounds
  std::vector<int64_t> resident_peak;   // [rank] max over rounds; empty unless resident
  std::vector<uint64_t> checksums;      // [step] the first round's: sum over the first stage's ranks
  bool same_over_rounds = true;         // every round's checksums equal the first's
  int64_t tokens_per_step = 0;
};

struct CompareResult {
  std::vector<CompareRun> runs;  // [entry]
  bool resident = false;         // resident_peak measured (clear_refs writable on every rank)
};

// Runs the comparison on this rank (collective); `data` is every step's source (the same for
// every entry). `out` (may be null) is filled on rank 0.
Status run_compare(comm::Communicator& comm, const CompareOptions& options, const DataSource& data,
                   CompareResult* out);

// The data's own checksum of steps [0, steps): every document of the step's micro-batches
// (batch(step * M + m)) at its positions, from DataSource::document (not the trainer's inputs).
std::vector<uint64_t> data_checksums(const DataSource& data, int64_t steps, int64_t micro_batches);

// Attention work max/mean over the data-parallel replicas before planning, per step: each
// replica's causal pairs (cost/analytic.h) over the step's micro-batches, as packed.
std::vector<double> attention_imbalance(const DataSource& data, int64_t steps, int64_t micro_batches);

// q-quantile with linear interpolation between order statistics (0.5: the median, the mean of
// the middle two for an even count); 0 when empty. 0 <= q <= 1.
double quantile(std::vector<double> v, double q);

// One entry's summary row.
struct CompareRow {
  std::string label, group;
  double median_s = 0, p10_s = 0, p90_s = 0, tokens_per_s = 0;
  double idle_max = 0, idle_mean = 0;        // over ranks, of each rank's median
  double exposed_max = 0, exposed_mean = 0;  // the same
  double attention_exposed_max = 0, attention_exposed_mean = 0;  // the same
  double attention_bytes = 0;                // median per step
  int64_t accounted_max = 0;                 // over ranks
  double accounted_max_over_mean = 0;
  int64_t resident_max = 0;                  // 0 unless measured
  double resident_max_over_mean = 0;
  // The same max/mean taken within each group of ranks doing the same work, one pipeline stage
  // and TP index across its data-parallel replicas ([stage * tp + t]; world rank = (stage * dp
  // + replica) * tp + t), and the largest of them. Pipeline stages hold different activations
  // by construction (1F1B: stage 0 keeps P micro-batches, the last one), so under pp > 1 the
  // whole-job figure measures the schedule, these the balance a mode controls. Equal to the
  // whole-job figure at pp = tp = 1.
  std::vector<double> accounted_replicas_by_stage, resident_replicas_by_stage;
  double accounted_replicas_max_over_mean = 0, resident_replicas_max_over_mean = 0;
  double reference_speedup = 0;  // the reference's speedup over this entry (paired by round)
  bool best_of_group = false;    // the group's lowest median step
};
std::vector<CompareRow> summarize_compare(const CompareOptions& options, const CompareResult& result);

// The comparison as JSON: the options that shape it, the per-step data figures, and per
// entry its row, its raw series and whether its checksums match the data's (same_documents).
nlohmann::json compare_json(const CompareOptions& options, const CompareResult& result,
                            const std::vector<CompareRow>& rows, const std::vector<uint64_t>& expected_checksums,
                            const std::vector<double>& imbalance);

}  // namespace distca::train
