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

#include "distca/comm/group.h"
#include "distca/comm/local.h"
#include "distca/kernels/blas.h"
#include "distca/model/llama.h"
#include "distca/model/optimizer.h"
#include "distca/cost/hardware_profile.h"
#include "distca/train/wlb_profile.h"
#include "distca/plan/auto_tolerance.h"
#include "distca/model/tensor_parallel.h"
#include "distca/plan/plan.h"
#include "distca/plan/topology.h"
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
  pctx.auto_table = s.auto_table;
  pctx.auto_model = s.auto_model;
  pctx.tolerance_auto = s.tolerance_auto;
  pctx.kv_once = s.kv_once;
  pctx.relayout = config.mode;
  pctx.chunking = s.chunking;
  pctx.chunking_table = s.chunking_table;
  const DataSource* data = s.data;
  const int64_t M = s.micro_batches;
  return std::make_unique<StepPlanner>(
      [pctx](int64_t step, int64_t index, const std::vector<Batch>& b) { return plan_unit(pctx, step, index, b); },
      [data, M](int64_t step) { return step_batches(*data, M, step); }, pctx.units_per_step(), first, config.steps,
      config.plan_ahead == "on" ? pctx.units_per_step() : 0, kPlanWaitLimitS);
}

// The planner's topology (explicit, or MPI's shared-memory split: collective, every rank
// calls it at the same point) and the --tolerance auto model (its profile read by every rank).
Status set_up_topology(const TrainConfig& config, comm::Communicator& world, RankSetup& s) {
  if (config.host_map == "mpi") {
    DISTCA_ASSIGN_OR_RETURN(s.sopt.topology.host, world.host_ids());
    if (config.inter_host_price != 0) s.sopt.topology.inter_host_price = config.inter_host_price;
  } else {
    DISTCA_ASSIGN_OR_RETURN(s.sopt.topology, topology_from_flags(config.ranks_per_host, config.host_map,
                                                                 config.inter_host_price, config.ranks));
  }
  s.tolerance_auto = config.tolerance_auto;
  s.kv_once = config.kv_once;
  if (!config.tolerance_auto && config.kv_once != "auto") return {};
  DISTCA_ASSIGN_OR_RETURN(HardwareProfile profile, load_hardware_profile(config.hardware));
  std::unique_ptr<AttentionCostModel> table;
  DISTCA_ASSIGN_OR_RETURN(AutoToleranceModel m,
                          auto_tolerance_model(profile, s.sopt.topology,
                                               config.overlap_or_default() != runtime::OverlapMode::kSingleStream, &table));
  s.auto_table = std::move(table);
  s.auto_model = std::make_shared<const AutoToleranceModel>(m);
  return {};
}

