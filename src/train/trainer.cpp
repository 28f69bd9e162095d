#include "distca/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <array>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>

#include "distca/comm/local.h"
#include "distca/kernels/blas.h"
#include "distca/model/llama.h"
#include "distca/model/optimizer.h"
#include "distca/plan/plan.h"
#include "distca/runtime/dispatcher.h"
#include "distca/runtime/pingpong.h"
#include "step.h"
#include "distca/train/data.h"
#include "distca/train/memory.h"

namespace distca::train {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Status fail_group(comm::Communicator& comm, const Status& st) {
  comm.fail(st);
  return st;
}

// The rank's planner (planner.h) for steps [first, config.steps): ahead or inline. Its
// functions capture copies of the plan settings and the immutable DataSource only.
std::unique_ptr<StepPlanner> start_planner(const TrainConfig& config, const RankSetup& s, int64_t first) {
  PlanContext pctx;
  pctx.sspec = s.sspec;
  pctx.sopt = s.sopt;
  pctx.pp = s.pp;
  pctx.dp = s.dp;
  pctx.micro_batches = s.micro_batches;
  pctx.pooled_ticks = config.mode == TrainMode::kCad && s.pp > 1;
  const DataSource* data = s.data;
  const int64_t M = s.micro_batches;
  return std::make_unique<StepPlanner>(
      [pctx](int64_t step, int64_t index, const std::vector<Batch>& b) { return plan_unit(pctx, step, index, b); },
      [data, M](int64_t step) { return step_batches(*data, M, step); }, pctx.units_per_step(), first, config.steps,
      config.plan_ahead == "on" ? pctx.units_per_step() : 0, kPlanWaitLimitS);
}

Result<std::unique_ptr<RankSetup>> set_up_rank(const TrainConfig& config, comm::Communicator& world,
                                               const TrainHooks& hooks) {
  auto s = std::make_unique<RankSetup>();
  s->pp = config.pp;
  s->dp = config.dp();
  s->micro_batches = config.micro_batches;
  s->stage = world.rank() / s->dp;
  s->replica = world.rank() % s->dp;
  std::vector<int> members;
  for (int64_t d = 0; d < s->dp; ++d) members.push_back(static_cast<int>(s->stage * s->dp + d));
  DISTCA_ASSIGN_OR_RETURN(s->dp_comm, comm::GroupCommunicator::create(world, std::move(members), kGroupTag));
  DISTCA_ASSIGN_OR_RETURN(s->spec, config.model_spec());
  if (hooks.data != nullptr) {
    s->data = hooks.data;
  } else {
    DISTCA_ASSIGN_OR_RETURN(DataSource d, DataSource::create(config, s->spec.vocab));
    s->own_data.emplace(std::move(d));
    s->data = &*s->own_data;
  }
  DISTCA_ASSIGN_OR_RETURN(s->sspec, parse_scheduler(config.mode == TrainMode::kCad ? config.scheduler : "colocated"));
  s->sopt.model = s->spec;
  s->sopt.dtype_bytes = 4;
  s->sopt.tolerance = config.tolerance;
  s->dims.n_heads = static_cast<int32_t>(s->spec.n_heads);
  s->dims.n_kv_heads = static_cast<int32_t>(s->spec.n_kv_heads);
  s->dims.head_dim = static_cast<int32_t>(s->spec.head_dim);
  s->sopt.align_rows = runtime::query_tile_rows(s->dims);  // cad cuts on tile boundaries: no padding
  // The planner starts before the model is built, so the first step's plans are made while
  // the parameters are initialised. The checkpoint is checked first: the first step planned
  // is its step.
  if (hooks.resume) DISTCA_RETURN_IF_ERROR(check_resume(*hooks.resume, config, model::param_count(s->spec), "--resume"));
  s->planner = start_planner(config, *s, hooks.resume ? hooks.resume->step : 0);
  s->layers = model::stage_layers(s->spec.n_layers, s->pp, s->stage);
  // Both modes run every stage in its 1F1B order (cad as one_f_one_b_ticks), so a stage holds
  // at most min(micro-batches, pp - stage) micro-batches in flight (plan/pipeline_schedule.h).
  const int64_t slots = pipeline_slots(config, s->stage);
  DISTCA_ASSIGN_OR_RETURN(auto model, model::Llama<float>::create(s->spec, config.tokens_per_rank, config.seed, {},
                                                                   s->layers, slots));
  s->model.emplace(std::move(model));
  {
    const std::vector<model::TensorInfo> full = model::param_layout(s->spec);
    for (const model::TensorInfo& ti : s->model->layout()) {
      const auto it = std::find_if(full.begin(), full.end(), [&](const model::TensorInfo& f) { return f.name == ti.name; });
      DISTCA_CHECK(it != full.end());
      s->full_tensor_index.push_back(it - full.begin());
    }
  }
  model::AdamWConfig acfg;
  acfg.weight_decay = config.weight_decay;
  DISTCA_ASSIGN_OR_RETURN(auto opt, model::AdamW::create(static_cast<int64_t>(s->model->params().size()),
                                                          model::decay_groups(s->model->layout()), acfg));
  s->opt.emplace(std::move(opt));
  s->sched.max_lr = config.lr;
  s->sched.min_lr = config.min_lr;
  s->sched.warmup_steps = std::min(config.warmup, config.steps);  // short runs: warm up all the way
  s->sched.total_steps = config.steps;
  DISTCA_RETURN_IF_ERROR(s->sched.validate());
  if (config.mode == TrainMode::kCad) s->overlap = config.overlap_or_default();
  return s;
}

// Loads a checkpoint (already checked against the run by check_resume) into the stage: the
// stage's range of the whole model's vectors.
Status restore(const TrainConfig& config, const Checkpoint& c, RankSetup& s) {
  DISTCA_RETURN_IF_ERROR(check_resume(c, config, model::param_count(s.spec), "--resume"));
  const ParamRange r = stage_param_range(s.spec, s.pp, s.stage);
  DISTCA_CHECK(r.size() == static_cast<int64_t>(s.model->params().size()));
  std::copy_n(c.params.begin() + r.first, r.size(), s.model->params().begin());
  std::copy_n(c.adam_m.begin() + r.first, r.size(), s.opt->m().begin());
  std::copy_n(c.adam_v.begin() + r.first, r.size(), s.opt->v().begin());
  s.opt->set_step_count(c.adam_step);
  s.start = c.step;
  return {};
}

bool checkpoint_due(const TrainConfig& config, int64_t step) {
  return !config.checkpoint_dir.empty() &&
         ((config.checkpoint_every > 0 && (step + 1) % config.checkpoint_every == 0) || step + 1 == config.steps);
}

// The whole model's vector on rank 0 from the stages' ranges (replica 0 of each stage sends
// its range point to point; collective over the pipeline of replica 0, a no-op copy without
// pipelines). Other ranks get an empty vector.
Result<std::vector<float>> gather_stages(comm::Communicator& world, const RankSetup& s, std::span<const float> mine,
                                         int which) {
  const int tag = kGatherTag + which;
  if (s.replica != 0) return std::vector<float>{};
  if (s.stage != 0) {
    DISTCA_ASSIGN_OR_RETURN(auto ex, world.start_send(std::as_bytes(mine), 0, tag));
    DISTCA_RETURN_IF_ERROR(ex->wait());
    return std::vector<float>{};
  }
  std::vector<float> all(static_cast<size_t>(model::param_count(s.spec)));
  std::copy(mine.begin(), mine.end(), all.begin());
  for (int64_t k = 1; k < s.pp; ++k) {
    const ParamRange r = stage_param_range(s.spec, s.pp, k);
    std::span<float> dst(all.data() + r.first, static_cast<size_t>(r.size()));
    DISTCA_ASSIGN_OR_RETURN(auto ex, world.start_recv(std::as_writable_bytes(dst), static_cast<int>(k * s.dp), tag));
    DISTCA_RETURN_IF_ERROR(ex->wait());
  }
  return all;
}

// Rank 0 writes the state after `step` (write_file_atomic: a registered temporary file, so an
// interrupted write leaves none behind); every stage's replica 0 takes part in the gather.
Result<std::string> write_step_checkpoint(const TrainConfig& config, comm::Communicator& world, const RankSetup& s,
                                          int64_t step) {
  Checkpoint c;
  DISTCA_ASSIGN_OR_RETURN(c.params, gather_stages(world, s, s.model->params(), 0));
  DISTCA_ASSIGN_OR_RETURN(c.adam_m, gather_stages(world, s, s.opt->m(), 1));
  DISTCA_ASSIGN_OR_RETURN(c.adam_v, gather_stages(world, s, s.opt->v(), 2));
  if (world.rank() != 0) return std::string();
  c.fingerprint = fingerprint(config, s.spec);
  c.step = step + 1;
  c.seed = config.seed;
  c.adam_step = s.opt->step_count();
  const std::string path = (std::filesystem::path(config.checkpoint_dir) / checkpoint_name(step + 1)).string();
  DISTCA_RETURN_IF_ERROR(write_checkpoint(path, c));
  return path;
}

// This rank's events since `from_us` on `trace`, gathered to rank 0 on one time axis: steady
// clock microseconds (shared by the processes of one machine) from the traced step's start
// (the earliest rank's).
Result<std::vector<TraceEvent>> collect_trace(comm::Communicator& comm, const TraceRecorder& trace, double from_us) {
  const double epoch_us =
      std::chrono::duration<double, std::micro>(trace.epoch().time_since_epoch()).count();
  std::vector<TraceEvent> mine;
  for (TraceEvent e : trace.events()) {
    if (e.start_us < from_us) continue;
    e.tid = comm.rank();
    e.start_us += epoch_us;
    e.end_us += epoch_us;
    mine.push_back(std::move(e));
  }
  const double zero = from_us + epoch_us;
  DISTCA_ASSIGN_OR_RETURN(std::vector<double> zeros, comm.all_gather_value(zero));
  // Time 0: the first rank to leave the barrier that starts the traced step.
  const double origin = *std::min_element(zeros.begin(), zeros.end());
  std::vector<TraceEvent> all;
  DISTCA_RETURN_IF_ERROR(runtime::gather_trace(comm, mine, &all));
  for (TraceEvent& e : all) {
    e.start_us -= origin;
    e.end_us -= origin;
  }
  return all;
}

void add_times(const StepMetrics& m, TrainResult& r) {
  r.linear_s += m.linear_s;
  r.attention_s += m.attention_s;
  r.optimizer_s += m.optimizer_s;
  r.comm_s += m.comm_s;
  r.wait_s += m.wait_s;
  r.total_s += m.seconds;
  r.plan_s += m.plan_s;
  r.plan_wait_s += m.plan_wait_s;
}

// TrainResult::accounted_peak_bytes of this rank but its dispatcher rows: parameters, gradients
// and AdamW moments, then per token the stage's saved activations for the most tokens its slots
// held at once and backward's scratch for its largest micro-batch.
int64_t accounted_peak(const RankSetup& s, const std::vector<StepMetrics>& steps) {
  int64_t live = 0, micro = 0;
  for (const StepMetrics& m : steps) {
    live = std::max(live, m.live_tokens_peak);
    micro = std::max(micro, m.micro_tokens_peak);
  }
  const model::ModelMemory mem = model::stage_memory(s.spec, s.layers, 1);
  return 4 * static_cast<int64_t>(sizeof(float) * s.model->params().size()) + mem.saved_activation_bytes_per_token * live +
         mem.scratch_bytes_per_token * micro;
}

// The body of run_training; any error it returns ends the group (fail_group).
Status train_rank(const TrainConfig& config, comm::Communicator& comm, const TrainHooks& hooks, TrainResult* result) {
  const bool lead = comm.rank() == 0;
  DISTCA_ASSIGN_OR_RETURN(auto setup, set_up_rank(config, comm, hooks));
  RankSetup& s = *setup;
  if (hooks.resume) DISTCA_RETURN_IF_ERROR(restore(config, *hooks.resume, s));
  const bool valid_outputs = s.overlap != runtime::OverlapMode::kSignal;
  if (lead && valid_outputs && !config.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(config.checkpoint_dir, ec);
    if (ec) return Status::io_error("--checkpoint-dir " + config.checkpoint_dir + ": " + ec.message());
  }
  const model::ModelMemory mem = model::model_memory(s.spec);
  // The stage's parameters, gradients and AdamW moments, and an activation workspace per slot
  // (every layer's width counted: an upper bound for a stage of fewer layers).
  const int64_t fixed_bytes = 4 * static_cast<int64_t>(sizeof(float) * s.model->params().size()) +
                              mem.activation_bytes_per_token() * config.tokens_per_rank * s.model->slots();
  int64_t peak_dispatch = 0;
  StepPlanner& planner = *s.planner;
  TrainResult local;
  std::vector<StepMetrics> own_steps;  // this rank's, for TrainResult::rank_steps
  for (int64_t step = s.start; step < config.steps; ++step) {
    const auto t_step = Clock::now();
    StepMetrics m;
    // The trace holds the run's last step: steady state, after every warm-up.
    const bool traced = !config.trace.empty() && step + 1 == config.steps;
    std::optional<TraceRecorder> own_trace;
    TraceRecorder* trace = nullptr;
    double trace_from_us = 0;
    if (traced) {
      if (hooks.trace == nullptr) own_trace.emplace();
      trace = hooks.trace != nullptr ? hooks.trace : &*own_trace;
      DISTCA_RETURN_IF_ERROR(comm.barrier());  // every rank starts the traced step together
      trace_from_us = trace->now_us();
    }
    DISTCA_RETURN_IF_ERROR(run_step(config, comm, s, planner, step, m, peak_dispatch, trace));
    if (traced) {
      DISTCA_ASSIGN_OR_RETURN(local.trace, collect_trace(comm, *trace, trace_from_us));
    }
    if (valid_outputs && checkpoint_due(config, step)) {
      DISTCA_ASSIGN_OR_RETURN(std::string path, write_step_checkpoint(config, comm, s, step));
      if (lead) {
        local.last_checkpoint = std::move(path);
        ++local.checkpoints_written;
      }
    }
    m.seconds = since(t_step);
    m.tokens_per_s = static_cast<double>(m.tokens) / m.seconds;
    add_times(m, local);
    own_steps.push_back(m);
    if (lead) {
      local.steps.push_back(m);
      if (hooks.on_step) hooks.on_step(m);
    }
  }
  DISTCA_ASSIGN_OR_RETURN(std::vector<float> final_params, gather_stages(comm, s, s.model->params(), 3));
  // Everyone's buffer estimate, for the summary, and their accounting at the high-water mark.
  DISTCA_ASSIGN_OR_RETURN(auto all, comm.all_gather_value(fixed_bytes + peak_dispatch));
  DISTCA_ASSIGN_OR_RETURN(auto accounted, comm.all_gather_value(accounted_peak(s, own_steps) + peak_dispatch));
  // Every rank's step metrics (every rank ran the same steps, so the same count).
  static_assert(std::is_trivially_copyable_v<StepMetrics>);
  const size_t n_steps = own_steps.size();
  std::vector<StepMetrics> gathered(n_steps * static_cast<size_t>(comm.size()));
  if (n_steps > 0) {
    DISTCA_RETURN_IF_ERROR(comm.all_gather(std::as_bytes(std::span<const StepMetrics>(own_steps)),
                                           std::as_writable_bytes(std::span<StepMetrics>(gathered))));
  }
  if (lead) {
    for (int r = 0; r < comm.size(); ++r) {
      const auto first = gathered.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(r) * n_steps);
      local.rank_steps.emplace_back(first, first + static_cast<std::ptrdiff_t>(n_steps));
    }
  }
  if (lead && result) {
    local.final_params = std::move(final_params);
    local.buffer_bytes = std::move(all);
    local.accounted_peak_bytes = std::move(accounted);
    local.outputs_valid = valid_outputs;
    *result = std::move(local);
  }
  return {};
}

}  // namespace

