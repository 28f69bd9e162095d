// The cluster simulator: one training iteration of a Llama-style model on a cluster of nodes,
// under one attention strategy (colocated packing, WLB-ideal, per-document CP, or CAD), with
// per-unit timelines of linear compute, core attention, communication and waiting, memory per
// GPU, and an optional Chrome trace. docs/simulation-model.md states every formula; the
// summary below is the contract.
//
// Units. A scheduler "rank" is a UNIT: one node of `gpus_per_node` GPUs running tensor
// parallelism inside the node (TP = gpus_per_node). DP, CP and PP groups are made of units.
// units = gpus / gpus_per_node; with PP degree p, units_per_stage = units / p, and unit u
// belongs to stage u / units_per_stage (stage-major numbering).
//
// Workload. One Batch per micro-batch; every Batch has ranks == units_per_stage (the DP*CP
// units of one pipeline stage) and holds, per unit, the tokens that unit's pipeline replica
// processes in that micro-batch. Every stage sees the same micro-batches (a micro-batch
// flows through all stages). draw_microbatches() draws them from WorkloadOptions.
//
// Compute (per unit, per layer): linear forward = tokens * linear_forward_flops_per_token /
// (G * peak * mfu), backward 2x (3x with activation checkpointing: the recomputed forward);
// attention of a task (q_len, kv_len) forward = its FLOPs / (G * peak * attention_efficiency)
// with q_len padded up to attention_tile rows (the kernel's tile; kv_len at least as long), or
// a profiled table's seconds (cost/profiled.h; forward : backward = 1 : 2.5); backward 2.5x.
// Communication between units: G * inter_node_bw bytes/s per unit plus inter_node_latency per
// message. CAD's exchanges run on the ping-pong timeline's link model (plan/link_model.h:
// every pair a message, per-direction queues, a host's units sharing its link with
// `topology`); the colocated context fetch and the CP collectives price a unit's part as
// max(k_out lat + sent / B, k_in lat + recv / B) with one message per peer it exchanges bytes
// with (docs/simulation-model.md, "Communication").
// Memory (per GPU, at each unit's peak): parameters, fp32 gradients, optimizer, the activations
// of the micro-batches in flight, buffers: remote rows kept from forward to backward for
// every layer (fetched K/V without checkpointing; keeping CAD servers' Q, K/V, O + LSE) plus
// the layer in flight (with checkpointing the recompute re-fetches the K/V: one more fetch
// per layer in backward, at the forward's cost), and the framework's memory (FrameworkMemory).
// Baselines: wlb:C and percp:C lay each micro-batch out with the plan layer's re-packs
// (plan/chunking.h, wlb_repack with wlb_chunking(options, C), percp_repack), the trainer's
// `--mode wlb|percp` calls, then serve it colocated (each piece where it is held, the K/V of
// its document's earlier rows fetched from their holders).
//
// Determinism: simulate() is a pure function of (options, micro-batches): the same inputs
// give the same result bits (including every event) on every platform.
// Thread safety: no global state; distinct calls may run concurrently. SimOptions holds a
// non-owning pointer (attention_table) that must outlive the call; hardware_profile is shared
// and immutable.
// Hardware profile (SimOptions::hardware_profile): measured GEMM rates, attention table and
// link figures replace peak x mfu, the analytic attention and the preset's links (see there).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/core/trace.h"
#include "distca/cost/hardware_profile.h"
#include "distca/cost/profiled.h"
#include "distca/data/batch.h"
#include "distca/data/workload.h"
#include "distca/plan/chunking.h"
#include "distca/plan/topology.h"

namespace distca::sim {

// ---------------------------------------------------------------------------------------------
// Strategy (--strategy)

enum class StrategyKind { kColocated, kWlb, kPerCp, kCad };
enum class CadMode { kPingPong, kSingleStream, kSignal };

struct Strategy {
  StrategyKind kind = StrategyKind::kCad;
  // wlb: 0 = sweep the CP degree (1, 2, 4, ... dividing units_per_stage) and keep the fastest
  // configuration that fits; C > 0 = that degree only. percp: the degree C (>= 1).
  int64_t cp_degree = 0;
  CadMode cad_mode = CadMode::kPingPong;  // cad only
  // "colocated", "wlb", "wlb:4", "percp:4", "cad" (= "cad:pingpong"), "cad:single-stream",
  // "cad:signal". parse_strategy(s.name()) == s.
  std::string name() const;
  bool operator==(const Strategy&) const = default;
};
// Parses the forms listed under name(); the message names --strategy.
Result<Strategy> parse_strategy(const std::string& text);
const char* cad_mode_name(CadMode mode);  // "pingpong" | "single-stream" | "signal"

// ---------------------------------------------------------------------------------------------
// Cluster

struct ClusterSpec {
  int64_t gpus = 64;
  int64_t gpus_per_node = 8;  // G = TP degree = GPUs per unit
  int64_t pp = 1;             // pipeline stages
  HardwareSpec hw;            // peak FLOP/s, HBM per GPU, links (per GPU)

