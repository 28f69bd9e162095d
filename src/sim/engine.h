// Internal pieces of the simulator shared by its source files: the cost rates of one
// configuration, the attention cost model the planner balances, the per-unit recorder, the
// memory model and the two strategy engines. Not installed; docs/simulation-model.md is the
// reference for every formula here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distca/cost/analytic.h"
#include "distca/cost/cost_model.h"
#include "distca/plan/auto_tolerance.h"
#include "distca/plan/link_model.h"
#include "distca/plan/pipeline_schedule.h"
#include "distca/sim/simulator.h"
#include "network.h"
#include "sharing.h"

namespace distca::sim::detail {

// Attention forward share of forward + backward (backward = 2.5 x forward).
inline constexpr double kAttnFwdShare = 1.0 / (1.0 + kAttentionBackwardFactor);

// Forward + backward seconds of one task on one unit, one layer: what the planner balances
// (so cad's loads are seconds and the padding of short shards counts).
class UnitAttentionCost final : public AttentionCostModel {
 public:
  explicit UnitAttentionCost(const SimOptions& o);
  double task_cost(int64_t q_len, int64_t kv_len) const override { return seconds(q_len, kv_len); }
  std::string unit() const override { return "seconds"; }
  // The same, without the virtual call (the CP accounting evaluates millions of chunks).
  double seconds(int64_t q_len, int64_t kv_len) const {
    if (q_len <= 0) return 0.0;
    if (table_ != nullptr) return table_seconds(q_len, kv_len);
    // Short shards run as whole tiles of query rows (the kernel's tile): a task of q < tile
    // rows costs what tile rows at the same end of the context cost.
    const int64_t q = q_len > tile_ ? q_len : tile_;
    const int64_t kv = kv_len > q ? kv_len : q;
    // task_pairs(q, kv) = q (2 kv - q + 1) / 2, in doubles (exact below 2^53).
    const double pairs = 0.5 * static_cast<double>(q) * static_cast<double>(2 * kv - q + 1);
    return pairs * seconds_per_pair_;
  }