Result<std::unique_ptr<RankSetup>> set_up_rank(const TrainConfig& config, comm::Communicator& world,
                                               TimedCommunicator* tp, const TrainHooks& hooks) {
  auto s = std::make_unique<RankSetup>();
  s->tp = tp;
  s->tp_timed = tp;
  s->lead = world.rank() == 0 && (tp == nullptr || tp->rank() == 0);
  s->pp = config.pp;
  s->dp = config.dp();
  s->micro_batches = config.micro_batches;
  s->stage = world.rank() / s->dp;
  s->replica = world.rank() % s->dp;
  std::vector<int> members;
  for (int64_t d = 0; d < s->dp; ++d) members.push_back(static_cast<int>(s->stage * s->dp + d));
  if (config.mode == TrainMode::kWlb || config.mode == TrainMode::kPerCp) {
    const int64_t g0 = s->replica / config.cp * config.cp;
    std::vector<int> cp_members;
    for (int64_t i = 0; i < config.cp; ++i) cp_members.push_back(static_cast<int>(s->stage * s->dp + g0 + i));
    DISTCA_ASSIGN_OR_RETURN(s->cp_comm, comm::GroupCommunicator::create(world, std::move(cp_members), kCpTag));
  }
  DISTCA_ASSIGN_OR_RETURN(s->dp_comm, comm::GroupCommunicator::create(world, std::move(members), kGroupTag));
  DISTCA_ASSIGN_OR_RETURN(s->spec, config.model_spec());
  if (hooks.data != nullptr) {
    s->data = hooks.data;
  } else {
    DISTCA_ASSIGN_OR_RETURN(DataSource d, DataSource::create(config, s->spec.vocab));
    s->own_data.emplace(std::move(d));
    s->data = &*s->own_data;
  }
  // wlb and percp re-lay the batch (PlanContext::relayout); their attention runs through the
  // CP group's collectives (train/cp_attention.h), the colocated plan sizing and checking it.
  DISTCA_ASSIGN_OR_RETURN(s->sspec, parse_scheduler(config.mode == TrainMode::kCad ? config.scheduler : "colocated"));
  // TP: the plans and the dispatcher move the TP rank's heads only; every TP rank of a group
  // makes the same plans from the same batch.
  ModelSpec rank_heads = s->spec;
  rank_heads.n_heads /= config.tp;
  rank_heads.n_kv_heads /= config.tp;
  s->sopt.model = rank_heads;
  s->sopt.dtype_bytes = 4;
  s->sopt.tolerance = config.tolerance;
  s->dims.n_heads = static_cast<int32_t>(rank_heads.n_heads);
  s->dims.n_kv_heads = static_cast<int32_t>(rank_heads.n_kv_heads);
  s->dims.head_dim = static_cast<int32_t>(s->spec.head_dim);
  s->sopt.align_rows = runtime::query_tile_rows(s->dims);  // cad cuts on tile boundaries: no padding
  DISTCA_RETURN_IF_ERROR(set_up_topology(config, world, *s));
  s->chunking = chunking_options(config, s->spec, s->sopt.align_rows);
  if (config.mode == TrainMode::kWlb && !config.hardware.empty()) {
    DISTCA_ASSIGN_OR_RETURN(s->chunking, load_profiled_chunking(config.hardware, s->spec, s->chunking, &s->chunking_table));
  }
  // The planner starts before the model is built, so the first step's plans are made while
  // the parameters are initialised. The checkpoint is checked first: the first step planned
  // is its step.
  if (hooks.resume) DISTCA_RETURN_IF_ERROR(check_resume(*hooks.resume, config, model::param_count(s->spec), "--resume"));
  s->planner = start_planner(config, *s, hooks.resume ? hooks.resume->step : 0);
  s->layers = model::stage_layers(s->spec.n_layers, s->pp, s->stage);
  // Both modes run every stage in its 1F1B order (cad as one_f_one_b_ticks), so a stage holds
  // at most min(micro-batches, pp - stage) micro-batches in flight (plan/pipeline_schedule.h).
  const int64_t slots = pipeline_slots(config, s->stage);
  model::LlamaOptions model_options;
  model_options.tp_overlap = config.tp_overlap == "on";
  DISTCA_ASSIGN_OR_RETURN(auto model, model::Llama<float>::create(s->spec, config.rank_capacity(), config.seed, model_options,
                                                                   s->layers, slots, tp));
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

// The TP rank's share of the whole model's vector (model::tp_param_layout), of which the
// stage holds the range from model.param_offset().
std::vector<float> tp_whole_shard(const RankSetup& s) {
  const std::vector<model::TensorInfo> l = model::tp_param_layout(s.spec, s.tp->size(), s.tp->rank());
  return std::vector<float>(static_cast<size_t>(l.back().offset + l.back().size()), 0.0f);
}

// TP: the stage's part of the rank's shard of `full` (the whole model's vector) into `dst`.
void tp_shard_stage(const RankSetup& s, const std::vector<float>& full, std::span<float> dst) {
  std::vector<float> shard = tp_whole_shard(s);
  model::tp_shard_params<float>(s.spec, model::tp_dims(s.spec, s.tp->size(), s.tp->rank()), full.data(),
                                shard.data());
  std::copy_n(shard.begin() + s.model->param_offset(), dst.size(), dst.begin());
}

// Loads a checkpoint (already checked against the run by check_resume) into the stage: the
// stage's range of the whole model's vectors.
Status restore(const TrainConfig& config, const Checkpoint& c, RankSetup& s) {
  DISTCA_RETURN_IF_ERROR(check_resume(c, config, model::param_count(s.spec), "--resume"));
  if (s.tp != nullptr) {  // the whole model's vectors, sharded: the stage's range of the shard
    tp_shard_stage(s, c.params, s.model->params());
    tp_shard_stage(s, c.adam_m, s.opt->m());
    tp_shard_stage(s, c.adam_v, s.opt->v());
  } else {
    const ParamRange r = stage_param_range(s.spec, s.pp, s.stage);
    DISTCA_CHECK(r.size() == static_cast<int64_t>(s.model->params().size()));
    std::copy_n(c.params.begin() + r.first, r.size(), s.model->params().begin());
    std::copy_n(c.adam_m.begin() + r.first, r.size(), s.opt->m().begin());
    std::copy_n(c.adam_v.begin() + r.first, r.size(), s.opt->v().begin());
  }
  s.opt->set_step_count(c.adam_step);
  s.start = c.step;
  return {};
}

bool checkpoint_due(const TrainConfig& config, int64_t step) {
  return !config.checkpoint_dir.empty() &&
         ((config.checkpoint_every > 0 && (step + 1) % config.checkpoint_every == 0) || step + 1 == config.steps);
}

// TP: the stage's tensors in the whole model's vector (zeros elsewhere) from the TP group's
// shards, on every TP rank of the stage: each rank writes its slices into zeros (a replicated
// tensor from TP rank 0 only), and the sum over the group, x + 0 = x, is exact.
Result<std::vector<float>> gather_tp(const RankSetup& s, std::span<const float> mine) {
  std::vector<float> shard = tp_whole_shard(s);
  std::copy(mine.begin(), mine.end(), shard.begin() + s.model->param_offset());
  std::vector<float> all(static_cast<size_t>(model::param_count(s.spec)), 0.0f);
  model::tp_unshard_params<float>(s.spec, model::tp_dims(s.spec, s.tp->size(), s.tp->rank()), shard.data(),
                                  all.data());
  if (s.tp->rank() != 0) {
    for (const model::TensorInfo& t : model::param_layout(s.spec)) {
      if (!model::tp_sharded(t)) std::fill_n(all.begin() + t.offset, t.size(), 0.0f);
    }
  }
  DISTCA_RETURN_IF_ERROR(s.tp->all_reduce_sum(std::span<float>(all)));
  return all;
}

// The whole model's vector on rank 0 from the stages' ranges (replica 0 of each stage sends
// its range point to point; collective over the pipeline of replica 0, a no-op copy without
// pipelines). Other ranks get an empty vector. TP: each stage's TP group first rebuilds the
// stage's range (gather_tp); TP index 0 takes part in the pipeline's gather.
Result<std::vector<float>> gather_stages(comm::Communicator& world, const RankSetup& s, std::span<const float> mine,
                                         int which) {
  const int tag = kGatherTag + which;
  if (s.replica != 0) return std::vector<float>{};
  const ParamRange own = stage_param_range(s.spec, s.pp, s.stage);
  std::vector<float> whole;
  if (s.tp != nullptr) {
    DISTCA_ASSIGN_OR_RETURN(whole, gather_tp(s, mine));
    if (s.tp->rank() != 0) return std::vector<float>{};
    mine = std::span<const float>(whole.data() + own.first, static_cast<size_t>(own.size()));
  }
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
  if (!s.lead) return std::string();
  c.fingerprint = fingerprint(config, s.spec);
  c.step = step + 1;
  c.seed = config.seed;
  c.adam_step = s.opt->step_count();
  const std::string path = (std::filesystem::path(config.checkpoint_dir) / checkpoint_name(step + 1)).string();
  DISTCA_RETURN_IF_ERROR(write_checkpoint(path, c));
  return path;
}

// This rank's events since `from_us` on `trace`, gathered to rank 0 of `world` (every rank,
// TP peers included; tid = the world rank) on one time axis: steady clock microseconds (shared
// by the processes of one machine) from the traced step's start (the earliest rank's).
Result<std::vector<TraceEvent>> collect_trace(comm::Communicator& world, const TraceRecorder& trace, double from_us) {
  const double epoch_us =
      std::chrono::duration<double, std::micro>(trace.epoch().time_since_epoch()).count();
  std::vector<TraceEvent> mine;
  for (TraceEvent e : trace.events()) {
    if (e.start_us < from_us) continue;
    e.tid = world.rank();
    e.start_us += epoch_us;
    e.end_us += epoch_us;
    mine.push_back(std::move(e));
  }
  const double zero = from_us + epoch_us;
  DISTCA_ASSIGN_OR_RETURN(std::vector<double> zeros, world.all_gather_value(zero));
  // Time 0: the first rank to leave the barrier that starts the traced step.
  const double origin = *std::min_element(zeros.begin(), zeros.end());
  std::vector<TraceEvent> all;
  DISTCA_RETURN_IF_ERROR(runtime::gather_trace(world, mine, &all));
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
  const model::ModelMemory mem = model::stage_memory(s.spec, s.layers, 1, 4, s.tp == nullptr ? 1 : s.tp->size());
  return 4 * static_cast<int64_t>(sizeof(float) * s.model->params().size()) + mem.saved_activation_bytes_per_token * live +
         mem.scratch_bytes_per_token * micro;
}

// The body of run_training; any error it returns ends the group (fail_group).
// comm: the world, or with TP the ranks of this rank's TP index (run_training); world: every
// rank, for the per-rank figures gathered at the end.
Status train_rank(const TrainConfig& config, comm::Communicator& comm, comm::Communicator& world, TimedCommunicator* tp,
                  const TrainHooks& hooks, TrainResult* result) {
  DISTCA_ASSIGN_OR_RETURN(auto setup, set_up_rank(config, comm, tp, hooks));
  RankSetup& s = *setup;
  const bool lead = s.lead;
  if (hooks.resume) DISTCA_RETURN_IF_ERROR(restore(config, *hooks.resume, s));
  const bool valid_outputs = s.overlap != runtime::OverlapMode::kSignal;
  if (lead && valid_outputs && !config.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(config.checkpoint_dir, ec);
    if (ec) return Status::io_error("--checkpoint-dir " + config.checkpoint_dir + ": " + ec.message());
  }
  const model::ModelMemory mem = model::model_memory(s.spec, 4, config.tp);
  // The stage's parameters, gradients and AdamW moments, and an activation workspace per slot
  // (every layer's width counted: an upper bound for a stage of fewer layers) for the most
  // rows the rank held (wlb's chunking varies them from rank to rank; the workspace is
  // allocated for the cap, the rows held are what a right-sized buffer needs).
  const int64_t state_bytes = 4 * static_cast<int64_t>(sizeof(float) * s.model->params().size());
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
      DISTCA_RETURN_IF_ERROR(world.barrier());  // every rank (TP peers too) starts the traced step together
      trace_from_us = trace->now_us();
    }
    DISTCA_RETURN_IF_ERROR(run_step(config, comm, s, planner, step, m, peak_dispatch, trace));
    if (traced) {
      DISTCA_ASSIGN_OR_RETURN(local.trace, collect_trace(world, *trace, trace_from_us));
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
  const int64_t fixed_bytes = state_bytes + mem.activation_bytes_per_token() * s.peak_tokens * s.model->slots();
  DISTCA_ASSIGN_OR_RETURN(auto all, world.all_gather_value(fixed_bytes + peak_dispatch));
  DISTCA_ASSIGN_OR_RETURN(auto rows, world.all_gather_value(s.peak_tokens));
  DISTCA_ASSIGN_OR_RETURN(auto accounted, world.all_gather_value(accounted_peak(s, own_steps) + peak_dispatch));
  // Every rank's step metrics (every rank ran the same steps, so the same count).
  static_assert(std::is_trivially_copyable_v<StepMetrics>);
  const size_t n_steps = own_steps.size();
  std::vector<StepMetrics> gathered(n_steps * static_cast<size_t>(world.size()));
  if (n_steps > 0) {
    DISTCA_RETURN_IF_ERROR(world.all_gather(std::as_bytes(std::span<const StepMetrics>(own_steps)),
                                           std::as_writable_bytes(std::span<StepMetrics>(gathered))));
  }
  if (lead) {
    for (int r = 0; r < world.size(); ++r) {
      const auto first = gathered.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(r) * n_steps);
      local.rank_steps.emplace_back(first, first + static_cast<std::ptrdiff_t>(n_steps));
    }
  }
  if (lead && result) {
    local.final_params = std::move(final_params);
    local.buffer_bytes = std::move(all);
    local.peak_rows = std::move(rows);
    local.accounted_peak_bytes = std::move(accounted);
    local.outputs_valid = valid_outputs;
    *result = std::move(local);
  }
  return {};
}

}  // namespace

