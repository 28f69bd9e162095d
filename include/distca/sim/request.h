// From what a user asks for to the simulator's options: the one mapping every entry point
// uses. `distca simulate` (its flags) and Python's distca.simulate (its keywords) fill a
// SimRequest and call make_sim_options; `distca bench train` and `bench simulate --validate`
// describe the training run they measured (TrainingRun) and call predict_training, which
// fills a SimRequest the same way. So a check, a default or a mapping is written once, with
// the CLI flag's name in its message (docs/simulation.md, "One mapping").
//
// Thread safety: pure functions of their arguments; distinct calls may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/cost/hardware_profile.h"
#include "distca/cost/profiled.h"
#include "distca/data/batch.h"
#include "distca/sim/simulator.h"

namespace distca::sim {

// One simulated iteration as the CLI's flags say it. An unset optional is a flag not given
// (the default applies); a set one is checked even when it equals the default.
struct SimRequest {
  std::string model = "llama-8b";      // --model: a preset (ignored when model_spec is set)
  std::optional<ModelSpec> model_spec;  // a model built by the caller (bench train's)
  std::string hardware = "h200";       // --hardware: a preset or a profile file
  // A profile loaded by the caller (bench train's --hardware): replaces `hardware`'s profile.
  std::shared_ptr<const HardwareProfile> hardware_profile;
  std::optional<double> peak_flops;    // replaces the preset's peak (FLOP/s per GPU, > 0)
  int64_t gpus = 0;                    // --gpus, > 0
  std::optional<int64_t> gpus_per_node;  // --gpus-per-node, > 0 (default: the preset's)
  int64_t pp = 1;                      // --pp
  std::string strategy = "cad";        // --strategy (parse_strategy)
  std::optional<double> mfu;                   // --mfu (default 0.5)
  std::optional<double> attention_efficiency;  // --attention-efficiency (default 0.5)
  int64_t attention_tile = 128;        // --attention-tile
  std::string cost_table;              // --cost-table FILE ("" none)
  // A table loaded by the caller instead (not owned; outlives the options); wins over cost_table.
  const ProfiledCostModel* attention_table = nullptr;
  double tolerance = 0.1;              // --tolerance
  bool tolerance_auto = false;         // SimOptions::tolerance_auto (a training run's --tolerance auto)
  int64_t ranks_per_host = 0;          // SimOptions::topology: units [h*N, (h+1)*N) on host h; 0 none
  double wlb_mem_cap = 1.2;            // --wlb-mem-cap
  int64_t wlb_cp_threshold = 0;        // SimOptions::wlb_cp_threshold (the trainer's --cp-threshold)
  std::string dtype = "bf16";          // --dtype: bf16 | fp32
  bool shard_optimizer = true;         // --no-shard-optimizer: false
  bool activation_checkpointing = true;  // --no-checkpointing: false
  bool lm_head = true;                 // --no-lm-head: false
  bool grad_sync = true;               // --no-grad-sync: false
  std::string cad_servers = "keep";    // --cad-servers: keep | stateless
  std::optional<double> inter_node_gbps;        // --inter-node-bw, GB/s per GPU, > 0
  std::optional<double> inter_node_latency_us;  // --inter-node-latency, microseconds, >= 0
  std::optional<double> memory_gb;              // --memory-gb, > 0
  bool record_events = false;          // --trace given
  bool tp_collectives = false;         // SimOptions::tp_collectives (a training run's: its rates are kernels')
};

// The options and what they point at: `options.attention_table` is `table` when the request
// named a --cost-table file. Move-only (the pointer follows the table it owns).
struct SimSetup {
  SimOptions options;
  std::unique_ptr<ProfiledCostModel> table;
};

// Checks every field of `r` in the CLI's order with its messages (--gpus, --model, --hardware,
// the overrides a hardware profile measured itself (--mfu, --attention-efficiency,
// --inter-node-bw, --inter-node-latency refused with one), --strategy, --dtype,
// --cad-servers, the overrides' ranges, --gpus-per-node, --cost-table, then
// SimOptions::validate) and returns the options. Reads the hardware profile and the cost
// table files it names. Errors: invalid_argument naming the flag, or the loaders' errors.
Result<SimSetup> make_sim_options(const SimRequest& r);

// A training run as `distca bench train` runs it: `tp` ranks per unit (gpus_per_node), `pp`
// stages over `ranks`, fp32, no activation checkpointing, no optimizer sharding, cad servers
// stateless with pipelines (the trainer's) and keeping their inputs without; wlb and percp at
// the run's CP degree (wlb:C, percp:C; C = 1 without one) with the run's chunking options.
struct TrainingRun {
  ModelSpec model;
  int64_t ranks = 1;
  int64_t pp = 1;
  int64_t tp = 1;                  // ranks per unit (the simulator's gpus_per_node: its TP degree)
  std::string mode = "colocated";  // train_mode_name: colocated | cad | a baseline the simulator knows (wlb, percp)
  std::string overlap;             // TrainConfig::overlap with cad: pingpong | single-stream | signal
  int64_t cp = 0;                  // a baseline's context-parallel degree (0 or 1: none)
  // wlb's chunking as the trainer runs it (train::chunking_options): --wlb-cap, --cp-threshold
  // (0: the default rule) and the attention kernel's query tile (runtime::query_tile_rows;
  // 128 for bench train's model, 8 heads over 4 K/V heads), also the simulator's
  // attention_tile.
  double wlb_cap = 1.2;
  int64_t cp_threshold = 0;
  int64_t tile_rows = 128;
  double tolerance = 0.1;          // the cad scheduler's
  bool tolerance_auto = false;     // --tolerance auto: the band and cut chosen per plan (SimOptions::tolerance_auto)
  int64_t ranks_per_host = 0;      // --ranks-per-host (0: none): the planner's topology and the links' hosts
  bool record_events = false;      // keep the simulated timeline (TrainingPrediction::trace)
  // The linear layers' rate without a hardware profile: the local-cpu preset's links and this
  // peak (a measured sgemm FLOP/s) at mfu 1, attention analytic at efficiency 0.5.
  double sgemm_flops = 0;
  std::shared_ptr<const HardwareProfile> hardware_profile;  // measured rates, attention, links
  const ProfiledCostModel* attention_table = nullptr;       // attention seconds (not owned)
};

// What the simulator predicts for a training run, in the figures bench train measures: idle is
// 1 - busy / step (busy = linear + attention), exposed is UnitStats::exposed_comm / step,
// blocked UnitStats::comm_blocked / step (what StepMetrics::comm_s counts).
struct TrainingPrediction {
  double step_s = 0;
  std::vector<double> stage_idle;    // [stage] idle fraction, mean over the stage's units
  std::vector<double> rank_idle;     // [rank]
  std::vector<double> rank_exposed;  // [rank]
  std::vector<double> rank_blocked;  // [rank]
  std::vector<double> rank_busy_s;   // [rank] UnitStats::busy, seconds
  std::vector<double> rank_linear_s;     // [rank] UnitStats::linear (beside StepMetrics::linear_s)
  std::vector<double> rank_attention_s;  // [rank] UnitStats::attention (beside attention_s)
  // Bytes the attention's exchanges send in the iteration, all ranks: SimResult::plan's
  // comm_bytes_forward + comm_bytes_backward (per layer) x the model's layers; what bench
  // train --compare sums from the ranks' StepMetrics::bytes_sent for wlb and percp.
  double attention_bytes = 0;
  // With TrainingRun::record_events: the simulated iteration as a Chrome trace (one process per
  // stage, a thread per unit: sim::trace_metadata), else empty.
  std::string trace;
};

// The request of one training run (make_sim_options' input), and its prediction on the
// micro-batches the run trained on (pp 1: one batch over every rank; pp P: each batch over
// the ranks / P replicas). Errors: make_sim_options' and simulate()'s.
SimRequest training_request(const TrainingRun& run);
Result<TrainingPrediction> predict_training(const TrainingRun& run, const std::vector<Batch>& batches);

// A prediction or the simulator's refusal, for a report that prints either beside what it
// measured (bench train, bench simulate --validate).
struct TrainingOutcome : TrainingPrediction {
  bool ok = false;
  std::string error;  // the refusal when !ok
};
// predict_training with its error kept as the outcome's text; never fails.
TrainingOutcome predict_outcome(const TrainingRun& run, const std::vector<Batch>& batches);
// The outcome as bench train's JSON "sim" object: the figures, their means over ranks, and
// over_measured = step_s / measured_s (0 when measured_s <= 0).
nlohmann::json to_json(const TrainingOutcome& p, double measured_s);

}  // namespace distca::sim