 private:
  double table_seconds(int64_t q_len, int64_t kv_len) const;
  double seconds_per_pair_ = 0;  // forward + backward, analytic
  ModelSpec model_;
  double unit_flops_ = 0;   // G * peak * efficiency
  int64_t tile_ = 128;
  const ProfiledCostModel* table_ = nullptr;
  std::shared_ptr<const ProfiledCostModel> profile_table_;  // the hardware profile's, when used
  double table_scale_ = 1;  // model FLOPs / table FLOPs per pair, / G
};

// Rates of one configuration (per unit unless stated).
struct Rates {
  explicit Rates(const SimOptions& o);
  const SimOptions& o;
  int64_t gpus_per_unit = 1;  // G: the node's GPUs (TP inside the unit)
  int64_t units = 1, units_per_stage = 1, pp = 1;
  double linear_fwd_per_token = 0;   // seconds per token per layer, forward
  double linear_bwd_per_token = 0;   // 2x forward (3x with activation checkpointing)
  double pre_share = 0;              // pre-CA (norm + QKV) share of a layer's linear work
  double lm_head_fwd_per_token = 0;  // LM head, last stage (0 without lm_head)
  double lm_head_bwd_per_token = 0;
  // The optimizer step after the gradient all-reduce: seconds per parameter of the unit's
  // share (a hardware profile's elementwise.optimizer / G; 0 without one: no step charged).
  double optimizer_per_param = 0;
  // Links between units (network.h): B = G x inter_node_bw and lat = inter_node_latency per
  // message; with a hardware profile, its all-to-all and p2p fits (B = G x the fit's
  // bandwidth; lat = the p2p fit's intercept (one message), the all-to-all fit's intercept /
  // (profile ranks - 1): its exchange sent ranks - 1 messages per rank).
  Link exchange;  // all-to-all, context fetch, gradient all-reduce
  Link p2p_link;  // stage-to-stage transfers (= exchange without a profile)
  // CAD's exchanges go through the link model the ping-pong timeline uses (plan/link_model.h):
  // between units (hosts) G x inter_node_bw and inter_node_latency per message, or the
  // profile's (plan/auto_tolerance.h profile_link_rates: its p2p fit, G x its bandwidth);
  // inside a host (SimOptions::topology) that rate times the topology's inter_host_price.
  LinkRates cad_links;
  // Seconds of compute a rank loses per byte it sends or receives while it computes (a
  // hardware profile's links.comm_cpu; 0 without one): CAD's overlapped exchanges slow the
  // compute they run beside (cad.cpp, TickRunner::taxed).
  double comm_cpu_per_byte = 0;
  std::vector<int64_t> unit_hosts;  // [units] SimOptions::topology's hosts, or empty
  // SimOptions::tolerance_auto: the profile's model (plan/auto_tolerance.h) and the table it
  // points at; null otherwise.
  std::shared_ptr<const AutoToleranceModel> auto_model;
  std::shared_ptr<const AttentionCostModel> auto_table;
  RowBytes row_bytes;
  UnitAttentionCost cost;
  std::vector<int64_t> stage_layers;  // [pp] layers of each stage (the first L % pp get one more)
  // Attention forward share of a task's forward + backward seconds: the profile's measured
  // split when its table is the attention (1 / (1 + attention_backward_ratio)), else 1 : 2.5.
  double attn_fwd_share = kAttnFwdShare;
  HostModel host;             // processor sharing (sharing.h; inactive without a profile)
  Sharing* sharing = nullptr;  // the pass being run when host is active (run_shared), else null
  // Tensor parallelism inside a unit (docs/simulation-model.md, "Tensor parallelism"): with
  // tp_explicit (G > 1 and rates of kernels: a hardware profile or SimOptions::tp_collectives)
  // the G ranks' all-gathers and reduce-scatters are charged on tp_link, one rank's link to
  // its TP peers (the profile's all-to-all fit per rank, else hw.intra_node_*); without it
  // they are folded into mfu.
  bool tp_explicit = false;
  Link tp_link;
  // The TP peers' wait (HardwareProfile::tp_wait, 0 without it): seconds a TP collective adds
  // per second of the unit's compute since its previous collective (Recorder::tp).
  double tp_wait = 0;
  // The TP collectives of one layer slot (cad.cpp's slots; slot k of a stage of n layers:
  // k = 0 the pre-attention part of the first layer, k = n the tail after the last, between
  // them a whole layer; a backward slot k mirrors slot n - k) for the nano-batch of rows
  // [first, first + rows) of a micro-batch of `total` rows, each TP rank holding
  // even_split(total, G, p) of them: per-rank seconds (the slowest rank) and the bytes the
  // G ranks send together. The embedding's forward reduce-scatter runs once over the whole
  // micro-batch: slot 0 of stage 0 charges it to the nano-batch with first = 0.
  struct TpCost {
    double seconds = 0, bytes = 0;
    double wait_per_compute = 0;  // tp_wait where the slot has collectives
  };
  TpCost tp_slot(double first, double rows, double total, bool bwd, int64_t k, int64_t stage) const;
  // Seconds of a point-to-point transfer of `bytes` between two units (0 bytes: 0).
  double p2p(double bytes) const { return p2p_seconds(p2p_link, bytes); }
  // Activation bytes crossing a stage boundary for `tokens` tokens (either direction).
  double boundary_bytes(double tokens) const {
    return tokens * static_cast<double>(o.model.hidden * o.dtype_bytes);
  }
  // Parameters of stage s.
  double stage_params(int64_t s) const;
  // Replaces the linear, LM-head and link rates by the profile's (SimOptions::hardware_profile).
  void apply_hardware_profile(const HardwareProfile& profile);
};

// Per-unit accumulators and (optionally) trace events: pid = unit, tid = kComputeTrack
// (linear, attention) or kCommTrack (communication in flight), microseconds from the iteration
// start, args {"microbatch": m} when tied to one. Times given in seconds from the iteration
// start. With `sharing` (processor sharing, sharing.h), linear() and attention() turn the
// base seconds they are given into wall seconds (Sharing::stretch) and return those: callers
// advance their clocks by the returned length.
inline constexpr int64_t kComputeTrack = 0;
inline constexpr int64_t kCommTrack = 1;
class Recorder {
 public:
  Recorder(int64_t units, bool keep_events, Sharing* sharing = nullptr);
  double linear(int64_t u, double start, double dur, const char* name, int64_t mb);
  double attention(int64_t u, double start, double dur, const char* name, int64_t mb);
  // Tensor parallelism's collectives of unit u from `start` (Rates::tp_slot): synchronous
  // inside the layer, so in flight and waited for (exposed) alike; their bytes go to
  // UnitStats::tp_bytes. With collectives (c.seconds > 0) they also carry the TP peers' wait,
  // c.wait_per_compute x the unit's compute (wall seconds) recorded since its previous
  // collectives. Returns the seconds (0 for none).
  double tp(int64_t u, double start, const Rates::TpCost& c, int64_t mb);
  // A collective (or transfer) involving u in flight over [start, start + dur).
  void comm(int64_t u, double start, double dur, double sent, double recv, const char* name, int64_t mb);
  // u waited from `ready` to `until` for data in flight over [start, end): the part while the
  // data moved is exposed communication, the rest is idle (not recorded: derived at the end).
  // All of it is time blocked in communication (UnitStats::comm_blocked), as the runtime's
  // waits count it, unless `barrier_before_start`: then the wait before `start` was for the
  // slowest unit to reach a barrier (the gradient all-reduce's), which the runtime times apart.
  void wait(int64_t u, double ready, double until, double start, bool barrier_before_start = false);
  std::vector<UnitStats>& stats() { return stats_; }
  std::vector<TraceEvent>& events() { return events_; }
  bool keep_events() const { return keep_; }