std::string mode_label(const TrainConfig& config) {
  switch (config.mode) {
    case TrainMode::kCad: return std::string("cad ") + runtime::overlap_mode_name(config.overlap_or_default());
    case TrainMode::kColocated: return "colocated";
    case TrainMode::kWlb: return config.cp > 1 ? "wlb cp " + std::to_string(config.cp) : "wlb";
    case TrainMode::kPerCp: return "percp cp " + std::to_string(config.cp);
  }
  return "?";
}

double max_over_mean(const std::vector<int64_t>& values) {
  if (values.empty()) return 1;
  double sum = 0, mx = 0;
  for (int64_t v : values) {
    sum += static_cast<double>(v);
    mx = std::max(mx, static_cast<double>(v));
  }
  return sum > 0 ? mx * static_cast<double>(values.size()) / sum : 1;
}

Status run_training(const TrainConfig& config, comm::Communicator& comm, const TrainHooks& hooks,
                    TrainResult* result) {
  DISTCA_RETURN_IF_ERROR(config.validate());
  if (comm.size() != config.ranks) {
    return Status::invalid_argument("--ranks " + std::to_string(config.ranks) + " does not match the " +
                                    comm.backend() + " group of " + std::to_string(comm.size()) + " ranks");
  }
  Status st;
  if (config.tp == 1) {
    st = train_rank(config, comm, comm, nullptr, hooks, result);
  } else {
    // TP innermost: the TP group is tp consecutive ranks; the trainer's data-parallel,
    // planning and attention traffic runs among the ranks of the same TP index, which are
    // exactly a tp = 1 run's ranks, each holding its heads.
    const int tp = static_cast<int>(config.tp), t = comm.rank() % tp;
    std::vector<int> group, slice;
    for (int i = 0; i < tp; ++i) group.push_back(comm.rank() - t + i);
    for (int r = t; r < comm.size(); r += tp) slice.push_back(r);
    auto tpc = comm::GroupCommunicator::create(comm, std::move(group), kTpTag);
    auto slc = tpc.ok() ? comm::GroupCommunicator::create(comm, std::move(slice), kTpSliceTag)
                        : Result<std::unique_ptr<comm::GroupCommunicator>>(tpc.status());
    if (slc.ok()) {
      TimedCommunicator timed(**tpc);  // its collectives' time is the step's TP communication
      st = train_rank(config, **slc, comm, &timed, hooks, result);
    } else {
      st = slc.status();
    }
  }
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
