// One optimizer step of one rank: the stage's program (its 1F1B order with each op's messages)
// run tick by tick through the runner, then the reductions and the optimizer (src/train/step.h).
#include "step.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "distca/model/tensor_parallel.h"
#include "distca/plan/plan.h"
#include "distca/plan/pool.h"
#include "distca/plan/pipeline_schedule.h"
#include "distca/runtime/tick_runner.h"
#include "distca/train/cp_attention.h"
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

// The same for the CP runner of wlb and percp (memory.h, cp_row_limits): its rows are bounded
// for every layout, so a failure here is a broken bound, not a bad input.
Status check_cp_rows(const CpAttention& att, int64_t rank, const CpRowLimits& limits, int64_t step) {
  if (att.gathered_rows() > limits.gathered || att.context_rows() > limits.context || att.query_rows() > limits.query) {
    return Status::internal("step " + std::to_string(step) + ": the layout gives rank " + std::to_string(rank) + " " +
                            std::to_string(att.gathered_rows()) + " gathered, " + std::to_string(att.context_rows()) +
                            " context and " + std::to_string(att.query_rows()) +
                            " query rows, more than the memory estimate allows (" + std::to_string(limits.gathered) +
                            ", " + std::to_string(limits.context) + " and " + std::to_string(limits.query) + ")");
  }
  return {};
}

// Which of the step's plans the runner's dispatchers hold (single-stream: the whole plan).
std::vector<const Plan*> running_plans(const NanoPlans& np, runtime::OverlapMode mode) {
  if (mode == runtime::OverlapMode::kSingleStream) return {&np.full};
  return {&np.nano[0], &np.nano[1]};
}

// The stage's layer phases as the runner's linear work (runtime/tick_runner.h, LinearFn): runner
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

// The rank's pieces of a split batch with the micro-batch's own document ids (a pooled batch
// numbers them apart, plan/pool.h), in the split's order: the micro-batch's token layout here.
std::vector<Piece> own_pieces(const PooledBatch* pool, const Batch& split, int64_t rank) {
  std::vector<Piece> out = split.per_rank[static_cast<size_t>(rank)];
  if (pool != nullptr) {
    for (Piece& p : out) p.doc = pool->original_doc(p.doc);
  }
  return out;
}

