#include "distca/train/compare.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "distca/core/check.h"
#include "distca/core/memory.h"
#include "distca/cost/analytic.h"
#include "distca/model/llama.h"
#include "distca/train/trainer.h"

namespace distca::train {
namespace {

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// max / mean of positive values (0 when the mean is not positive).
template <typename T>
double max_over_mean(const std::vector<T>& v) {
  double mx = 0, sum = 0;
  for (T x : v) {
    mx = std::max(mx, static_cast<double>(x));
    sum += static_cast<double>(x);
  }
  return sum > 0 ? mx / (sum / static_cast<double>(v.size())) : 0;
}

// max_over_mean within each group of ranks doing the same work (CompareRow's
// *_replicas_by_stage): rank k is in group (k / (dp x tp)) x tp + k % tp.
std::vector<double> replicas_max_over_mean(const std::vector<int64_t>& per_rank, int64_t dp, int64_t tp) {
  const size_t stage_ranks = static_cast<size_t>(std::max<int64_t>(1, dp) * std::max<int64_t>(1, tp));
  const size_t t_count = static_cast<size_t>(std::max<int64_t>(1, tp));
  const size_t stages = (per_rank.size() + stage_ranks - 1) / stage_ranks;
  std::vector<std::vector<int64_t>> groups(stages * t_count);
  for (size_t k = 0; k < per_rank.size(); ++k) groups[(k / stage_ranks) * t_count + k % t_count].push_back(per_rank[k]);
  std::vector<double> out;
  for (const auto& g : groups) out.push_back(max_over_mean(g));
  return out;
}

double largest(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

// Folds one run's figures (rank 0's TrainResult) into the entry's.
void fold_run(const TrainConfig& cfg, const ModelSpec& spec, const TrainResult& r, int64_t warmup, int round,
              CompareRun& run) {
  const size_t ranks = r.rank_steps.size();
  const int64_t dp = cfg.dp();
  std::vector<double> mine;
  run.rank_idle.resize(ranks);
  run.rank_exposed.resize(ranks);
  run.rank_attention_exposed.resize(ranks);
  run.rank_metrics.resize(ranks);
  for (size_t s = static_cast<size_t>(warmup); s < r.steps.size(); ++s) {
    const double t = r.steps[s].seconds;  // rank 0's: the job's step (it ends in a barrier)
    mine.push_back(t);
    run.tokens_per_step = r.steps[s].tokens;
    double bytes = 0;
    for (size_t k = 0; k < ranks; ++k) {
      const StepMetrics& m = r.rank_steps[k][s];
      run.rank_idle[k].push_back(t > 0 ? 1.0 - m.busy_s() / t : 0.0);
      run.rank_exposed[k].push_back(t > 0 ? m.comm_s / t : 0.0);
      run.rank_attention_exposed[k].push_back(t > 0 ? m.attention_comm_s / t : 0.0);
      run.rank_metrics[k].push_back(m);
      // bytes_sent is the last layer's; every layer of a stage runs the same plan.
      const model::StageRange layers = model::stage_layers(spec.n_layers, cfg.pp, static_cast<int64_t>(k) / dp);
      bytes += static_cast<double>(m.bytes_sent) * static_cast<double>(layers.last - layers.first);
    }
    run.attention_bytes.push_back(bytes);
  }
  run.step_s.insert(run.step_s.end(), mine.begin(), mine.end());
  run.round_median_s.push_back(quantile(mine, 0.5));
  // The step's documents: the first stage's ranks (every stage loads its replica's inputs).
  std::vector<uint64_t> sums(r.steps.size(), 0);
  for (size_t s = 0; s < sums.size(); ++s) {
    for (int64_t k = 0; k < dp && static_cast<size_t>(k) < ranks; ++k) sums[s] += r.rank_steps[static_cast<size_t>(k)][s].input_checksum;
  }
  if (round == 0) {
    run.checksums = std::move(sums);
  } else if (sums != run.checksums) {
    run.same_over_rounds = false;
  }
  run.accounted_peak.resize(r.accounted_peak_bytes.size(), 0);
  for (size_t k = 0; k < r.accounted_peak_bytes.size(); ++k) {
    run.accounted_peak[k] = std::max(run.accounted_peak[k], r.accounted_peak_bytes[k]);
  }
}

}  // namespace

std::vector<CompareMode> compare_modes(int64_t dp) {
  std::vector<CompareMode> out;
  out.push_back({"colocated", "colocated", TrainMode::kColocated, std::nullopt, 1, false});
  for (int64_t c = 1; c <= dp; ++c) {
    if (dp % c == 0) out.push_back({"wlb cp " + std::to_string(c), "wlb", TrainMode::kWlb, std::nullopt, c, false});
  }
  for (int64_t c = 2; c <= dp; ++c) {
    if (dp % c == 0) out.push_back({"percp cp " + std::to_string(c), "percp", TrainMode::kPerCp, std::nullopt, c, false});
  }
  out.push_back({"cad single-stream", "cad single-stream", TrainMode::kCad, runtime::OverlapMode::kSingleStream, 1, false});
  out.push_back({"cad pingpong", "cad pingpong", TrainMode::kCad, runtime::OverlapMode::kPingPong, 1, true});
  return out;
}

Result<TrainConfig> compare_config(const TrainConfig& base, const CompareMode& m) {
  const bool chunked = m.mode == TrainMode::kWlb || m.mode == TrainMode::kPerCp;
  if (m.cp != 1 && !chunked) {
    return Status::invalid_argument("mode entry '" + m.label + "': CP degree " + std::to_string(m.cp) +
                                    " applies to wlb and percp only");
  }
  TrainConfig c = base;
  c.mode = m.mode;
  c.cp = m.cp;
  c.overlap = m.mode == TrainMode::kCad ? m.overlap : std::nullopt;
  c.trace.clear();
  c.metrics.clear();
  c.checkpoint_dir.clear();
  return c;
}

Status CompareOptions::validate() const {
  if (modes.empty()) return Status::invalid_argument("a comparison needs at least one mode entry");
  if (rounds < 1) return Status::invalid_argument("--rounds must be at least 1 (got " + std::to_string(rounds) + ")");
  if (warmup_steps < 0 || base.steps <= warmup_steps) {
    return Status::invalid_argument("--steps (" + std::to_string(base.steps) + ") must exceed --warmup-steps (" +
                                    std::to_string(warmup_steps) + ")");
  }
  std::set<std::string> labels;
  int references = 0;
  for (const CompareMode& m : modes) {
    if (!labels.insert(m.label).second) return Status::invalid_argument("mode entry '" + m.label + "' appears twice");
    references += m.reference ? 1 : 0;
    DISTCA_ASSIGN_OR_RETURN(TrainConfig c, compare_config(base, m));
    if (Status st = c.validate(); !st.ok()) {
      return Status::invalid_argument("mode " + m.label + ": " + st.message());
    }
  }
  if (references != 1) return Status::invalid_argument("a comparison needs exactly one reference entry");
  return {};
}

Status run_compare(comm::Communicator& comm, const CompareOptions& o, const DataSource& data, CompareResult* out) {
  const bool lead = comm.rank() == 0;
  DISTCA_ASSIGN_OR_RETURN(ModelSpec spec, o.base.model_spec());
  CompareResult res;
  res.resident = o.resident;
  res.runs.resize(o.modes.size());
  TrainHooks hooks;
  hooks.data = &data;
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t e = 0; e < o.modes.size(); ++e) {
      DISTCA_ASSIGN_OR_RETURN(TrainConfig cfg, compare_config(o.base, o.modes[e]));
      DISTCA_RETURN_IF_ERROR(comm.barrier());  // nothing allocates while the mark is reset
      const int reset = o.resident && reset_peak_resident() ? 1 : 0;
      DISTCA_RETURN_IF_ERROR(comm.barrier());
      TrainResult r;
      DISTCA_RETURN_IF_ERROR(run_training(cfg, comm, hooks, lead ? &r : nullptr));
      DISTCA_RETURN_IF_ERROR(comm.barrier());
      DISTCA_ASSIGN_OR_RETURN(std::vector<int64_t> peaks, comm.all_gather_value(o.resident ? peak_resident_bytes() : int64_t{0}));
      DISTCA_ASSIGN_OR_RETURN(std::vector<int> resets, comm.all_gather_value(reset));
      if (!lead) continue;
      CompareRun& run = res.runs[e];
      fold_run(cfg, spec, r, o.warmup_steps, round, run);
      res.resident = res.resident && std::all_of(resets.begin(), resets.end(), [](int x) { return x == 1; });
      if (o.resident) {
        run.resident_peak.resize(peaks.size(), 0);
        for (size_t k = 0; k < peaks.size(); ++k) run.resident_peak[k] = std::max(run.resident_peak[k], peaks[k]);
      }
    }
  }
  if (lead && out != nullptr) {
    if (!res.resident) {
      for (CompareRun& run : res.runs) run.resident_peak.clear();
    }
    *out = std::move(res);
  }
  return {};
}

