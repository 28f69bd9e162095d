// `distca bench train --pp P`: the pipeline benchmark (train::run_pipeline_bench, train/bench.h)
// launched, and its report: each stage's idle fraction, the FLOP-ideal and the simulator's
// prediction for the same configuration (docs/benchmarks.md, "Pipelines (bench train --pp)").
// Also the pieces both halves of bench train share (bench_train.h): predict and the report's
// writing.
//
// Idle of a rank in a step: 1 - (linear + attention) / the step's time; linear holds the layer
// phases, the embedding and the optimizer, attention the kernels and row packing (served rows
// included), so idle is the bubble, waiting for neighbours and exchanges, and the barrier
// behind the slowest rank.
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

namespace {

// What the pipeline report is about: the configuration and its FLOP-ideal step.
struct PipeContext {
  const TrainBenchFlags& f;
  int64_t ranks, dp;
  ModelSpec spec;
  std::vector<Batch> batches;
  TrainingFlops flops;
  double sgemm_mean = 0, flop_ideal = 0;
  const ProfiledCostModel* table;
  const std::shared_ptr<const HardwareProfile>& hw_profile;
  std::string sim_attention;  // what the simulator's attention seconds come from
};

PipeContext pipe_context(const TrainBenchFlags& f, int64_t ranks, const PipeFigures& fig,
                         const ProfiledCostModel* table, const std::shared_ptr<const HardwareProfile>& hw_profile) {
  PipeContext c{f, ranks, ranks / f.pp, bench_spec(f), pipeline_batches(f, ranks / f.pp), {}, 0, 0, table, hw_profile, ""};
  c.flops = total_step_flops(c.spec, c.batches);
  c.sgemm_mean = mean_of(fig.sgemm);
  c.flop_ideal = c.flops.total() / static_cast<double>(ranks) / c.sgemm_mean;
  c.sim_attention = table != nullptr ? "cost table " + f.cost_table
                    : hw_profile     ? "hardware profile " + f.hardware
                                     : std::string("analytic, efficiency 0.5");
  return c;
}

nlohmann::json pipe_header_json(const PipeContext& c, const PipeFigures& fig) {
  const TrainBenchFlags& f = c.f;
  nlohmann::json j;
  j["format"] = kBenchTrainFormat;
  j["bench_flags"] = bench_flags_json(f);
  j["backend"] = f.backend;
  j["ranks"] = c.ranks;
  j["pp"] = f.pp;
  j["dp"] = c.dp;
  j["micro_batches"] = f.micro_batches;
  j["omp_threads"] = 1;
  j["model"] = to_json(c.spec);
  j["workload"] = {{"kind", f.workload}, {"tokens_per_rank", f.tokens}, {"long_doc", long_doc(f)},
                   {"short_doc", f.short_doc}, {"long_every", f.workload == "uniform" ? 1 : 4}};
  j["sgemm_flops"] = fig.sgemm;
  j["flops_per_step"] = {{"linear", c.flops.linear}, {"attention", c.flops.attention}};
  j["flop_ideal_s"] = c.flop_ideal;
  j["simulator"] = {{"hardware", c.hw_profile ? "hardware profile " + f.hardware : std::string("local-cpu links, peak = mean sgemm, mfu 1")},
                    {"attention", c.sim_attention}};
  j["modes"] = nlohmann::json::array();
  return j;
}

void print_pipe_header(std::string& out, const PipeContext& c, const PipeFigures& fig) {
  const TrainBenchFlags& f = c.f;
  const ModelSpec& spec = c.spec;
  appendf(out, "distca bench train --pp %lld: %lld ranks = %lld replica(s) x %lld stages (%s backend), %lld "
               "micro-batches per replica and step, 1 OpenMP thread per rank, OpenBLAS on 1 thread, %s\n",
          static_cast<long long>(f.pp), static_cast<long long>(c.ranks), static_cast<long long>(c.dp),
          static_cast<long long>(f.pp), f.backend.c_str(), static_cast<long long>(f.micro_batches), heap_pages());
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
  appendf(out, "FLOPs per step: %.2f G (linear %.2f, attention %.2f); sgemm GFLOP/s per rank:", c.flops.total() / 1e9,
          c.flops.linear / 1e9, c.flops.attention / 1e9);
  for (double x : fig.sgemm) appendf(out, " %.1f", x / 1e9);
  appendf(out, "\n%d round(s) x %lld steps per mode, the first %lld of each run discarded; medians\n", f.rounds,
          static_cast<long long>(f.steps), static_cast<long long>(f.warmup_steps));
  std::string stages;
  for (int64_t s = 0; s < f.pp; ++s) stages += " s" + std::to_string(s);
  appendf(out, "%-18s %8s %9s  idle per stage:%s  %6s %6s %8s %9s %8s %6s  %s\n", "mode", "step s", "tokens/s",
          stages.c_str(), "mean", "exp", "ideal/t", "sim s", "sim/meas", "sim exp", "sim idle per stage");
}

// " 12%" per fraction.
std::string percents(const std::vector<double>& v) {
  std::string s;
  for (double x : v) {
    char b[16];
    std::snprintf(b, sizeof(b), " %3.0f%%", 100 * x);
    s += b;
  }
  return s;
}

// One mode's row of the table (with the simulator's prediction); its JSON.
nlohmann::json pipe_mode_row(std::string& out, const PipeContext& c, const Mode& mode, const PipeModeFigures& m) {
  const double t = median(m.steps);
  const double tps = t > 0 ? static_cast<double>(m.tokens) / t : 0;
  std::vector<double> idle;
  for (const auto& v : m.stage_idle) idle.push_back(median(v));
  const double mean_idle = mean_of(idle);
  const SimFigures sim = predict(c.f, c.ranks, mode, c.sgemm_mean, c.table, c.hw_profile, c.batches);
  const std::vector<double> rank_idle = m.per_rank.median_idle(), rank_exposed = m.per_rank.median_exposed();
  appendf(out, "%-18s %8.3f %9.0f  %*s%s  %5.1f%% %5.1f%% %8.3f %9.3f %8.2f %5.1f%% %s\n", mode.name, t, tps,
          static_cast<int>(std::string("idle per stage:").size()), "", percents(idle).c_str(), 100 * mean_idle,
          100 * mean_of(rank_exposed), t > 0 ? c.flop_ideal / t : 0, sim.step_s, t > 0 ? sim.step_s / t : 0,
          100 * mean_of(sim.rank_exposed), sim.ok ? percents(sim.stage_idle).c_str() : ("(simulator: " + sim.error + ")").c_str());
  return {{"name", mode.name},
          {"mode", mode.mode},
          {"overlap", mode.overlap},
          {"median_s", t},
          {"steps_s", m.steps},
          {"round_median_s", m.round_median},
          {"tokens_per_s", tps},
          {"stage_idle", idle},
          {"mean_idle", mean_idle},
          {"busy_ideal_s", median(m.busy_mean)},
          {"flop_ideal_over_step", t > 0 ? c.flop_ideal / t : 0},
          {"rank_idle", rank_idle},
          {"rank_exposed", rank_exposed},
          {"mean_exposed", mean_of(rank_exposed)},
          {"sim", sim::to_json(sim, t)}};
}

void print_pipe_summary(std::string& out, nlohmann::json& j, const PipeContext& c, const PipeFigures& fig,
                        const std::vector<Mode>& modes) {
  // Paired by round: colocated's round median over each cad mode's.
  nlohmann::json sp = nlohmann::json::object();
  for (size_t mi = 1; mi < modes.size(); ++mi) {
    sp[modes[mi].overlap] = paired_ratio(fig.modes[0].round_median, fig.modes[mi].round_median);
  }
  const double idle0 = j["modes"][0]["mean_idle"].get<double>(), idle1 = j["modes"][1]["mean_idle"].get<double>();
  const double idle_ratio = idle0 > 0 ? idle1 / idle0 : 0;
  j["speedup_paired"] = sp;
  j["cad_idle_over_colocated"] = idle_ratio;
  appendf(out, "idle: 1 - (linear + attention) / step time per rank, mean over a stage's replicas (bubble, waiting "
               "for neighbours and exchanges, the barrier behind the slowest rank); mean: over the stages; exp: "
               "StepMetrics::comm_s / step (sends, receives and exchanges blocked on, all-reduces), mean over ranks; "
               "the simulator's idle is the same 1 - busy / step, its exp UnitStats::exposed_comm / step\n");
  appendf(out, "ideal/t: FLOP-ideal (every rank the same share of the step's FLOPs at the mean sgemm rate, no bubble: "
               "%.3f s) over the step time\n", c.flop_ideal);
  appendf(out, "cad pingpong's idle over colocated's: %.2f (the issue expects at most 0.5)\n", idle_ratio);
  appendf(out, "speedup over colocated 1F1B (paired by round): pingpong %.3f, single-stream %.3f\n",
          sp["pingpong"].get<double>(), sp["single-stream"].get<double>());
  const auto preset = hardware_preset("local-cpu");
  if (c.hw_profile) {
    appendf(out, "sim: distca's simulator on this configuration: one unit per rank, the hardware profile %s (GEMM rates "
                 "measured with %lld ranks at once, links %s), attention %s; fp32, no checkpointing, stateless cad servers\n",
            c.f.hardware.c_str(), static_cast<long long>(c.hw_profile->ranks), c.hw_profile->all_to_all ? "measured" : "local-cpu preset",
            c.sim_attention.c_str());
  } else {
    appendf(out, "sim: distca's simulator on this configuration: one unit per rank, local-cpu links (%.2f GB/s, %.0f us), "
                 "peak = mean sgemm rate, mfu 1, attention %s; fp32, no checkpointing, stateless cad servers\n",
            preset.ok() ? preset->inter_node_bw / 1e9 : 0.0, preset.ok() ? preset->inter_node_latency * 1e6 : 0.0,
            c.table != nullptr ? ("from " + c.f.cost_table).c_str() : "analytic at efficiency 0.5 (no --cost-table)");
  }
}

int report_pipeline(const TrainBenchFlags& f, int64_t ranks, const PipeFigures& fig, const ProfiledCostModel* table,
                    const std::shared_ptr<const HardwareProfile>& hw_profile) {
  const std::vector<Mode> modes = pipeline_modes();
  const PipeContext c = pipe_context(f, ranks, fig, table, hw_profile);
  nlohmann::json j = pipe_header_json(c, fig);
  std::string out;
  print_pipe_header(out, c, fig);
  for (size_t mi = 0; mi < modes.size(); ++mi) j["modes"].push_back(pipe_mode_row(out, c, modes[mi], fig.modes[mi]));
  print_pipe_summary(out, j, c, fig, modes);
  return write_report(f, std::move(out), j, {});
}

}  // namespace