// One micro-batch on this stage, from its forward to its backward.
struct Micro {
  RankInputs in;
  std::vector<Piece> layout;  // own_pieces at its forward
  std::array<model::RowRange, 2> rows{};
  int64_t slot = 0;
  std::optional<NanoPlans> plans;      // a micro-batch's own runner: its plans
  std::unique_ptr<runtime::TickRunner> runner;  // and the runner, from its forward to its backward
  std::unique_ptr<CpRunner> cp_runner;          // wlb, percp: the runner (CP through collectives)
  std::vector<float> grad_out;                  // (n, hidden): the input gradient sent back
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

// The runner of a micro-batch or a tick: the dispatcher's, or in wlb and percp the CP runner.
struct RunnerRef {
  runtime::TickRunner* tick = nullptr;
  CpRunner* cp = nullptr;
  Status run(const runtime::TickIo& io) const { return cp != nullptr ? cp->run(io) : tick->run(io); }
  runtime::RunnerTimes times() const { return cp != nullptr ? cp->times() : tick->times(); }
  int64_t last_bytes_sent() const { return cp != nullptr ? cp->last_bytes_sent() : tick->last_bytes_sent(); }
};

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
  // runner_waited: the part of waited the runners blocked on attention's communication.
  double waited = 0, linear = 0, attention = 0, rest = 0, runner_waited = 0;
  // TP collectives inside linear and rest (TimedCommunicator): moved to comm by finish_step.
  double tp = 0;
  int64_t tp_bytes = 0;
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
  // TP: the replicated tensors' gradients are partial over the TP rank's rows until summed.
  DISTCA_RETURN_IF_ERROR(model.sync_replicated_grads());
  DISTCA_RETURN_IF_ERROR(dpc.all_reduce_sum(model.grads()));
  // Only the last stage holds losses; the other ranks add zeros, which is exact. TP: each TP
  // rank's sums cover its rows, so the TP group adds them up.
  double sums[3] = {loss.loss_sum, loss.report_sum, loss.report_weight};
  DISTCA_RETURN_IF_ERROR(world.all_reduce_sum(std::span<double>(sums, 3)));
  if (s.tp != nullptr) DISTCA_RETURN_IF_ERROR(s.tp->all_reduce_sum(std::span<double>(sums, 3)));
  // The global norm over every stage: each tensor's squared norm from replica 0 of its stage;
  // TP: a sharded tensor's from every TP rank (summed over the TP group), a replicated one's
  // from TP rank 0.
  const std::vector<model::TensorInfo>& mine = model.layout();
  std::vector<double> squares(static_cast<size_t>(9 * s.spec.n_layers + 3), 0.0);
  if (s.replica == 0) {
    for (size_t i = 0; i < mine.size(); ++i) {
      const model::TensorInfo& ti = mine[i];
      if (s.tp != nullptr && s.tp->rank() != 0 && !model::tp_sharded(ti)) continue;
      squares[static_cast<size_t>(s.full_tensor_index[i])] =
          model::squared_norm(std::span<const float>(model.grads().data() + ti.offset, static_cast<size_t>(ti.size())));
    }
  }
  DISTCA_RETURN_IF_ERROR(world.all_reduce_sum(std::span<double>(squares)));
  if (s.tp != nullptr) DISTCA_RETURN_IF_ERROR(s.tp->all_reduce_sum(std::span<double>(squares)));
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
  m.comm_s = comm_s + ph.waited + ph.tp;
  m.attention_comm_s = ph.runner_waited;
  m.wait_s = wait_s;
  m.linear_s = std::max(0.0, ph.linear + ph.rest - ph.tp);
  m.tp_comm_s = ph.tp;
  m.tp_bytes_sent = ph.tp_bytes;
  m.optimizer_s = opt_s;
  return {};
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

// For each tick of the step, the step of the stage's program this rank runs in it (-1: none).
// A micro-batch with its own runner makes every program step a tick of its own; pooled ticks
// are those of one_f_one_b_ticks, in which every stage runs its program in order.
std::vector<int64_t> program_ticks(const StageProgram& program, const RankSetup& s, bool pooled) {
  std::vector<int64_t> out;
  if (!pooled) {
    for (size_t i = 0; i < program.size(); ++i) out.push_back(static_cast<int64_t>(i));
    return out;
  }
  size_t next = 0;
  for (const std::vector<PipeOp>& tick : one_f_one_b_ticks(s.pp, s.micro_batches)) {
    int64_t k = -1;
    for (const PipeOp& op : tick) {
      if (op.stage != s.stage) continue;
      DISTCA_CHECK(next < program.size() && program[next].op == op);
      k = static_cast<int64_t>(next++);
    }
    out.push_back(k);
  }
  DISTCA_CHECK(next == program.size());
  return out;
}

// One step of one rank. Two ways to plan and run the core attention (trainer.h):
//   - per micro-batch (colocated, or cad without pipelines): each micro-batch's plans and
//     runner live from its forward to its backward, on the stage's data-parallel group;
//   - pooled ticks (cad with pp > 1): in each tick of one_f_one_b_ticks every stage runs at
//     most one op; the tick's forwards are one pooled batch over every rank of the job
//     (plan/pool.h) and its backwards another, planned apart and run by one runner pass that
//     interleaves the two directions, so every rank - forward, backward, or idle (it only
//     serves) - takes part in every exchange. Servers are stateless: a micro-batch's backward
//     is pooled with other micro-batches than its forward, so it adopts the forward's outputs;
//     the forward's LSE stays with the home rows (one buffer per layer and slot).
// Either way the stage runs its program: before an op the message it needs (activations from
// the previous stage, or the output gradient from the next), after it the message it posts.
class StepRun {
 public:
  StepRun(const TrainConfig& config, comm::Communicator& world, RankSetup& s, StepPlanner& planner, int64_t step,
          StepMetrics& m, int64_t& peak_dispatch, TraceRecorder* trace)
      : config_(config), world_(world), s_(s), planner_(planner), step_(step), m_(m), peak_dispatch_(peak_dispatch),
        trace_(trace), pooled_(config.mode == TrainMode::kCad && s.pp > 1),
        collective_cp_(config.mode == TrainMode::kWlb || config.mode == TrainMode::kPerCp),
        at_("step " + std::to_string(step)),
        layers_(static_cast<int>(s.layers.last - s.layers.first)) {
    count_ = load_micro_batches(s, step, batches_, mbs_);
    busy_.assign(static_cast<size_t>(s.model->slots()), false);
    // The forward's LSE of this rank's rows, per slot: (layers, tokens_per_rank, its heads).
    if (pooled_ && s.lse.size() != busy_.size()) {
      s.lse.assign(busy_.size(), std::vector<float>(static_cast<size_t>(layers_ * config.tokens_per_rank * s.dims.n_heads)));
    }
  }

