// One optimizer step of one rank: the stage's 1F1B order of the step's micro-batches, each
// through the ping-pong runner, then the reductions and the optimizer (src/train/step.h).
#include "step.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "distca/plan/plan.h"
#include "distca/plan/pool.h"
#include "distca/plan/pipeline_schedule.h"
#include "distca/runtime/tick_runner.h"
#include "distca/train/memory.h"

namespace distca::train {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Bytes of the dispatcher's row buffers for one micro-batch of `plan` on `rank` (an estimate:
// the received Q and K/V rows kept for every layer until backward, plus one layer's send
// buffers).
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

// Which of the step's plans the runner's dispatchers hold (single-stream: the whole plan).
std::vector<const Plan*> running_plans(const NanoPlans& np, runtime::OverlapMode mode) {
  if (mode == runtime::OverlapMode::kSingleStream) return {&np.full};
  return {&np.nano[0], &np.nano[1]};
}

// The stage's layer phases as the runner's linear work (runtime/pingpong.h, LinearFn): runner
// layer l is model layer first + l; the rows of nano-batch x are rows[x] of the micro-batch's
// token buffer (nano 0 first). The head runs on the last stage only; elsewhere the runner's
// last forward call ends with post-CA of the stage's last layer (its output goes to the next
// stage) and its first backward call starts from the received output gradient.
runtime::LinearFn stage_linear(model::Llama<float>& model, const model::StageRange& layers, bool head,
                               const std::array<model::RowRange, 2>& rows, double grad_scale) {
  const int first = static_cast<int>(layers.first);
  const int n = static_cast<int>(layers.last - layers.first);
  return [&model, rows, grad_scale, first, n, head](int x, int l, bool backward) {
    const model::RowRange r = rows[static_cast<size_t>(x)];
    if (r.size() == 0) return;
    if (!backward) {
      if (l > 0) model.forward_post(first + l - 1, r);
      if (l < n) model.forward_pre(first + l, r);
      else if (head) model.forward_head(r);
      return;
    }
    if (l < n) model.backward_pre(first + l, r);
    else if (head) model.backward_head(r, grad_scale);
    if (l > 0) model.backward_post(first + l - 1, r);
  };
}

// One micro-batch on this stage, from its forward to its backward.
struct Micro {
  std::optional<NanoPlans> plans;
  RankInputs in;
  std::array<model::RowRange, 2> rows{};
  std::unique_ptr<runtime::PingPongRunner> runner;
  int64_t slot = 0;
  std::vector<float> grad_out;                 // (n, hidden): the input gradient sent back
  std::unique_ptr<comm::Exchange> send_fwd, send_bwd;
  int64_t tokens() const { return rows[1].end; }
};

// Adds a micro-batch's loss sums to the step's.
void add_loss(model::StepLoss& step, const model::StepLoss& mb) {
  step.loss_sum += mb.loss_sum;
  step.count += mb.count;
  step.report_sum += mb.report_sum;
  step.report_weight += mb.report_weight;
}

// The step's micro-batches: their batches into `batches` (planner.h, step_batches) and one
// Micro each into `mbs`; returns the global target count: every document's tokens but its
// last, over all micro-batches and replicas (every rank computes it from the data alone).
double load_micro_batches(const RankSetup& s, int64_t step, std::vector<Batch>& batches, std::vector<Micro>& mbs) {
  const int64_t M = s.micro_batches;
  mbs = std::vector<Micro>(static_cast<size_t>(M));
  batches = step_batches(*s.data, M, step);
  double count = 0;
  for (const Batch& batch : batches) {
    for (const auto& pieces : batch.per_rank) {
      for (const Piece& p : pieces) count += static_cast<double>(p.len - (p.offset + p.len == p.doc_len ? 1 : 0));
    }
  }
  return count;
}

// Blocks on `ex`, adding the time to `waited`.
Status wait_for(comm::Exchange& ex, double& waited) {
  const auto t0 = Clock::now();
  Status st = ex.wait();
  waited += since(t0);
  return st;
}

// What a step's pipeline phase measured, for finish_step.
struct StepPhases {
  // linear: the runners' linear callbacks; rest: the step's other compute outside the runners
  // (embedding, head, copies of pipeline messages).
  double waited = 0, linear = 0, attention = 0, rest = 0;
  double imbalance_before = 1, imbalance_after = 1;
  int64_t bytes = 0;
};

// The end of every step: barrier, the data-parallel gradient all-reduce of the stage, the
// losses and the global norm over every rank, clipping and AdamW (not in signal mode).
Status finish_step(const TrainConfig& config, comm::Communicator& world, RankSetup& s, int64_t step,
                   const model::StepLoss& loss, double count, const StepPhases& ph, StepMetrics& m) {
  auto& model = *s.model;
  comm::Communicator& dpc = *s.dp_comm;
  const std::string at = "step " + std::to_string(step);
  double wait_s = 0, comm_s = 0;
  auto t0 = Clock::now();
  DISTCA_RETURN_IF_ERROR(world.barrier());
  wait_s += since(t0);
  t0 = Clock::now();
  DISTCA_RETURN_IF_ERROR(dpc.all_reduce_sum(model.grads()));
  // Only the last stage holds losses; the other ranks add zeros, which is exact.
  double sums[3] = {loss.loss_sum, loss.report_sum, loss.report_weight};
  DISTCA_RETURN_IF_ERROR(world.all_reduce_sum(std::span<double>(sums, 3)));
  // The global norm over every stage: each tensor's squared norm from replica 0 of its stage.
  const std::vector<model::TensorInfo>& mine = model.layout();
  std::vector<double> squares(static_cast<size_t>(9 * s.spec.n_layers + 3), 0.0);
  if (s.replica == 0) {
    for (size_t i = 0; i < mine.size(); ++i) {
      const model::TensorInfo& ti = mine[i];
      squares[static_cast<size_t>(s.full_tensor_index[i])] =
          model::squared_norm(std::span<const float>(model.grads().data() + ti.offset, static_cast<size_t>(ti.size())));
    }
  }
  DISTCA_RETURN_IF_ERROR(world.all_reduce_sum(std::span<double>(squares)));
  comm_s += since(t0);

  t0 = Clock::now();
  const double norm = model::norm_from_tensor_squares(squares);
  const double lr = s.sched.at(step);
  const bool valid = s.overlap != runtime::OverlapMode::kSignal;
  if (valid) {
    if (!std::isfinite(norm)) {
      return Status::internal(at + ": gradient norm is not finite (diverged; lower --lr)");
    }
    model::clip_to_norm(model.grads(), norm, config.clip);
    DISTCA_RETURN_IF_ERROR(s.opt->step(model.params(), model.grads(), lr));
  }
  const double opt_s = since(t0);

  m.step = step;
  m.loss = sums[0] / count;
  m.report_loss = sums[2] > 0 ? sums[1] / sums[2] : m.loss;
  m.lr = lr;
  m.grad_norm = norm;
  m.tokens = config.dp() * config.tokens_per_rank * s.micro_batches;
  m.imbalance_before = ph.imbalance_before;
  m.imbalance_after = ph.imbalance_after;
  m.bytes_sent = ph.bytes;
  m.attention_s = ph.attention;
  m.comm_s = comm_s + ph.waited;
  m.wait_s = wait_s;
  m.linear_s = ph.linear + ph.rest;
  m.optimizer_s = opt_s;
  return {};
}


}  // namespace

