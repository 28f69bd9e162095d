// `distca bench train --pp P`: whole training steps of a P-stage pipeline (ranks = DP x P,
// stage-major), colocated 1F1B against cad's 1F1B ticks with pooled attention (pingpong, and
// single-stream), round-robin on one communicator like the data-parallel benchmark
// (cmd_bench_train.cpp), with each stage's idle fraction, the FLOP-ideal and the simulator's
// prediction for the same configuration (docs/benchmarks.md, "Pipelines (bench train --pp)").
//
// Workload: M micro-batches per replica and step; micro-batch m holds one document of
// --long-doc tokens per replica when m % 4 == 0 and --short-doc documents otherwise, so the
// attention work of one micro-batch in four is much heavier (--workload uniform: every
// micro-batch the long document; DataSource::fixed's cycle: the
// trainer reads batch(step * M + m), M a multiple of 4 or not, always micro-batch m's batch).
//
// Also the pieces both halves of bench train share (bench_train.h): predict, the per-rank
// figures, the JSON of the flags and of the simulator's figures.
//
// Idle of a rank in a step: 1 - (linear + attention) / the step's time, from every rank's own
// StepMetrics (TrainResult::rank_steps); linear holds the layer phases, the embedding and the
// optimizer, attention the kernels and row packing (served rows included), so idle is the
// bubble, waiting for neighbours and exchanges, and the barrier behind the slowest rank.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_train.h"
#include "command.h"
#include "launcher.h"
#include "distca/comm/launch.h"
#include "distca/core/io.h"
#include "distca/cost/analytic.h"
#include "distca/cost/hardware_profile.h"
#include "distca/cost/options.h"
#include "distca/cost/profiled.h"
#include "distca/cost/step_flops.h"
#include "distca/kernels/blas.h"
#include "distca/sim/simulator.h"
#include "distca/train/data.h"
#include "distca/train/trainer.h"