  Status run() {
    const StageProgram program = one_f_one_b_programs(s_.pp, s_.micro_batches)[static_cast<size_t>(s_.stage)];
    const std::vector<int64_t> ticks = program_ticks(program, s_, pooled_);
    s_.model->zero_grads();
    const auto t_pipe = Clock::now();
    const double tp0 = s_.tp_timed != nullptr ? s_.tp_timed->seconds() : 0.0;
    const int64_t tp_bytes0 = s_.tp_timed != nullptr ? s_.tp_timed->bytes_sent() : 0;
    for (size_t t = 0; t < ticks.size(); ++t) {
      const StageStep* mine = ticks[t] >= 0 ? &program[static_cast<size_t>(ticks[t])] : nullptr;
      DISTCA_ASSIGN_OR_RETURN(const RunnerRef runner, runner_of(static_cast<int64_t>(t), mine));
      if (mine != nullptr) DISTCA_RETURN_IF_ERROR(begin_op(*mine));
      Status st = runner.run(tick_io(mine));
      if (!st.ok()) return st.with_context(at_ + (mine == nullptr ? ", tick" : mine->op.backward ? ", backward" : ", forward"));
      if (mine != nullptr) DISTCA_RETURN_IF_ERROR(end_op(*mine));
      if (pooled_ || mine->op.backward) {  // the runner is done: fold its times, drop it
        const runtime::RunnerTimes rt = runner.times();
        ph_.linear += rt.linear;
        ph_.waited += rt.waited;
        ph_.runner_waited += rt.waited;
        ph_.attention += rt.attention;
        ph_.bytes += runner.last_bytes_sent();
        if (pooled_) {
          tick_runner_.reset();
        } else {
          Micro& u = mbs_[static_cast<size_t>(mine->op.microbatch)];
          if (u.cp_runner) {
            peak_dispatch_ = std::max(peak_dispatch_, u.cp_runner->peak_buffer_bytes() *
                                                          std::min<int64_t>(s_.micro_batches, s_.pp - s_.stage));
          }
          u.runner.reset();
          u.cp_runner.reset();
          u.plans.reset();
        }
      }
    }
    for (Micro& u : mbs_) {
      if (u.send_bwd) DISTCA_RETURN_IF_ERROR(wait_for(*u.send_bwd, ph_.waited).with_context(at_));
    }
    ph_.rest = std::max(0.0, since(t_pipe) - ph_.linear - ph_.waited - ph_.attention);  // embedding, copies
    if (s_.tp_timed != nullptr) {  // inside the linear callbacks and the embedding and head (rest)
      ph_.tp = s_.tp_timed->seconds() - tp0;
      ph_.tp_bytes = s_.tp_timed->bytes_sent() - tp_bytes0;
    }
    return finish_step(config_, world_, s_, step_, loss_, count_, ph_, m_);
  }