int write_report(const TrainBenchFlags& f, std::string out, const nlohmann::json& j,
                 std::vector<std::pair<std::string, std::string>> files) {
  if (f.backend == "local") {
    appendf(out, "note: local backend: the ranks are threads sharing the process's cores; use --backend mpi for figures\n");
  }
  if (f.json == "-") {
    out += j.dump(2) + "\n";
  } else if (!f.json.empty()) {
    files.insert(files.begin(), {f.json, j.dump(2) + "\n"});
  }
  if (Status w = write_files_atomic(files); !w.ok()) return fail(w);
  if (Status w = write_stdout(out); !w.ok()) return fail(w);
  return kExitOk;
}

SimFigures predict(const TrainBenchFlags& f, int64_t ranks, const Mode& mode, double sgemm_mean,
                   const ProfiledCostModel* table, const std::shared_ptr<const HardwareProfile>& hw_profile,
                   const std::vector<Batch>& batches, bool record_events) {
  sim::TrainingRun run;
  run.model = bench_spec(f);
  run.ranks = ranks;
  run.pp = f.pp;
  run.tp = f.tp;
  run.mode = mode.mode;
  run.overlap = mode.overlap;
  run.tolerance = f.tolerance;
  run.tolerance_auto = f.tolerance_auto;
  run.ranks_per_host = f.ranks_per_host;
  run.sgemm_flops = sgemm_mean;
  run.hardware_profile = hw_profile;
  run.attention_table = table;
  run.record_events = record_events;
  return sim::predict_outcome(run, batches);
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
  auto hw_profile = load_hardware_flag(f);
  if (!hw_profile.ok()) return first ? fail_input(hw_profile.status().message()) : kExitBadInput;
  const kernels::ScopedBlasThreads one_blas_thread(1);
  PipeFigures fig;
  const bool mpi = f.backend == "mpi";
  comm::LaunchOptions lo{mpi ? comm::Backend::kMpi : comm::Backend::kLocal, f.ranks, {}};
  lo.mpi.timeout_s = f.mpi_timeout;
  std::optional<train::DataSource> data;
  auto prepare = [&](const comm::GroupInfo& g) -> Status {
    if (mpi && g.size < 2) return Status::invalid_argument("--backend mpi needs at least 2 ranks (mpirun -np 2 ...)");
    if (Status mem = check_bench_memory(f, g.size, g.rank == 0, pipeline_modes(), env_int("OMPI_COMM_WORLD_LOCAL_SIZE")); !mem.ok()) {
      return Status::invalid_argument(mem.message());
    }
    DISTCA_ASSIGN_OR_RETURN(data, train::DataSource::fixed(pipeline_batches(f, g.size / f.pp), std::min<int64_t>(32, f.vocab), 1));
    return Status::ok_status();
  };
  const comm::Launched launched = comm::launch(lo, bench_settings(f), prepare, [&](comm::Communicator& c, int) {
    return run_pipeline_bench(c, f, *data, &fig);
  });
  if (!launched.status.ok()) return launch_failed(launched);
  if (!launched.speaks) return kExitOk;
  return report_pipeline(f, launched.group.size, fig, table, *hw_profile);
}

}  // namespace distca::cli::bench_train