namespace distca::cli::bench_train {

// Micro-batch m of a replica's step, packed over the dp replicas (the trainer's Batch of one
// micro-batch): every replica one long document (m % 4 == 0, or every m when uniform) or
// short ones.
std::vector<Batch> pipeline_batches(const TrainBenchFlags& f, int64_t dp) {
  std::vector<Batch> out;
  for (int64_t m = 0; m < f.micro_batches; ++m) {
    Batch b;
    b.ranks = dp;
    b.tokens_per_rank = f.tokens;
    b.per_rank.resize(static_cast<size_t>(dp));
    int64_t id = 0;
    const int64_t len = m % 4 == 0 || f.workload == "uniform" ? long_doc(f) : f.short_doc;
    for (int64_t r = 0; r < dp; ++r) {
      for (int64_t t = 0; t + len <= f.tokens; t += len) b.per_rank[static_cast<size_t>(r)].push_back({id++, 0, len, len});
    }
    out.push_back(std::move(b));
  }
  return out;
}

namespace {

// FLOPs of one step (forward + backward) over every micro-batch and replica.
TrainingFlops pipeline_flops(const ModelSpec& m, const std::vector<Batch>& batches) {
  TrainingFlops s;
  for (const Batch& b : batches) {
    for (const auto& pieces : b.per_rank) {
      for (const Piece& p : pieces) {
        const TrainingFlops f = training_step_flops(m, static_cast<double>(p.len), static_cast<double>(document_pairs(p.len)));
        s.linear += f.linear;
        s.attention += f.attention;
      }
    }
  }
  return s;
}

struct PipeModeFigures {
  std::vector<double> steps;         // timed steps of every round, seconds (rank 0's)
  std::vector<double> round_median;  // [rounds]
  std::vector<std::vector<double>> stage_idle;  // [stage][timed step] mean over the replicas
  std::vector<double> busy_mean;     // [timed step] mean busy over every rank, seconds
  int64_t tokens = 0;                // per step
  RankFigures per_rank;              // every rank's idle and exposed communication
};

struct PipeFigures {
  std::vector<PipeModeFigures> modes;
  std::vector<double> sgemm;  // [ranks] FLOP/s
};

Status run_rank(comm::Communicator& comm, const TrainBenchFlags& f, const train::DataSource& data, PipeFigures* out) {
  const int64_t n = comm.size();
  const bool lead = comm.rank() == 0;
  const int64_t dp = n / f.pp;
  const std::vector<Mode> modes = pipeline_modes();
  const kernels::ScopedComputeThreads one_thread(1);
  PipeFigures fig;
  fig.sgemm.assign(static_cast<size_t>(n), 0);
  fig.modes.resize(modes.size());
  for (PipeModeFigures& m : fig.modes) m.stage_idle.resize(static_cast<size_t>(f.pp));
  train::TrainHooks hooks;
  hooks.data = &data;
  for (int round = 0; round < f.rounds; ++round) {
    DISTCA_RETURN_IF_ERROR(probe_sgemm_round(comm, f, fig.sgemm));
    for (size_t mi = 0; mi < modes.size(); ++mi) {
      const train::TrainConfig cfg = make_config(f, n, modes[mi]);
      DISTCA_RETURN_IF_ERROR(comm.barrier());
      train::TrainResult result;
      DISTCA_RETURN_IF_ERROR(train::run_training(cfg, comm, hooks, lead ? &result : nullptr));
      if (!lead) continue;
      PipeModeFigures& m = fig.modes[mi];
      std::vector<double> mine;
      for (size_t s = static_cast<size_t>(f.warmup_steps); s < result.steps.size(); ++s) {
        const double t = result.steps[s].seconds;
        mine.push_back(t);
        m.tokens = result.steps[s].tokens;
        double busy_sum = 0;
        for (int64_t stage = 0; stage < f.pp; ++stage) {
          double idle = 0;
          for (int64_t d = 0; d < dp; ++d) {
            const train::StepMetrics& rs = result.rank_steps[static_cast<size_t>(stage * dp + d)][s];
            const double busy = rs.busy_s();
            busy_sum += busy;
            idle += t > 0 ? 1.0 - busy / t : 0.0;
          }
          m.stage_idle[static_cast<size_t>(stage)].push_back(idle / static_cast<double>(dp));
        }
        m.busy_mean.push_back(busy_sum / static_cast<double>(n));
      }
      m.steps.insert(m.steps.end(), mine.begin(), mine.end());
      m.round_median.push_back(median(mine));
      m.per_rank.add(result, f.warmup_steps);
    }
  }
  if (lead) *out = std::move(fig);
  return Status::ok_status();
}

int report(const TrainBenchFlags& f, int64_t ranks, const PipeFigures& fig, const ProfiledCostModel* table,
           const std::shared_ptr<const HardwareProfile>& hw_profile) {
  const std::vector<Mode> modes = pipeline_modes();
  const ModelSpec spec = bench_spec(f);
  const int64_t dp = ranks / f.pp;
  const std::vector<Batch> batches = pipeline_batches(f, dp);
  const TrainingFlops fl = pipeline_flops(spec, batches);
  const double sgemm_mean = mean_of(fig.sgemm);
  const double flop_ideal = fl.total() / static_cast<double>(ranks) / sgemm_mean;

  nlohmann::json j;
  j["format"] = kBenchTrainFormat;
  j["bench_flags"] = bench_flags_json(f);
  j["backend"] = f.backend;
  j["ranks"] = ranks;
  j["pp"] = f.pp;
  j["dp"] = dp;
  j["micro_batches"] = f.micro_batches;
  j["omp_threads"] = 1;
  j["model"] = to_json(spec);
  j["workload"] = {{"kind", f.workload}, {"tokens_per_rank", f.tokens}, {"long_doc", long_doc(f)},
                   {"short_doc", f.short_doc}, {"long_every", f.workload == "uniform" ? 1 : 4}};
  j["sgemm_flops"] = fig.sgemm;
  j["flops_per_step"] = {{"linear", fl.linear}, {"attention", fl.attention}};
  j["flop_ideal_s"] = flop_ideal;
  const std::string sim_attention = table != nullptr ? "cost table " + f.cost_table
                                   : hw_profile ? "hardware profile " + f.hardware
                                                : std::string("analytic, efficiency 0.5");
  j["simulator"] = {{"hardware", hw_profile ? "hardware profile " + f.hardware : std::string("local-cpu links, peak = mean sgemm, mfu 1")},
                    {"attention", sim_attention}};
  j["modes"] = nlohmann::json::array();

  std::string out;
  appendf(out, "distca bench train --pp %lld: %lld ranks = %lld replica(s) x %lld stages (%s backend), %lld "
               "micro-batches per replica and step, 1 OpenMP thread per rank, OpenBLAS on 1 thread\n",
          static_cast<long long>(f.pp), static_cast<long long>(ranks), static_cast<long long>(dp),
          static_cast<long long>(f.pp), f.backend.c_str(), static_cast<long long>(f.micro_batches));
  appendf(out, "model: width %lld, %lld layers (%lld per stage), %lld heads (%lld K/V) x %lld, ffn %lld, vocab %lld\n",
          static_cast<long long>(spec.hidden), static_cast<long long>(spec.n_layers),
          static_cast<long long>(spec.n_layers / f.pp), static_cast<long long>(spec.n_heads),
          static_cast<long long>(spec.n_kv_heads), static_cast<long long>(spec.head_dim), static_cast<long long>(spec.ffn),
          static_cast<long long>(spec.vocab));
  if (f.workload == "uniform") {
    appendf(out, "workload: uniform, %lld tokens per rank and micro-batch; every micro-batch %lld document(s) of %lld "
                 "per replica\n",
            static_cast<long long>(f.tokens), static_cast<long long>(f.tokens / long_doc(f)), static_cast<long long>(long_doc(f)));
  } else {
    appendf(out, "workload: skewed, %lld tokens per rank and micro-batch; micro-batches 0, 4, ...: %lld document(s) of "
                 "%lld per replica, the others %lld of %lld\n",
            static_cast<long long>(f.tokens), static_cast<long long>(f.tokens / long_doc(f)),
            static_cast<long long>(long_doc(f)), static_cast<long long>(f.tokens / f.short_doc),
            static_cast<long long>(f.short_doc));
  }
  appendf(out, "FLOPs per step: %.2f G (linear %.2f, attention %.2f); sgemm GFLOP/s per rank:", fl.total() / 1e9,
          fl.linear / 1e9, fl.attention / 1e9);
  for (double x : fig.sgemm) appendf(out, " %.1f", x / 1e9);
  appendf(out, "\n%d round(s) x %lld steps per mode, the first %lld of each run discarded; medians\n", f.rounds,
          static_cast<long long>(f.steps), static_cast<long long>(f.warmup_steps));
  std::string stages;
  for (int64_t s = 0; s < f.pp; ++s) stages += " s" + std::to_string(s);
  appendf(out, "%-18s %8s %9s  idle per stage:%s  %6s %6s %8s %9s %8s %6s  %s\n", "mode", "step s", "tokens/s",
          stages.c_str(), "mean", "exp", "ideal/t", "sim s", "sim/meas", "sim exp", "sim idle per stage");
  std::vector<double> mean_idle(modes.size(), 0);
  for (size_t mi = 0; mi < modes.size(); ++mi) {
    const PipeModeFigures& m = fig.modes[mi];
    const double t = median(m.steps);
    const double tps = t > 0 ? static_cast<double>(m.tokens) / t : 0;
    std::vector<double> idle;
    std::string idles;
    for (const auto& v : m.stage_idle) {
      idle.push_back(median(v));
      char b[16];
      std::snprintf(b, sizeof(b), " %3.0f%%", 100 * idle.back());
      idles += b;
    }
    mean_idle[mi] = mean_of(idle);
    const SimFigures sim = predict(f, ranks, modes[mi], sgemm_mean, table, hw_profile, batches);
    std::string sim_idles;
    for (double x : sim.stage_idle) {
      char b[16];
      std::snprintf(b, sizeof(b), " %3.0f%%", 100 * x);
      sim_idles += b;
    }
    const double busy_ideal = median(m.busy_mean);
    const std::vector<double> rank_idle = m.per_rank.median_idle(), rank_exposed = m.per_rank.median_exposed();
    appendf(out, "%-18s %8.3f %9.0f  %*s%s  %5.1f%% %5.1f%% %8.3f %9.3f %8.2f %5.1f%% %s\n", modes[mi].name, t, tps,
            static_cast<int>(std::string("idle per stage:").size()), "", idles.c_str(), 100 * mean_idle[mi],
            100 * mean_of(rank_exposed), t > 0 ? flop_ideal / t : 0, sim.step_s, t > 0 ? sim.step_s / t : 0,
            100 * mean_of(sim.rank_exposed), sim.ok ? sim_idles.c_str() : ("(simulator: " + sim.error + ")").c_str());
    j["modes"].push_back({{"name", modes[mi].name},
                          {"mode", modes[mi].mode},
                          {"overlap", modes[mi].overlap},
                          {"median_s", t},
                          {"steps_s", m.steps},
                          {"round_median_s", m.round_median},
                          {"tokens_per_s", tps},
                          {"stage_idle", idle},
                          {"mean_idle", mean_idle[mi]},
                          {"busy_ideal_s", busy_ideal},
                          {"flop_ideal_over_step", t > 0 ? flop_ideal / t : 0},
                          {"rank_idle", rank_idle},
                          {"rank_exposed", rank_exposed},
                          {"mean_exposed", mean_of(rank_exposed)},
                          {"sim", sim_json(sim, t)}});
  }
  // Paired by round: colocated's round median over each cad mode's.
  nlohmann::json sp = nlohmann::json::object();
  for (size_t mi = 1; mi < modes.size(); ++mi) {
    std::vector<double> r;
    const auto& a = fig.modes[0].round_median;
    const auto& b = fig.modes[mi].round_median;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      if (b[i] > 0) r.push_back(a[i] / b[i]);
    }
    sp[modes[mi].overlap] = median(r);
  }
  const double idle_ratio = mean_idle[0] > 0 ? mean_idle[1] / mean_idle[0] : 0;
  j["speedup_paired"] = sp;
  j["cad_idle_over_colocated"] = idle_ratio;
  appendf(out, "idle: 1 - (linear + attention) / step time per rank, mean over a stage's replicas (bubble, waiting "
               "for neighbours and exchanges, the barrier behind the slowest rank); mean: over the stages; exp: "
               "StepMetrics::comm_s / step (sends, receives and exchanges blocked on, all-reduces), mean over ranks; "
               "the simulator's idle is the same 1 - busy / step, its exp UnitStats::exposed_comm / step\n");
  appendf(out, "ideal/t: FLOP-ideal (every rank the same share of the step's FLOPs at the mean sgemm rate, no bubble: "
               "%.3f s) over the step time\n", flop_ideal);
  appendf(out, "cad pingpong's idle over colocated's: %.2f (the issue expects at most 0.5)\n", idle_ratio);
  appendf(out, "speedup over colocated 1F1B (paired by round): pingpong %.3f, single-stream %.3f\n",
          sp["pingpong"].get<double>(), sp["single-stream"].get<double>());
  const auto preset = hardware_preset("local-cpu");
  if (hw_profile) {
    appendf(out, "sim: distca's simulator on this configuration: one unit per rank, the hardware profile %s (GEMM rates "
                 "measured with %lld ranks at once, links %s), attention %s; fp32, no checkpointing, stateless cad servers\n",
            f.hardware.c_str(), static_cast<long long>(hw_profile->ranks), hw_profile->all_to_all ? "measured" : "local-cpu preset",
            sim_attention.c_str());
  } else {
    appendf(out, "sim: distca's simulator on this configuration: one unit per rank, local-cpu links (%.2f GB/s, %.0f us), "
                 "peak = mean sgemm rate, mfu 1, attention %s; fp32, no checkpointing, stateless cad servers\n",
            preset.ok() ? preset->inter_node_bw / 1e9 : 0.0, preset.ok() ? preset->inter_node_latency * 1e6 : 0.0,
            table != nullptr ? ("from " + f.cost_table).c_str() : "analytic at efficiency 0.5 (no --cost-table)");
  }
  return finish_report(f, std::move(out), j);
}

}  // namespace