 private:
  int rank_of_stage(int64_t stage) const { return static_cast<int>(stage * s_.dp + s_.replica); }

  // Folds the planned micro-batches' or directions' metrics into the step's, checks their rows
  // against the memory estimate and records the dispatcher bytes they keep. `rank`: this
  // rank's index in the plans.
  Status account(const std::vector<const NanoPlans*>& planned, int64_t rank) {
    std::vector<const Plan*> running;
    for (const NanoPlans* p : planned) {
      ph_.imbalance_before = std::max(ph_.imbalance_before, p->full.metrics.load_before_max_over_mean);
      ph_.imbalance_after = std::max(ph_.imbalance_after, p->full.metrics.load_max_over_mean);
      for (const Plan* r : running_plans(*p, s_.overlap)) running.push_back(r);
    }
    if (collective_cp_) return {};  // the CP runner's own rows are checked and counted instead
    DISTCA_RETURN_IF_ERROR(check_plan_rows(running, rank, dispatch_row_limits(config_), step_));
    int64_t kept = 0;
    if (pooled_) {  // stateless servers: one layer's rows at a time (the LSE buffers with the slots)
      for (const Plan* p : running) kept += dispatcher_bytes(*p, rank, 1);
      peak_dispatch_ = std::max(peak_dispatch_, kept + static_cast<int64_t>(s_.lse.size() * s_.lse.front().size() * sizeof(float)));
    } else {
      for (const Plan* p : running) kept += dispatcher_bytes(*p, rank, layers_);
      peak_dispatch_ = std::max(peak_dispatch_, kept * std::min<int64_t>(s_.micro_batches, s_.pp - s_.stage));
    }
    return {};
  }

  // The runner of tick t: a micro-batch's own (made at its forward, its plans being the
  // planner's unit of that micro-batch: 1F1B runs the forwards in micro-batch order on every
  // stage), or the tick's (its unit the tick's pooled directions).
  // wlb and percp: the CP runner over the plan's layout (the colocated plan sizes and checks
  // the rows; the dispatcher does not run).
  Result<RunnerRef> runner_of(int64_t t, const StageStep* mine) {
    if (!pooled_) {
      Micro& u = mbs_[static_cast<size_t>(mine->op.microbatch)];
      if (mine->op.backward) return RunnerRef{u.runner.get(), u.cp_runner.get()};
      DISTCA_ASSIGN_OR_RETURN(PlanUnit unit, take_plan(planner_, step_, mine->op.microbatch, batches_, m_));
      u.plans.emplace(std::move(*unit.micro));
      DISTCA_RETURN_IF_ERROR(account({&*u.plans}, s_.replica));
      if (collective_cp_) {
        DISTCA_ASSIGN_OR_RETURN(CpAttention att, CpAttention::create(u.plans->split.batch, s_.replica, config_.cp, s_.dims, layers_));
        DISTCA_RETURN_IF_ERROR(check_cp_rows(att, s_.replica, cp_row_limits(config_), step_));
        u.cp_runner = std::make_unique<CpRunner>(std::move(att), *s_.cp_comm, *s_.dp_comm, trace_, world_.rank());
        return RunnerRef{nullptr, u.cp_runner.get()};
      }
      DISTCA_ASSIGN_OR_RETURN(u.runner, runtime::TickRunner::create(*s_.dp_comm, *u.plans, s_.dims, s_.overlap, trace_,
                                                                    false, unit.kv_once));
      return RunnerRef{u.runner.get(), nullptr};
    }
    DISTCA_ASSIGN_OR_RETURN(unit_, take_plan(planner_, step_, t, batches_, m_));
    const NanoPlans* f = unit_.forward.plans ? &*unit_.forward.plans : nullptr;
    const NanoPlans* b = unit_.backward.plans ? &*unit_.backward.plans : nullptr;
    std::vector<const NanoPlans*> planned;
    for (const NanoPlans* p : {f, b}) {
      if (p != nullptr) planned.push_back(p);
    }
    DISTCA_RETURN_IF_ERROR(account(planned, world_.rank()));
    DISTCA_ASSIGN_OR_RETURN(tick_runner_, runtime::TickRunner::create_tick(world_, f, b, s_.dims, s_.overlap, trace_,
                                                                            unit_.kv_once));
    return RunnerRef{tick_runner_.get(), nullptr};
  }