Status run_training(const TrainConfig& config, comm::Communicator& comm, const TrainHooks& hooks,
                    TrainResult* result) {
  DISTCA_RETURN_IF_ERROR(config.validate());
  if (comm.size() != config.ranks) {
    return Status::invalid_argument("--ranks " + std::to_string(config.ranks) + " does not match the " +
                                    comm.backend() + " group of " + std::to_string(comm.size()) + " ranks");
  }
  Status st = train_rank(config, comm, hooks, result);
  if (!st.ok()) return fail_group(comm, st);
  return {};
}

Status run_training_local(const TrainConfig& config, const TrainHooks& hooks, TrainResult* result) {
  DISTCA_RETURN_IF_ERROR(config.validate());
  // Ranks as threads share OpenBLAS's process-wide thread count: BLAS stays on one thread and
  // each rank computes with its own OpenMP team (the spare cores when ranks < cores; the model
  // gives the same bits for any team size). Both settings are restored afterwards.
  const kernels::ScopedBlasThreads one_blas_thread(1);
  const int threads = kernels::compute_threads_per_rank(config.ranks);
  return comm::run_local(static_cast<int>(config.ranks), [&](comm::Communicator& c) {
    const kernels::ScopedComputeThreads team(threads);  // this rank thread's team
    return run_training(config, c, hooks, c.rank() == 0 ? result : nullptr);
  });
}

}  // namespace distca::train