Result<std::shared_ptr<const HardwareProfile>> load_hardware_flag(const TrainBenchFlags& f) {
  if (f.hardware.empty()) return std::shared_ptr<const HardwareProfile>();
  auto hp = load_hardware_profile(f.hardware);
  if (!hp.ok()) return Status::invalid_argument("--hardware: " + hp.status().message());
  return std::make_shared<const HardwareProfile>(std::move(hp).value());
}

int finish_report(const TrainBenchFlags& f, std::string out, const nlohmann::json& j,
                  std::vector<std::pair<std::string, std::string>> files) {
  if (f.backend == "local") {
    appendf(out, "note: local backend: the ranks are threads sharing the process's cores; use --backend mpi for figures\n");
  }
  if (f.json == "-") {
    out += j.dump(2) + "\n";
  } else if (!f.json.empty()) {
    files.emplace_back(f.json, j.dump(2) + "\n");
  }
  if (Status w = write_files_atomic(files); !w.ok()) return fail(w);
  if (Status w = write_stdout(out); !w.ok()) return fail(w);
  return kExitOk;
}

SimFigures predict(const TrainBenchFlags& f, int64_t ranks, const Mode& mode, double sgemm_mean,
                   const ProfiledCostModel* table, const std::shared_ptr<const HardwareProfile>& hw_profile,
                   const std::vector<Batch>& batches) {
  sim::TrainingRun run;
  run.model = bench_spec(f);
  run.ranks = ranks;
  run.pp = f.pp;
  run.mode = mode.mode;
  run.overlap = mode.overlap;
  run.tolerance = f.tolerance;
  run.sgemm_flops = sgemm_mean;
  run.hardware_profile = hw_profile;
  run.attention_table = table;
  SimFigures out;
  auto p = sim::predict_training(run, batches);
  if (!p.ok()) {
    out.error = p.status().message();
    return out;
  }
  static_cast<sim::TrainingPrediction&>(out) = std::move(p).value();
  out.ok = true;
  return out;
}