  // The plans this rank's op runs on, their pool (pooled ticks) and this rank's index in them.
  const NanoPlans& op_plans(const StageStep& st, const PooledBatch** pool, int64_t* rank) const {
    if (!pooled_) {
      *pool = nullptr;
      *rank = s_.replica;
      return *mbs_[static_cast<size_t>(st.op.microbatch)].plans;
    }
    const PlannedDirection& d = st.op.backward ? unit_.backward : unit_.forward;
    *pool = &*d.pool;
    *rank = world_.rank();
    return *d.plans;
  }

  // Before the op: the micro-batch's rows and slot, then the message it needs.
  Status begin_op(const StageStep& st) {
    auto& model = *s_.model;
    Micro& u = mbs_[static_cast<size_t>(st.op.microbatch)];
    const PooledBatch* pool = nullptr;
    int64_t rank = 0;
    const NanoPlans& plans = op_plans(st, &pool, &rank);
    std::vector<Piece> layout = own_pieces(pool, plans.split.batch, rank);
    if (!st.op.backward) {
      u.layout = std::move(layout);
      u.in = layout_inputs(st.op.microbatch, u.layout);
      m_.input_checksum += inputs_checksum(u.in.tokens, u.in.positions);
      const auto& t = plans.split.tokens[static_cast<size_t>(rank)];
      u.rows = {model::RowRange{0, t[0]}, model::RowRange{t[0], t[0] + t[1]}};
      s_.peak_tokens = std::max(s_.peak_tokens, u.tokens());
      live_tokens_ += u.tokens();
      m_.live_tokens_peak = std::max(m_.live_tokens_peak, live_tokens_);
      m_.micro_tokens_peak = std::max(m_.micro_tokens_peak, u.tokens());
      // Slots: the lowest free one at a micro-batch's forward, freed by its backward.
      u.slot = std::find(busy_.begin(), busy_.end(), false) - busy_.begin();
      DISTCA_CHECK(u.slot < static_cast<int64_t>(busy_.size()));
      busy_[static_cast<size_t>(u.slot)] = true;
      // TP: every TP rank holds an even share of each nano-batch's rows (Llama::begin_step's
      // sp_cut), so no rank's sequence-parallel work keeps its peers waiting at a collective.
      // Pipeline stages keep the uncut split: a stage's neighbours must hold the same rows.
      const int64_t sp_cut = s_.pp == 1 ? u.rows[0].end : 0;
      DISTCA_RETURN_IF_ERROR(model.begin_step(u.in.view(), {}, static_cast<int>(u.slot), sp_cut).with_context(at_));
    } else {
      // The backward's split must lay the micro-batch's rows out as its forward did.
      if (layout != u.layout) {
        return Status::internal(at_ + ": micro-batch " + std::to_string(st.op.microbatch) +
                                " is split differently in its backward tick than in its forward tick");
      }
      model.select_slot(static_cast<int>(u.slot));
    }
    if (!st.recv) return {};
    const P2pMessage& msg = *st.recv;
    const int peer = rank_of_stage(msg.from);
    // TP: the rank's rows of the boundary only, from the same TP index of the other stage.
    float* dst = msg.gradient ? model.stage_output_grad() : model.stage_input();
    std::span<std::byte> bytes(reinterpret_cast<std::byte*>(dst), sizeof(float) * model.boundary_row_count() * s_.spec.hidden);
    DISTCA_ASSIGN_OR_RETURN(auto r, world_.start_recv(bytes, peer, static_cast<int>(msg.tag)));
    DISTCA_RETURN_IF_ERROR(wait_for(*r, ph_.waited)
                               .with_context(at_ + (msg.gradient ? ": gradients" : ": activations") + " from rank " +
                                             std::to_string(peer)));
    // The activations sent in forward live in this slot: their send must be done before the
    // slot is reused, and it is done once the next stage has sent the gradient back.
    if (msg.gradient) DISTCA_RETURN_IF_ERROR(wait_for(*u.send_fwd, ph_.waited).with_context(at_));
    return {};
  }