 private:
  // A compute interval counted in `bucket` (linear or attention) and in busy.
  double compute(int64_t u, double start, double dur, const char* name, int64_t mb, double UnitStats::*bucket);
  void keep_event(int64_t u, int64_t track, const char* name, double start, double dur, int64_t mb);
  std::vector<UnitStats> stats_;
  std::vector<double> compute_since_tp_;  // [unit] compute seconds since its last TP collectives
  std::vector<TraceEvent> events_;
  bool keep_ = false;
  Sharing* sharing_ = nullptr;
};

// Peak memory inputs of one unit, filled by the engines. Bytes are the whole unit's (/ G per
// GPU); the *_kv parts are the K/V rows (and their dK/dV) inside the figure before them.
struct MemoryInput {
  double tokens_in_flight = 0;   // peak sum of tokens of the micro-batches held at once
  double tokens_max = 0;         // most tokens of one micro-batch (recompute / logits transients)
  // Peak bytes kept from forward to backward for every layer of the micro-batches in flight:
  // fetched K/V without checkpointing, keeping CAD servers' inputs and outputs.
  double kept_bytes = 0;
  double kept_kv_bytes = 0;
  // Peak bytes of the one layer in flight: fetched K/V with checkpointing (and the
  // dK/dV before it goes back), stateless CAD servers' inputs, dO and gradients.
  double transient_bytes = 0;
  double transient_kv_bytes = 0;
  // Units this unit's strategy exchanges with point to point (the framework's communication
  // buffers: one connection each).
  int64_t exchange_peers = 0;
};
// Fills `stats.memory` of every unit and the OOM fields of `r`.
void apply_memory(const Rates& rates, const std::vector<MemoryInput>& in, SimResult& r);

// The engines: fill r.per_unit (via the recorder), pipeline/grad/iteration seconds, plan stats,
// memory and cp_degree. `cp` is the CP degree for the baselines (wlb, percp, colocated = 1).
Status run_baseline(const Rates& rates, const std::vector<Batch>& mbs, int64_t cp, SimResult& r);
Status run_cad(const Rates& rates, const std::vector<Batch>& mbs, SimResult& r);

// DP gradient all-reduce of stage s (ring over the stage's units): seconds and bytes each
// unit sends (= receives).
double grad_sync_seconds(const Rates& rates, int64_t s, double* bytes_per_unit);

// Runs every stage's gradient all-reduce, stage s starting at stage_start[s] (its units,
// free at unit_free[u], wait for it), then, with optimizer_per_param > 0, each unit's
// optimizer step (compute, "optimizer"), and sets r.grad_sync_seconds and
// r.iteration_seconds (the latest end).
void run_grad_sync(const Rates& rates, Recorder& rec, const std::vector<double>& stage_start,
                   const std::vector<double>& unit_free, SimResult& r);

}  // namespace distca::sim::detail