std::vector<uint64_t> data_checksums(const DataSource& data, int64_t steps, int64_t micro_batches) {
  std::vector<uint64_t> out;
  for (int64_t step = 0; step < steps; ++step) {
    uint64_t sum = 0;
    for (int64_t m = 0; m < micro_batches; ++m) {
      const int64_t index = step * micro_batches + m;
      const Batch b = data.batch(index);
      std::set<int64_t> docs;
      for (const auto& pieces : b.per_rank) {
        for (const Piece& p : pieces) docs.insert(p.doc);
      }
      for (int64_t d : docs) {
        const std::vector<int32_t> tokens = data.document(index, b, d);
        std::vector<int32_t> positions(tokens.size());
        for (size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int32_t>(i);
        sum += inputs_checksum(tokens, positions);
      }
    }
    out.push_back(sum);
  }
  return out;
}

std::vector<double> attention_imbalance(const DataSource& data, int64_t steps, int64_t micro_batches) {
  std::vector<double> out;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<double> load;
    for (int64_t m = 0; m < micro_batches; ++m) {
      const Batch b = data.batch(step * micro_batches + m);
      load.resize(b.per_rank.size(), 0.0);
      for (size_t r = 0; r < b.per_rank.size(); ++r) {
        for (const Piece& p : b.per_rank[r]) load[r] += static_cast<double>(causal_pairs(p.offset, p.offset + p.len));
      }
    }
    out.push_back(max_over_mean(load));
  }
  return out;
}