  int64_t units() const { return gpus_per_node > 0 ? gpus / gpus_per_node : 0; }
  int64_t units_per_stage() const { return pp > 0 ? units() / pp : 0; }
  // gpus, gpus_per_node, pp positive; gpus divisible by gpus_per_node; units divisible by pp;
  // hw valid. Messages name --gpus, --gpus-per-node, --pp or the hardware field.
  Status validate() const;
};
// A cluster of `gpus` GPUs on the preset's nodes (gpus_per_node = the preset's), pp = 1.
Result<ClusterSpec> make_cluster(const std::string& preset, int64_t gpus);

// ---------------------------------------------------------------------------------------------
// Options

// Memory per GPU that is not the model's tensors (docs/simulation-model.md, "Framework
// memory", gives the sources): the CUDA context with the libraries' workspaces; NCCL's
// staging buffers, comm_buffer_bytes per channel per connected peer of every communicator
// (ring_channels channels for a ring: tensor-parallel, gradient all-reduce; p2p_channels per
// peer for point-to-point traffic: the strategy's exchange, pipeline transfers); and the
// caching allocator's fragmentation, reserved = allocated / (1 - fragmentation) for the
// memory allocated and freed every step (activations, buffers). All >= 0, fragmentation < 1.
struct FrameworkMemory {
  double context_bytes = 0;
  double comm_buffer_bytes = 0;
  int64_t ring_channels = 0;
  int64_t p2p_channels = 0;
  double fragmentation = 0;
  // The figures of a GPU run (the sources' defaults).
  static FrameworkMemory gpu();
};

struct SimOptions {
  ModelSpec model;
  ClusterSpec cluster;
  Strategy strategy;
  double mfu = 0.5;                   // linear layers: achieved fraction of peak, (0, 1]
  double attention_efficiency = 0.5;  // analytic attention: fraction of peak, (0, 1]
  int64_t attention_tile = 128;       // analytic attention: query rows padded up to this (>= 1)
  // Profiled attention: when set, attention seconds come from this table (measured on one
  // device for its own head configuration; scaled by FLOPs to the model's heads, split over
  // the G GPUs of a unit). Not owned; must outlive simulate().
  const ProfiledCostModel* attention_table = nullptr;
  // A measured hardware profile (cost/hardware_profile.h; load_hardware_profile reads one).
  // When set, per unit (G = gpus_per_node ranks' worth): linear layers run at the profile's
  // GEMM rates at the model's shapes (each layer's FLOPs / its measured FLOP/s; the
  // concurrent figures when the cluster has more than one unit or its host is shared (see
  // host_ranks), else the alone ones) instead of peak x mfu; attention comes from the
  // profile's table unless attention_table is set (split forward : backward as measured);
  // CAD's exchanges cost its p2p fit (plan/auto_tolerance.h profile_link_rates), the other
  // exchanges its all-to-all latency and bandwidth, stage-to-stage transfers its p2p figures
  // (instead of hw.inter_node_*). docs/simulation-model.md,
  // "Hardware profile". Shared, immutable.
  std::shared_ptr<const HardwareProfile> hardware_profile;
  double tolerance = 0.1;     // cad scheduler tolerance, [0, 1]
  // cad with a hardware profile: every plan's band and nano-batch cut chosen as `--tolerance
  // auto` chooses them (plan/auto_tolerance.h choose_tolerance, from the profile's model with
  // `topology`), instead of `tolerance` and the L / sqrt(2) rule. Refused without a profile.
  bool tolerance_auto = false;
  double wlb_mem_cap = 1.2;   // wlb re-pack token cap over the mean, >= 1
  // wlb:C, C > 1: documents longer than this many tokens are sharded over a CP group; 0: the
  // chunking's default rule (plan/chunking.h cp_shard_threshold, on attention_tile). >= 0.
  int64_t wlb_cp_threshold = 0;
  int64_t dtype_bytes = 2;    // activations and parameters on the wire and in memory: 2 or 4
  bool shard_optimizer = true;           // optimizer state (and fp32 master) sharded over DP
  // Keep layer inputs (and O, LSE) only; the backward recomputes each layer's forward, its
  // K/V context fetch included (fetched K/V are not kept across layers).
  bool activation_checkpointing = true;
  bool lm_head = true;     // charge the LM head (and its memory) to the last stage
  bool grad_sync = true;   // charge the DP gradient all-reduce at the end of the iteration
  // cad: stateless attention servers (the paper's design; runtime DispatcherOptions::stateless)
  // keep nothing from forward to backward: the homes send Q, K/V and O + LSE again with dO.
  // Default false: servers keep their inputs (the runtime's default), less traffic, more memory.
  bool cad_stateless = false;
  bool record_events = false;  // keep per-unit timeline events (SimResult::events)
  // Tensor parallelism inside a unit (G = gpus_per_node > 1): charge its collectives (per layer
  // and direction two all-gathers and two reduce-scatters of the rows' activations, the
  // embedding's and the LM head's) on the link between the unit's GPUs (a hardware profile's
  // all-to-all fit per rank, else hw.intra_node_bw and intra_node_latency), as exposed
  // communication. False: folded into mfu, as the paper's per-token time folds NVLink traffic.
  // A hardware profile turns them on whatever this says (its GEMM rates are the kernels' alone).
  bool tp_collectives = false;
  // Processor sharing (docs/simulation-model.md, "Processor sharing"), with a hardware profile
  // only: units in consecutive groups of host_ranks / gpus_per_node run on one host of
  // host_cores cores and share them (a computing unit's speed is min(1, cores / the cores its
  // host's computing units ask for) of a core, the profile's concurrent figures rescaled to
  // that). 0: the profile's machine.ranks / profile_cores(), the host it was measured on. Off
  // when nothing is oversubscribed (then every result bit is as without it). Without a
  // profile units are devices and never share: setting either is refused. 0..65536.
  int64_t host_ranks = 0;
  int64_t host_cores = 0;
  // Which host every unit runs on ([units], or empty: every unit a host of its own) and the
  // price of a byte between hosts (plan/topology.h). CAD's exchanges run on the link model
  // (plan/link_model.h): a host's units share its one link to the others, and inside a host
  // bytes move inter_host_price times faster; the cad planner places work by it as the
  // trainer's --ranks-per-host does (over each tick's pooled ranks). Other strategies ignore it.
  HostTopology topology;
  // Memory the framework holds beside the model's tensors (docs/simulation-model.md,
  // "Framework memory"); FrameworkMemory{} (all zero) for a CPU run.
  FrameworkMemory framework = FrameworkMemory::gpu();