ParamRange stage_param_range(const ModelSpec& spec, int64_t pp, int64_t k) {
  const std::vector<model::TensorInfo> layout = model::param_layout(spec);
  const int64_t total = layout.back().offset + layout.back().size();
  // Tensor 1 + 9 l is layer l's attn_norm, the first tensor of the layer (llama.h layout).
  auto layer_start = [&](int64_t l) { return layout[static_cast<size_t>(1 + 9 * l)].offset; };
  const model::StageRange r = model::stage_layers(spec.n_layers, pp, k);
  ParamRange out;
  out.first = k == 0 ? 0 : layer_start(r.first);
  out.end = k == pp - 1 ? total : layer_start(r.last);
  return out;
}

// Takes unit `index` of `step` from the planner, adding its times to the step's metrics.
Result<PlanUnit> take_plan(StepPlanner& planner, int64_t step, int64_t index, const std::vector<Batch>& batches,
                           StepMetrics& m) {
  double waited = 0;
  Result<PlanUnit> unit = planner.next(step, index, batches, &waited);
  m.plan_wait_s += waited;
  if (unit.ok()) m.plan_s += unit->seconds;
  return unit;
}

Status run_step(const TrainConfig& config, comm::Communicator& world, RankSetup& s, StepPlanner& planner,
                int64_t step, StepMetrics& m, int64_t& peak_dispatch, TraceRecorder* trace) {
  auto& model = *s.model;
  comm::Communicator& dpc = *s.dp_comm;
  const int64_t P = s.pp, M = s.micro_batches, stage = s.stage;
  const bool head = stage == P - 1;
  const int hidden = static_cast<int>(s.spec.hidden);
  const int prev = stage > 0 ? static_cast<int>((stage - 1) * s.dp + s.replica) : -1;
  const int next = head ? -1 : static_cast<int>((stage + 1) * s.dp + s.replica);
  const std::string at = "step " + std::to_string(step);
  double waited = 0, linear = 0, attention = 0, rest = 0;

  std::vector<Batch> batches;
  std::vector<Micro> mbs;
  const double count = load_micro_batches(s, step, batches, mbs);
  const double grad_scale = 1.0 / count;

  const int L = static_cast<int>(s.layers.last - s.layers.first);
  std::vector<runtime::LayerForward> fw;
  std::vector<runtime::LayerBackward> bw;
  model.zero_grads();
  const std::vector<PipeOp> ops = one_f_one_b(P, M)[static_cast<size_t>(stage)];
  const auto t_pipe = Clock::now();
  model::StepLoss loss;
  double imbalance_before = 1, imbalance_after = 1;
  int64_t bytes = 0;
  for (const PipeOp& op : ops) {
    Micro& u = mbs[static_cast<size_t>(op.microbatch)];
    const int tag = static_cast<int>(2 * op.microbatch);
    if (!op.backward) {
      // 1F1B runs the forwards in micro-batch order on every stage: the planner's order.
      DISTCA_ASSIGN_OR_RETURN(PlanUnit unit, take_plan(planner, step, op.microbatch, batches, m));
      u.plans.emplace(std::move(*unit.micro));
      const NanoPlans& plans = *u.plans;
      imbalance_before = std::max(imbalance_before, plans.full.metrics.load_before_max_over_mean);
      imbalance_after = std::max(imbalance_after, plans.full.metrics.load_max_over_mean);
      u.in = s.data->rank_inputs(step * M + op.microbatch, plans.split.batch, s.replica);
      const auto& t = plans.split.tokens[static_cast<size_t>(s.replica)];
      u.rows = {model::RowRange{0, t[0]}, model::RowRange{t[0], t[0] + t[1]}};
      const std::vector<const Plan*> running = running_plans(plans, s.overlap);
      DISTCA_RETURN_IF_ERROR(check_plan_rows(running, s.replica, dispatch_row_limits(config), step));
      int64_t kept = 0;
      for (const Plan* p : running) kept += dispatcher_bytes(*p, s.replica, L);
      peak_dispatch = std::max(peak_dispatch, kept * std::min<int64_t>(M, P - stage));
      DISTCA_ASSIGN_OR_RETURN(u.runner, runtime::PingPongRunner::create(dpc, plans, s.dims, s.overlap, trace));
      u.slot = op.microbatch % model.slots();
      DISTCA_RETURN_IF_ERROR(model.begin_step(u.in.view(), {}, static_cast<int>(u.slot)).with_context(at));
      const int64_t n = u.tokens();
      if (prev >= 0) {
        std::span<std::byte> dst(reinterpret_cast<std::byte*>(model.stage_input()), sizeof(float) * n * hidden);
        DISTCA_ASSIGN_OR_RETURN(auto r, world.start_recv(dst, prev, tag));
        DISTCA_RETURN_IF_ERROR(wait_for(*r, waited).with_context(at + ": activations from rank " + std::to_string(prev)));
      }
      fw.clear();
      for (int l = 0; l < L; ++l) {
        const model::LayerAttentionIo<float> io = model.attention_io(static_cast<int>(s.layers.first) + l);
        fw.push_back({io.q, io.k, io.v, io.o, nullptr});
      }
      Status st = u.runner->forward(fw, stage_linear(model, s.layers, head, u.rows, grad_scale));
      if (!st.ok()) return st.with_context(at + ", forward");
      if (next >= 0) {
        std::span<const std::byte> src(reinterpret_cast<const std::byte*>(model.stage_output()), sizeof(float) * n * hidden);
        DISTCA_ASSIGN_OR_RETURN(u.send_fwd, world.start_send(src, next, tag));
      }
      if (head) {
        add_loss(loss, model.step_loss());
      }
      continue;
    }
    const int64_t n = u.tokens();
    model.select_slot(static_cast<int>(u.slot));
    if (next >= 0) {
      // The activations sent in forward live in this slot: their send must be done before
      // the slot is reused, and it is done once the next stage has sent the gradient back.
      std::span<std::byte> dst(reinterpret_cast<std::byte*>(model.stage_output_grad()), sizeof(float) * n * hidden);
      DISTCA_ASSIGN_OR_RETURN(auto r, world.start_recv(dst, next, tag + 1));
      DISTCA_RETURN_IF_ERROR(wait_for(*r, waited).with_context(at + ": gradients from rank " + std::to_string(next)));
      DISTCA_RETURN_IF_ERROR(wait_for(*u.send_fwd, waited).with_context(at));
    }
    bw.clear();
    for (int l = 0; l < L; ++l) {
      const model::LayerAttentionIo<float> io = model.attention_io(static_cast<int>(s.layers.first) + l);
      bw.push_back({io.d_o, io.dq, io.dk, io.dv});
    }
    Status st = u.runner->backward(bw, stage_linear(model, s.layers, head, u.rows, grad_scale));
    if (!st.ok()) return st.with_context(at + ", backward");
    if (prev >= 0) {
      // The model's input gradient lives in shared scratch: send a copy.
      u.grad_out.assign(model.stage_input_grad(), model.stage_input_grad() + n * hidden);
      std::span<const std::byte> src(reinterpret_cast<const std::byte*>(u.grad_out.data()), sizeof(float) * n * hidden);
      DISTCA_ASSIGN_OR_RETURN(u.send_bwd, world.start_send(src, prev, tag + 1));
    }
    const runtime::RunnerTimes rt = u.runner->times();
    linear += rt.linear;
    waited += rt.waited;
    attention += rt.attention;
    bytes += u.runner->last_bytes_sent();
    if (op.microbatch + 1 == M) m.nano_tokens = {u.rows[0].size(), u.rows[1].size()};
    u.runner.reset();
    u.plans.reset();
  }
  for (Micro& u : mbs) {
    if (u.send_bwd) DISTCA_RETURN_IF_ERROR(wait_for(*u.send_bwd, waited).with_context(at));
  }
  rest = std::max(0.0, since(t_pipe) - linear - waited - attention);  // embedding, copies

  StepPhases ph{waited, linear, attention, rest, imbalance_before, imbalance_after, bytes};
  return finish_step(config, world, s, step, loss, count, ph, m);
}