double quantile(std::vector<double> v, double q) {
  DISTCA_CHECK(q >= 0 && q <= 1);
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(at));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (at - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

std::vector<CompareRow> summarize_compare(const CompareOptions& o, const CompareResult& res) {
  std::vector<CompareRow> rows;
  size_t ref = 0;
  for (size_t e = 0; e < o.modes.size(); ++e) ref = o.modes[e].reference ? e : ref;
  for (size_t e = 0; e < o.modes.size(); ++e) {
    const CompareRun& run = res.runs[e];
    CompareRow row;
    row.label = o.modes[e].label;
    row.group = o.modes[e].group;
    row.median_s = quantile(run.step_s, 0.5);
    row.p10_s = quantile(run.step_s, 0.1);
    row.p90_s = quantile(run.step_s, 0.9);
    row.tokens_per_s = row.median_s > 0 ? static_cast<double>(run.tokens_per_step) / row.median_s : 0;
    std::vector<double> idle, exposed, attention_exposed;
    for (const auto& v : run.rank_idle) idle.push_back(quantile(v, 0.5));
    for (const auto& v : run.rank_exposed) exposed.push_back(quantile(v, 0.5));
    for (const auto& v : run.rank_attention_exposed) attention_exposed.push_back(quantile(v, 0.5));
    row.idle_max = idle.empty() ? 0 : *std::max_element(idle.begin(), idle.end());
    row.idle_mean = mean(idle);
    row.exposed_max = exposed.empty() ? 0 : *std::max_element(exposed.begin(), exposed.end());
    row.exposed_mean = mean(exposed);
    row.attention_exposed_max =
        attention_exposed.empty() ? 0 : *std::max_element(attention_exposed.begin(), attention_exposed.end());
    row.attention_exposed_mean = mean(attention_exposed);
    row.attention_bytes = quantile(run.attention_bytes, 0.5);
    row.accounted_max = run.accounted_peak.empty() ? 0 : *std::max_element(run.accounted_peak.begin(), run.accounted_peak.end());
    row.accounted_max_over_mean = max_over_mean(run.accounted_peak);
    row.resident_max = run.resident_peak.empty() ? 0 : *std::max_element(run.resident_peak.begin(), run.resident_peak.end());
    row.resident_max_over_mean = max_over_mean(run.resident_peak);
    row.accounted_replicas_by_stage = replicas_max_over_mean(run.accounted_peak, o.base.dp(), o.base.tp);
    row.accounted_replicas_max_over_mean = largest(row.accounted_replicas_by_stage);
    row.resident_replicas_by_stage = replicas_max_over_mean(run.resident_peak, o.base.dp(), o.base.tp);
    row.resident_replicas_max_over_mean = largest(row.resident_replicas_by_stage);
    std::vector<double> ratio;
    const CompareRun& r = res.runs[ref];
    for (size_t i = 0; i < std::min(run.round_median_s.size(), r.round_median_s.size()); ++i) {
      if (r.round_median_s[i] > 0) ratio.push_back(run.round_median_s[i] / r.round_median_s[i]);
    }
    row.reference_speedup = quantile(ratio, 0.5);
    rows.push_back(std::move(row));
  }
  for (CompareRow& row : rows) {
    row.best_of_group = std::none_of(rows.begin(), rows.end(), [&](const CompareRow& other) {
      return other.group == row.group && &other != &row &&
             (other.median_s < row.median_s || (other.median_s == row.median_s && &other < &row));
    });
  }
  return rows;
}

namespace {

// [rank][timed step] each rank's own time split (CompareRun::rank_metrics), in seconds.
nlohmann::json rank_time_split(const std::vector<std::vector<StepMetrics>>& per_rank) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& steps : per_rank) {
    nlohmann::json rank = nlohmann::json::array();
    for (const StepMetrics& m : steps) {
      rank.push_back({{"step_s", m.seconds},        {"linear_s", m.linear_s},
                      {"attention_s", m.attention_s}, {"optimizer_s", m.optimizer_s},
                      {"comm_s", m.comm_s},           {"attention_comm_s", m.attention_comm_s},
                      {"wait_s", m.wait_s},           {"plan_s", m.plan_s},
                      {"plan_wait_s", m.plan_wait_s}, {"bytes_sent", m.bytes_sent}});
    }
    out.push_back(std::move(rank));
  }
  return out;
}

}  // namespace

