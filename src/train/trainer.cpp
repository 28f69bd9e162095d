#include "distca/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "distca/comm/local.h"
#include "distca/model/llama.h"
#include "distca/model/optimizer.h"
#include "distca/plan/plan.h"
#include "distca/runtime/dispatcher.h"
#include "distca/train/data.h"

// OpenBLAS's own control (declared here rather than through cblas.h, which the model layer
// keeps private).
extern "C" void openblas_set_num_threads(int num_threads);

namespace distca::train {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct PhaseTimes {
  double attention = 0;
  double comm = 0;
};

// The model's executor contract on top of the CA dispatcher (1:1, dispatcher.h), with the
// phased calls timed separately: start/finish count as communication, serve as attention.
class DispatchExecutor final : public model::AttentionExecutor {
 public:
  DispatchExecutor(runtime::CaDispatcher& d, PhaseTimes& t) : d_(d), t_(t) {}
  model::AttentionShape shape() const override {
    const auto& dims = d_.dims();
    return {d_.n_tokens(), dims.n_heads, dims.n_kv_heads, dims.head_dim};
  }
  Status forward(int layer, const float* q, const float* k, const float* v, float* o) override {
    auto t0 = Clock::now();
    DISTCA_RETURN_IF_ERROR(d_.start_forward(layer, q, k, v, o, nullptr));
    t_.comm += since(t0);
    t0 = Clock::now();
    DISTCA_RETURN_IF_ERROR(d_.serve_forward(layer));
    t_.attention += since(t0);
    t0 = Clock::now();
    DISTCA_RETURN_IF_ERROR(d_.finish_forward(layer));
    t_.comm += since(t0);
    return {};
  }
  Status backward(int layer, const float* d_o, float* dq, float* dk, float* dv) override {
    auto t0 = Clock::now();
    DISTCA_RETURN_IF_ERROR(
        d_.start_backward(layer, d_o, dq, dk, dv, runtime::BackwardWrite::kOverwrite));
    t_.comm += since(t0);
    t0 = Clock::now();
    DISTCA_RETURN_IF_ERROR(d_.serve_backward(layer));
    t_.attention += since(t0);
    t0 = Clock::now();
    DISTCA_RETURN_IF_ERROR(d_.finish_backward(layer));
    t_.comm += since(t0);
    return {};
  }

 private:
  runtime::CaDispatcher& d_;
  PhaseTimes& t_;
};

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

Status fail_group(comm::Communicator& comm, const Status& st) {
  comm.fail(st);
  return st;
}

}  // namespace

