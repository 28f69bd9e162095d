// `distca train`: data-parallel training of a Llama-style model with core attention through
// the CA dispatcher (docs/training.md). Flags override --config FILE, which overrides the
// embedded default (configs/default.toml).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "launcher.h"
#include "distca/comm/launch.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/trace.h"
#include "distca/kernels/blas.h"
#include "distca/model/llama.h"
#include "distca/cost/hardware_profile.h"
#include "distca/plan/auto_tolerance.h"
#include "distca/train/checkpoint.h"
#include "distca/train/config.h"
#include "distca/train/data.h"
#include "distca/train/memory.h"
#include "distca/train/session.h"
#include "distca/train/settings.h"
#include "distca/train/trainer.h"

namespace distca::cli::cmd_train {
namespace {

using train::TrainConfig;

struct Options {
  std::string config_file;
  std::string resume;
  double mpi_timeout = 300;  // seconds; --backend mpi
  TrainConfig flags;  // values of the flags given (the others are ignored)
  std::string mode, overlap;  // --mode, --overlap as given (parsed by their setters)
  std::string tolerance;      // --tolerance as given: a number or auto
  double wlb_cap = 0;          // --wlb-cap as given
  int64_t cp_threshold = 0;    // --cp-threshold as given
  // (option, copy the flag's value into the config; a value that does not parse is an error)
  // for every config flag.
  std::vector<std::pair<CLI::Option*, std::function<Status(TrainConfig&)>>> setters;
};

int64_t max_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux: KiB
}

std::string mib_label(int64_t bytes) { return mib(static_cast<double>(bytes), 1) + " MiB"; }

std::string eta(double s) {
  char b[32];
  const auto t = static_cast<long long>(s + 0.5);
  if (t >= 3600) std::snprintf(b, sizeof(b), "%lldh%02lldm", t / 3600, (t / 60) % 60);
  else std::snprintf(b, sizeof(b), "%lldm%02llds", t / 60, t % 60);
  return b;
}

// The config from --config and the flags given, checked against the launcher's environment
// before any work: kExitOk when it may run, else the exit code (only the launcher's rank 0, or
// a process without one, speaks).
int make_config(const Options& o, const Launcher& launcher, TrainConfig& cfg, bool& ranks_given) {
  const auto early_fail = [&](const std::string& msg) { return launcher.rank <= 0 ? fail_input(msg) : kExitBadInput; };
  if (!o.config_file.empty()) {
    Status st = train::apply_toml_file(o.config_file, cfg);
    if (!st.ok()) return launcher.rank <= 0 ? fail(st) : exit_code(st);
  }
  ranks_given = false;
  for (const auto& [opt, set] : o.setters) {
    if (opt->count() > 0) {
      if (Status st = set(cfg); !st.ok()) return early_fail(st.message());
      if (opt->get_name() == "--ranks") ranks_given = true;
    }
  }
  const bool backend_mpi = cfg.backend == "mpi";
  if (cfg.backend == "local" && launcher.present && (launcher.size > 1 || launcher.rank > 0)) {
    const std::string n = launcher.size > 0 ? std::to_string(launcher.size) : "several";
    return early_fail("--backend local under mpirun would run " + n +
                      " independent jobs (one per process); add --backend mpi, or run without mpirun");
  }
  if (backend_mpi && !launcher.present && cfg.ranks != 1) {
    return fail_input("--backend mpi: config says " + std::to_string(cfg.ranks) +
                      " ranks but the MPI world has 1 (not started by mpirun); run under mpirun -np " +
                      std::to_string(cfg.ranks));
  }
  if (backend_mpi && ranks_given && launcher.size > 0 && cfg.ranks != launcher.size) {
    return early_fail("--ranks " + std::to_string(cfg.ranks) + " does not match mpirun -np " +
                      std::to_string(launcher.size));
  }
  return kExitOk;
}

// What the run's hooks collect on the lead rank while it trains.
struct Progress {
  bool show = false;  // a progress line on stderr (lead, stderr a terminal)
  double first_report = NAN;
  int64_t done = 0, start_step = 0;
  double elapsed = 0;
  std::string jsonl;
  Status metrics_status;
};

// After every step: --metrics rewritten with the new line, the progress line.
void on_step(const TrainConfig& cfg, Progress& p, const train::StepMetrics& m) {
  if (std::isnan(p.first_report)) p.first_report = m.report_loss;
  ++p.done;
  p.elapsed += m.seconds;
  if (!cfg.metrics.empty() && p.metrics_status.ok()) {
    p.jsonl += train::step_metrics_json(m).dump() + "\n";
    p.metrics_status = write_file_atomic(cfg.metrics, p.jsonl);
  }
  if (p.show) {
    const double left = static_cast<double>(cfg.steps - p.start_step - p.done);
    std::fprintf(stderr,
                 "\rstep %lld/%lld  loss %.4f  2nd-half %.4f  %.0f tok/s  attn imbalance %.2f -> %.2f  ETA %s   ",
                 static_cast<long long>(m.step + 1), static_cast<long long>(cfg.steps), m.loss, m.report_loss,
                 m.tokens_per_s, m.imbalance_before, m.imbalance_after,
                 eta(p.elapsed / static_cast<double>(p.done) * left).c_str());
    std::fflush(stderr);
  }
}

Status write_trace(const TrainConfig& cfg, const train::TrainResult& result) {
  const bool cad = cfg.mode == train::TrainMode::kCad;
  const TraceMetadata meta = rank_trace_metadata(
      "distca train", cfg.ranks,
      {{"step", cfg.steps - 1}, {"overlap", cad ? runtime::overlap_mode_name(cfg.overlap_or_default()) : "none"},
       {"mode", train::train_mode_name(cfg.mode)}, {"backend", cfg.backend}});
  return write_file_atomic(cfg.trace, chrome_trace_json(result.trace, meta)).with_context("--trace");
}

// The run's summary on stdout.
void print_summary(const TrainConfig& cfg, const train::TrainResult& result, const train::PreparedTraining& prep,
                   const std::vector<int64_t>& rss, const Progress& p) {
  const bool backend_mpi = cfg.backend == "mpi";
  const ModelSpec* spec = &prep.spec;
  const std::string mode = train::mode_label(cfg);
  std::printf("distca train: model %s (%lld layers, hidden %lld), %lld ranks (%s backend), mode %s, data %s, steps %lld..%lld\n",
              spec->name.c_str(), static_cast<long long>(spec->n_layers), static_cast<long long>(spec->hidden),
              static_cast<long long>(cfg.ranks), cfg.backend.c_str(), mode.c_str(), cfg.data.c_str(),
              static_cast<long long>(p.start_step),
              static_cast<long long>(cfg.steps));
  if (cfg.pp > 1 || cfg.micro_batches > 1) {
    std::printf("pipeline: %lld stage(s) x %lld data-parallel replica(s), %lld micro-batch(es) per replica and step (%s)\n",
                static_cast<long long>(cfg.pp), static_cast<long long>(cfg.dp()), static_cast<long long>(cfg.micro_batches),
                cfg.schedule_name().c_str());
  }
  if (cfg.tp > 1) {
    std::printf("tensor parallel: %lld ranks per layer x %lld data-parallel replica(s), TP innermost\n",
                static_cast<long long>(cfg.tp), static_cast<long long>(cfg.dp()));
  }
  const double tot = result.total_s > 0 ? result.total_s : 1;
  std::printf("time (rank 0): %.2f s = linear %.2f s (%.0f%%), attention %.2f s (%.0f%%), "
              "communication waited for %.2f s (%.0f%%), waiting %.2f s (%.0f%%), optimizer %.2f s (%.0f%%)\n",
              result.total_s, result.linear_s, 100 * result.linear_s / tot, result.attention_s,
              100 * result.attention_s / tot, result.comm_s, 100 * result.comm_s / tot,
              result.wait_s, 100 * result.wait_s / tot, result.optimizer_s, 100 * result.optimizer_s / tot);
  // Planning (docs/training.md, "Planning ahead"): on the planning thread or inline.
  std::printf("planning (rank 0): %.4f s making plans (%s), steps waited %.4f s for them (max %.4f s in one step)\n",
              result.plan_s, cfg.plan_ahead == "on" ? "ahead, on a background thread" : "inline",
              result.plan_wait_s, train::max_plan_wait(result));
  // The policy both backends applied (kernels/blas.h); the bits do not depend on it.
  std::printf("threads per rank: %d (OpenMP; BLAS on one thread each; %d usable cores)\n",
              kernels::compute_threads_per_rank(backend_mpi ? mpi_local_ranks(cfg.ranks) : cfg.ranks),
              kernels::usable_cores());
  std::printf("peak memory per rank (model, optimizer, activations and dispatcher buffers):");
  for (size_t r = 0; r < result.buffer_bytes.size(); ++r) std::printf(" %s", mib_label(result.buffer_bytes[r]).c_str());
  if (!result.buffer_bytes.empty()) {
    std::printf(" (max %s, max/mean %.3f)", mib_label(*std::max_element(result.buffer_bytes.begin(), result.buffer_bytes.end())).c_str(),
                train::max_over_mean(result.buffer_bytes));
  }
  std::printf("\n");
  std::printf("memory estimate per process: %s (%lld rank%s in it; docs/training.md, \"Memory\")\n",
              format_bytes(prep.memory.process_total()).c_str(), static_cast<long long>(prep.memory.ranks_in_process),
              prep.memory.ranks_in_process == 1 ? "" : "s");
  if (backend_mpi) {
    std::printf("max RSS per rank process:");
    for (int64_t b : rss) std::printf(" %s", mib_label(b).c_str());
    std::printf("\n");
  } else {
    std::printf("max RSS of the process (all %lld rank threads): %s\n", static_cast<long long>(cfg.ranks),
                mib_label(rss[0]).c_str());
  }
  if (!result.last_checkpoint.empty()) std::printf("checkpoint: %s\n", result.last_checkpoint.c_str());
  if (!result.outputs_valid) {
    std::printf("outputs invalid (--overlap signal): losses below are not a model's, parameters were not updated\n");
  }
  if (!result.steps.empty()) {
    const train::FinalLoss fl = train::final_loss(result);
    std::printf("%s: first step %.4f, last step %.4f, mean of the last %zu steps %.4f\n",
                cfg.data == "copy" ? "second-half loss" : "loss", p.first_report, result.steps.back().report_loss,
                fl.steps, fl.value);
    std::printf("final loss: %.6f\n", fl.value);
  }
}

int run(const Options& o) {
  // main installs it too; idempotent. A signal then removes the temporary file of a
  // checkpoint or metrics write in progress before the process dies.
  install_temp_file_cleanup();
  // Before the MPI group exists only the launcher's rank 0 (or a process without one) speaks.
  const Launcher launcher = detect_launcher();
  TrainConfig cfg;
  bool ranks_given = false;
  if (const int code = make_config(o, launcher, cfg, ranks_given); code != kExitOk) return code;
  const bool backend_mpi = cfg.backend == "mpi";
  // With --trace on mpi, the communicator records its exchanges' transfers too (start to the
  // moment the progress thread saw them complete): that is what shows overlap in the trace.
  TraceRecorder trace_recorder;
  comm::LaunchOptions lo;
  lo.backend = backend_mpi ? comm::Backend::kMpi : comm::Backend::kLocal;
  lo.ranks = static_cast<int>(std::clamp<int64_t>(cfg.ranks, 1, 1 << 20));  // prepare refuses a bad --ranks
  lo.mpi.timeout_s = o.mpi_timeout;
  if (backend_mpi && !cfg.trace.empty()) lo.mpi.trace = &trace_recorder;
  comm::Settings settings = train::run_settings(cfg);
  settings.add("--resume", o.resume);

  train::PreparedTraining prep;
  train::TrainHooks hooks;
  Progress progress;
  // Every process checks its own share (memory, files it can see); under mpi the lowest rank
  // that refused speaks, and every rank stops before step 0.
  auto prepare_process = [&](const comm::GroupInfo& g) -> Status {
    const bool lead = g.rank == 0;
    if (backend_mpi) {
      if (!ranks_given) cfg.ranks = g.size;  // the config file's or default ranks yield to mpirun -np
      if (cfg.ranks != g.size) {
        return Status::invalid_argument("--ranks " + std::to_string(cfg.ranks) + " does not match mpirun -np " +
                                        std::to_string(g.size));
      }
    }
    DISTCA_RETURN_IF_ERROR(train::prepare_training(cfg, o.resume, lead, env_int("OMPI_COMM_WORLD_LOCAL_SIZE"), prep));
    hooks.data = &*prep.data;
    if (prep.resume) hooks.resume = &prep.ckpt;
    if (backend_mpi && !cfg.trace.empty()) hooks.trace = &trace_recorder;
    progress.start_step = hooks.resume ? hooks.resume->step : 0;
    progress.show = lead && stderr_is_terminal();
    return Status::ok_status();
  };
  hooks.on_step = [&](const train::StepMetrics& m) { on_step(cfg, progress, m); };

  train::TrainResult result;
  std::vector<int64_t> rss;  // mpi: every rank process's; local: this process's, after the run
  auto run_rank = [&](comm::Communicator& c, int slot) -> Status {
    if (c.rank() == 0 && cfg.mode == train::TrainMode::kCad && cfg.overlap == runtime::OverlapMode::kSignal) {
      std::fprintf(stderr, "distca train: --overlap signal is a timing ablation: exchanges carry 1 byte, outputs are "
                           "invalid, parameters are not updated and no checkpoint is written\n");
    }
    // An OpenMP team per rank sized by the ranks sharing this machine's cores (mpi: Open MPI's
    // local size; all ranks when it is not set).
    const kernels::ScopedComputeThreads team(
        kernels::compute_threads_per_rank(backend_mpi ? mpi_local_ranks(cfg.ranks) : cfg.ranks));
    DISTCA_RETURN_IF_ERROR(train::run_training(cfg, c, hooks, slot == 0 ? &result : nullptr));
    if (backend_mpi) {
      DISTCA_ASSIGN_OR_RETURN(rss, c.all_gather_value(max_rss_bytes()));
    }
    return Status::ok_status();
  };
  // Ranks as threads or processes: BLAS on one thread each (kernels/blas.h).
  const kernels::ScopedBlasThreads one_blas_thread(1);
  const comm::Launched launched = comm::launch(lo, settings, prepare_process, run_rank);
  if (progress.show) std::fprintf(stderr, "\n");
  if (!launched.status.ok()) return launch_failed(launched);
  if (!launched.speaks) return kExitOk;
  if (!backend_mpi) rss = {max_rss_bytes()};
  if (!progress.metrics_status.ok()) return fail(progress.metrics_status);
  if (!cfg.trace.empty()) {
    if (Status ws = write_trace(cfg, result); !ws.ok()) return fail(ws);
  }
  print_summary(cfg, result, prep, rss, progress);
  return kExitOk;
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  TrainConfig& f = o->flags;
  sub.add_option("--config", o->config_file, "TOML file of settings (keys as the flags, '_' for '-'); flags override it")
      ->check(CLI::ExistingFile);
  sub.add_option("--resume", o->resume, "Continue from a checkpoint written by a run of the same config");
  add_mpi_timeout(sub, o->mpi_timeout, "--backend mpi");
  auto add = [&](const std::string& name, auto& field, const std::string& help,
                 std::function<Status(TrainConfig&)> set) {
    CLI::Option* opt = sub.add_option(name, field, help);
    o->setters.emplace_back(opt, std::move(set));
  };
  // The setters live inside *o, so they hold a plain pointer: capturing the shared_ptr would
  // make a reference cycle (a leak the asan preset reports).
  Options* const op = o.get();
#define DISTCA_FLAG(flag, field, help) \
  add(flag, f.field, help, [op](TrainConfig& c) { \
    c.field = op->flags.field;                      \
    return Status{};                                \
  })
  add("--mode", o->mode,
      "cad (plan every step) | colocated | wlb (WLB-LLM chunking, --cp for per-document CP) | percp (--cp C) "
      "(default cad)", [op](TrainConfig& c) -> Status {
    DISTCA_ASSIGN_OR_RETURN(c.mode, train::parse_train_mode(op->mode, "--mode"));
    return {};
  });
  DISTCA_FLAG("--ranks", ranks, "Data-parallel ranks (default 2; mpi: mpirun's -np)");
  DISTCA_FLAG("--backend", backend, "local (ranks as threads) | mpi (under mpirun)");
  DISTCA_FLAG("--steps", steps, "Optimizer steps (default 500)");
  add("--model", f.model, "Model preset: tiny | llama-8b | llama-34b (drops the default's/config's model_overrides)",
      [op](TrainConfig& c) {
        c.model = op->flags.model;
        c.model_overrides = {};
        return Status{};
      });
  DISTCA_FLAG("--seed", seed, "Seed of the parameters and the data (default 1)");
  DISTCA_FLAG("--lr", lr, "Peak learning rate (default 3e-3)");
  DISTCA_FLAG("--min-lr", min_lr, "Cosine floor of the learning rate (default 3e-4)");
  DISTCA_FLAG("--warmup", warmup, "Linear warm-up steps (default 20)");
  DISTCA_FLAG("--weight-decay", weight_decay, "AdamW weight decay (default 0.01)");
  DISTCA_FLAG("--clip", clip, "Global gradient-norm clip, <= 0 disables (default 1)");
  DISTCA_FLAG("--data", data, "copy | text:DIR (default copy)");
  DISTCA_FLAG("--copy-vocab", copy_vocab, "Copy task: token alphabet size, 0 = the model's vocabulary (default 32)");
  DISTCA_FLAG("--tokens-per-rank", tokens_per_rank, "Tokens per rank per step, multiple of 16 (default 256)");
  DISTCA_FLAG("--dist", dist, "Document lengths: pretrain | prolong | fixed:N | uniform:A:B | file:PATH (default pretrain)");
  DISTCA_FLAG("--max-doc-len", max_doc_len, "Cap on document length, 0 none (default 128)");
  DISTCA_FLAG("--scheduler", scheduler, "cad mode: cad | cad-symmetric | percp:C (default cad)");
  add("--tolerance", o->tolerance, "cad scheduler: balance tolerance in [0, 1] (default 0.05) | auto (needs --hardware)",
      [op](TrainConfig& c) -> Status {
        DISTCA_ASSIGN_OR_RETURN(const std::optional<double> t, parse_tolerance(op->tolerance));
        c.tolerance_auto = !t.has_value();
        c.tolerance = t.value_or(c.tolerance);
        return {};
      });
  DISTCA_FLAG("--hardware", hardware, "--tolerance auto: a `distca profile --hardware-out` file (link and attention); --mode wlb: the chunking's work from its GEMM rates and attention table");
  DISTCA_FLAG("--ranks-per-host", ranks_per_host, "cad: ranks [h*N, (h+1)*N) share host h (topology-aware placement)");
  DISTCA_FLAG("--host-map", host_map, "cad: each rank's host, comma-separated (0,0,1,1), or mpi (MPI's shared-memory split)");
  DISTCA_FLAG("--inter-host-price", inter_host_price, "cad: a byte between hosts costs this many within a host (default 8)");
  DISTCA_FLAG("--checkpoint-dir", checkpoint_dir, "Write checkpoints into DIR (step-NNNNNNNN.ckpt)");
  DISTCA_FLAG("--checkpoint-every", checkpoint_every, "Checkpoint every N steps (0: at the end only)");
  DISTCA_FLAG("--metrics", metrics, "Write per-step metrics as JSONL to FILE");
  add("--overlap", o->overlap,
      "cad mode: pingpong (two nano-batches hide each other's exchanges; default) | single-stream | "
      "signal (1-byte exchanges: a timing ablation, outputs invalid, no update)",
      [op](TrainConfig& c) -> Status {
        DISTCA_ASSIGN_OR_RETURN(c.overlap, runtime::parse_overlap_mode(op->overlap, "--overlap"));
        return {};
      });
  DISTCA_FLAG("--kv-once", kv_once,
              "cad pingpong: on (default): send each K/V row once per server across the nano-batch pair | off | "
              "auto (per micro-batch from the ping-pong timeline of --hardware's link); same bits");
  DISTCA_FLAG("--cp", cp, "wlb, percp: context-parallel group size, dividing ranks / pp (default 1)");
  add("--wlb-cap", o->wlb_cap, "wlb: tokens per rank at most this x the mean, >= 1 (default 1.2)", [op](TrainConfig& c) {
    c.wlb_cap = op->wlb_cap;
    return Status{};
  });
  add("--cp-threshold", o->cp_threshold,
      "wlb with --cp > 1: shard documents longer than N tokens over a CP group (default 2 x cp x query tile - 1)",
      [op](TrainConfig& c) {
        c.cp_threshold = op->cp_threshold;
        return Status{};
      });
  DISTCA_FLAG("--trace", trace, "Write a Chrome trace of the last step (every rank) to FILE");
  DISTCA_FLAG("--pp", pp,
              "Pipeline stages (default 1): ranks = data-parallel replicas x stages; colocated 1F1B, cad pooled ticks");
  DISTCA_FLAG("--tp", tp,
              "Tensor-parallel ranks per layer (default 1): ranks = tp x pp x replicas, TP innermost");
  DISTCA_FLAG("--tp-overlap", tp_overlap,
              "on (default): overlap the TP collectives with the layers' products | off: blocking between "
              "them (same bits)");
  DISTCA_FLAG("--micro-batches", micro_batches,
              "Micro-batches per replica per step (default 1; >= --pp; with --pp 1: gradient accumulation)");
  DISTCA_FLAG("--plan-ahead", plan_ahead,
              "on (default): plan the next step on a background thread while this one runs | off: "
              "plan inline (same bits)");
#undef DISTCA_FLAG
  return [o] { return run(*o); };
}

}  // namespace

DISTCA_REGISTER_COMMAND(train, {"train", "", "Train a Llama-style model with data parallelism and core attention disaggregation",
                                5, &setup});

}  // namespace distca::cli::cmd_train