  // The inputs of micro-batch `mb`'s rows laid as `layout`: each piece's tokens from the
  // micro-batch the loader drew its document in (another one when wlb re-packs across
  // micro-batches: its id says which, plan/chunking.h micro_doc_id).
  RankInputs layout_inputs(int64_t mb, const std::vector<Piece>& layout) const {
    const int64_t M = s_.micro_batches;
    const auto r = static_cast<size_t>(s_.replica);
    if (!repacks_across_micro_batches(config_.mode, s_.pp, M)) {
      Batch local = batches_[static_cast<size_t>(mb)];
      local.per_rank[r] = layout;
      return s_.data->rank_inputs(step_ * M + mb, local, s_.replica);
    }
    RankInputs in;
    for (const Piece& p : layout) {
      const int64_t origin = p.doc % M;
      Batch local = batches_[static_cast<size_t>(origin)];
      local.per_rank[r] = {Piece{p.doc / M, p.offset, p.len, p.doc_len}};
      RankInputs part = s_.data->rank_inputs(step_ * M + origin, local, s_.replica);
      in.tokens.insert(in.tokens.end(), part.tokens.begin(), part.tokens.end());
      in.positions.insert(in.positions.end(), part.positions.begin(), part.positions.end());
      in.targets.insert(in.targets.end(), part.targets.begin(), part.targets.end());
      in.report_weights.insert(in.report_weights.end(), part.report_weights.begin(), part.report_weights.end());
    }
    return in;
  }

  // The runner's buffers: the op's direction from the model, every other direction the runner
  // has (pooled ticks) with placeholders (this rank has no rows there; it only serves).
  runtime::TickIo tick_io(const StageStep* mine) {
    runtime::TickIo io;
    const size_t L = static_cast<size_t>(layers_);
    if (pooled_) {
      float* idle = idle_.data();
      const runtime::LayerForward f{idle, idle, idle, idle, idle, 0};
      if (unit_.forward.plans) io.forward.assign(L, f);
      if (unit_.backward.plans) {
        io.backward.assign(L, runtime::LayerBackward{idle, idle, idle, idle, 0});
        io.adopt.assign(L, f);
      }
    }
    if (mine == nullptr) return io;
    auto& model = *s_.model;
    const Micro& u = mbs_[static_cast<size_t>(mine->op.microbatch)];
    float* lse = pooled_ ? s_.lse[static_cast<size_t>(u.slot)].data() : nullptr;
    // A layer's LSE slot holds tokens_per_rank rows (the runner checks the rest against `rows`).
    DISTCA_CHECK_MSG(lse == nullptr || u.tokens() <= config_.tokens_per_rank,
                     at_ + ": a micro-batch's rows outgrow its LSE slot");
    std::vector<runtime::LayerForward> fw(L);
    std::vector<runtime::LayerBackward> bw(L);
    for (size_t l = 0; l < L; ++l) {
      const model::LayerAttentionIo<float> a = model.attention_io(static_cast<int>(s_.layers.first + static_cast<int64_t>(l)));
      fw[l] = {a.q, a.k, a.v, a.o, lse ? lse + static_cast<int64_t>(l) * config_.tokens_per_rank * s_.dims.n_heads : nullptr,
               u.tokens()};
      bw[l] = {a.d_o, a.dq, a.dk, a.dv, u.tokens()};
    }
    runtime::LinearFn linear = stage_linear(model, s_.layers, s_.stage == s_.pp - 1, u.rows, 1.0 / count_);
    if (!mine->op.backward) {
      io.forward = std::move(fw);
      io.linear_forward = std::move(linear);
    } else {
      io.backward = std::move(bw);
      io.linear_backward = std::move(linear);
      if (pooled_) io.adopt = std::move(fw);
    }
    return io;
  }