nlohmann::json sim_json(const SimFigures& sim, double measured_s) {
  return {{"ok", sim.ok},
          {"error", sim.error},
          {"step_s", sim.step_s},
          {"over_measured", measured_s > 0 ? sim.step_s / measured_s : 0},
          {"stage_idle", sim.stage_idle},
          {"rank_idle", sim.rank_idle},
          {"rank_exposed", sim.rank_exposed},
          {"rank_busy_s", sim.rank_busy_s},
          {"mean_idle", mean_of(sim.rank_idle)},
          {"mean_exposed", mean_of(sim.rank_exposed)},
          {"rank_blocked", sim.rank_blocked},
          {"mean_blocked", mean_of(sim.rank_blocked)}};
}

std::vector<Batch> bench_batches(const TrainBenchFlags& f, int64_t ranks) {
  return f.pp > 1 ? pipeline_batches(f, ranks / f.pp) : std::vector<Batch>{dp_batch(f, ranks)};
}

void RankFigures::add(const train::TrainResult& result, int64_t warmup_steps) {
  idle.resize(std::max(idle.size(), result.rank_steps.size()));
  exposed.resize(idle.size());
  for (size_t r = 0; r < result.rank_steps.size(); ++r) {
    for (size_t s = static_cast<size_t>(warmup_steps); s < result.rank_steps[r].size() && s < result.steps.size(); ++s) {
      const double t = result.steps[s].seconds;  // rank 0's: the job's step (it ends in a barrier)
      const train::StepMetrics& m = result.rank_steps[r][s];
      idle[r].push_back(t > 0 ? 1.0 - m.busy_s() / t : 0.0);
      exposed[r].push_back(t > 0 ? m.comm_s / t : 0.0);
    }
  }
}
std::vector<double> RankFigures::median_idle() const {
  std::vector<double> out;
  for (const auto& v : idle) out.push_back(median(v));
  return out;
}
std::vector<double> RankFigures::median_exposed() const {
  std::vector<double> out;
  for (const auto& v : exposed) out.push_back(median(v));
  return out;
}

