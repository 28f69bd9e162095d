// `--tolerance auto`: the balance band chosen batch by batch from the cost model with the
// measured link (docs/scheduler.md, "Choosing the tolerance"; docs/training.md says why this
// variant and not a controller fed by measured steps).
//
// For every tolerance of kAutoTolerances the batch is planned and its step predicted. The
// default band (kAutoDefaultTolerance, the fixed flag's default) is kept unless another is
// predicted more than kAutoToleranceMargin faster; among those the lowest prediction wins,
// ties to the tighter band. So where the link costs nothing (every prediction within the
// margin) auto plans exactly as the default does: a prediction's balance terms are not exact
// enough to trade a fraction of a percent of predicted step for a different plan. Two
// predictions:
//  - ping-pong with the linear work known (AutoToleranceModel::pingpong(), as a hardware
//    profile gives it): the nano-batch plans' timeline (plan/pingpong_model.h), which knows
//    which compute each nano-batch's exchange can hide behind;
//  - otherwise, per rank: compute c_r = the forward+backward attention seconds of its tasks
//    (the model's cost table), communication m_r = its forward+backward bytes sent and
//    received on each link over that link's rate (between hosts, or inside a host when the
//    topology says so), t_r = max(c_r, m_r) when the exchanges overlap compute or c_r + m_r
//    when they do not (single-stream). The prediction is max_r t_r.
//
// Determinism: a pure function of (batch, spec, options, model): every rank that plans the
// same batch chooses the same tolerance, without a collective. Thread safety: pure, like the
// schedulers it calls.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distca/core/status.h"
#include "distca/cost/cost_model.h"
#include "distca/cost/hardware_profile.h"
#include "distca/data/batch.h"
#include "distca/plan/link_model.h"
#include "distca/plan/nano_plan.h"
#include "distca/plan/schedule.h"

namespace distca {

// The candidate tolerances, ascending. The wide rungs let a slow link move less: at 1 a
// server up to twice the mean keeps all its work, which is the right plan when moving it
// costs more transfer than it saves compute.
inline constexpr double kAutoTolerances[] = {0.0, 0.02, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0};
// The nano-batch cuts the ping-pong timeline tries with every tolerance (split_nano_batches'
// cut_fraction; 0 the L / sqrt(2) rule). Another cut than the rule's wins only when its step
// is predicted more than kAutoCutMargin faster than the rule's best: a fast link keeps the
// rule's split.
inline constexpr double kAutoCutFractions[] = {0.0, 0.4, 0.5, 0.6, 0.8, 1.0};
inline constexpr double kAutoCutMargin = 0.01;
// The band kept unless another beats its prediction by more than kAutoToleranceMargin (a
// fraction of its predicted step): ScheduleOptions' default tolerance.
inline constexpr double kAutoDefaultTolerance = 0.05;
inline constexpr double kAutoToleranceMargin = 0.01;

struct AutoToleranceModel {
  // Forward+backward seconds of one task (unit "seconds"); not owned, outlives the calls.
  const AttentionCostModel* seconds = nullptr;
  double inter_host_bytes_per_second = 0;  // between hosts (every byte without a topology)
  double intra_host_bytes_per_second = 0;  // inside a host
  bool overlap = true;                     // exchanges hidden behind compute (ping-pong)
  // The linear work per token row of one layer (GEMMs and element-wise, forward and
  // backward) and the backward's share of the attention seconds: the ping-pong timeline's
  // figures. 0 linear seconds: not known (the max(compute, bytes) prediction).
  double linear_forward_seconds_per_row = 0;
  double linear_backward_seconds_per_row = 0;
  double attention_backward_share = 0.5;
  // The ping-pong timeline's dispatches carry the pair's K/V wire (plan/kv_once.h, the
  // runner's default) or each nano plan's own kKv exchange.
  bool kv_once = true;
  // The ping-pong timeline's fixed seconds per message (the link fit's intercept).
  double message_seconds = 0;
  // The timeline's compute beside a transfer slows by this many seconds per byte its rank sends
  // or receives (a profile's links.comm_cpu; 0 without one): plan/link_model.h
  // charge_transfer_cpu.
  double comm_cpu_seconds_per_byte = 0;
  bool pingpong() const { return overlap && linear_forward_seconds_per_row + linear_backward_seconds_per_row > 0; }
  // The link model's rates (plan/link_model.h): the two classes and message_seconds.
  LinkRates link_rates() const {
    return {inter_host_bytes_per_second, intra_host_bytes_per_second, message_seconds};
  }
  Status validate() const;
};

// The link rates a hardware profile gives the link model (plan/link_model.h), what both the
// timeline (auto_tolerance_model) and the simulator's CAD exchanges price bytes at: its
// point-to-point fit (all-to-all when it has none) as the inter-host rate and its intercept,
// clamped to [0, 1] s, as the seconds per message; inside a host that rate times
// inter_host_price. nullopt: the profile has no link figures (profiled with one rank).
std::optional<LinkRates> profile_link_rates(const HardwareProfile& profile, int64_t inter_host_price);

// The model of a hardware profile (`distca profile --hardware-out`): its attention table, its
// point-to-point link (all-to-all when it has no p2p fit) as the inter-host rate, and that
// rate times topology.inter_host_price inside a host (the price says how much faster a host's
// own links are); the linear seconds per row from its GEMMs of one layer (concurrent figures,
// over the profile's rows) plus its element-wise per-token figures when it has them, the
// backward share from its median backward / forward attention ratio, and the link's latency
// (its fit's intercept) as the seconds per message. `table` receives the cost model `seconds` points to. Refuses a profile
// without link figures (profiled with one rank), naming `flag`.
Result<AutoToleranceModel> auto_tolerance_model(const HardwareProfile& profile, const HostTopology& topology,
                                                bool overlap, std::unique_ptr<AttentionCostModel>* table,
                                                const std::string& flag = "--hardware");

struct AutoToleranceChoice {
  double tolerance = 0;
  double cut_fraction = 0;              // the nano-batch cut to plan with (0 without pingpong())
  double predicted_seconds = 0;         // of the chosen tolerance and cut
  // [kAutoTolerances] every tolerance's prediction (with pingpong(): at its best cut, the
  // rule's unless another beats it by kAutoCutMargin).
  std::vector<double> predicted;
  // With pingpong() (else empty), per tolerance: that cut and the timeline's signal step
  // (exchanges free).
  std::vector<double> cuts, predicted_signal;
};

// The choice for one batch (parse_tolerance, schedule.h, reads the flag). spec: cad or
// cad-symmetric (others have no band: refused). With model.pingpong() every tolerance is
// planned at every cut of kAutoCutFractions and the timeline runs options.model.n_layers
// layers (at least 1); plan with plan_nano_batches(batch, spec, options at the chosen
// tolerance, choice.cut_fraction).
// options.tolerance is ignored. Errors: what run_scheduler refuses, an invalid model.
Result<AutoToleranceChoice> choose_tolerance(const Batch& batch, const SchedulerSpec& spec,
                                             const ScheduleOptions& options, const AutoToleranceModel& model);

// `--kv-once auto`: whether the runner should send K/V once per server across `plans`' pair.
// The ping-pong timeline (plan/pingpong_model.h) predicts the step with the wire and with each
// plan's own K/V; on unless off is predicted more than kAutoToleranceMargin faster (a free link
// keeps the default). Without model.pingpong(): on. Pure, like choose_tolerance.
bool kv_once_pays(const NanoPlans& plans, const AutoToleranceModel& model, int64_t layers);

}  // namespace distca
