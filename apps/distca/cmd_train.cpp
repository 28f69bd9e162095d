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
#include "distca/train/checkpoint.h"
#include "distca/train/config.h"
#include "distca/train/data.h"
#include "distca/train/memory.h"
#include "distca/train/settings.h"
#include "distca/train/trainer.h"

namespace distca::cli {
namespace {

using train::TrainConfig;

struct Options {
  std::string config_file;
  std::string resume;
  double mpi_timeout = 300;  // seconds; --backend mpi
  TrainConfig flags;  // values of the flags given (the others are ignored)
  std::string mode, overlap;  // --mode, --overlap as given (parsed by their setters)
  // (option, copy the flag's value into the config; a value that does not parse is an error)
  // for every config flag.
  std::vector<std::pair<CLI::Option*, std::function<Status(TrainConfig&)>>> setters;
};

int64_t max_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux: KiB
}

std::string mib(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return b;
}

std::string eta(double s) {
  char b[32];
  const auto t = static_cast<long long>(s + 0.5);
  if (t >= 3600) std::snprintf(b, sizeof(b), "%lldh%02lldm", t / 3600, (t / 60) % 60);
  else std::snprintf(b, sizeof(b), "%lldm%02llds", t / 60, t % 60);
  return b;
}

nlohmann::json step_json(const train::StepMetrics& m) {
  return {{"step", m.step},           {"loss", m.loss},
          {"report_loss", m.report_loss}, {"lr", m.lr},
          {"grad_norm", m.grad_norm}, {"tokens", m.tokens},
          {"seconds", m.seconds},     {"tokens_per_s", m.tokens_per_s},
          {"imbalance_before", m.imbalance_before}, {"imbalance_after", m.imbalance_after},
          {"linear_s", m.linear_s},   {"attention_s", m.attention_s},
          {"comm_s", m.comm_s},       {"wait_s", m.wait_s}, {"optimizer_s", m.optimizer_s},
          {"nano_tokens", {m.nano_tokens[0], m.nano_tokens[1]}}, {"bytes_sent", m.bytes_sent},
          {"plan_s", m.plan_s},       {"plan_wait_s", m.plan_wait_s}};
}

double max_plan_wait(const train::TrainResult& r) {
  double w = 0;
  for (const train::StepMetrics& m : r.steps) w = std::max(w, m.plan_wait_s);
  return w;
}

bool is_input_error(const Status& st) {
  switch (st.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorrupt:
    case StatusCode::kOutOfMemory:  // a refused memory estimate is bad input (too large flags)
      return true;
    default:
      return false;
  }
}

int report(const Status& st) { return is_input_error(st) ? fail_input(st.message()) : fail(st); }
int exit_code(const Status& st) { return st.ok() ? kExitOk : is_input_error(st) ? kExitBadInput : kExitFailure; }

// Everything checked and read before step 0, in an order that refuses cheaply first: the
// config, outputs, inputs (without reading), the memory estimate, then the reads and the
// checkpoint's contents, and last the checkpoint directory (created here).
struct Prepared {
  ModelSpec spec;
  std::optional<train::DataSource> data;
  train::Checkpoint ckpt;
  bool resume = false;
  train::TrainMemoryEstimate memory;
};

Status prepare(const TrainConfig& cfg, const std::string& resume, bool lead, Prepared& p) {
  DISTCA_RETURN_IF_ERROR(cfg.validate());
  DISTCA_ASSIGN_OR_RETURN(p.spec, cfg.model_spec());
  if (lead) {
    DISTCA_RETURN_IF_ERROR(check_distinct_outputs(
        {{"--metrics", cfg.metrics}, {"--trace", cfg.trace}, {"--checkpoint-dir", cfg.checkpoint_dir}}));
  }
  if (lead && !cfg.metrics.empty()) {
    if (Status st = check_output_path(cfg.metrics); !st.ok()) return Status::invalid_argument("--metrics: " + st.message());
  }
  if (lead && !cfg.trace.empty()) {
    if (Status st = check_output_path(cfg.trace); !st.ok()) return Status::invalid_argument("--trace: " + st.message());
  }
  train::MemoryInputs mi;
  mi.mpi = cfg.backend == "mpi";
  mi.ranks_in_process = mi.mpi ? 1 : cfg.ranks;
  mi.lead = lead;
  mi.resume = !resume.empty();
  if (const std::string dir = cfg.text_dir(); !dir.empty()) {
    DISTCA_ASSIGN_OR_RETURN(train::TextCorpus corpus, train::scan_text_corpus(dir));
    mi.text_bytes = corpus.bytes;
    mi.text_files = static_cast<int64_t>(corpus.paths.size());
    mi.largest_text_file = corpus.largest;
  }
  if (!resume.empty()) {
    if (Status st = check_input_file(resume); !st.ok()) return Status::not_found("--resume " + resume + ": " + st.message());
  }
  p.memory = train::estimate_train_memory(cfg, p.spec, mi);
  // mpi: each process checks its share; the processes mpirun put on this machine share its
  // memory, so the share is counted that many times.
  const int64_t here = mi.mpi ? std::max<int64_t>(1, env_int("OMPI_COMM_WORLD_LOCAL_SIZE")) : 1;
  const std::string what = train::memory_flags(cfg) + (here > 1 ? " x " + std::to_string(here) + " processes on this machine" : "");
  DISTCA_RETURN_IF_ERROR(check_memory(p.memory.process_total() * static_cast<double>(here), what));

  DISTCA_ASSIGN_OR_RETURN(train::DataSource data, train::DataSource::create(cfg, p.spec.vocab));
  p.data.emplace(std::move(data));
  if (!resume.empty()) {
    DISTCA_ASSIGN_OR_RETURN(p.ckpt, train::read_checkpoint(resume, train::fingerprint(cfg, p.spec)));
    DISTCA_RETURN_IF_ERROR(train::check_resume(p.ckpt, cfg, model::param_count(p.spec), "--resume " + resume));
    p.resume = true;
  }
  if (lead && !cfg.checkpoint_dir.empty()) {
    if (Status st = check_output_dir(cfg.checkpoint_dir, /*create=*/true); !st.ok()) {
      return Status::invalid_argument("--checkpoint-dir: " + st.message());
    }
    // Temporary files of a run killed with SIGKILL (the signal handler removes the others):
    // only those of this run's own outputs, checkpoint names.
    remove_stale_temp_files(cfg.checkpoint_dir, train::is_checkpoint_name);
  }
  if (lead && !cfg.metrics.empty()) {
    const std::filesystem::path m(cfg.metrics);
    const std::string dir = m.parent_path().empty() ? "." : m.parent_path().string();
    const std::string name = m.filename().string();
    remove_stale_temp_files(dir, [&name](const std::string& target) { return target == name; });
  }
  return {};
}

int run(const Options& o) {
  // main installs it too; idempotent. A signal then removes the temporary file of a
  // checkpoint or metrics write in progress before the process dies.
  install_temp_file_cleanup();
  // Before the MPI group exists only the launcher's rank 0 (or a process without one) speaks.
  const Launcher launcher = detect_launcher();
  const auto early_fail = [&](const std::string& msg) { return launcher.rank <= 0 ? fail_input(msg) : kExitBadInput; };
  TrainConfig cfg;
  if (!o.config_file.empty()) {
    Status st = train::apply_toml_file(o.config_file, cfg);
    if (!st.ok()) return launcher.rank <= 0 ? report(st) : exit_code(st);
  }
  bool ranks_given = false;
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

  bool lead = true;
  bool progress = false;
  Prepared prep;
  train::TrainHooks hooks;
  std::string jsonl;
  double first_report = NAN;
  int64_t done = 0;
  int64_t start_step = 0;
  double elapsed = 0;
  Status metrics_status;
  // Every process checks its own share (memory, files it can see); under mpi the lowest rank
  // that refused speaks, and every rank stops before step 0.
  auto prepare_process = [&](const comm::GroupInfo& g) -> Status {
    lead = g.rank == 0;
    if (backend_mpi) {
      if (!ranks_given) cfg.ranks = g.size;  // the config file's or default ranks yield to mpirun -np
      if (cfg.ranks != g.size) {
        return Status::invalid_argument("--ranks " + std::to_string(cfg.ranks) + " does not match mpirun -np " +
                                        std::to_string(g.size));
      }
    }
    DISTCA_RETURN_IF_ERROR(prepare(cfg, o.resume, lead, prep));
    hooks.data = &*prep.data;
    if (prep.resume) hooks.resume = &prep.ckpt;
    if (backend_mpi && !cfg.trace.empty()) hooks.trace = &trace_recorder;
    start_step = hooks.resume ? hooks.resume->step : 0;
    progress = lead && stderr_is_terminal();
    return Status::ok_status();
  };
  hooks.on_step = [&](const train::StepMetrics& m) {
    if (std::isnan(first_report)) first_report = m.report_loss;
    ++done;
    elapsed += m.seconds;
    if (!cfg.metrics.empty() && metrics_status.ok()) {
      jsonl += step_json(m).dump() + "\n";
      metrics_status = write_file_atomic(cfg.metrics, jsonl);
    }
    if (progress) {
      std::fprintf(stderr,
                   "\rstep %lld/%lld  loss %.4f  2nd-half %.4f  %.0f tok/s  attn imbalance %.2f -> %.2f  ETA %s   ",
                   static_cast<long long>(m.step + 1), static_cast<long long>(cfg.steps), m.loss,
                   m.report_loss, m.tokens_per_s, m.imbalance_before, m.imbalance_after,
                   eta(elapsed / static_cast<double>(done) * static_cast<double>(cfg.steps - start_step - done)).c_str());
      std::fflush(stderr);
    }
  };

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
  const Status& st = launched.status;
  const ModelSpec* spec = &prep.spec;
  if (progress) std::fprintf(stderr, "\n");
  if (!st.ok()) return launched.speaks ? report(st) : exit_code(st);
  if (!launched.speaks) return kExitOk;
  if (!backend_mpi) rss = {max_rss_bytes()};
  if (!metrics_status.ok()) return fail(metrics_status);
  if (!cfg.trace.empty()) {
    TraceMetadata meta;
    TraceProcess proc{0, "distca train", 0, {}};
    for (int64_t r = 0; r < cfg.ranks; ++r) proc.threads.emplace_back(r, "rank " + std::to_string(r));
    meta.processes.push_back(std::move(proc));
    const bool cad = cfg.mode == train::TrainMode::kCad;
    meta.other_data = {{"step", cfg.steps - 1}, {"overlap", cad ? runtime::overlap_mode_name(cfg.overlap_or_default()) : "none"},
                       {"mode", train::train_mode_name(cfg.mode)}, {"backend", cfg.backend}};
    if (Status ws = write_file_atomic(cfg.trace, chrome_trace_json(result.trace, meta)); !ws.ok()) {
      return fail(ws.with_context("--trace"));
    }
  }

  const bool copy = cfg.data == "copy";
  const std::string mode = cfg.mode == train::TrainMode::kCad
                               ? std::string("cad ") + runtime::overlap_mode_name(cfg.overlap_or_default())
                               : std::string("colocated");
  std::printf("distca train: model %s (%lld layers, hidden %lld), %lld ranks (%s backend), mode %s, data %s, steps %lld..%lld\n",
              spec->name.c_str(), static_cast<long long>(spec->n_layers), static_cast<long long>(spec->hidden),
              static_cast<long long>(cfg.ranks), cfg.backend.c_str(), mode.c_str(), cfg.data.c_str(),
              static_cast<long long>(start_step),
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
              result.plan_wait_s, max_plan_wait(result));
  // The policy both backends applied (kernels/blas.h); the bits do not depend on it.
  std::printf("threads per rank: %d (OpenMP; BLAS on one thread each; %d usable cores)\n",
              kernels::compute_threads_per_rank(backend_mpi ? mpi_local_ranks(cfg.ranks) : cfg.ranks),
              kernels::usable_cores());
  std::printf("peak memory per rank (model, optimizer, activations and dispatcher buffers):");
  for (size_t r = 0; r < result.buffer_bytes.size(); ++r) std::printf(" %s", mib(result.buffer_bytes[r]).c_str());
  std::printf("\n");
  std::printf("memory estimate per process: %s (%lld rank%s in it; docs/training.md, \"Memory\")\n",
              format_bytes(prep.memory.process_total()).c_str(), static_cast<long long>(prep.memory.ranks_in_process),
              prep.memory.ranks_in_process == 1 ? "" : "s");
  if (backend_mpi) {
    std::printf("max RSS per rank process:");
    for (int64_t b : rss) std::printf(" %s", mib(b).c_str());
    std::printf("\n");
  } else {
    std::printf("max RSS of the process (all %lld rank threads): %s\n", static_cast<long long>(cfg.ranks),
                mib(rss[0]).c_str());
  }
  if (!result.last_checkpoint.empty()) std::printf("checkpoint: %s\n", result.last_checkpoint.c_str());
  if (!result.outputs_valid) {
    std::printf("outputs invalid (--overlap signal): losses below are not a model's, parameters were not updated\n");
  }
  if (!result.steps.empty()) {
    // Batches differ step to step (one long document or many short ones), so a single step's
    // loss is noisy: the final loss is the mean over the last tenth of the run (>= 1 step).
    const size_t n = result.steps.size(), tail = std::max<size_t>(1, n / 10);
    double final_loss = 0;
    for (size_t i = n - tail; i < n; ++i) final_loss += result.steps[i].report_loss;
    final_loss /= static_cast<double>(tail);
    std::printf("%s: first step %.4f, last step %.4f, mean of the last %zu steps %.4f\n",
                copy ? "second-half loss" : "loss", first_report, result.steps.back().report_loss, tail,
                final_loss);
    std::printf("final loss: %.6f\n", final_loss);
  }
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
  add("--mode", o->mode, "cad (plan every step) | colocated (default cad)", [op](TrainConfig& c) -> Status {
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
  DISTCA_FLAG("--tolerance", tolerance, "cad scheduler: balance tolerance (default 0.05)");
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
  DISTCA_FLAG("--trace", trace, "Write a Chrome trace of the last step (every rank) to FILE");
  DISTCA_FLAG("--pp", pp,
              "Pipeline stages (default 1): ranks = data-parallel replicas x stages; colocated 1F1B, cad pooled ticks");
  DISTCA_FLAG("--tp", tp,
              "Tensor-parallel ranks per layer (default 1): ranks = tp x pp x replicas, TP innermost");
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

}  // namespace distca::cli
