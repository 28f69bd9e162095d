// `distca bench train`: whole training steps of `distca train`'s model and trainer on a fixed
// skewed batch (rank 0 long documents, every other rank short ones; --workload uniform: every
// rank the long ones), timed in four modes on one communicator, round-robin: colocated, cad
// single-stream, cad pingpong and cad signal
// (docs/benchmarks.md, "Training step"). With --pp > 1 the pipeline benchmark instead
// (bench_train_pipeline.cpp).
//
//   mpirun -np 2 distca bench train --backend mpi --json -
//
// The runs and measurements are train::run_data_parallel_bench's (train/bench.h); this file
// checks the flags, launches, and prints. Under mpirun every rank runs the same steps and only
// rank 0 prints. On the local backend the ranks are threads sharing the process's cores and
// memory, so its figures are a smoke test.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
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
#include "distca/core/memory.h"
#include "distca/core/trace.h"
#include "distca/cost/step_flops.h"
#include "distca/kernels/blas.h"
#include "distca/plan/auto_tolerance.h"
#include "distca/train/config.h"
#include "distca/train/data.h"
#include "distca/train/trainer.h"

namespace distca::cli::bench_train {
namespace {

const std::vector<Mode> kModes = data_parallel_modes();
constexpr size_t kColocated = kDpColocated, kSingle = kDpSingle, kPingPong = kDpPingPong, kSignal = kDpSignal;
using ModeFigures = DpModeFigures;
using Figures = DpFigures;

double paired(const ModeFigures& a, const ModeFigures& b) { return paired_ratio(a.round_median, b.round_median); }

// The figures the report derives from the measurements, beside them.
struct Derived {
  ModelSpec spec;
  Batch batch;
  std::vector<TrainingFlops> flops;  // [rank] colocated
  double flops_sum = 0, rate_sum = 0, ideal = 0;
  double exposed = 0, exposed_paired = 0, speedup_pingpong = 0, slowdown = 0;
};

Derived derive(const TrainBenchFlags& f, int64_t ranks, const Figures& fig) {
  Derived d;
  d.spec = bench_spec(f);
  d.batch = dp_batch(f, ranks / f.tp);  // one rank's tokens per replica (a TP group)
  d.flops = rank_step_flops(d.spec, d.batch);
  double fmax = 0;
  for (const TrainingFlops& x : d.flops) fmax = std::max(fmax, x.total()), d.flops_sum += x.total();
  for (double x : fig.sgemm) d.rate_sum += x;
  d.ideal = fmax / (d.flops_sum / static_cast<double>(d.flops.size()));
  const auto& md = fig.modes;
  const double pp = median(md[kPingPong].steps), sig = median(md[kSignal].steps);
  d.exposed = pp > 0 ? (pp - sig) / pp : 0;
  d.exposed_paired = 1.0 - 1.0 / paired(md[kPingPong], md[kSignal]);
  d.speedup_pingpong = paired(md[kColocated], md[kPingPong]);
  d.slowdown = paired(md[kSingle], md[kPingPong]) - 1.0;
  return d;
}

nlohmann::json header_json(const TrainBenchFlags& f, int64_t ranks, const Figures& fig, const Derived& d) {
  const ModelSpec& spec = d.spec;
  nlohmann::json j;
  j["format"] = kBenchTrainFormat;
  j["bench_flags"] = bench_flags_json(f);
  j["backend"] = f.backend;
  j["ranks"] = ranks;
  j["omp_threads"] = 1;
  j["model"] = {{"hidden", spec.hidden},         {"layers", spec.n_layers}, {"n_heads", spec.n_heads},
                {"n_kv_heads", spec.n_kv_heads}, {"head_dim", spec.head_dim}, {"ffn", spec.ffn},
                {"vocab", spec.vocab}};
  j["tokens_per_rank"] = f.tokens;
  j["long_doc"] = long_doc(f);
  j["short_doc"] = f.short_doc;
  j["rounds"] = f.rounds;
  j["steps"] = f.steps;
  j["warmup_steps"] = f.warmup_steps;
  j["sgemm_flops"] = fig.sgemm;
  std::vector<double> linear, attention;
  for (const TrainingFlops& x : d.flops) linear.push_back(x.linear), attention.push_back(x.attention);
  j["flops_per_rank"] = {{"linear", linear}, {"attention", attention}};
  j["ideal_speedup"] = d.ideal;
  j["memory_source"] = fig.resident ? "vmhwm" : "buffer_estimate";
  j["modes"] = nlohmann::json::array();
  return j;
}

void print_header(std::string& out, const TrainBenchFlags& f, int64_t ranks, const Figures& fig, const Derived& d) {
  const ModelSpec& spec = d.spec;
  appendf(out, "distca bench train: %lld ranks (%s backend), 1 OpenMP thread per rank, OpenBLAS on 1 thread, %s\n",
          static_cast<long long>(ranks), f.backend.c_str(), heap_pages());
  appendf(out, "model: width %lld, %lld layers, %lld heads (%lld K/V) x %lld, ffn %lld, vocab %lld\n",
          static_cast<long long>(spec.hidden), static_cast<long long>(spec.n_layers), static_cast<long long>(spec.n_heads),
          static_cast<long long>(spec.n_kv_heads), static_cast<long long>(spec.head_dim), static_cast<long long>(spec.ffn),
          static_cast<long long>(spec.vocab));
  if (f.tp > 1) {
    appendf(out, "tensor parallel: %lld ranks per layer x %lld replica(s); the workload's \"rank\" is a replica\n",
            static_cast<long long>(f.tp), static_cast<long long>(ranks / f.tp));
  }
  if (f.workload == "uniform") {
    appendf(out, "workload: uniform, %lld tokens per rank; every rank %lld document(s) of %lld\n",
            static_cast<long long>(f.tokens), static_cast<long long>(f.tokens / long_doc(f)),
            static_cast<long long>(long_doc(f)));
  } else {
    appendf(out, "workload: skewed, %lld tokens per rank; rank 0 %lld document(s) of %lld, the others %lld of %lld\n",
            static_cast<long long>(f.tokens), static_cast<long long>(f.tokens / long_doc(f)),
            static_cast<long long>(long_doc(f)), static_cast<long long>(f.tokens / f.short_doc),
            static_cast<long long>(f.short_doc));
  }
  appendf(out, "FLOPs per step, colocated:");
  for (size_t r = 0; r < d.flops.size(); ++r) {
    appendf(out, " rank %zu %.1f G (linear %.1f, attention %.1f)%s", r, d.flops[r].total() / 1e9,
            d.flops[r].linear / 1e9, d.flops[r].attention / 1e9, r + 1 < d.flops.size() ? ";" : "\n");
  }
  appendf(out, "sgemm at the model's linear shapes (%lld rows, 1 thread; best round), GFLOP/s per rank:",
          static_cast<long long>(sgemm_rows(f)));
  for (double x : fig.sgemm) appendf(out, " %.1f", x / 1e9);
  appendf(out, "\n%d round(s) x %lld steps per mode, the first %lld of each run discarded; medians\n", f.rounds,
          static_cast<long long>(f.steps), static_cast<long long>(f.warmup_steps));
  appendf(out, "%-18s %9s %10s %6s %8s %8s %8s %8s %8s %8s %6s %6s %9s  %s\n", "mode", "step s", "tokens/s", "MFU", "linear",
          "attn", "comm", "wait", "optim", "other", "idle", "exp", "sent MiB", fig.resident ? "peak MiB per rank" : "buffers MiB per rank");
}

const char* local_note(const TrainBenchFlags& f) { return f.backend == "local" ? " (whole process: every rank thread)" : ""; }

// One mode's row of the table; its JSON.
nlohmann::json mode_row(std::string& out, const TrainBenchFlags& f, int64_t ranks, const Figures& fig, const Derived& d,
                        size_t mi) {
  const ModeFigures& m = fig.modes[mi];
  const double t = median(m.steps);
  const double tps = t > 0 ? static_cast<double>(ranks / f.tp * f.tokens) / t : 0;
  const double mfu = t > 0 && d.rate_sum > 0 ? d.flops_sum / t / d.rate_sum : 0;
  const std::vector<int64_t>& mem = fig.resident ? m.peak : m.buffers;
  std::string mems;
  for (size_t r = 0; r < mem.size(); ++r) {
    if (f.backend == "local" && fig.resident && r > 0) break;
    mems += (r ? " " : "") + mib(static_cast<double>(mem[r]), 0);
  }
  const std::vector<double> idle = m.per_rank.median_idle(), exposed = m.per_rank.median_exposed();
  appendf(out, "%-18s %9.3f %10.0f %5.1f%% %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %5.1f%% %5.1f%% %9.1f  %s%s%s\n",
          kModes[mi].name, t, tps, 100 * mfu, median(m.linear), median(m.attention), median(m.comm), median(m.wait),
          median(m.optimizer), median(m.other), 100 * mean_of(idle), 100 * mean_of(exposed), static_cast<double>(m.bytes_sent) / (1024.0 * 1024.0),
          mems.c_str(), fig.resident ? local_note(f) : "", m.outputs_valid ? "" : "  (signal: 1-byte exchanges, outputs invalid)");
  return {{"name", kModes[mi].name},
          {"mode", kModes[mi].mode},
          {"overlap", kModes[mi].overlap},
          {"median_s", t},
          {"steps_s", m.steps},
          {"round_median_s", m.round_median},
          {"tokens_per_s", tps},
          {"mfu", mfu},
          {"linear_s", median(m.linear)},
          {"attention_s", median(m.attention)},
          {"comm_s", median(m.comm)},
          {"wait_s", median(m.wait)},
          {"optimizer_s", median(m.optimizer)},
          {"other_s", median(m.other)},
          {"tp_comm_s", median(m.tp_comm)},
          {"imbalance_after", median(m.imbalance)},
          {"bytes_sent", m.bytes_sent},
          {"peak_bytes", fig.resident ? nlohmann::json(m.peak) : nlohmann::json(nullptr)},
          {"buffer_bytes", m.buffers},
          {"rank_idle", idle},
          {"rank_exposed", exposed},
          {"mean_idle", mean_of(idle)},
          {"mean_exposed", mean_of(exposed)},
          {"outputs_valid", m.outputs_valid}};
}

// The simulator on the measured profile, beside the measured medians (issue 17's check).
// --sim-trace: the pingpong prediction's trace, appended to `files`.
void sim_rows(std::string& out, nlohmann::json& j, const TrainBenchFlags& f, int64_t ranks, const Figures& fig,
              const Derived& d, const HardwareProfile& hw_profile, const std::shared_ptr<const HardwareProfile>& hw,
              std::vector<std::pair<std::string, std::string>>& files) {
  appendf(out, "sim (hardware profile %s, %lld ranks at once): step s, of measured, idle, exposed (means over ranks):",
          f.hardware.c_str(), static_cast<long long>(hw_profile.ranks));
  for (size_t mi = 0; mi < kModes.size(); ++mi) {
    const bool traced = mi == kDpPingPong && !f.sim_trace.empty();
    SimFigures sim = predict(f, ranks, kModes[mi], d.rate_sum / static_cast<double>(ranks), nullptr, hw, {d.batch}, traced);
    if (traced && sim.ok) files.emplace_back(f.sim_trace, std::move(sim.trace));
    const double t = median(fig.modes[mi].steps);
    if (sim.ok) {
      appendf(out, " %s %.3f s (%.2f), %.1f%%, %.1f%%%s", kModes[mi].name, sim.step_s, t > 0 ? sim.step_s / t : 0.0,
              100 * mean_of(sim.rank_idle), 100 * mean_of(sim.rank_exposed), mi + 1 < kModes.size() ? ";" : "\n");
    } else {
      appendf(out, " %s: %s%s", kModes[mi].name, sim.error.c_str(), mi + 1 < kModes.size() ? ";" : "\n");
    }
    j["modes"][mi]["sim"] = sim::to_json(sim, t);
  }
  j["simulator"] = {{"hardware", "hardware profile " + f.hardware}};
}

// Tensor parallelism: the time a rank waits in its collectives (the blocking ones whole, the
// layers' overlapped ones where their products did not hide them; train/timed_comm.h) is -
// as Megatron-LM counts un-overlapped TP communication - exposed communication: in comm and exp. signal mode shrinks the attention exchanges only, so
// (pingpong - signal) / pingpong leaves them out; the total is pingpong's exp.
void print_tp_summary(std::string& out, nlohmann::json& j, const Figures& fig) {
  const ModeFigures& pp = fig.modes[kPingPong];
  const double t = median(pp.steps);
  const double tp = t > 0 ? median(pp.tp_comm) / t : 0.0;
  const double total = mean_of(pp.per_rank.median_exposed());
  j["tp_comm_share"] = tp;
  j["exposed_total"] = total;
  appendf(out, "tensor parallel (cad pingpong): TP collectives %.1f%% of the step (rank 0; the waits the "
               "products did not hide, counted as exposed: in comm and exp); exposed communication in all %.1f%% (exp, mean over ranks: TP "
               "collectives, attention exchanges, all-reduces); plan load max/mean %.3f\n",
          100 * tp, 100 * total, median(pp.imbalance));
}

void print_summary(std::string& out, nlohmann::json& j, const TrainBenchFlags& f, const Figures& fig, const Derived& d) {
  nlohmann::json sp = nlohmann::json::object();
  for (size_t mi = 1; mi < kModes.size(); ++mi) sp[kModes[mi].overlap] = paired(fig.modes[kColocated], fig.modes[mi]);
  j["speedup_paired"] = sp;
  j["pingpong_over_ideal"] = d.speedup_pingpong / d.ideal;
  j["single_stream_slowdown"] = d.slowdown;
  j["exposed"] = d.exposed;
  j["exposed_paired"] = d.exposed_paired;
  appendf(out, "time split: rank 0's StepMetrics, medians (comm = exchanges waited for + all-reduces + TP collectives; wait = behind the "
               "slowest rank; other = the step's rest: planning, inputs); idle = 1 - (linear + attn) / step, exp = comm "
               "/ step, each rank's own, mean over ranks; sent = rank 0's attention bytes sent, last layer, forward + "
               "backward\n");
  appendf(out, "ideal speedup (FLOPs, perfect balance: max / mean over ranks): %.3f\n", d.ideal);
  appendf(out, "speedup over colocated (paired by round): single-stream %.3f, pingpong %.3f, signal %.3f\n",
          sp["single-stream"].get<double>(), sp["pingpong"].get<double>(), sp["signal"].get<double>());
  appendf(out, "pingpong / ideal speedup: %.3f\n", d.speedup_pingpong / d.ideal);
  appendf(out, "single-stream slower than pingpong: %+.1f%% (paired)\n", 100 * d.slowdown);
  appendf(out, "exposed: %.1f%% ((pingpong - signal) / pingpong, medians; paired %.1f%%)\n", 100 * d.exposed,
          100 * d.exposed_paired);
  if (f.tp > 1) print_tp_summary(out, j, fig);
  appendf(out, "MFU: model FLOPs per step / step time / (sum of the ranks' sgemm rates)\n");
  if (!fig.resident) {
    appendf(out, "peak memory: /proc/self/clear_refs is not writable here, so the column is the trainer's buffer "
                 "estimate (TrainResult::buffer_bytes), not resident memory\n");
  } else {
    appendf(out, "peak memory: VmHWM of each rank process%s, reset before every run\n", local_note(f));
  }
}

int report_data_parallel(const TrainBenchFlags& f, int64_t ranks, const Figures& fig, const std::shared_ptr<const HardwareProfile>& hw) {
  const Derived d = derive(f, ranks, fig);
  nlohmann::json j = header_json(f, ranks, fig, d);
  std::string out;
  print_header(out, f, ranks, fig, d);
  for (size_t mi = 0; mi < kModes.size(); ++mi) j["modes"].push_back(mode_row(out, f, ranks, fig, d, mi));
  std::vector<std::pair<std::string, std::string>> files;
  if (hw) sim_rows(out, j, f, ranks, fig, d, *hw, hw, files);
  print_summary(out, j, f, fig, d);
  if (!f.trace.empty()) {
    const TraceMetadata meta = rank_trace_metadata(
        "distca bench train", ranks, {{"mode", "cad pingpong"}, {"round", f.rounds}, {"step", f.steps - 1}, {"backend", f.backend}});
    files.emplace_back(f.trace, chrome_trace_json(fig.trace, meta));
  }
  return write_report(f, std::move(out), j, std::move(files));
}

// What the trainer's config checks would refuse of the model and the pipeline, said in bench
// train's flags (the trainer's messages name `--mode cad` and `[model_overrides]`, which bench
// train does not have).
Status check_pipeline_flags(const TrainBenchFlags& f, int64_t ranks) {
  const ModelSpec m = bench_spec(f);
  // The trainer's model ranges (train::model_ranges), each named by the flag that sets it.
  const std::pair<const char*, const char*> flag_of[] = {
      {"n_layers", "--layers"}, {"hidden", "--width"}, {"n_heads", "--width / --head-dim (query heads)"},
      {"n_kv_heads", "--width / --head-dim (K/V heads)"}, {"head_dim", "--head-dim"},
      {"ffn", "--width (ffn: about 8/3 of it)"}, {"vocab", "--vocab"}};
  for (const train::ModelRange& r : train::model_ranges()) {
    const int64_t v = m.*(r.field);
    if (v >= r.min && v <= r.max) continue;
    std::string flag = r.key;
    for (const auto& [key, name] : flag_of) {
      if (flag == key) flag = name;
    }
    return Status::invalid_argument(flag + " gives " + r.key + " " + std::to_string(v) + ", outside the trainer's " +
                                    std::to_string(r.min) + ".." + std::to_string(r.max));
  }
  const int64_t widest = std::max({m.hidden, m.q_dim(), m.kv_dim(), m.ffn, m.vocab});
  if (widest > INT32_MAX / f.tokens) {
    return Status::invalid_argument("--tokens-per-rank " + std::to_string(f.tokens) + " times the model's widest layer (" +
                                    std::to_string(widest) + ") exceeds the BLAS int range (2^31 - 1)");
  }
  if (f.pp == 1) return {};
  const std::string pp = "--pp " + std::to_string(f.pp);
  if (ranks % f.pp != 0) {
    return Status::invalid_argument(pp + " must divide the ranks (" + std::to_string(ranks) +
                                    (f.backend == "mpi" ? ": mpirun -np)" : ": --ranks)"));
  }
  if (f.micro_batches < f.pp) {
    return Status::invalid_argument("--micro-batches " + std::to_string(f.micro_batches) + " is fewer than " + pp +
                                    " (1F1B needs at least one micro-batch per stage)");
  }
  // Every pipeline run includes the cad modes, whose ticks run the same layers on every stage.
  if (f.layers % f.pp != 0) {
    return Status::invalid_argument(pp + " must divide --layers " + std::to_string(f.layers) +
                                    " (the cad modes run the same layers on every stage per tick)");
  }
  return {};
}

}  // namespace

int64_t run_ranks(const TrainBenchFlags& f) {
  return f.backend == "mpi" ? std::max<int64_t>(detect_launcher().size == 1 ? 1 : 2, detect_launcher().size) : f.ranks;
}

Result<std::shared_ptr<const HardwareProfile>> load_hardware_flag(const TrainBenchFlags& f) {
  if (f.hardware.empty()) return std::shared_ptr<const HardwareProfile>();
  auto hp = load_hardware_profile(f.hardware);
  if (!hp.ok()) return Status::invalid_argument("--hardware: " + hp.status().message());
  if (f.tolerance_auto || f.kv_once == "auto") {  // the profile must hold what the timeline reads (link figures)
    std::unique_ptr<AttentionCostModel> table;
    DISTCA_RETURN_IF_ERROR(auto_tolerance_model(*hp, {}, true, &table).status());
  }
  return std::make_shared<const HardwareProfile>(std::move(hp).value());
}

// Flag checks that need no group: every one refuses before any work.
Status check_flags(const TrainBenchFlags& f, bool ranks_given) {
  auto multiple16 = [](const char* flag, int64_t v) -> Status {
    if (v <= 0 || v % 16 != 0) {
      return Status::invalid_argument(std::string(flag) + " must be a positive multiple of 16 (got " + std::to_string(v) + ")");
    }
    return {};
  };
  DISTCA_RETURN_IF_ERROR(multiple16("--width", f.width));
  DISTCA_RETURN_IF_ERROR(multiple16("--tokens-per-rank", f.tokens));
  if (!f.compare) {  // --compare draws its documents
    DISTCA_RETURN_IF_ERROR(multiple16("--short-doc", f.short_doc));
    if (f.long_doc != 0) DISTCA_RETURN_IF_ERROR(multiple16("--long-doc", f.long_doc));
    if (f.tokens % long_doc(f) != 0) return Status::invalid_argument("--long-doc must divide --tokens-per-rank");
    if (f.tokens % f.short_doc != 0) return Status::invalid_argument("--short-doc must divide --tokens-per-rank");
  }
  if (f.head_dim <= 0 || f.head_dim % 2 != 0 || f.width % f.head_dim != 0) {
    return Status::invalid_argument("--head-dim must be even and divide --width (got " + std::to_string(f.head_dim) + ")");
  }
  if (f.steps <= f.warmup_steps) {
    return Status::invalid_argument("--steps (" + std::to_string(f.steps) + ") must exceed --warmup-steps (" +
                                    std::to_string(f.warmup_steps) + ")");
  }
  if (f.backend == "mpi" && ranks_given) return Status::invalid_argument("--ranks applies to --backend local (mpi: mpirun -np)");
  if (f.backend == "local" && detect_launcher().size > 1) {
    return Status::invalid_argument("--backend local under mpirun would run one independent benchmark per process; add --backend mpi");
  }
  DISTCA_RETURN_IF_ERROR(check_outputs({{"--json", f.json, true}, {"--trace", f.trace}, {"--sim-trace", f.sim_trace}}));
  // The trainer's own checks (model, workload) for every mode.
  const int64_t ranks = run_ranks(f);
  if (f.pp > 1 && !f.trace.empty()) return Status::invalid_argument("--trace is not recorded with --pp (yet)");
  if (f.pp == 1 && !f.cost_table.empty()) return Status::invalid_argument("--cost-table applies to --pp > 1 (the simulator's prediction)");
  if (f.pp == 1 && f.micro_batches > 1) return Status::invalid_argument("--micro-batches applies to --pp > 1");
  if (f.tp > 1 && (f.pp > 1 || f.compare)) return Status::invalid_argument("--tp applies to --pp 1 without --compare (not yet)");
  if (ranks % f.tp != 0) {
    return Status::invalid_argument("--tp " + std::to_string(f.tp) + " must divide the ranks (" + std::to_string(ranks) +
                                    (f.backend == "mpi" ? ": mpirun -np)" : ": --ranks)"));
  }
  if (!f.cost_table.empty() && !std::ifstream(f.cost_table)) {
    return Status::invalid_argument("--cost-table " + f.cost_table + ": cannot be read");
  }
  DISTCA_RETURN_IF_ERROR(check_pipeline_flags(f, ranks));
  if (f.compare) return {};  // its mode entries are checked with its options (CompareOptions::validate)
  // The trainer's own checks (train/config.h) for every mode. The checks above answer every
  // case they know in bench train's own flags; one that still reaches the trainer says so, since
  // its message names `distca train`'s flags and keys.
  for (const Mode& m : bench_modes(f)) {
    if (Status st = make_config(f, ranks, m).validate(); !st.ok()) {
      return Status::invalid_argument("the flags make a training run that distca train refuses (mode " +
                                      std::string(m.name) + "): " + st.message());
    }
  }
  return {};
}

namespace {

int run(const TrainBenchFlags& f, bool ranks_given) {
  if (f.compare) return run_compare_bench(f, ranks_given);
  const bool first = detect_launcher().rank <= 0;  // before the group exists only rank 0 speaks
  if (Status st = check_flags(f, ranks_given); !st.ok()) return first ? fail_input(st.message()) : kExitBadInput;
  if (f.pp > 1) return run_pipeline(f);
  auto loaded = load_hardware_flag(f);
  if (!loaded.ok()) return first ? fail_input(loaded.status().message()) : kExitBadInput;
  const std::shared_ptr<const HardwareProfile> hw = *loaded;
  const kernels::ScopedBlasThreads one_blas_thread(1);
  Figures fig;
  // With --trace on mpi the communicator records its exchanges' transfers too (declared before
  // the launch, whose communicator records into it until it is gone).
  TraceRecorder recorder;
  const bool mpi = f.backend == "mpi";
  comm::LaunchOptions lo{mpi ? comm::Backend::kMpi : comm::Backend::kLocal, f.ranks, {}};
  lo.mpi.timeout_s = f.mpi_timeout;
  if (mpi && !f.trace.empty()) lo.mpi.trace = &recorder;
  std::optional<train::DataSource> data;
  // Every process checks its own memory; the lowest rank that refused speaks, and all stop.
  auto prepare = [&](const comm::GroupInfo& g) -> Status {
    // One rank only under a launcher that says so (mpirun -np 1: the validation's 1-rank run).
    if (mpi && g.size < 2 && detect_launcher().size != 1) {
      return Status::invalid_argument("--backend mpi needs at least 2 ranks (mpirun -np 2 ...)");
    }
    if (Status mem = check_bench_memory(f, g.size, g.rank == 0, bench_modes(f), env_int("OMPI_COMM_WORLD_LOCAL_SIZE")); !mem.ok()) {
      return Status::invalid_argument(mem.message());
    }
    DISTCA_ASSIGN_OR_RETURN(data, train::DataSource::fixed(dp_batch(f, g.size / f.tp), std::min<int64_t>(32, f.vocab), 1));
    return Status::ok_status();
  };
  const comm::Launched launched = comm::launch(lo, bench_settings(f), prepare, [&](comm::Communicator& c, int slot) {
    return run_data_parallel_bench(c, f, *data, slot == 0, mpi && !f.trace.empty() ? &recorder : nullptr, &fig);
  });
  if (!launched.status.ok()) return launch_failed(launched);
  if (!launched.speaks) return kExitOk;
  return report_data_parallel(f, launched.group.size, fig, hw);
}

// The first refusal among flags that are valid alone but not together (before --compare's
// defaults apply), or nullopt.
std::optional<std::string> combination_error(const TrainBenchFlags& g, bool drawn, bool seed_given) {
  if (g.tolerance_auto && g.hardware.empty()) {
    return "--tolerance auto needs --hardware FILE (the link and attention figures)";
  }
  if (g.tolerance_auto && (g.pp > 1 || g.compare)) return "--tolerance auto applies to --pp 1 without --compare";
  if (g.kv_once == "auto" && (g.hardware.empty() || g.pp > 1 || g.compare)) {
    return "--kv-once auto needs --hardware FILE and applies to --pp 1 without --compare";
  }
  if (g.ranks_per_host != 0 && g.compare) return "--ranks-per-host applies to bench train without --compare";
  if (!g.sim_trace.empty() && (g.hardware.empty() || g.pp > 1 || g.compare)) {
    return "--sim-trace needs --hardware FILE and applies to --pp 1 without --compare";
  }
  if (!g.compare && (drawn || seed_given)) {
    return std::string(drawn ? "--workload " + g.workload : "--seed") + " applies to --compare";
  }
  return std::nullopt;
}

Runner setup(CLI::App& app) {
  auto f = std::make_shared<TrainBenchFlags>();
  app.add_option("--backend", f->backend, "local (rank threads) or mpi (under mpirun)")
      ->check(CLI::IsMember({"local", "mpi"}));
  CLI::Option* ranks = app.add_option("--ranks", f->ranks, "ranks of the local backend (default 2)")->check(CLI::Range(2, 64));
  app.add_option("--width", f->width, "model width (hidden size; multiple of 16, default 512)")
      ->check(CLI::Range(int64_t{16}, int64_t{65536}));
  app.add_option("--layers", f->layers, "transformer layers (default 2)")->check(CLI::Range(int64_t{1}, int64_t{64}));
  app.add_option("--head-dim", f->head_dim, "head dimension: width / it query heads, half as many K/V heads (default 64)")
      ->check(CLI::Range(int64_t{2}, int64_t{1024}));
  app.add_option("--vocab", f->vocab, "vocabulary (default 512)")->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  CLI::Option* tokens_opt = app.add_option(
      "--tokens-per-rank", f->tokens,
      "tokens per rank per step (multiple of 16; default 8192, with --pp > 1 4096 per micro-batch: the defaults fit "
      "4 ranks of a 24 GiB machine, about 11 GiB at -np 4; larger runs are refused by the memory estimate)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--long-doc", f->long_doc, "length of rank 0's documents (default: one of --tokens-per-rank)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_option("--short-doc", f->short_doc, "length of the other ranks' documents (default 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--rounds", f->rounds, "rounds; each runs every mode once (default 3)")->check(CLI::Range(1, 1000));
  app.add_option("--steps", f->steps, "steps per run (default 3)")->check(CLI::Range(int64_t{1}, int64_t{100000}));
  app.add_option("--warmup-steps", f->warmup_steps, "first steps of every run not timed (default 1)")
      ->check(CLI::Range(int64_t{0}, int64_t{100000}));
  auto tolerance = std::make_shared<std::string>("0.05");
  app.add_option("--tolerance", *tolerance,
                 "cad scheduler's balance tolerance in [0, 1] (default 0.05) | auto (chosen per batch from --hardware)");
  add_mpi_timeout(app, f->mpi_timeout, "mpi");
  app.add_option("--json", f->json, "write the figures as JSON to FILE (- for stdout)");
  app.add_option("--trace", f->trace, "write a Chrome trace (Perfetto) of the last round's cad pingpong, last step");
  app.add_option("--sim-trace", f->sim_trace,
                 "write the simulator's Chrome trace (Perfetto) of its cad pingpong prediction (needs --hardware; "
                 "beside --trace's measured step)");
  app.add_option("--pp", f->pp, "pipeline stages (ranks = replicas x stages): colocated 1F1B against cad's "
                               "1F1B ticks with pooled attention, micro-batches of skewed attention (default 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  app.add_option("--tp", f->tp, "tensor-parallel ranks per layer (--pp 1; ranks = tp x replicas, each replica "
                               "one rank's tokens; default 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  app.add_option("--micro-batches", f->micro_batches, "--pp: micro-batches per replica and step (default 2 x --pp)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--cost-table", f->cost_table, "--pp: the simulator's attention seconds from a `distca profile` table");
  app.add_option("--workload", f->workload,
                 "skewed (rank 0, with --pp micro-batches 0, 4, ...: --long-doc documents, the rest --short-doc) or "
                 "uniform (every rank and micro-batch --long-doc documents; default skewed); with --compare pretrain "
                 "or prolong (drawn documents up to a rank's tokens; default pretrain)")
      ->check(CLI::IsMember({"skewed", "uniform", "pretrain", "prolong"}));
  app.add_flag("--compare", f->compare,
               "every mode on one configuration, paired round by round on the same drawn steps: colocated, cad "
               "single-stream, cad pingpong (step time, idle, exposed communication, bytes, peak memory per rank)");
  app.add_option("--seed", f->seed, "--compare: the seed of the drawn documents (default 1)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 62));
  app.add_option("--kv-once", f->kv_once,
                 "cad modes: on (default): K/V once per server across the nano-batch pair | off | auto (per batch "
                 "from the ping-pong timeline of --hardware's link); the same bits")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  app.add_option("--tp-overlap", f->tp_overlap,
                 "with --tp: on (default): the TP collectives overlapped with the layers' products | off: blocking "
                 "between them; the same bits")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--ranks-per-host", f->ranks_per_host,
                 "cad modes: ranks [h*N, (h+1)*N) share host h (topology-aware placement, K/V relays; --pp 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--hardware", f->hardware,
                 "the simulator's hardware profile of this machine (`distca profile --hardware-out`: GEMM rates, "
                 "attention, links): its prediction beside every mode's measured step");
  CLI::Option* layers_opt = app.get_option("--layers");
  CLI::Option* workload_opt = app.get_option("--workload");
  CLI::Option* long_opt = app.get_option("--long-doc");
  CLI::Option* short_opt = app.get_option("--short-doc");
  CLI::Option* seed_opt = app.get_option("--seed");
  return [f, tolerance, ranks, layers_opt, tokens_opt, workload_opt, long_opt, short_opt, seed_opt] {
    TrainBenchFlags g = *f;
    const bool drawn = g.workload == "pretrain" || g.workload == "prolong";
    const bool first = detect_launcher().rank <= 0;  // before the group exists only rank 0 speaks
    const auto tol = parse_tolerance(*tolerance);
    if (!tol.ok()) return first ? fail_input(tol.status().message()) : kExitBadInput;
    g.tolerance_auto = !tol->has_value();
    g.tolerance = tol->value_or(g.tolerance);
    if (const auto e = combination_error(g, drawn, seed_opt->count() > 0)) return first ? fail_input(*e) : kExitBadInput;
    if (g.compare) {
      if (workload_opt->count() > 0 && !drawn) {
        return first ? fail_input("--compare draws its documents: --workload pretrain or prolong (got " + g.workload + ")")
                     : kExitBadInput;
      }
      if (workload_opt->count() == 0) g.workload = "pretrain";
      g.doc_flags_given = long_opt->count() > 0 || short_opt->count() > 0;
      // 16K tokens per rank (8K per micro-batch with --pp): attention a real share of the step.
      if (tokens_opt->count() == 0) g.tokens = 16384;
    }
    if (g.pp > 1 && g.micro_batches == 0) g.micro_batches = 2 * g.pp;
    // 2 x --pp micro-batches of 8192 tokens would need 17-21 GiB at 4 ranks (--pp 2, 4).
    if (g.pp > 1 && tokens_opt->count() == 0) g.tokens = g.compare ? 8192 : 4096;
    if (g.pp > 1 && layers_opt->count() == 0) g.layers = (g.layers + g.pp - 1) / g.pp * g.pp;
    return run(g, ranks->count() > 0);
  };
}

}  // namespace

DISTCA_REGISTER_COMMAND(bench_train, {"train", "bench",
                                      "Training step: colocated vs cad single-stream, pingpong and signal", 63,
                                      &setup});

}  // namespace distca::cli::bench_train
