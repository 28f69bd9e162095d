// The checks before step 0, the metrics line and the final figures of a training run (session.h).
#include "distca/train/session.h"

#include <algorithm>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/model/llama.h"
#include "distca/plan/auto_tolerance.h"
#include "distca/train/wlb_profile.h"

namespace distca::train {

namespace {

// The outputs' checks (lead only): distinct, writable.
Status check_outputs(const TrainConfig& cfg) {
  DISTCA_RETURN_IF_ERROR(check_distinct_outputs(
      {{"--metrics", cfg.metrics}, {"--trace", cfg.trace}, {"--checkpoint-dir", cfg.checkpoint_dir}}));
  if (!cfg.metrics.empty()) {
    if (Status st = check_output_path(cfg.metrics); !st.ok()) return Status::invalid_argument("--metrics: " + st.message());
  }
  if (!cfg.trace.empty()) {
    if (Status st = check_output_path(cfg.trace); !st.ok()) return Status::invalid_argument("--trace: " + st.message());
  }
  return {};
}

// The checkpoint directory, created; the temporary files of a run killed with SIGKILL (the
// signal handler removes the others), only those of this run's own outputs, removed.
Status prepare_outputs(const TrainConfig& cfg) {
  if (!cfg.checkpoint_dir.empty()) {
    if (Status st = check_output_dir(cfg.checkpoint_dir, /*create=*/true); !st.ok()) {
      return Status::invalid_argument("--checkpoint-dir: " + st.message());
    }
    remove_stale_temp_files(cfg.checkpoint_dir, is_checkpoint_name);
  }
  if (!cfg.metrics.empty()) {
    const std::filesystem::path m(cfg.metrics);
    const std::string dir = m.parent_path().empty() ? "." : m.parent_path().string();
    const std::string name = m.filename().string();
    remove_stale_temp_files(dir, [&name](const std::string& target) { return target == name; });
  }
  return {};
}

}  // namespace

Status prepare_training(const TrainConfig& cfg, const std::string& resume, bool lead, int64_t processes_here,
                        PreparedTraining& p) {
  DISTCA_RETURN_IF_ERROR(cfg.validate());
  DISTCA_ASSIGN_OR_RETURN(p.spec, cfg.model_spec());
  if (cfg.tolerance_auto) {
    // Read again by every rank at its start; checked here so a bad file is refused first.
    auto profile = load_hardware_profile(cfg.hardware);
    if (!profile.ok()) return Status::invalid_argument("--hardware: " + profile.status().message());
    std::unique_ptr<AttentionCostModel> table;
    DISTCA_RETURN_IF_ERROR(auto_tolerance_model(*profile, {}, true, &table).status());
  }
  if (cfg.mode == TrainMode::kWlb && !cfg.hardware.empty()) {
    std::shared_ptr<const AttentionCostModel> table;
    DISTCA_RETURN_IF_ERROR(load_profiled_chunking(cfg.hardware, p.spec, ChunkingOptions{}, &table).status());
  }
  if (lead) DISTCA_RETURN_IF_ERROR(check_outputs(cfg));
  MemoryInputs mi;
  mi.mpi = cfg.backend == "mpi";
  mi.ranks_in_process = mi.mpi ? 1 : cfg.ranks;
  mi.lead = lead;
  mi.resume = !resume.empty();
  if (const std::string dir = cfg.text_dir(); !dir.empty()) {
    DISTCA_ASSIGN_OR_RETURN(TextCorpus corpus, scan_text_corpus(dir));
    mi.text_bytes = corpus.bytes;
    mi.text_files = static_cast<int64_t>(corpus.paths.size());
    mi.largest_text_file = corpus.largest;
  }
  if (!resume.empty()) {
    if (Status st = check_input_file(resume); !st.ok()) return Status::not_found("--resume " + resume + ": " + st.message());
  }
  p.memory = estimate_train_memory(cfg, p.spec, mi);
  // mpi: the processes mpirun put on this machine share its memory, so the share counts that
  // many times.
  const int64_t here = mi.mpi ? std::max<int64_t>(1, processes_here) : 1;
  const std::string what = memory_flags(cfg) + (here > 1 ? " x " + std::to_string(here) + " processes on this machine" : "");
  DISTCA_RETURN_IF_ERROR(check_memory(p.memory.process_total() * static_cast<double>(here), what));

  DISTCA_ASSIGN_OR_RETURN(DataSource data, DataSource::create(cfg, p.spec.vocab));
  p.data.emplace(std::move(data));
  if (!resume.empty()) {
    DISTCA_ASSIGN_OR_RETURN(p.ckpt, read_checkpoint(resume, fingerprint(cfg, p.spec)));
    DISTCA_RETURN_IF_ERROR(check_resume(p.ckpt, cfg, model::param_count(p.spec), "--resume " + resume));
    p.resume = true;
  }
  return lead ? prepare_outputs(cfg) : Status{};
}

nlohmann::json step_metrics_json(const StepMetrics& m) {
  return {{"step", m.step},           {"loss", m.loss},
          {"report_loss", m.report_loss}, {"lr", m.lr},
          {"grad_norm", m.grad_norm}, {"tokens", m.tokens},
          {"seconds", m.seconds},     {"tokens_per_s", m.tokens_per_s},
          {"imbalance_before", m.imbalance_before}, {"imbalance_after", m.imbalance_after},
          {"linear_s", m.linear_s},   {"attention_s", m.attention_s},
          {"comm_s", m.comm_s},       {"wait_s", m.wait_s}, {"optimizer_s", m.optimizer_s},
          {"nano_tokens", {m.nano_tokens[0], m.nano_tokens[1]}}, {"bytes_sent", m.bytes_sent},
          {"plan_s", m.plan_s},       {"plan_wait_s", m.plan_wait_s},
          {"tp_comm_s", m.tp_comm_s}, {"tp_bytes_sent", m.tp_bytes_sent}};
}

FinalLoss final_loss(const TrainResult& result) {
  FinalLoss out;
  const size_t n = result.steps.size();
  if (n == 0) return out;
  out.steps = std::max<size_t>(1, n / 10);
  for (size_t i = n - out.steps; i < n; ++i) out.value += result.steps[i].report_loss;
  out.value /= static_cast<double>(out.steps);
  return out;
}

double max_plan_wait(const TrainResult& result) {
  double w = 0;
  for (const StepMetrics& m : result.steps) w = std::max(w, m.plan_wait_s);
  return w;
}

}  // namespace distca::train