nlohmann::json bench_flags_json(const TrainBenchFlags& f) {
  return {{"width", f.width},         {"layers", f.layers},       {"head_dim", f.head_dim},
          {"vocab", f.vocab},         {"tokens_per_rank", f.tokens}, {"long_doc", long_doc(f)},
          {"short_doc", f.short_doc}, {"tolerance", f.tolerance},  {"pp", f.pp},
          {"micro_batches", f.micro_batches}, {"workload", f.workload}};
}

Result<TrainBenchFlags> bench_flags_from_json(const nlohmann::json& j) {
  TrainBenchFlags f;
  if (!j.is_object()) return Status::invalid_argument("bench_flags: not an object");
  auto integer = [&](const char* k, int64_t& v, int64_t lo, int64_t hi) -> Status {
    if (!j.contains(k) || !j[k].is_number_integer()) return Status::invalid_argument(std::string("bench_flags.") + k + ": missing or not an integer");
    v = j[k].get<int64_t>();
    if (v < lo || v > hi) return Status::invalid_argument(std::string("bench_flags.") + k + ": out of range");
    return {};
  };
  DISTCA_RETURN_IF_ERROR(integer("width", f.width, 16, int64_t{1} << 16));
  DISTCA_RETURN_IF_ERROR(integer("layers", f.layers, 1, 64));
  DISTCA_RETURN_IF_ERROR(integer("head_dim", f.head_dim, 2, int64_t{1} << 16));
  DISTCA_RETURN_IF_ERROR(integer("vocab", f.vocab, 2, int64_t{1} << 20));
  DISTCA_RETURN_IF_ERROR(integer("tokens_per_rank", f.tokens, 16, int64_t{1} << 24));
  DISTCA_RETURN_IF_ERROR(integer("long_doc", f.long_doc, 16, int64_t{1} << 24));
  DISTCA_RETURN_IF_ERROR(integer("short_doc", f.short_doc, 16, int64_t{1} << 24));
  DISTCA_RETURN_IF_ERROR(integer("pp", f.pp, 1, 64));
  DISTCA_RETURN_IF_ERROR(integer("micro_batches", f.micro_batches, 0, 4096));
  if (!j.contains("tolerance") || !j["tolerance"].is_number()) return Status::invalid_argument("bench_flags.tolerance: missing or not a number");
  f.tolerance = j["tolerance"].get<double>();
  if (!(f.tolerance >= 0 && f.tolerance <= 1)) return Status::invalid_argument("bench_flags.tolerance: out of range");
  if (!j.contains("workload") || !j["workload"].is_string()) return Status::invalid_argument("bench_flags.workload: missing or not a string");
  f.workload = j["workload"].get<std::string>();
  if (f.workload != "skewed" && f.workload != "uniform") return Status::invalid_argument("bench_flags.workload: not skewed or uniform");
  if (f.width % f.head_dim != 0 || f.tokens % f.long_doc != 0 || f.tokens % f.short_doc != 0) {
    return Status::invalid_argument("bench_flags: head_dim, long_doc or short_doc do not divide width or tokens_per_rank");
  }
  if (f.pp > 1 && f.micro_batches < f.pp) return Status::invalid_argument("bench_flags.micro_batches: fewer than pp");
  return f;
}