  // After the op: the message it posts, the loss (last stage's forwards), the slot freed.
  Status end_op(const StageStep& st) {
    auto& model = *s_.model;
    Micro& u = mbs_[static_cast<size_t>(st.op.microbatch)];
    const int64_t n = model.boundary_row_count() * s_.spec.hidden;  // TP: the rank's rows
    if (!st.op.backward) {
      if (st.send) {
        std::span<const std::byte> src(reinterpret_cast<const std::byte*>(model.stage_output()), sizeof(float) * n);
        DISTCA_ASSIGN_OR_RETURN(u.send_fwd, world_.start_send(src, rank_of_stage(st.send->to), static_cast<int>(st.send->tag)));
      }
      if (s_.stage == s_.pp - 1) add_loss(loss_, model.step_loss());
      return {};
    }
    if (st.send) {
      // The model's input gradient lives in shared scratch: send a copy.
      u.grad_out.assign(model.stage_input_grad(), model.stage_input_grad() + n);
      std::span<const std::byte> src(reinterpret_cast<const std::byte*>(u.grad_out.data()), sizeof(float) * n);
      DISTCA_ASSIGN_OR_RETURN(u.send_bwd, world_.start_send(src, rank_of_stage(st.send->to), static_cast<int>(st.send->tag)));
    }
    busy_[static_cast<size_t>(u.slot)] = false;
    live_tokens_ -= u.tokens();
    if (st.op.microbatch + 1 == s_.micro_batches) m_.nano_tokens = {u.rows[0].size(), u.rows[1].size()};
    return {};
  }

  const TrainConfig& config_;
  comm::Communicator& world_;
  RankSetup& s_;
  StepPlanner& planner_;
  const int64_t step_;
  StepMetrics& m_;
  int64_t& peak_dispatch_;
  TraceRecorder* trace_;
  const bool pooled_;  // cad with pp > 1
  const bool collective_cp_;  // wlb, percp: attention through the CP runner
  const std::string at_;
  const int layers_;   // this stage's
  std::vector<Batch> batches_;
  std::vector<Micro> mbs_;
  double count_ = 0;   // the global target count (load_micro_batches)
  std::vector<bool> busy_;  // [slot]
  int64_t live_tokens_ = 0;  // tokens of the micro-batches between their forward and backward
  model::StepLoss loss_;
  StepPhases ph_;
  std::vector<float> idle_ = std::vector<float>(1, 0.0f);  // the buffers of a rank without rows (never read)
  // Pooled ticks: the current tick's unit and runner (destroyed first: it refers to the unit).
  PlanUnit unit_;
  std::unique_ptr<runtime::TickRunner> tick_runner_;
};

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

Status run_step(const TrainConfig& config, comm::Communicator& world, RankSetup& s, StepPlanner& planner,
                int64_t step, StepMetrics& m, int64_t& peak_dispatch, TraceRecorder* trace) {
  return StepRun(config, world, s, planner, step, m, peak_dispatch, trace).run();
}

}  // namespace distca::train