nlohmann::json compare_json(const CompareOptions& o, const CompareResult& res, const std::vector<CompareRow>& rows,
                            const std::vector<uint64_t>& expected, const std::vector<double>& imbalance) {
  const TrainConfig& c = o.base;
  nlohmann::json j;
  j["ranks"] = c.ranks;
  j["pp"] = c.pp;
  j["dp"] = c.dp();
  j["micro_batches"] = c.micro_batches;
  j["tokens_per_rank"] = c.tokens_per_rank;
  j["workload"] = {{"dist", c.dist}, {"max_doc_len", c.max_doc_len}, {"seed", c.seed}};
  j["rounds"] = o.rounds;
  j["steps"] = c.steps;
  j["warmup_steps"] = o.warmup_steps;
  j["attention_imbalance"] = imbalance;  // [step] before planning
  j["data_checksums"] = expected;
  j["memory"] = {{"accounted", "the trainer's accounting of each rank's buffers at their high-water mark"},
                 {"resident", res.resident ? "VmHWM of each rank process, reset before every run" : ""},
                 {"replicas", "max/mean within each pipeline stage and TP index, across its data-parallel replicas "
                              "(by_stage: [stage * tp + t]); the whole-job figure is *_max_over_mean"}};
  j["modes"] = nlohmann::json::array();
  for (size_t e = 0; e < rows.size(); ++e) {
    const CompareRow& row = rows[e];
    const CompareRun& run = res.runs[e];
    const CompareMode& m = o.modes[e];
    j["modes"].push_back({{"label", row.label},
                          {"group", row.group},
                          {"mode", train_mode_name(m.mode)},
                          {"overlap", m.overlap ? runtime::overlap_mode_name(*m.overlap) : ""},
                          {"cp", m.cp},
                          {"reference", m.reference},
                          {"best_of_group", row.best_of_group},
                          {"median_s", row.median_s},
                          {"p10_s", row.p10_s},
                          {"p90_s", row.p90_s},
                          {"tokens_per_s", row.tokens_per_s},
                          {"idle_max", row.idle_max},
                          {"idle_mean", row.idle_mean},
                          {"exposed_max", row.exposed_max},
                          {"exposed_mean", row.exposed_mean},
                          {"attention_exposed_max", row.attention_exposed_max},
                          {"attention_exposed_mean", row.attention_exposed_mean},
                          {"attention_bytes_per_step", row.attention_bytes},
                          {"accounted_peak_bytes", run.accounted_peak},
                          {"accounted_max_bytes", row.accounted_max},
                          {"accounted_max_over_mean", row.accounted_max_over_mean},
                          {"resident_peak_bytes", run.resident_peak},
                          {"resident_max_bytes", row.resident_max},
                          {"resident_max_over_mean", row.resident_max_over_mean},
                          {"accounted_replicas_max_over_mean", row.accounted_replicas_max_over_mean},
                          {"accounted_replicas_max_over_mean_by_stage", row.accounted_replicas_by_stage},
                          {"resident_replicas_max_over_mean", row.resident_replicas_max_over_mean},
                          {"resident_replicas_max_over_mean_by_stage", row.resident_replicas_by_stage},
                          {"reference_speedup", row.reference_speedup},
                          {"steps_s", run.step_s},
                          {"round_median_s", run.round_median_s},
                          {"rank_idle", run.rank_idle},
                          {"rank_exposed", run.rank_exposed},
                          {"rank_attention_exposed", run.rank_attention_exposed},
                          {"rank_time_split", rank_time_split(run.rank_metrics)},
                          {"step_checksums", run.checksums},
                          {"same_documents", run.same_over_rounds && run.checksums == expected}});
  }
  return j;
}

}  // namespace distca::train
