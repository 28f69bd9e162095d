// `distca train`: data-parallel training of a Llama-style model with core attention through
// the CA dispatcher (docs/training.md). Flags override --config FILE, which overrides the
// embedded default (configs/default.toml).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "distca/comm/mpi.h"
#include "distca/core/io.h"
#include "distca/model/llama.h"
#include "distca/train/checkpoint.h"
#include "distca/train/config.h"
#include "distca/train/trainer.h"

namespace distca::cli {
namespace {

using train::TrainConfig;

struct Options {
  std::string config_file;
  std::string resume;
  TrainConfig flags;  // values of the flags given (the others are ignored)
  // (option, copy the flag's value into the config) for every config flag.
  std::vector<std::pair<CLI::Option*, std::function<void(TrainConfig&)>>> setters;
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
          {"comm_s", m.comm_s},       {"wait_s", m.wait_s}};
}

int run(const Options& o) {
  // The mpi backend's group exists before anything else so only rank 0 speaks.
  TrainConfig cfg;
  if (!o.config_file.empty()) {
    Status st = train::apply_toml_file(o.config_file, cfg);
    if (!st.ok()) return fail(st);
  }
  bool ranks_given = false;
  for (const auto& [opt, set] : o.setters) {
    if (opt->count() > 0) {
      set(cfg);
      if (opt->get_name() == "--ranks") ranks_given = true;
    }
  }
  const bool backend_mpi = cfg.backend == "mpi";
  std::unique_ptr<comm::MpiCommunicator> mpi;
  int rank = 0;
  if (backend_mpi) {
    auto c = comm::make_mpi_communicator(nullptr, nullptr);
    if (!c.ok()) return fail(c.status());
    mpi = std::move(*c);
    rank = mpi->rank();
    if (!ranks_given) cfg.ranks = mpi->size();  // the config file's or default ranks yield to mpirun -np
    if (cfg.ranks != mpi->size()) {
      return rank == 0 ? fail_input("--ranks " + std::to_string(cfg.ranks) + " does not match mpirun -np " +
                                    std::to_string(mpi->size()))
                       : kExitBadInput;
    }
  }
  const bool lead = rank == 0;
  auto quiet_fail = [&](const Status& st) { return lead ? fail(st) : (st.code() == StatusCode::kInternal || st.code() == StatusCode::kIoError ? kExitFailure : kExitBadInput); };
  if (Status st = cfg.validate(); !st.ok()) return quiet_fail(st);
  auto spec = cfg.model_spec();
  if (!spec.ok()) return quiet_fail(spec.status());
  {
    // Refuse a model that cannot fit before allocating it (parameters, gradients, AdamW m and
    // v, and the activation workspace; ranks as threads share this machine's memory).
    const model::ModelMemory mem = model::model_memory(*spec);
    const double per_rank = 4.0 * static_cast<double>(mem.param_bytes) +
                            static_cast<double>(mem.activation_bytes_per_token()) * static_cast<double>(cfg.tokens_per_rank);
    const double need = backend_mpi ? per_rank : per_rank * static_cast<double>(cfg.ranks);
    const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
    if (have > 0 && need > have) {
      char msg[256];
      std::snprintf(msg, sizeof(msg), "--model %s needs %.1f GiB (%s) but this machine has %.1f GiB",
                    cfg.model.c_str(), need / (1 << 30), backend_mpi ? "per rank" : "all ranks", have / (1 << 30));
      return quiet_fail(Status::invalid_argument(msg));
    }
  }
  if (!cfg.metrics.empty()) {
    const auto dir = std::filesystem::path(cfg.metrics).parent_path();
    if (!dir.empty() && !std::filesystem::is_directory(dir)) {
      return quiet_fail(Status::invalid_argument("--metrics: directory '" + dir.string() + "' does not exist"));
    }
  }
  train::Checkpoint ckpt;
  train::TrainHooks hooks;
  if (!o.resume.empty()) {
    auto c = train::read_checkpoint(o.resume, train::fingerprint(cfg, *spec));
    if (!c.ok()) return quiet_fail(c.status());
    ckpt = std::move(*c);
    hooks.resume = &ckpt;
  }

  const bool progress = lead && stderr_is_terminal();
  std::string jsonl;
  double first_report = NAN;
  int64_t done = 0;
  const int64_t start_step = hooks.resume ? hooks.resume->step : 0;
  const int64_t to_run = cfg.steps - start_step;
  double elapsed = 0;
  Status metrics_status;
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
                   eta(elapsed / static_cast<double>(done) * static_cast<double>(to_run - done)).c_str());
      std::fflush(stderr);
    }
  };

  train::TrainResult result;
  Status st;
  std::vector<int64_t> rss;
  if (backend_mpi) {
    train::use_single_blas_thread();
    st = train::run_training(cfg, *mpi, hooks, &result);
    if (!st.ok()) mpi->fail(st);
    auto all = mpi->all_gather_value(max_rss_bytes());
    if (!all.ok()) mpi->fail(all.status());
    rss = *all;
  } else {
    st = train::run_training_local(cfg, hooks, &result);
    rss = {max_rss_bytes()};
  }
  if (progress) std::fprintf(stderr, "\n");
  if (!lead) return st.ok() ? kExitOk : kExitFailure;
  if (!st.ok()) return fail(st);
  if (!metrics_status.ok()) return fail(metrics_status);

  const bool copy = cfg.data == "copy";
  std::printf("distca train: model %s (%lld layers, hidden %lld), %lld ranks (%s backend), mode %s, data %s, steps %lld..%lld\n",
              spec->name.c_str(), static_cast<long long>(spec->n_layers), static_cast<long long>(spec->hidden),
              static_cast<long long>(cfg.ranks), cfg.backend.c_str(),
              cfg.mode.c_str(), cfg.data.c_str(), static_cast<long long>(start_step),
              static_cast<long long>(cfg.steps));
  const double tot = result.total_s > 0 ? result.total_s : 1;
  std::printf("time (rank 0): %.2f s = linear %.2f s (%.0f%%), attention %.2f s (%.0f%%), "
              "communication %.2f s (%.0f%%), waiting %.2f s (%.0f%%)\n",
              result.total_s, result.linear_s, 100 * result.linear_s / tot, result.attention_s,
              100 * result.attention_s / tot, result.comm_s, 100 * result.comm_s / tot,
              result.wait_s, 100 * result.wait_s / tot);
  std::printf("peak memory per rank (model, optimizer, activations and dispatcher buffers):");
  for (size_t r = 0; r < result.buffer_bytes.size(); ++r) std::printf(" %s", mib(result.buffer_bytes[r]).c_str());
  std::printf("\n");
  if (backend_mpi) {
    std::printf("max RSS per rank process:");
    for (int64_t b : rss) std::printf(" %s", mib(b).c_str());
    std::printf("\n");
  } else {
    std::printf("max RSS of the process (all %lld rank threads): %s\n", static_cast<long long>(cfg.ranks),
                mib(rss[0]).c_str());
  }
  if (!result.last_checkpoint.empty()) std::printf("checkpoint: %s\n", result.last_checkpoint.c_str());
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
  auto add = [&](const std::string& name, auto& field, const std::string& help,
                 std::function<void(TrainConfig&)> set) {
    CLI::Option* opt = sub.add_option(name, field, help);
    o->setters.emplace_back(opt, std::move(set));
  };
  // The setters live inside *o, so they hold a plain pointer: capturing the shared_ptr would
  // make a reference cycle (a leak the asan preset reports).
  Options* const op = o.get();
#define DISTCA_FLAG(flag, field, help) \
  add(flag, f.field, help, [op](TrainConfig& c) { c.field = op->flags.field; })
  DISTCA_FLAG("--mode", mode, "cad (plan every step) | colocated (default cad)");
  DISTCA_FLAG("--ranks", ranks, "Data-parallel ranks (default 2; mpi: mpirun's -np)");
  DISTCA_FLAG("--backend", backend, "local (ranks as threads) | mpi (under mpirun)");
  DISTCA_FLAG("--steps", steps, "Optimizer steps (default 500)");
  add("--model", f.model, "Model preset: tiny | llama-8b | llama-34b (drops the default's/config's model_overrides)",
      [op](TrainConfig& c) {
        c.model = op->flags.model;
        c.model_overrides = {};
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
#undef DISTCA_FLAG
  return [o] { return run(*o); };
}

}  // namespace

DISTCA_REGISTER_COMMAND(train, {"train", "", "Train a Llama-style model with data parallelism and core attention disaggregation",
                                5, &setup});

}  // namespace distca::cli
