#include "distca/train/trainer.h"

#include <chrono>
#include <cmath>
#include <array>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>

#include "distca/comm/local.h"
#include "distca/kernels/blas.h"
#include "distca/model/llama.h"
#include "distca/model/optimizer.h"
#include "distca/plan/plan.h"
#include "distca/runtime/dispatcher.h"
#include "distca/runtime/pingpong.h"
#include "distca/train/data.h"
#include "distca/train/memory.h"

namespace distca::train {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Bytes of the dispatcher's row buffers for one step of `plan` on `rank` (an estimate: the
// received Q and K/V rows kept for every layer until backward, plus one layer's send buffers).
int64_t dispatcher_bytes(const Plan& plan, int64_t rank, int64_t n_layers) {
  const RankPlan& rp = plan.ranks[static_cast<size_t>(rank)];
  int64_t kept = 0, send = 0;
  for (int e = 0; e < kNumExchanges; ++e) {
    const Exchange& x = rp.exchanges[static_cast<size_t>(e)];
    send += x.send_rows() * x.row_bytes;
    if (e <= static_cast<int>(ExchangeKind::kKv)) kept += x.recv_rows() * x.row_bytes;
  }
  return n_layers * kept + send;
}

// The memory estimate (memory.h) bounds every rank's dispatcher rows, summed over the plans
// whose dispatchers live at once (ping and pong); a step past the bound would make the
// estimate a lie, so the step fails instead of allocating it.
Status check_plan_rows(const std::vector<const Plan*>& plans, int64_t rank, const DispatchRowLimits& limits,
                       int64_t step) {
  int64_t q = 0, kv = 0;
  for (const Plan* plan : plans) {
    const RankPlan& rp = plan->ranks[static_cast<size_t>(rank)];
    const ServerPlan& sp = plan->servers[static_cast<size_t>(rank)];
    q += std::max(rp.exchange(ExchangeKind::kQ).recv_rows(),
                  sp.cu_seqlens_q.empty() ? int64_t{0} : int64_t{sp.cu_seqlens_q.back()});
    kv += std::max(rp.exchange(ExchangeKind::kKv).recv_rows(),
                   sp.cu_seqlens_k.empty() ? int64_t{0} : int64_t{sp.cu_seqlens_k.back()});
  }
  if (q > limits.q || kv > limits.kv) {
    return Status::internal("step " + std::to_string(step) + ": the plan gives rank " + std::to_string(rank) + " " +
                                 std::to_string(q) + " query and " + std::to_string(kv) +
                                 " context rows, more than the memory estimate allows (" + std::to_string(limits.q) +
                                 " and " + std::to_string(limits.kv) + ")");
  }
  return {};
}

Status fail_group(comm::Communicator& comm, const Status& st) {
  comm.fail(st);
  return st;
}

// Everything a rank builds before its first step.
struct RankSetup {
  ModelSpec spec;
  std::optional<DataSource> own_data;  // when the hooks bring none
  const DataSource* data = nullptr;
  std::optional<model::Llama<float>> model;
  std::optional<model::AdamW> opt;
  model::LrSchedule sched;
  SchedulerSpec sspec;
  ScheduleOptions sopt;
  runtime::AttentionDims dims;
  runtime::OverlapMode overlap = runtime::OverlapMode::kSingleStream;  // colocated: one exchange per layer
  int64_t start = 0;  // first step to run
};

Result<std::unique_ptr<RankSetup>> set_up_rank(const TrainConfig& config, const TrainHooks& hooks) {
  auto s = std::make_unique<RankSetup>();
  DISTCA_ASSIGN_OR_RETURN(s->spec, config.model_spec());
  if (hooks.data != nullptr) {
    s->data = hooks.data;
  } else {
    DISTCA_ASSIGN_OR_RETURN(DataSource d, DataSource::create(config, s->spec.vocab));
    s->own_data.emplace(std::move(d));
    s->data = &*s->own_data;
  }
  DISTCA_ASSIGN_OR_RETURN(auto model, model::Llama<float>::create(s->spec, config.tokens_per_rank, config.seed));
  s->model.emplace(std::move(model));
  model::AdamWConfig acfg;
  acfg.weight_decay = config.weight_decay;
  DISTCA_ASSIGN_OR_RETURN(auto opt, model::AdamW::create(model::param_count(s->spec),
                                                          model::decay_groups(s->model->layout()), acfg));
  s->opt.emplace(std::move(opt));
  s->sched.max_lr = config.lr;
  s->sched.min_lr = config.min_lr;
  s->sched.warmup_steps = std::min(config.warmup, config.steps);  // short runs: warm up all the way
  s->sched.total_steps = config.steps;
  DISTCA_RETURN_IF_ERROR(s->sched.validate());
  DISTCA_ASSIGN_OR_RETURN(s->sspec, parse_scheduler(config.mode == "cad" ? config.scheduler : "colocated"));
  s->sopt.model = s->spec;
  s->sopt.dtype_bytes = 4;
  s->sopt.tolerance = config.tolerance;
  s->dims.n_heads = static_cast<int32_t>(s->spec.n_heads);
  s->dims.n_kv_heads = static_cast<int32_t>(s->spec.n_kv_heads);
  s->dims.head_dim = static_cast<int32_t>(s->spec.head_dim);
  s->sopt.align_rows = runtime::query_tile_rows(s->dims);  // cad cuts on tile boundaries: no padding
  if (config.mode == "cad") {
    DISTCA_ASSIGN_OR_RETURN(s->overlap, runtime::parse_overlap_mode(config.overlap_or_default(), "--overlap"));
  }
  return s;
}

// Loads a checkpoint (already checked against the run by check_resume) into the replica.
Status restore(const TrainConfig& config, const Checkpoint& c, RankSetup& s) {
  DISTCA_RETURN_IF_ERROR(check_resume(c, config, static_cast<int64_t>(s.model->params().size()), "--resume"));
  std::copy(c.params.begin(), c.params.end(), s.model->params().begin());
  std::copy(c.adam_m.begin(), c.adam_m.end(), s.opt->m().begin());
  std::copy(c.adam_v.begin(), c.adam_v.end(), s.opt->v().begin());
  s.opt->set_step_count(c.adam_step);
  s.start = c.step;
  return {};
}

// The model's layer phases as the runner's linear work (runtime/pingpong.h, LinearFn): the
// rows of nano-batch x are rows[x] of the rank's token buffer (nano 0 first).
runtime::LinearFn model_linear(model::Llama<float>& model, const std::array<model::RowRange, 2>& rows,
                               double grad_scale) {
  const int L = static_cast<int>(model.spec().n_layers);
  return [&model, rows, grad_scale, L](int x, int l, bool backward) {
    const model::RowRange r = rows[static_cast<size_t>(x)];
    if (r.size() == 0) return;
    if (!backward) {
      if (l > 0) model.forward_post(l - 1, r);
      if (l < L) model.forward_pre(l, r);
      else model.forward_head(r);
      return;
    }
    if (l == L) model.backward_head(r, grad_scale);
    else model.backward_pre(l, r);
    if (l > 0) model.backward_post(l - 1, r);
  };
}

// Which of the step's plans the runner's dispatchers hold (single-stream: the whole plan).
std::vector<const Plan*> running_plans(const runtime::NanoPlans& np, runtime::OverlapMode mode) {
  if (mode == runtime::OverlapMode::kSingleStream) return {&np.full};
  return {&np.nano[0], &np.nano[1]};
}

// One optimizer step on this rank: plan, forward/backward of the model's nano-batches through
// the ping-pong runner, gradient and loss all-reduces, clip, AdamW (not in signal mode, whose
// outputs are invalid). Fills the metrics but the step's total time.
Status run_step(const TrainConfig& config, comm::Communicator& comm, RankSetup& s, int64_t step,
                StepMetrics& m, int64_t& peak_dispatch, TraceRecorder* trace) {
  const int rank = comm.rank();
  auto& model = *s.model;
  double wait_s = 0, comm_s = 0;
  const Batch batch = s.data->batch(step);
  auto planned = runtime::plan_nano_batches(batch, s.sspec, s.sopt);
  if (!planned.ok()) return planned.status().with_context("step " + std::to_string(step));
  const runtime::NanoPlans& plans = *planned;
  // The rank's tokens in the split's order: nano 0's rows, then nano 1's.
  const RankInputs in = s.data->rank_inputs(step, plans.split.batch, rank);
  const auto& t = plans.split.tokens[static_cast<size_t>(rank)];
  const std::array<model::RowRange, 2> rows{model::RowRange{0, t[0]}, model::RowRange{t[0], t[0] + t[1]}};
  const std::vector<const Plan*> running = running_plans(plans, s.overlap);
  DISTCA_RETURN_IF_ERROR(check_plan_rows(running, rank, dispatch_row_limits(config), step));
  int64_t kept = 0;
  for (const Plan* p : running) kept += dispatcher_bytes(*p, rank, s.spec.n_layers);
  peak_dispatch = std::max(peak_dispatch, kept);
  DISTCA_ASSIGN_OR_RETURN(auto runner, runtime::PingPongRunner::create(comm, plans, s.dims, s.overlap, trace));

  int64_t local_count = 0;
  for (int32_t target : in.targets) local_count += target >= 0 ? 1 : 0;
  auto t0 = Clock::now();
  double count = static_cast<double>(local_count);
  DISTCA_RETURN_IF_ERROR(comm.all_reduce_sum(std::span<double>(&count, 1)));
  comm_s += since(t0);

  const int L = static_cast<int>(s.spec.n_layers);
  std::vector<runtime::LayerForward> fw;
  std::vector<runtime::LayerBackward> bw;
  for (int l = 0; l < L; ++l) {
    const model::LayerAttentionIo<float> io = model.attention_io(l);
    fw.push_back({io.q, io.k, io.v, io.o, nullptr});
    bw.push_back({io.d_o, io.dq, io.dk, io.dv});
  }
  model.zero_grads();
  t0 = Clock::now();
  DISTCA_RETURN_IF_ERROR(model.begin_step(in.view()).with_context("step " + std::to_string(step)));
  const runtime::LinearFn linear = model_linear(model, rows, 1.0 / count);
  Status st = runner->forward(fw, linear);
  if (!st.ok()) return st.with_context("step " + std::to_string(step) + ", forward");
  const model::StepLoss loss = model.step_loss();
  st = runner->backward(bw, linear);
  if (!st.ok()) return st.with_context("step " + std::to_string(step) + ", backward");
  const double fb_s = since(t0);
  const runtime::RunnerTimes rt = runner->times();

  t0 = Clock::now();
  DISTCA_RETURN_IF_ERROR(comm.barrier());
  wait_s += since(t0);
  t0 = Clock::now();
  DISTCA_RETURN_IF_ERROR(comm.all_reduce_sum(model.grads()));
  double sums[3] = {loss.loss_sum, loss.report_sum, loss.report_weight};
  DISTCA_RETURN_IF_ERROR(comm.all_reduce_sum(std::span<double>(sums, 3)));
  comm_s += since(t0);

  t0 = Clock::now();
  const double norm = model::clip_grad_norm(model.grads(), config.clip);
  const double lr = s.sched.at(step);
  if (runner->outputs_valid()) {
    if (!std::isfinite(norm)) {
      return Status::internal("step " + std::to_string(step) + ": gradient norm is not finite (diverged; lower --lr)");
    }
    DISTCA_RETURN_IF_ERROR(s.opt->step(model.params(), model.grads(), lr));
  }
  const double opt_s = since(t0);

  m.step = step;
  m.loss = sums[0] / count;
  m.report_loss = sums[2] > 0 ? sums[1] / sums[2] : m.loss;
  m.lr = lr;
  m.grad_norm = norm;
  m.tokens = config.ranks * config.tokens_per_rank;
  m.imbalance_before = plans.full.metrics.load_before_max_over_mean;
  m.imbalance_after = plans.full.metrics.load_max_over_mean;
  m.nano_tokens = {t[0], t[1]};
  m.bytes_sent = runner->last_bytes_sent();
  // Everything inside forward/backward that is neither linear work nor a wait for an exchange:
  // attention kernels, packing and assembling rows (the runner's "other").
  m.attention_s = rt.other;
  m.comm_s = comm_s + rt.waited;
  m.wait_s = wait_s;
  m.linear_s = std::max(0.0, fb_s - rt.other - rt.waited) + opt_s;  // begin_step's embedding included
  return {};
}

bool checkpoint_due(const TrainConfig& config, int64_t step) {
  return !config.checkpoint_dir.empty() &&
         ((config.checkpoint_every > 0 && (step + 1) % config.checkpoint_every == 0) || step + 1 == config.steps);
}

// Rank 0 writes the state after `step` (write_file_atomic: a registered temporary file, so an
// interrupted write leaves none behind).
Result<std::string> write_step_checkpoint(const TrainConfig& config, const RankSetup& s, int64_t step) {
  Checkpoint c;
  c.fingerprint = fingerprint(config, s.spec);
  c.step = step + 1;
  c.seed = config.seed;
  c.adam_step = s.opt->step_count();
  c.params.assign(s.model->params().begin(), s.model->params().end());
  c.adam_m.assign(s.opt->m().begin(), s.opt->m().end());
  c.adam_v.assign(s.opt->v().begin(), s.opt->v().end());
  char name[64];
  std::snprintf(name, sizeof(name), "step-%08lld.ckpt", static_cast<long long>(step + 1));
  const std::string path = (std::filesystem::path(config.checkpoint_dir) / name).string();
  DISTCA_RETURN_IF_ERROR(write_checkpoint(path, c));
  return path;
}

// This rank's events since `from_us` on `trace`, gathered to rank 0 on one time axis: steady
// clock microseconds (shared by the processes of one machine) from rank 0's traced-step start.
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
  std::vector<TraceEvent> all;
  DISTCA_RETURN_IF_ERROR(runtime::gather_trace(comm, mine, &all));
  for (TraceEvent& e : all) {
    e.start_us -= zeros[0];
    e.end_us -= zeros[0];
  }
  return all;
}

