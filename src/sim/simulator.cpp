// simulate(): checks, strategy dispatch (with WLB-ideal's CP-degree sweep), final per-unit
// figures, and the JSON summary (simulator.h).
#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "engine.h"

namespace distca::sim {
namespace {

// Idle time, fractions and totals once the engine has run.
void finish(const SimOptions& o, const std::vector<Batch>& mbs, SimResult& r) {
  r.strategy = o.strategy;
  r.cad_stateless = o.cad_stateless;
  r.model = o.model.name;
  r.hardware = o.cluster.hw.name;
  r.gpus = o.cluster.gpus;
  r.gpus_per_node = o.cluster.gpus_per_node;
  r.units = o.cluster.units();
  r.pp = o.cluster.pp;
  r.microbatches = static_cast<int64_t>(mbs.size());
  r.tokens = 0;
  for (const Batch& b : mbs) {
    for (int64_t i = 0; i < b.ranks; ++i) r.tokens += b.rank_tokens(i);
  }
  double idle = 0, exposed = 0;
  r.bytes_total = 0;
  for (UnitStats& u : r.per_unit) {
    u.idle = std::max(0.0, r.iteration_seconds - u.busy - u.exposed_comm);
    idle += u.idle;
    exposed += u.exposed_comm;
    r.bytes_total += u.bytes_sent;
  }
  const double n = static_cast<double>(std::max<size_t>(r.per_unit.size(), 1));
  r.idle_fraction = r.iteration_seconds > 0 ? idle / n / r.iteration_seconds : 0.0;
  r.exposed_comm_fraction = r.iteration_seconds > 0 ? exposed / n / r.iteration_seconds : 0.0;
  r.tokens_per_second = r.iteration_seconds > 0 ? static_cast<double>(r.tokens) / r.iteration_seconds : 0.0;
  std::sort(r.events.begin(), r.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    if (a.pid != b.pid) return a.pid < b.pid;
    if (a.tid != b.tid) return a.tid < b.tid;
    return a.start_us < b.start_us;
  });
}

Status check_batches(const SimOptions& o, const std::vector<Batch>& mbs) {
  if (mbs.empty()) return Status::invalid_argument("--microbatches: no micro-batches to simulate");
  const int64_t ups = o.cluster.units_per_stage();
  for (size_t j = 0; j < mbs.size(); ++j) {
    const Batch& b = mbs[j];
    if (b.ranks != ups) {
      return Status::invalid_argument("micro-batch " + std::to_string(j) + " has " + std::to_string(b.ranks) +
                                      " ranks; the cluster has " + std::to_string(ups) +
                                      " nodes per pipeline stage (--gpus / --gpus-per-node / --pp)");
    }
    DISTCA_RETURN_IF_ERROR(b.validate().with_context("micro-batch " + std::to_string(j)));
  }
  return Status::ok_status();
}

}  // namespace

Result<SimResult> simulate(const SimOptions& options, const std::vector<Batch>& microbatches) {
  DISTCA_RETURN_IF_ERROR(options.validate());
  DISTCA_RETURN_IF_ERROR(check_batches(options, microbatches));
  DISTCA_RETURN_IF_ERROR(detail::host_model(options).status());
  detail::Rates rates(options);
  // Every engine run goes through run_shared: once, or to the processor-sharing fixed point.
  auto baseline = [&](detail::Rates& R, int64_t c, SimResult& out) {
    return detail::run_shared(
        R, [&](const detail::Rates& pr, SimResult& pass) { return detail::run_baseline(pr, microbatches, c, pass); },
        out);
  };
  SimResult r;
  const Strategy& st = options.strategy;
  switch (st.kind) {
    case StrategyKind::kColocated:
      DISTCA_RETURN_IF_ERROR(baseline(rates, 1, r));
      break;
    case StrategyKind::kPerCp:
      DISTCA_RETURN_IF_ERROR(baseline(rates, st.cp_degree, r));
      r.cp_candidates.push_back({st.cp_degree, r.iteration_seconds, r.oom, r.peak_memory});
      break;
    case StrategyKind::kCad:
      DISTCA_RETURN_IF_ERROR(detail::run_shared(
          rates, [&](const detail::Rates& pr, SimResult& pass) { return detail::run_cad(pr, microbatches, pass); }, r));
      break;
    case StrategyKind::kWlb: {
      if (st.cp_degree > 0) {
        DISTCA_RETURN_IF_ERROR(baseline(rates, st.cp_degree, r));
        r.cp_candidates.push_back({st.cp_degree, r.iteration_seconds, r.oom, r.peak_memory});
        break;
      }
      // WLB-ideal: every power-of-two CP degree dividing the stage's units; the fastest that
      // fits wins (ties: the smaller degree); if none fits, the one needing the least memory.
      // Candidates run without events; the winner is re-run with them when asked.
      SimOptions quiet = options;
      quiet.record_events = false;
      detail::Rates quiet_rates(quiet);
      std::vector<CpCandidate> cands;
      int64_t best = -1;
      std::vector<SimResult> results;
      for (int64_t c = 1; rates.units_per_stage % c == 0; c *= 2) {
        SimResult one;
        DISTCA_RETURN_IF_ERROR(baseline(quiet_rates, c, one));
        cands.push_back({c, one.iteration_seconds, one.oom, one.peak_memory});
        results.push_back(std::move(one));
        if (c >= rates.units_per_stage) break;
      }
      for (size_t i = 0; i < cands.size(); ++i) {
        if (cands[i].oom) continue;
        if (best < 0 || cands[i].iteration_seconds < cands[static_cast<size_t>(best)].iteration_seconds) {
          best = static_cast<int64_t>(i);
        }
      }
      if (best < 0) {
        best = 0;
        for (size_t i = 1; i < cands.size(); ++i) {
          if (cands[i].peak_memory < cands[static_cast<size_t>(best)].peak_memory) best = static_cast<int64_t>(i);
        }
      }
      if (options.record_events) {
        DISTCA_RETURN_IF_ERROR(baseline(rates, cands[static_cast<size_t>(best)].cp_degree, r));
      } else {
        r = std::move(results[static_cast<size_t>(best)]);
      }
      r.cp_candidates = std::move(cands);
      break;
    }
  }
  finish(options, microbatches, r);
  return r;
}