namespace {

// The rank's pieces of a pooled split batch with the member's own document ids, in the
// split's order: the micro-batch's token layout on this rank.
std::vector<Piece> own_pieces(const PooledBatch& pool, const Batch& split, int64_t rank) {
  std::vector<Piece> out = split.per_rank[static_cast<size_t>(rank)];
  for (Piece& p : out) p.doc = pool.original_doc(p.doc);
  return out;
}

}  // namespace

// CAD under pipelines: the global ticks of one_f_one_b_ticks (1F1B's slots). In a
// tick each stage runs at most one op, a forward or a backward; the tick's forwards are one
// pooled batch over every rank of the job (plan/pool.h) and its backwards another, planned
// apart and run by one TickRunner pass (runtime/tick_runner.h) that interleaves the two
// directions' layer steps, so every rank - forward, backward, or idle (it only serves) -
// takes part in every exchange. Servers are stateless: a micro-batch's backward is pooled
// with other micro-batches than its forward, so its dispatcher adopts the forward's outputs
// (CaDispatcher::adopt_forward); the forward's LSE stays with the home rows (one buffer per
// layer and slot). Activations and gradients travel between stages point to point as in
// 1F1B, sent in one tick and received in a later one.
Status run_step_pooled_ticks(const TrainConfig& config, comm::Communicator& world, RankSetup& s, StepPlanner& planner,
                              int64_t step, StepMetrics& m, int64_t& peak_dispatch, TraceRecorder* trace) {
  auto& model = *s.model;
  const int64_t P = s.pp, M = s.micro_batches, stage = s.stage;
  const int rank = world.rank();
  const bool head = stage == P - 1;
  const int hidden = static_cast<int>(s.spec.hidden);
  const int prev = stage > 0 ? static_cast<int>((stage - 1) * s.dp + s.replica) : -1;
  const int next = head ? -1 : static_cast<int>((stage + 1) * s.dp + s.replica);
  const std::string at = "step " + std::to_string(step);
  const int L = static_cast<int>(s.layers.last - s.layers.first);
  const int64_t H = s.spec.n_heads;

  std::vector<Batch> batches;
  std::vector<Micro> mbs;
  const double count = load_micro_batches(s, step, batches, mbs);
  std::vector<std::vector<Piece>> layout(static_cast<size_t>(M));  // the F tick's local pieces
  const double grad_scale = 1.0 / count;
  // Slots: the lowest free one at a micro-batch's forward, freed by its backward.
  std::vector<bool> busy(static_cast<size_t>(model.slots()), false);
  // The forward's LSE of this rank's rows, per slot: (layers, tokens_per_rank, n_heads).
  if (s.lse.size() != busy.size()) s.lse.assign(busy.size(), std::vector<float>(static_cast<size_t>(L * config.tokens_per_rank * H)));
  std::vector<float> idle(1, 0.0f);  // the buffers of a rank without rows (never read)

  model.zero_grads();
  model::StepLoss loss;
  StepPhases ph;
  const auto t_pipe = Clock::now();
  const std::vector<std::vector<PipeOp>> ticks = one_f_one_b_ticks(P, M);
  for (size_t ti = 0; ti < ticks.size(); ++ti) {
    const PipeOp* mine = nullptr;
    for (const PipeOp& op : ticks[ti]) {
      if (op.stage == stage) mine = &op;
    }
    // The tick's forwards pooled and planned, and its backwards (planner.h, plan_unit).
    DISTCA_ASSIGN_OR_RETURN(PlanUnit unit, take_plan(planner, step, static_cast<int64_t>(ti), batches, m));
    const PlannedDirection& f = unit.forward;
    const PlannedDirection& b = unit.backward;
    std::vector<const Plan*> running;
    for (const PlannedDirection* d : {&f, &b}) {
      if (d->plans) {
        ph.imbalance_before = std::max(ph.imbalance_before, d->plans->full.metrics.load_before_max_over_mean);
        ph.imbalance_after = std::max(ph.imbalance_after, d->plans->full.metrics.load_max_over_mean);
        for (const Plan* p : running_plans(*d->plans, s.overlap)) running.push_back(p);
      }
    }
    DISTCA_RETURN_IF_ERROR(check_plan_rows(running, rank, dispatch_row_limits(config), step));
    // Stateless servers: one layer's rows at a time (the LSE buffers are counted with the slots).
    int64_t kept = 0;
    for (const Plan* p : running) kept += dispatcher_bytes(*p, rank, 1);
    peak_dispatch = std::max(peak_dispatch, kept + static_cast<int64_t>(s.lse.size() * s.lse.front().size() * sizeof(float)));
    DISTCA_ASSIGN_OR_RETURN(auto runner,
                            runtime::TickRunner::create(world, f.plans ? &*f.plans : nullptr, b.plans ? &*b.plans : nullptr,
                                                        s.dims, s.overlap, trace));
    const runtime::LayerForward dummy_f{idle.data(), idle.data(), idle.data(), idle.data(), idle.data()};
    const runtime::LayerBackward dummy_b{idle.data(), idle.data(), idle.data(), idle.data()};
    std::vector<runtime::LayerForward> fw(static_cast<size_t>(L), dummy_f), adopt(fw);
    std::vector<runtime::LayerBackward> bw(static_cast<size_t>(L), dummy_b);
    runtime::LinearFn linear_f, linear_b;  // none on a rank without an op in that direction
    Micro* u = mine != nullptr ? &mbs[static_cast<size_t>(mine->microbatch)] : nullptr;
    const int tag = mine != nullptr ? static_cast<int>(2 * mine->microbatch) : 0;
    if (u != nullptr) {
      const PlannedDirection& d = mine->backward ? b : f;
      const auto& t = d.plans->split.tokens[static_cast<size_t>(rank)];
      const std::array<model::RowRange, 2> rows{model::RowRange{0, t[0]}, model::RowRange{t[0], t[0] + t[1]}};
      if (!mine->backward) {
        layout[static_cast<size_t>(mine->microbatch)] = own_pieces(*d.pool, d.plans->split.batch, rank);
        Batch local = batches[static_cast<size_t>(mine->microbatch)];
        local.per_rank[static_cast<size_t>(s.replica)] = layout[static_cast<size_t>(mine->microbatch)];
        u->in = s.data->rank_inputs(step * M + mine->microbatch, local, s.replica);
        u->rows = rows;
        u->slot = std::find(busy.begin(), busy.end(), false) - busy.begin();
        DISTCA_CHECK(u->slot < static_cast<int64_t>(busy.size()));
        busy[static_cast<size_t>(u->slot)] = true;
        DISTCA_RETURN_IF_ERROR(model.begin_step(u->in.view(), {}, static_cast<int>(u->slot)).with_context(at));
        if (prev >= 0) {
          std::span<std::byte> dst(reinterpret_cast<std::byte*>(model.stage_input()), sizeof(float) * u->tokens() * hidden);
          DISTCA_ASSIGN_OR_RETURN(auto r, world.start_recv(dst, prev, tag));
          DISTCA_RETURN_IF_ERROR(wait_for(*r, ph.waited).with_context(at + ": activations from rank " + std::to_string(prev)));
        }
      } else {
        // The backward's pooled split must lay the micro-batch's rows out as its forward did.
        if (own_pieces(*d.pool, d.plans->split.batch, rank) != layout[static_cast<size_t>(mine->microbatch)]) {
          return Status::internal(at + ": micro-batch " + std::to_string(mine->microbatch) +
                                  " is split differently in its backward tick than in its forward tick");
        }
        model.select_slot(static_cast<int>(u->slot));
        if (next >= 0) {
          std::span<std::byte> dst(reinterpret_cast<std::byte*>(model.stage_output_grad()), sizeof(float) * u->tokens() * hidden);
          DISTCA_ASSIGN_OR_RETURN(auto r, world.start_recv(dst, next, tag + 1));
          DISTCA_RETURN_IF_ERROR(wait_for(*r, ph.waited).with_context(at + ": gradients from rank " + std::to_string(next)));
          DISTCA_RETURN_IF_ERROR(wait_for(*u->send_fwd, ph.waited).with_context(at));
        }
      }
      float* lse = s.lse[static_cast<size_t>(u->slot)].data();
      for (int l = 0; l < L; ++l) {
        const model::LayerAttentionIo<float> io = model.attention_io(static_cast<int>(s.layers.first) + l);
        const runtime::LayerForward lf{io.q, io.k, io.v, io.o, lse + static_cast<int64_t>(l) * config.tokens_per_rank * H};
        (mine->backward ? adopt : fw)[static_cast<size_t>(l)] = lf;
        if (mine->backward) bw[static_cast<size_t>(l)] = {io.d_o, io.dq, io.dk, io.dv};
      }
      (mine->backward ? linear_b : linear_f) = stage_linear(model, s.layers, head, u->rows, grad_scale);
    }
    Status st = runner->run(fw, linear_f, adopt, bw, linear_b);
    if (!st.ok()) return st.with_context(at + ", tick");
    if (u != nullptr && !mine->backward) {
      if (next >= 0) {
        std::span<const std::byte> src(reinterpret_cast<const std::byte*>(model.stage_output()), sizeof(float) * u->tokens() * hidden);
        DISTCA_ASSIGN_OR_RETURN(u->send_fwd, world.start_send(src, next, tag));
      }
      if (head) {
        add_loss(loss, model.step_loss());
      }
    } else if (u != nullptr) {
      if (prev >= 0) {
        const int64_t n = u->tokens();
        u->grad_out.assign(model.stage_input_grad(), model.stage_input_grad() + n * hidden);
        std::span<const std::byte> src(reinterpret_cast<const std::byte*>(u->grad_out.data()), sizeof(float) * n * hidden);
        DISTCA_ASSIGN_OR_RETURN(u->send_bwd, world.start_send(src, prev, tag + 1));
      }
      busy[static_cast<size_t>(u->slot)] = false;
      if (mine->microbatch + 1 == M) m.nano_tokens = {u->rows[0].size(), u->rows[1].size()};
    }
    const runtime::RunnerTimes rt = runner->times();
    ph.linear += rt.linear;
    ph.waited += rt.waited;
    ph.attention += rt.attention;
    ph.bytes += runner->last_bytes_sent();
  }
  for (Micro& x : mbs) {
    if (x.send_bwd) DISTCA_RETURN_IF_ERROR(wait_for(*x.send_bwd, ph.waited).with_context(at));
  }
  ph.rest = std::max(0.0, since(t_pipe) - ph.linear - ph.waited - ph.attention);
  return finish_step(config, world, s, step, loss, count, ph, m);
}

}  // namespace distca::train