Status run_training(const TrainConfig& config, comm::Communicator& comm, const TrainHooks& hooks,
                    TrainResult* result) {
  DISTCA_RETURN_IF_ERROR(config.validate());
  if (comm.size() != config.ranks) {
    return Status::invalid_argument("--ranks " + std::to_string(config.ranks) + " does not match the " +
                                    comm.backend() + " group of " + std::to_string(comm.size()) + " ranks");
  }
  const int rank = comm.rank();
  const bool lead = rank == 0;
  DISTCA_ASSIGN_OR_RETURN(ModelSpec spec, config.model_spec());
  DISTCA_ASSIGN_OR_RETURN(DataSource data, DataSource::create(config, spec.vocab));
  DISTCA_ASSIGN_OR_RETURN(auto model, model::Llama<float>::create(spec, config.tokens_per_rank, config.seed));
  model::AdamWConfig acfg;
  acfg.weight_decay = config.weight_decay;
  DISTCA_ASSIGN_OR_RETURN(auto opt, model::AdamW::create(model::param_count(spec),
                                                          model::decay_groups(model.layout()), acfg));
  model::LrSchedule sched;
  sched.max_lr = config.lr;
  sched.min_lr = config.min_lr;
  sched.warmup_steps = std::min(config.warmup, config.steps);  // short runs: warm up all the way
  sched.total_steps = config.steps;
  DISTCA_RETURN_IF_ERROR(sched.validate());
  DISTCA_ASSIGN_OR_RETURN(SchedulerSpec sspec,
                          parse_scheduler(config.mode == "cad" ? config.scheduler : "colocated"));
  ScheduleOptions sopt;
  sopt.model = spec;
  sopt.dtype_bytes = 4;
  sopt.tolerance = config.tolerance;
  runtime::AttentionDims dims;
  dims.n_heads = static_cast<int32_t>(spec.n_heads);
  dims.n_kv_heads = static_cast<int32_t>(spec.n_kv_heads);
  dims.head_dim = static_cast<int32_t>(spec.head_dim);
  sopt.align_rows = runtime::query_tile_rows(dims);  // cad cuts on tile boundaries: no padding

  int64_t start = 0;
  if (hooks.resume) {
    const Checkpoint& c = *hooks.resume;
    if (c.params.size() != model.params().size() || c.step > config.steps) {
      return Status::invalid_argument("--resume: checkpoint does not fit this run");
    }
    std::copy(c.params.begin(), c.params.end(), model.params().begin());
    std::copy(c.adam_m.begin(), c.adam_m.end(), opt.m().begin());
    std::copy(c.adam_v.begin(), c.adam_v.end(), opt.v().begin());
    opt.set_step_count(c.adam_step);
    start = c.step;
  }
  if (lead && !config.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(config.checkpoint_dir, ec);
    if (ec) return fail_group(comm, Status::io_error("--checkpoint-dir " + config.checkpoint_dir + ": " + ec.message()));
  }

  const model::ModelMemory mem = model::model_memory(spec);
  const int64_t fixed_bytes = 4 * mem.param_bytes + mem.activation_bytes_per_token() * config.tokens_per_rank;
  int64_t peak_dispatch = 0;
  TrainResult local;
  for (int64_t step = start; step < config.steps; ++step) {
    const auto t_step = Clock::now();
    PhaseTimes pt;
    double wait_s = 0, comm_s = 0;
    const Batch batch = data.batch(step);
    const RankInputs in = data.rank_inputs(step, batch, rank);
    auto plan = make_plan(batch, sspec, sopt);
    if (!plan.ok()) return fail_group(comm, plan.status().with_context("step " + std::to_string(step)));
    peak_dispatch = std::max(peak_dispatch, dispatcher_bytes(*plan, rank, spec.n_layers));
    auto disp = runtime::CaDispatcher::create(comm, *plan, dims);
    if (!disp.ok()) return fail_group(comm, disp.status());
    DispatchExecutor exec(**disp, pt);

    int64_t local_count = 0;
    for (int32_t t : in.targets) local_count += t >= 0 ? 1 : 0;
    auto t0 = Clock::now();
    double count = static_cast<double>(local_count);
    Status st = comm.all_reduce_sum(std::span<double>(&count, 1));
    if (!st.ok()) return fail_group(comm, st);
    comm_s += since(t0);

    model.zero_grads();
    t0 = Clock::now();
    auto loss = model.forward_backward(in.view(), exec, 1.0 / count);
    const double fb_s = since(t0);
    if (!loss.ok()) return fail_group(comm, loss.status().with_context("step " + std::to_string(step)));

    t0 = Clock::now();
    st = comm.barrier();
    if (!st.ok()) return fail_group(comm, st);
    wait_s += since(t0);
    t0 = Clock::now();
    st = comm.all_reduce_sum(model.grads());
    if (!st.ok()) return fail_group(comm, st);
    double sums[3] = {loss->loss_sum, loss->report_sum, loss->report_weight};
    st = comm.all_reduce_sum(std::span<double>(sums, 3));
    if (!st.ok()) return fail_group(comm, st);
    comm_s += since(t0);

    t0 = Clock::now();
    const double norm = model::clip_grad_norm(model.grads(), config.clip);
    const double lr = sched.at(step);
    if (!std::isfinite(norm)) {
      return fail_group(comm, Status::internal("step " + std::to_string(step) + ": gradient norm is not finite (diverged; lower --lr)"));
    }
    st = opt.step(model.params(), model.grads(), lr);
    if (!st.ok()) return fail_group(comm, st);
    const double opt_s = since(t0);

    StepMetrics m;
    m.step = step;
    m.loss = sums[0] / count;
    m.report_loss = sums[2] > 0 ? sums[1] / sums[2] : m.loss;
    m.lr = lr;
    m.grad_norm = norm;
    m.tokens = config.ranks * config.tokens_per_rank;
    m.imbalance_before = plan->metrics.load_before_max_over_mean;
    m.imbalance_after = plan->metrics.load_max_over_mean;
    m.attention_s = pt.attention;
    m.comm_s = comm_s + pt.comm;
    m.wait_s = wait_s;
    m.linear_s = fb_s - pt.attention - pt.comm + opt_s;

    if (lead && !config.checkpoint_dir.empty() &&
        ((config.checkpoint_every > 0 && (step + 1) % config.checkpoint_every == 0) ||
         step + 1 == config.steps)) {
      Checkpoint c;
      c.fingerprint = fingerprint(config, spec);
      c.step = step + 1;
      c.seed = config.seed;
      c.adam_step = opt.step_count();
      c.params.assign(model.params().begin(), model.params().end());
      c.adam_m.assign(opt.m().begin(), opt.m().end());
      c.adam_v.assign(opt.v().begin(), opt.v().end());
      char name[64];
      std::snprintf(name, sizeof(name), "step-%08lld.ckpt", static_cast<long long>(step + 1));
      const std::string path = (std::filesystem::path(config.checkpoint_dir) / name).string();
      st = write_checkpoint(path, c);
      if (!st.ok()) return fail_group(comm, st);
      ++local.checkpoints_written;
      local.last_checkpoint = path;
    }
    m.seconds = since(t_step);
    m.tokens_per_s = static_cast<double>(m.tokens) / m.seconds;
    local.linear_s += m.linear_s;
    local.attention_s += m.attention_s;
    local.comm_s += m.comm_s;
    local.wait_s += m.wait_s;
    local.total_s += m.seconds;
    if (lead) {
      local.steps.push_back(m);
      if (hooks.on_step) hooks.on_step(m);
    }
  }
  // Everyone's buffer estimate, for the summary.
  const int64_t mine = fixed_bytes + peak_dispatch;
  auto all = comm.all_gather_value(mine);
  if (!all.ok()) return fail_group(comm, all.status());
  if (lead && result) {
    local.final_params.assign(model.params().begin(), model.params().end());
    local.buffer_bytes = std::move(*all);
    *result = std::move(local);
  }
  return {};
}

void use_single_blas_thread() { openblas_set_num_threads(1); }

Status run_training_local(const TrainConfig& config, const TrainHooks& hooks, TrainResult* result) {
  DISTCA_RETURN_IF_ERROR(config.validate());
  // Ranks as threads share OpenBLAS's thread count; one thread per rank keeps the bits those
  // of an mpi run (one single-threaded OpenBLAS per process).
  use_single_blas_thread();
  return comm::run_local(static_cast<int>(config.ranks), [&](comm::Communicator& c) {
    return run_training(config, c, hooks, c.rank() == 0 ? result : nullptr);
  });
}

}  // namespace distca::train