nlohmann::json to_json(const SimResult& r) {
  nlohmann::json j;
  j["strategy"] = r.strategy.name();
  j["cad_servers"] = r.cad_stateless ? "stateless" : "keep";
  j["model"] = r.model;
  j["hardware"] = r.hardware;
  j["gpus"] = r.gpus;
  j["gpus_per_node"] = r.gpus_per_node;
  j["units"] = r.units;
  j["pp"] = r.pp;
  j["microbatches"] = r.microbatches;
  j["dp"] = r.dp;
  j["cp_degree"] = r.cp_degree;
  j["tokens"] = r.tokens;
  j["iteration_seconds"] = r.iteration_seconds;
  j["pipeline_seconds"] = r.pipeline_seconds;
  j["grad_sync_seconds"] = r.grad_sync_seconds;
  j["tokens_per_second"] = r.tokens_per_second;
  j["oom"] = r.oom;
  j["oom_unit"] = r.oom_unit;
  j["oom_reason"] = r.oom_reason;
  j["peak_memory_bytes"] = r.peak_memory;
  j["idle_fraction"] = r.idle_fraction;
  j["exposed_comm_fraction"] = r.exposed_comm_fraction;
  j["bytes_total"] = r.bytes_total;
  double busy_max = 0, busy_sum = 0;
  for (const UnitStats& u : r.per_unit) {
    busy_max = std::max(busy_max, u.busy);
    busy_sum += u.busy;
  }
  const double busy_mean = r.per_unit.empty() ? 0.0 : busy_sum / static_cast<double>(r.per_unit.size());
  j["busy_max_over_mean"] = busy_mean > 0 ? busy_max / busy_mean : 1.0;
  j["pp_ticks"] = r.pp_ticks;
  j["sharing"] = {{"passes", r.sharing_passes}, {"converged", r.sharing_converged}};
  j["plan"] = {{"plans", r.plan.plans},
               {"tasks", r.plan.tasks},
               {"load_max_over_mean", r.plan.load_max_over_mean},
               {"load_before_max_over_mean", r.plan.load_before_max_over_mean},
               {"comm_bytes_forward", r.plan.comm_bytes_forward},
               {"comm_bytes_backward", r.plan.comm_bytes_backward},
               {"plan_seconds", r.plan.plan_seconds},
               {"backward_replans", r.plan.backward_replans}};
  nlohmann::json cands = nlohmann::json::array();
  for (const CpCandidate& c : r.cp_candidates) {
    cands.push_back({{"cp_degree", c.cp_degree},
                     {"iteration_seconds", c.iteration_seconds},
                     {"oom", c.oom},
                     {"peak_memory_bytes", c.peak_memory}});
  }
  j["cp_candidates"] = std::move(cands);
  nlohmann::json units = nlohmann::json::array();
  for (size_t i = 0; i < r.per_unit.size(); ++i) {
    const UnitStats& u = r.per_unit[i];
    units.push_back({{"unit", i},
                     {"stage", u.stage},
                     {"tokens", u.tokens},
                     {"busy", u.busy},
                     {"linear", u.linear},
                     {"attention", u.attention},
                     {"attention_pairs", u.attention_pairs},
                     {"comm", u.comm},
                     {"exposed_comm", u.exposed_comm},
                     {"comm_blocked", u.comm_blocked},
                     {"idle", u.idle},
                     {"bytes_sent", u.bytes_sent},
                     {"bytes_received", u.bytes_received},
                     {"memory",
                      {{"params", u.memory.params},
                       {"grads", u.memory.grads},
                       {"optimizer", u.memory.optimizer},
                       {"activations", u.memory.activations},
                       {"buffers", u.memory.buffers},
                       {"kv_buffers", u.memory.kv_buffers},
                       {"framework", u.memory.framework},
                       {"total", u.memory.total()}}}});
  }
  j["per_unit"] = std::move(units);
  return j;
}

}  // namespace distca::sim