std::vector<Mode> pipeline_modes() {
  return {{"colocated 1F1B", "colocated", ""}, {"cad pingpong", "cad", "pingpong"},
          {"cad single-stream", "cad", "single-stream"}};
}

int run_pipeline(const TrainBenchFlags& f) {
  // The cost table is read before any work (a bad one refuses at once, on every rank).
  std::unique_ptr<ProfiledCostModel> table_model;
  const bool first = detect_launcher().rank <= 0;
  if (!f.cost_table.empty()) {
    auto t = load_cost_table_option(f.cost_table);
    if (!t.ok()) return first ? fail_input(t.status().message()) : kExitBadInput;
    table_model = std::move(t).value();
  }
  const ProfiledCostModel* table = table_model.get();
  auto hw = load_hardware_flag(f);
  if (!hw.ok()) return first ? fail_input(hw.status().message()) : kExitBadInput;
  const std::shared_ptr<const HardwareProfile> hw_profile = *hw;
  const kernels::ScopedBlasThreads one_blas_thread(1);
  PipeFigures fig;
  const bool mpi = f.backend == "mpi";
  comm::LaunchOptions lo{mpi ? comm::Backend::kMpi : comm::Backend::kLocal, f.ranks, {}};
  lo.mpi.timeout_s = f.mpi_timeout;
  std::optional<train::DataSource> data;
  auto prepare = [&](const comm::GroupInfo& g) -> Status {
    if (mpi && g.size < 2) return Status::invalid_argument("--backend mpi needs at least 2 ranks (mpirun -np 2 ...)");
    if (Status mem = check_bench_memory(f, g.size, g.rank == 0, pipeline_modes()); !mem.ok()) {
      return Status::invalid_argument(mem.message());
    }
    DISTCA_ASSIGN_OR_RETURN(data, train::DataSource::fixed(pipeline_batches(f, g.size / f.pp), std::min<int64_t>(32, f.vocab), 1));
    return Status::ok_status();
  };
  const comm::Launched launched = comm::launch(lo, bench_settings(f), prepare, [&](comm::Communicator& c, int) {
    return run_rank(c, f, *data, &fig);
  });
  if (!launched.status.ok()) return launch_failed(launched);
  if (!launched.speaks) return kExitOk;
  return report(f, launched.group.size, fig, table, hw_profile);
}

}  // namespace distca::cli::bench_train