  // Every field and the cluster; also n_layers >= cluster.pp. Messages name the flag (--mfu,
  // --tolerance, --pp, ...). Batch-dependent checks happen in simulate().
  Status validate() const;
};

// Processor sharing: the cores a hardware profile's run had (SimOptions::host_cores' default).
// machine.cores, or, when its alone figures were timed with the other ranks asleep
// (alone_waiters_sleep) and its ranks x threads_per_rank exceeded them, that product x (sum of
// seconds_alone / sum of seconds_concurrent over the GEMMs) clamped to [1, machine.cores]:
// alone, rank 0 had its cores; at once, each rank had its share of what the run got (other
// processes on the machine may have taken the rest).
double profile_cores(const HardwareProfile& profile);

// Draws `microbatches` micro-batches for `cluster`: options.ranks is replaced by
// units_per_stage and options.batches by `microbatches` (batch b = micro-batch b). Checks
// validate_draw first.
Result<std::vector<Batch>> draw_microbatches(WorkloadOptions options, const ClusterSpec& cluster,
                                             int64_t microbatches);
// What draw_microbatches checks, without drawing: the cluster, microbatches in 1..10000, the
// workload options, and the units per stage within the data layer's limits (at most 2^24
// ranks, 2^40 tokens per batch). Since the ranks come from the cluster, those messages name
// --gpus (and --tokens-per-rank), not the workload's --ranks.
Status validate_draw(const WorkloadOptions& options, const ClusterSpec& cluster, int64_t microbatches);

// The re-pack options of wlb:cp (the runtime's `--mode wlb`, train::chunking_options' rule):
// cap wlb_mem_cap, CP groups of cp units, threshold wlb_cp_threshold, tile attention_tile,
// work in causal pairs (cost nullptr) plus linear_per_token = the model's linear training
// FLOPs per token over its attention training FLOPs per causal pair (cost/step_flops.h).
ChunkingOptions wlb_chunking(const SimOptions& options, int64_t cp);

// ---------------------------------------------------------------------------------------------
// Result

// Memory of one GPU of a unit at its peak, bytes.
struct MemoryStats {
  double params = 0;       // dtype_bytes per parameter of the stage / G
  double grads = 0;        // fp32 gradients of the stage / G
  double optimizer = 0;    // fp32 master + Adam m, v (12 B/param) / G, / DP when sharded
  double activations = 0;  // stored activations of the micro-batches in flight
  double buffers = 0;      // fetched K/V, CAD server inputs kept for backward, transients
  // The K/V part of buffers: K/V rows received from other units (the fetched context, CAD
  // servers' K/V contexts) kept for backward or held for the layer in
  // flight, with their dK/dV before it is sent back. Included in buffers (and in total).
  double kv_buffers = 0;
  // SimOptions::framework: context + communication buffers + the allocator's fragmentation
  // of the activations and buffers.
  double framework = 0;
  double total() const { return params + grads + optimizer + activations + buffers + framework; }
};

// Whole-iteration figures of one unit (seconds, bytes per unit = node; per GPU: / G).
struct UnitStats {
  int64_t stage = 0;
  int64_t tokens = 0;          // most tokens the unit holds in one micro-batch
  double busy = 0;             // linear + attention
  double linear = 0;
  double attention = 0;
  double attention_pairs = 0;  // causal pairs served (all layers, forward), for conservation
  double comm = 0;             // time collectives involving this unit were in flight
  double exposed_comm = 0;     // time its compute waited while its data was moving
  double idle = 0;             // iteration - busy - exposed_comm
  // Time blocked in communication, as the runtime's StepMetrics::comm_s counts it: every wait
  // on an exchange, a context fetch or a stage-to-stage transfer from the moment the unit was
  // ready (waiting for a slower peer included), and the gradient all-reduce itself (not the
  // wait for the slowest unit before it). exposed_comm <= comm_blocked <= exposed_comm + idle.
  double comm_blocked = 0;
  double bytes_sent = 0;       // all layers, forward + backward (+ PP activations, grads)
  double bytes_received = 0;
  // Bytes the unit's G ranks send one another in tensor parallelism's collectives (all
  // layers, forward + backward, the embedding and the LM head; with explicit TP collectives
  // only, SimOptions::tp_collectives). Not in bytes_sent, which crosses units.
  double tp_bytes = 0;
  MemoryStats memory;
};

// One CP degree tried by wlb (or the single one of wlb:C / percp:C).
struct CpCandidate {
  int64_t cp_degree = 1;
  double iteration_seconds = 0;
  bool oom = false;
  double peak_memory = 0;  // bytes per GPU, the largest over units
};

// Planner figures over every plan the run made (one per micro-batch; cad with PP: one per
// forward tick). Loads are attention seconds (fwd + bwd, one layer).
struct PlanStats {
  int64_t plans = 0;
  int64_t tasks = 0;                       // summed over plans
  double load_max_over_mean = 1;           // worst plan
  double load_before_max_over_mean = 1;    // worst plan, colocated on the same batch
  double comm_bytes_forward = 0;           // per layer, summed over plans
  double comm_bytes_backward = 0;
  double plan_seconds = 0;                 // wall clock of the scheduler calls
  // cad with PP: backward plans (every tick's backward members are planned anew, apart
  // from its forward members; stateless servers: the inputs are sent again).
  int64_t backward_replans = 0;
};

struct SimResult {
  Strategy strategy;        // as requested
  bool cad_stateless = false;  // SimOptions::cad_stateless (JSON "cad_servers")
  std::string model;
  std::string hardware;
  int64_t gpus = 0, gpus_per_node = 0, units = 0, pp = 0, microbatches = 0;
  int64_t dp = 0;           // data-parallel replicas per stage (units_per_stage / cp_degree)
  int64_t cp_degree = 1;    // CP degree used (wlb: the one chosen)
  int64_t tokens = 0;       // tokens of the iteration (all micro-batches)
  double iteration_seconds = 0;
  double pipeline_seconds = 0;   // forward + backward of all micro-batches
  double grad_sync_seconds = 0;  // DP gradient all-reduce after the pipeline
  double tokens_per_second = 0;
  bool oom = false;              // some unit does not fit in hw.memory_bytes
  int64_t oom_unit = -1;         // the first such unit
  std::string oom_reason;        // "unit 3: 152.1 GB needed > 141.0 GB (activations 98.2 GB, ...)"
  double peak_memory = 0;        // bytes per GPU, the largest over units
  double idle_fraction = 0;      // mean idle / iteration
  double exposed_comm_fraction = 0;  // mean exposed comm / iteration
  double bytes_total = 0;        // sent by all units, whole iteration
  std::vector<UnitStats> per_unit;   // [units]
  std::vector<CpCandidate> cp_candidates;  // wlb / percp
  PlanStats plan;
  int64_t pp_ticks = 0;          // cad with PP: one_f_one_b_ticks' mixed ticks (2 (m + p - 1))
  // Processor sharing: the engine passes run to its fixed point (0: sharing off, one plain
  // run) and whether the last one matched the one before (false: stopped at the pass limit).
  int64_t sharing_passes = 0;
  bool sharing_converged = true;
  // Only with record_events: spans of the units' timelines (core/trace.h), ordered by (pid =
  // unit, tid, start). tid 0: compute ("fwd linear", "fwd attention", ...; category
  // "compute"); tid 1: communication in flight ("bwd dispatch", "grad all-reduce", ...;
  // category "comm"). Microseconds from the iteration start; args {"microbatch": m} when the
  // span belongs to one micro-batch.
  std::vector<TraceEvent> events;
};

// Memory estimates, for refusing a run before allocating (core/memory.h check_memory). Upper
// bounds of the dominant allocations, from what is known at each point:
// * draw_microbatches: every piece of every unit could be as short as the 16-token length
//   quantum, so microbatches x units_per_stage x (tokens_per_unit / 16 + 1) pieces of a
//   Batch's bytes plus the drawing's transients.
// * simulate: per piece of the micro-batches (the plans, shards and tasks made of it), per unit
//   and per (unit, micro-batch) (timelines, plans per tick), and with record_events every
//   event (max_trace_events) together with its share of the Chrome trace text.
double estimate_draw_bytes(const ClusterSpec& cluster, int64_t tokens_per_unit, int64_t microbatches);
double estimate_simulate_bytes(const SimOptions& options, const std::vector<Batch>& microbatches);
// Most trace events simulate() records for these options and micro-batch count (a bound the
// tests check against real runs).
int64_t max_trace_events(const SimOptions& options, int64_t microbatches);

// Simulates one iteration. Errors (kInvalidArgument, one line): invalid options, no
// micro-batches, a micro-batch whose ranks != units_per_stage or that fails validation, a
// CP degree not dividing units_per_stage. OOM is NOT an error: the result says oom (wlb
// reports the fastest fitting CP degree, or the least-memory one if none fits).
Result<SimResult> simulate(const SimOptions& options, const std::vector<Batch>& microbatches);

// The result as JSON (docs/simulation-model.md lists the keys): strategy, cad_servers, model, hardware,
// gpus, gpus_per_node, units, pp, microbatches, dp, cp_degree, tokens, iteration_seconds,
// pipeline_seconds, grad_sync_seconds, tokens_per_second, oom, oom_unit, oom_reason,
// peak_memory_bytes, idle_fraction, exposed_comm_fraction, bytes_total, busy_max_over_mean,
// plan{plans, tasks, load_max_over_mean, load_before_max_over_mean, comm_bytes_forward,
// comm_bytes_backward, plan_seconds, backward_replans},
// cp_candidates[{cp_degree, iteration_seconds, oom, peak_memory_bytes}], pp_ticks,
// sharing{passes, converged},
// per_unit[{unit, stage, tokens, busy, linear, attention, attention_pairs, comm, exposed_comm,
// comm_blocked, idle, bytes_sent, bytes_received, memory{params, grads, optimizer, activations, buffers,
// kv_buffers, total}}].
// Events are not included (see trace_metadata).
nlohmann::json to_json(const SimResult& result);

// The rows of a Chrome trace of `result.events` (core/trace.h chrome_trace_json writes it): one
// process per unit ("unit U (stage S)", sorted by unit), thread 0 "compute", thread 1
// "communication"; otherData {strategy, model, gpus, iteration_seconds}.
TraceMetadata trace_metadata(const SimResult& result);

}  // namespace distca::sim