void add_times(const StepMetrics& m, TrainResult& r) {
  r.linear_s += m.linear_s;
  r.attention_s += m.attention_s;
  r.comm_s += m.comm_s;
  r.wait_s += m.wait_s;
  r.total_s += m.seconds;
}

// The body of run_training; any error it returns ends the group (fail_group).
Status train_rank(const TrainConfig& config, comm::Communicator& comm, const TrainHooks& hooks, TrainResult* result) {
  const bool lead = comm.rank() == 0;
  DISTCA_ASSIGN_OR_RETURN(auto setup, set_up_rank(config, hooks));
  RankSetup& s = *setup;
  if (hooks.resume) DISTCA_RETURN_IF_ERROR(restore(config, *hooks.resume, s));
  const bool valid_outputs = s.overlap != runtime::OverlapMode::kSignal;
  if (lead && valid_outputs && !config.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(config.checkpoint_dir, ec);
    if (ec) return Status::io_error("--checkpoint-dir " + config.checkpoint_dir + ": " + ec.message());
  }
  const model::ModelMemory mem = model::model_memory(s.spec);
  const int64_t fixed_bytes = 4 * mem.param_bytes + mem.activation_bytes_per_token() * config.tokens_per_rank;
  int64_t peak_dispatch = 0;
  TrainResult local;
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
    DISTCA_RETURN_IF_ERROR(run_step(config, comm, s, step, m, peak_dispatch, trace));
    if (traced) {
      DISTCA_ASSIGN_OR_RETURN(local.trace, collect_trace(comm, *trace, trace_from_us));
    }
    if (lead && valid_outputs && checkpoint_due(config, step)) {
      DISTCA_ASSIGN_OR_RETURN(local.last_checkpoint, write_step_checkpoint(config, s, step));
      ++local.checkpoints_written;
    }
    m.seconds = since(t_step);
    m.tokens_per_s = static_cast<double>(m.tokens) / m.seconds;
    add_times(m, local);
    if (lead) {
      local.steps.push_back(m);
      if (hooks.on_step) hooks.on_step(m);
    }
  }
  // Everyone's buffer estimate, for the summary.
  DISTCA_ASSIGN_OR_RETURN(auto all, comm.all_gather_value(fixed_bytes + peak_dispatch));
  if (lead && result) {
    local.final_params.assign(s.model->params().begin(), s.model->params().end());
    local.buffer_bytes = std::move(all);
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
