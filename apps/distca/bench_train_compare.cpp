// `distca bench train --compare`: one configuration in every mode of train::compare_modes,
// paired round by round on the same drawn steps (train/compare.h runs it; this file checks the
// flags, launches the ranks and prints). docs/benchmarks.md, "Comparing the modes".
//
//   mpirun -np 4 distca bench train --compare --backend mpi --workload prolong --json -
//
// Data: --workload pretrain or prolong (data/workload.h) at --tokens-per-rank per rank (per
// micro-batch with --pp), documents capped at one rank's tokens, drawn with --seed; the copy
// task's tokens. Each step's attention max/mean over the replicas before planning is printed
// first. With --hardware FILE the simulator predicts every entry on the same steps through
// sim::predict_training (the one configuration-to-simulator mapping, sim/request.h).
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
#include "distca/core/memory.h"
#include "distca/cost/hardware_profile.h"
#include "distca/kernels/attention_traits.h"
#include "distca/kernels/blas.h"
#include "distca/sim/request.h"
#include "distca/train/bench.h"
#include "distca/train/compare.h"
#include "distca/train/data.h"

namespace distca::cli::bench_train {
namespace {

// The run every entry shares: bench train's model and sizes, the drawn workload.
train::TrainConfig compare_base(const TrainBenchFlags& f, int64_t ranks) {
  train::TrainConfig c = make_config(f, ranks, Mode{"colocated", "colocated", ""});
  c.dist = f.workload;
  c.max_doc_len = f.tokens;  // documents up to one rank's tokens
  c.seed = static_cast<uint64_t>(f.seed);
  return c;
}

train::CompareOptions compare_options(const TrainBenchFlags& f, int64_t ranks) {
  train::CompareOptions o;
  o.base = compare_base(f, ranks);
  o.modes = train::compare_modes(ranks / std::max<int64_t>(1, f.pp));
  o.rounds = f.rounds;
  o.warmup_steps = f.warmup_steps;
  o.resident = f.backend == "mpi";  // ranks are processes: each has its own VmHWM
  return o;
}

Status check_compare(const TrainBenchFlags& f, bool ranks_given) {
  if (f.doc_flags_given) {
    return Status::invalid_argument("--long-doc and --short-doc shape the skewed workload; --compare draws its documents");
  }
  if (!f.trace.empty()) return Status::invalid_argument("--trace is not recorded with --compare");
  if (!f.cost_table.empty()) return Status::invalid_argument("--cost-table does not apply to --compare (its prediction takes --hardware)");
  DISTCA_RETURN_IF_ERROR(check_flags(f, ranks_given));
  const int64_t ranks = run_ranks(f);
  if (Status st = compare_options(f, ranks).validate(); !st.ok()) {
    return Status::invalid_argument("the flags make a training run that distca train refuses (" + st.message() + ")");
  }
  return {};
}

// The simulator's median step over the timed steps, each predicted on its own batches.
SimFigures predict_entry(const TrainBenchFlags& f, int64_t ranks, const train::CompareMode& m, const train::DataSource& data,
                         const std::shared_ptr<const HardwareProfile>& hw) {
  sim::TrainingRun run;
  run.model = bench_spec(f);
  run.ranks = ranks;
  run.pp = f.pp;
  run.mode = train::train_mode_name(m.mode);
  run.overlap = m.overlap ? runtime::overlap_mode_name(*m.overlap) : "";
  run.cp = m.cp > 1 ? m.cp : 0;
  run.tolerance = f.tolerance;
  // The chunking's query tile is the kernel's for this model (wlb_cap and cp_threshold keep
  // the trainer's defaults: bench train --compare does not change them).
  run.tile_rows = kernels::AttentionTraits::query_tile_rows(run.model.n_heads / run.model.n_kv_heads);
  run.sgemm_flops = profile_hardware_spec(*hw, f.hardware).peak_flops;
  run.hardware_profile = hw;
  const int64_t M = std::max<int64_t>(1, f.micro_batches);
  SimFigures out;
  std::vector<double> steps;
  for (int64_t s = f.warmup_steps; s < f.steps; ++s) {
    std::vector<Batch> batches;
    for (int64_t k = 0; k < M; ++k) batches.push_back(data.batch(s * M + k));
    out = sim::predict_outcome(run, batches);
    if (!out.ok) return out;
    steps.push_back(out.step_s);
  }
  out.step_s = train::quantile(steps, 0.5);
  return out;
}

int report_compare(const TrainBenchFlags& f, int64_t ranks, const train::CompareResult& res, const train::DataSource& data,
                   const std::shared_ptr<const HardwareProfile>& hw) {
  const train::CompareOptions o = compare_options(f, ranks);
  const ModelSpec spec = bench_spec(f);
  const int64_t M = o.base.micro_batches;
  const std::vector<uint64_t> expected = train::data_checksums(data, o.base.steps, M);
  const std::vector<double> imbalance = train::attention_imbalance(data, o.base.steps, M);
  const std::vector<train::CompareRow> rows = train::summarize_compare(o, res);
  nlohmann::json j = train::compare_json(o, res, rows, expected, imbalance);
  j["format"] = "distca-bench-train-compare";
  j["bench_flags"] = bench_flags_json(f);
  j["backend"] = f.backend;
  j["heap_huge_pages"] = malloc_on_huge_pages();
  j["model"] = to_json(spec);

  std::string out;
  appendf(out, "distca bench train --compare: %lld ranks = %lld replica(s) x %lld stage(s) (%s backend), 1 OpenMP thread "
               "per rank, OpenBLAS on 1 thread, %s\n",
          static_cast<long long>(ranks), static_cast<long long>(o.base.dp()), static_cast<long long>(f.pp), f.backend.c_str(),
          heap_pages());
  appendf(out, "model: width %lld, %lld layers, %lld heads (%lld K/V) x %lld, ffn %lld, vocab %lld\n",
          static_cast<long long>(spec.hidden), static_cast<long long>(spec.n_layers), static_cast<long long>(spec.n_heads),
          static_cast<long long>(spec.n_kv_heads), static_cast<long long>(spec.head_dim), static_cast<long long>(spec.ffn),
          static_cast<long long>(spec.vocab));
  appendf(out, "workload: %s, %lld tokens per rank%s, documents up to %lld, seed %lld; %lld micro-batch(es) per step\n",
          f.workload.c_str(), static_cast<long long>(f.tokens), f.pp > 1 ? " and micro-batch" : "",
          static_cast<long long>(o.base.max_doc_len), static_cast<long long>(f.seed), static_cast<long long>(M));
  appendf(out, "attention max/mean over the replicas before planning, per step:");
  for (double x : imbalance) appendf(out, " %.2f", x);
  std::vector<double> timed(imbalance.begin() + std::min<int64_t>(f.warmup_steps, static_cast<int64_t>(imbalance.size())), imbalance.end());
  appendf(out, " (timed steps: median %.2f, max %.2f)\n", train::quantile(timed, 0.5),
          timed.empty() ? 0.0 : *std::max_element(timed.begin(), timed.end()));
  appendf(out, "%d round(s) x %lld steps per mode, the first %lld of each run discarded; the same steps in every mode\n",
          f.rounds, static_cast<long long>(f.steps), static_cast<long long>(f.warmup_steps));
  appendf(out, "%-18s %8s %8s %8s %9s %10s %10s %8s %11s %6s %6s%s %8s%s\n", "mode", "step s", "p10", "p90", "tokens/s",
          "idle max/mean", "exp max/mean", "MiB/step", "peak MiB", "max/mu", "stg", res.resident ? "  resid MiB max/mu    stg" : "",
          "pingpong x", hw ? "   sim s  sim/meas" : "");
  bool same = true;
  for (size_t e = 0; e < rows.size(); ++e) {
    const train::CompareRow& r = rows[e];
    const bool docs = j["modes"][e]["same_documents"].get<bool>();
    same = same && docs;
    std::string resident;
    if (res.resident) {
      char b[64];
      std::snprintf(b, sizeof(b), "  %9s %6.3f %6.3f", mib(static_cast<double>(r.resident_max), 1).c_str(), r.resident_max_over_mean,
                    r.resident_replicas_max_over_mean);
      resident = b;
    }
    std::string sim;
    if (hw) {
      const SimFigures p = predict_entry(f, ranks, o.modes[e], data, hw);
      j["modes"][e]["sim"] = sim::to_json(p, r.median_s);
      char b[96];
      if (p.ok) {
        std::snprintf(b, sizeof(b), "  %7.3f %8.2f", p.step_s, r.median_s > 0 ? p.step_s / r.median_s : 0.0);
      } else {
        std::snprintf(b, sizeof(b), "  (simulator: %.60s)", p.error.c_str());
      }
      sim = b;
    }
    appendf(out, "%-18s %8.3f %8.3f %8.3f %9.0f %5.1f/%4.1f%% %5.1f/%4.1f%% %8.1f %11s %6.3f %6.3f%s %8.3f%s%s%s\n",
            r.label.c_str(), r.median_s, r.p10_s, r.p90_s, r.tokens_per_s, 100 * r.idle_max, 100 * r.idle_mean,
            100 * r.exposed_max, 100 * r.exposed_mean, r.attention_bytes / (1024.0 * 1024.0),
            mib(static_cast<double>(r.accounted_max), 1).c_str(), r.accounted_max_over_mean, r.accounted_replicas_max_over_mean,
            resident.c_str(),
            r.reference_speedup, sim.c_str(), docs ? "" : "  (DIFFERENT DOCUMENTS)", r.best_of_group ? "" : "  (not its group's best)");
  }
  appendf(out, "step: rank 0's wall time (ends behind the slowest rank), median and p10/p90 over the timed steps of every "
               "round; idle = 1 - (linear + attention) / step and exp = communication waited for / step, each rank's "
               "median, max and mean over ranks; MiB/step: attention exchange bytes sent by every rank, every layer, "
               "forward and backward\n");
  appendf(out, "peak MiB: the trainer's accounting of each rank's buffers at their high-water mark (parameters, gradients, "
               "AdamW moments, saved activations of the tokens it held, backward scratch, dispatcher rows), max over "
               "ranks, and max/mean across ranks; stg: max/mean within each pipeline stage across its data-parallel "
               "replicas, the largest over stages (the balance a mode controls: stages differ by schedule)%s\n",
          res.resident ? "; resid: VmHWM of each rank process, reset before every run" : "");
  appendf(out, "pingpong x: cad pingpong's speedup over each mode, the median over rounds of the round medians' ratio\n");
  appendf(out, "documents: every mode's step checksums %s the data's own\n", same ? "equal" : "DIFFER FROM");
  if (hw) {
    appendf(out, "sim: distca's simulator on each timed step's batches (hardware profile %s), median predicted step\n",
            f.hardware.c_str());
  }
  if (const int rc = write_report(f, std::move(out), j, {}); rc != kExitOk) return rc;
  if (!same) return fail(Status::internal("a mode trained on other documents than the data's (see the step checksums)"));
  return kExitOk;
}

}  // namespace

int run_compare_bench(const TrainBenchFlags& f, bool ranks_given) {
  const bool first = detect_launcher().rank <= 0;  // before the group exists only rank 0 speaks
  if (Status st = check_compare(f, ranks_given); !st.ok()) return first ? fail_input(st.message()) : kExitBadInput;
  auto loaded = load_hardware_flag(f);
  if (!loaded.ok()) return first ? fail_input(loaded.status().message()) : kExitBadInput;
  const std::shared_ptr<const HardwareProfile> hw = *loaded;
  const kernels::ScopedBlasThreads one_blas_thread(1);
  const bool mpi = f.backend == "mpi";
  comm::LaunchOptions lo{mpi ? comm::Backend::kMpi : comm::Backend::kLocal, f.ranks, {}};
  lo.mpi.timeout_s = f.mpi_timeout;
  std::optional<train::DataSource> data;
  train::CompareResult result;
  auto prepare = [&](const comm::GroupInfo& g) -> Status {
    if (mpi && g.size < 2) return Status::invalid_argument("--backend mpi needs at least 2 ranks (mpirun -np 2 ...)");
    const train::CompareOptions o = compare_options(f, g.size);
    std::vector<train::TrainConfig> configs;
    for (const train::CompareMode& m : o.modes) configs.push_back(*train::compare_config(o.base, m));
    if (Status mem = check_configs_memory(f, g.size, g.rank == 0, configs, 0, env_int("OMPI_COMM_WORLD_LOCAL_SIZE")); !mem.ok()) {
      return Status::invalid_argument(mem.message());
    }
    DISTCA_ASSIGN_OR_RETURN(ModelSpec spec, o.base.model_spec());
    DISTCA_ASSIGN_OR_RETURN(data, train::DataSource::create(o.base, spec.vocab));
    return Status::ok_status();
  };
  const comm::Launched launched = comm::launch(lo, bench_settings(f), prepare, [&](comm::Communicator& c, int) {
    const kernels::ScopedComputeThreads one_thread(1);
    return train::run_compare(c, compare_options(f, c.size()), *data, &result);
  });
  if (!launched.status.ok()) return launch_failed(launched);
  if (!launched.speaks) return kExitOk;
  return report_compare(f, launched.group.size, result, *data, hw);
}

}  // namespace distca::cli::bench_train
