// From a request (the CLI's flags, Python's keywords) or a training run to SimOptions
// (request.h): the one mapping every entry point calls.
#include "distca/sim/request.h"

#include <algorithm>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "distca/core/stats.h"
#include "distca/core/trace.h"
#include "distca/cost/options.h"

namespace distca::sim {

Result<SimSetup> make_sim_options(const SimRequest& r) {
  if (r.gpus <= 0) return Status::invalid_argument("--gpus must be positive (got " + std::to_string(r.gpus) + ")");
  SimSetup out;
  SimOptions& so = out.options;
  if (r.model_spec) {
    so.model = *r.model_spec;
  } else {
    auto m = model_preset(r.model);
    if (!m.ok()) return Status(m.status().code(), "--model: " + m.status().message());
    so.model = *m;
  }
  DISTCA_ASSIGN_OR_RETURN(ResolvedHardware hw, resolve_hardware(r.hardware));
  if (hw.profile) {
    for (const auto& [flag, set] : {std::pair{"--mfu", r.mfu.has_value()},
                                    std::pair{"--attention-efficiency", r.attention_efficiency.has_value()},
                                    std::pair{"--inter-node-bw", r.inter_node_gbps.has_value()},
                                    std::pair{"--inter-node-latency", r.inter_node_latency_us.has_value()}}) {
      if (set) {
        return Status::invalid_argument(std::string(flag) + " cannot be combined with a hardware profile (--hardware " +
                                        r.hardware + " measured it)");
      }
    }
  }
  DISTCA_ASSIGN_OR_RETURN(so.strategy, parse_strategy(r.strategy));
  DISTCA_ASSIGN_OR_RETURN(so.dtype_bytes, dtype_bytes_of(r.dtype));
  if (r.cad_servers != "keep" && r.cad_servers != "stateless") {
    return Status::invalid_argument("--cad-servers: expected keep or stateless, got '" + r.cad_servers + "'");
  }
  so.cluster.hw = hw.spec;
  so.hardware_profile = r.hardware_profile ? r.hardware_profile : hw.profile;
  if (r.peak_flops) so.cluster.hw.peak_flops = *r.peak_flops;
  if (r.inter_node_gbps) {
    if (!(*r.inter_node_gbps > 0)) return Status::invalid_argument("--inter-node-bw must be positive (GB/s per GPU)");
    so.cluster.hw.inter_node_bw = *r.inter_node_gbps * 1e9;
  }
  if (r.inter_node_latency_us) {
    if (!(*r.inter_node_latency_us >= 0)) return Status::invalid_argument("--inter-node-latency must be >= 0 (microseconds)");
    so.cluster.hw.inter_node_latency = *r.inter_node_latency_us * 1e-6;
  }
  if (r.memory_gb) {
    if (!(*r.memory_gb > 0)) return Status::invalid_argument("--memory-gb must be positive");
    so.cluster.hw.memory_bytes = *r.memory_gb * 1e9;
  }
  if (r.gpus_per_node && *r.gpus_per_node <= 0) return Status::invalid_argument("--gpus-per-node must be positive");
  so.cluster.gpus = r.gpus;
  so.cluster.gpus_per_node = r.gpus_per_node ? *r.gpus_per_node : so.cluster.hw.gpus_per_node;
  so.cluster.pp = r.pp;
  so.mfu = r.mfu.value_or(so.mfu);
  so.attention_efficiency = r.attention_efficiency.value_or(so.attention_efficiency);
  so.attention_tile = r.attention_tile;
  so.tolerance = r.tolerance;
  so.tolerance_auto = r.tolerance_auto;
  if (r.ranks_per_host != 0) {
    if (r.ranks_per_host % so.cluster.gpus_per_node != 0) {
      return Status::invalid_argument("--ranks-per-host " + std::to_string(r.ranks_per_host) +
                                      " is not a whole number of units of " + std::to_string(so.cluster.gpus_per_node) +
                                      " ranks");
    }
    DISTCA_ASSIGN_OR_RETURN(so.topology, topology_ranks_per_host(so.cluster.units(),
                                                                 r.ranks_per_host / so.cluster.gpus_per_node));
  }
  so.wlb_mem_cap = r.wlb_mem_cap;
  so.wlb_cp_threshold = r.wlb_cp_threshold;
  // Framework memory is a GPU runtime's: none on the local CPU (its preset, or a profile
  // measured there by distca profile).
  if (so.hardware_profile != nullptr || so.cluster.hw.name == "local-cpu") so.framework = FrameworkMemory{};
  so.shard_optimizer = r.shard_optimizer;
  so.activation_checkpointing = r.activation_checkpointing;
  so.lm_head = r.lm_head;
  so.grad_sync = r.grad_sync;
  so.cad_stateless = r.cad_servers == "stateless";
  so.record_events = r.record_events;
  so.tp_collectives = r.tp_collectives;
  so.attention_table = r.attention_table;
  if (r.attention_table == nullptr && !r.cost_table.empty()) {
    DISTCA_ASSIGN_OR_RETURN(out.table, load_cost_table_option(r.cost_table));
    so.attention_table = out.table.get();
  }
  DISTCA_RETURN_IF_ERROR(so.validate());
  return out;
}

SimRequest training_request(const TrainingRun& run) {
  SimRequest r;
  r.model_spec = run.model;
  r.gpus = run.ranks;
  r.gpus_per_node = run.tp;
  r.pp = run.pp;
  // The local-cpu preset's links and memory; its peak is the measured sgemm rate at mfu 1
  // (a hardware profile, when given, replaces the rates and the links).
  r.hardware = "local-cpu";
  r.hardware_profile = run.hardware_profile;
  r.peak_flops = run.sgemm_flops;
  r.mfu = 1.0;
  r.tp_collectives = true;  // the sgemm rate (or the profile's) is the kernels' alone: TP's traffic is not in it
  r.attention_table = run.attention_table;
  r.tolerance = run.tolerance;
  r.tolerance_auto = run.tolerance_auto && run.mode == "cad";
  r.ranks_per_host = run.ranks_per_host;
  r.record_events = run.record_events;
  r.dtype = "fp32";
  r.shard_optimizer = false;
  r.activation_checkpointing = false;
  r.cad_servers = run.pp > 1 ? "stateless" : "keep";  // pipelines plan every backward apart
  r.wlb_mem_cap = run.wlb_cap;
  r.wlb_cp_threshold = run.cp_threshold;
  r.attention_tile = run.tile_rows;
  // Every other mode is the simulator strategy of its name, the re-packing baselines at the
  // run's CP degree (a bare "wlb" would be WLB-ideal's search over degrees, not the run), so
  // a mode the simulator lacks is refused by make_sim_options, never simulated as another.
  if (run.mode == "cad") {
    r.strategy = "cad:" + run.overlap;
  } else if (run.mode == "wlb" || run.mode == "percp") {
    r.strategy = run.mode + ":" + std::to_string(std::max<int64_t>(run.cp, 1));
  } else {
    r.strategy = run.cp > 0 ? run.mode + ":" + std::to_string(run.cp) : run.mode;
  }
  return r;
}

Result<TrainingPrediction> predict_training(const TrainingRun& run, const std::vector<Batch>& batches) {
  DISTCA_ASSIGN_OR_RETURN(SimSetup setup, make_sim_options(training_request(run)));
  DISTCA_ASSIGN_OR_RETURN(SimResult r, simulate(setup.options, batches));
  TrainingPrediction out;
  out.step_s = r.iteration_seconds;
  out.attention_bytes = (r.plan.comm_bytes_forward + r.plan.comm_bytes_backward) * static_cast<double>(run.model.n_layers);
  const int64_t ups = run.ranks / run.tp / run.pp;  // units per stage
  const double t = r.iteration_seconds;
  out.stage_idle.assign(static_cast<size_t>(run.pp), 0);
  for (const UnitStats& u : r.per_unit) {
    const double idle = t > 0 ? 1.0 - u.busy / t : 0.0;
    out.stage_idle[static_cast<size_t>(u.stage)] += idle / static_cast<double>(ups);
    out.rank_idle.push_back(idle);
    out.rank_exposed.push_back(t > 0 ? u.exposed_comm / t : 0.0);
    out.rank_blocked.push_back(t > 0 ? u.comm_blocked / t : 0.0);
    out.rank_busy_s.push_back(u.busy);
    out.rank_linear_s.push_back(u.linear);
    out.rank_attention_s.push_back(u.attention);
  }
  if (run.record_events) out.trace = chrome_trace_json(r.events, trace_metadata(r));
  return out;
}

TrainingOutcome predict_outcome(const TrainingRun& run, const std::vector<Batch>& batches) {
  TrainingOutcome out;
  auto p = predict_training(run, batches);
  if (!p.ok()) {
    out.error = p.status().message();
    return out;
  }
  static_cast<TrainingPrediction&>(out) = std::move(p).value();
  out.ok = true;
  return out;
}

nlohmann::json to_json(const TrainingOutcome& p, double measured_s) {
  return {{"ok", p.ok},
          {"error", p.error},
          {"step_s", p.step_s},
          {"over_measured", measured_s > 0 ? p.step_s / measured_s : 0},
          {"stage_idle", p.stage_idle},
          {"rank_idle", p.rank_idle},
          {"rank_exposed", p.rank_exposed},
          {"rank_busy_s", p.rank_busy_s},
          {"rank_linear_s", p.rank_linear_s},
          {"rank_attention_s", p.rank_attention_s},
          {"mean_idle", mean_of(p.rank_idle)},
          {"mean_exposed", mean_of(p.rank_exposed)},
          {"rank_blocked", p.rank_blocked},
          {"mean_blocked", mean_of(p.rank_blocked)}};
}

}  // namespace distca::sim
