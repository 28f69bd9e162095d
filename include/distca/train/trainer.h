// The trainer: data parallelism over a Communicator, core attention through the CA dispatcher.
//
// Every rank builds Llama<float> from the same seed (identical replicas) and, per step b:
//   1. builds step b's batch (data.h; a pure function of (seed, b), so every rank agrees
//      without communicating) and its own inputs;
//   2. plans the step: plan_nano_batches splits the batch into two nano-batches
//      (plan/nano_split.h: each rank's rows of nano 0 first, then nano 1's) and plans it with
//      the `cad` scheduler (--mode cad) or `colocated` (--mode colocated); the rank's inputs
//      follow the split's order. Every rank makes the same plans itself (no exchange), and
//      with TrainConfig::plan_ahead "on" a background thread of the rank makes them up to one
//      step ahead of the step that runs them (src/train/planner.h): step b + 1's while step
//      b computes. The plans are the same bits either way, so is everything else;
//   3. all-reduces the target counts (double), then runs the model's phased step
//      (model/llama.h) under a runtime::TickRunner: the model's layer phases per
//      nano-batch are the runner's linear work, core attention goes through its dispatchers
//      (--overlap: pingpong overlaps each nano-batch's exchanges with the other's linear work
//      and attention; single-stream and colocated run one exchange per layer, waited for at
//      once; signal sends 1-byte messages). Every mode runs the same model calls in the same
//      order, so the linear layers give the same bits in every mode; then all-reduces the
//      gradient buffer (deterministic rank order sum), clips, takes an AdamW step at
//      LrSchedule::at(b) (signal: outputs are invalid, so no step and no checkpoint);
//   4. all-reduces the loss sums: loss = sum / count, report loss = report sum / weight.
// Replicas stay bitwise identical; the same config gives the same bits on either backend.
// Modes agree bitwise where their attention tasks are the same and within float rounding
// otherwise (dK/dV partial sums associate differently; docs/runtime.md, "Numerics"; tests/train).
//
// OpenBLAS: the trainer runs OpenBLAS with one thread per process (ranks as threads share it;
// sgemm's bits depend on it), so the local and mpi backends run identical arithmetic. The
// caller's setting is restored afterwards (kernels::ScopedBlasThreads); the mpi CLI holds one
// such scope around run_training.
//
// Memory: every step's plan is checked against the rows the memory estimate allows
// (memory.h, dispatch_row_limit); a plan past it fails the run (out_of_memory) before the
// dispatcher allocates.
//
// Time split per step (rank-local wall clock): communication = only the time the rank was
// blocked waiting for an exchange to complete (runtime::RunnerTimes::waited), plus the
// gradient and loss all-reduces (blocking); attention = the rest of the runner's time that is
// not linear work (kernels, packing and assembling rows); waiting = a barrier before the
// gradient all-reduce (idle time behind the slowest rank); linear = the model's layer phases,
// the embedding and the optimizer. Hidden communication thus counts nowhere.
//
// Trace (TrainConfig::trace): the run's last step is recorded (runner and dispatcher events,
// plus whatever else records into TrainHooks::trace during it, e.g. the mpi backend's
// exchanges) and gathered to rank 0 in TrainResult::trace, on one time axis from that step's
// start (a barrier starts it on every rank).
//
// Tensor parallelism (TrainConfig::tp, docs/training.md): the TP group is tp consecutive
// ranks, each building its share of the model (model/tensor_parallel.h); everything above
// (batches, plans, dispatcher exchanges of the rank's heads, pipeline messages of the rank's
// rows, the data-parallel all-reduce, loss and norm reductions) runs among the ranks of one
// TP index, and the TP group adds the replicated gradients, the loss sums and the norm's
// squares. The trace covers the ranks of TP index 0; buffer_bytes, accounted_peak_bytes and
// rank_steps every rank.
//
// Thread safety: run_training is called once per rank, from that rank's thread. With
// plan_ahead on it starts one planning thread per rank, which reads only the config's copies,
// the (immutable) DataSource and the batches it loads itself, and is joined before
// run_training returns, on every path (a failed step included); an error on it (or an
// exception) comes back as the Status of the step that needed the plan, and the step waits at
// most kPlanWaitLimitS for a plan.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/status.h"
#include "distca/core/trace.h"
#include "distca/train/checkpoint.h"
#include "distca/train/config.h"
#include "distca/train/data.h"

namespace distca::train {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0;           // mean over every target of the step (all ranks)
  double report_loss = 0;    // copy: mean over second-half targets; text: = loss
  double lr = 0;
  double grad_norm = 0;      // before clipping
  int64_t tokens = 0;        // all ranks
  double seconds = 0;        // rank 0's wall time of the step
  double tokens_per_s = 0;
  double imbalance_before = 1;  // attention load max/mean, colocated (plan metrics)
  double imbalance_after = 1;   // attention load max/mean of the plan that ran
  // Rank 0's time this step, by what it measures: linear_s the model outside core attention
  // (the runners' linear callbacks and the step's other compute); attention_s the runners'
  // attention work (packing rows, kernels, assembling contexts: RunnerTimes::attention);
  // comm_s communication waited for (exchanges, pipeline messages, all-reduces); wait_s the
  // end-of-step barrier; optimizer_s clipping and AdamW.
  double linear_s = 0, attention_s = 0, comm_s = 0, wait_s = 0, optimizer_s = 0;
  // Tensor parallelism (tp > 1): the time rank 0 spent in its TP group's collectives during
  // the forward and backward (the layers' all-gathers and reduce-scatters, the embedding's and
  // the LM head's, waits for the slower TP peer included) and the bytes it sent in them. They
  // are synchronous inside the layer, so they count as exposed communication: the time is in
  // comm_s, not in linear_s (the replicated gradients' and the loss's TP all-reduces after the
  // backward are in comm_s too, not here).
  double tp_comm_s = 0;
  int64_t tp_bytes_sent = 0;
  // The part of comm_s the runners waited for attention's communication (the dispatcher's
  // exchanges; wlb and percp: the CP collectives, whose trace wait spans add up to it).
  double attention_comm_s = 0;
  double busy_s() const { return linear_s + attention_s + optimizer_s; }  // compute
  std::array<int64_t, 2> nano_tokens{0, 0};  // rank 0's rows in nano-batch 0 and 1
  int64_t bytes_sent = 0;  // rank 0's attention exchange bytes, last layer's forward + backward
  // Planning (rank 0): plan_s is the time spent making this step's plans (on the planning
  // thread when they are made ahead); plan_wait_s the time the step was blocked for them: with
  // --plan-ahead off every plan is made inline, so plan_wait_s = plan_s; on, only a plan not
  // finished when the step needed it counts (0 when every plan was ready).
  double plan_s = 0, plan_wait_s = 0;
  // What this rank trained on and held (each rank's own; rank 0's in `steps`): the order-free
  // checksum of its inputs' tokens at their document positions over the step's micro-batches
  // (inputs_checksum, data.h; every stage loads its replica's inputs, so a step's documents
  // are the sum over the first stage's ranks), the most tokens its activation slots held at
  // once, and its largest micro-batch in tokens.
  uint64_t input_checksum = 0;
  int64_t live_tokens_peak = 0, micro_tokens_peak = 0;
};

struct TrainResult {
  std::vector<StepMetrics> steps;   // the steps this run executed
  std::vector<float> final_params;  // rank 0's parameters at the end
  double linear_s = 0, attention_s = 0, comm_s = 0, wait_s = 0, optimizer_s = 0, total_s = 0;  // rank 0 sums
  double plan_s = 0, plan_wait_s = 0;  // rank 0 sums of StepMetrics' planning times
  // [ranks] params+grads+adam, the activation workspace for the most rows the rank held in a
  // micro-batch (wlb varies them), peak dispatcher rows: the peak memory per rank reported.
  std::vector<int64_t> buffer_bytes;
  std::vector<int64_t> peak_rows;  // [ranks] the most rows each rank held in one micro-batch
  // [ranks] the trainer's accounting of each rank's buffers at their high-water mark over the
  // run: parameters, gradients and AdamW moments, the saved activations of the most tokens its
  // slots held at once, backward scratch for its largest micro-batch, and its dispatcher's rows
  // at their peak (as buffer_bytes counts them). Unlike buffer_bytes it follows the tokens a
  // rank was given, not the workspace it was sized for; it is an accounting, not resident memory.
  std::vector<int64_t> accounted_peak_bytes;
  int64_t checkpoints_written = 0;
  std::string last_checkpoint;
  bool outputs_valid = true;       // false with --overlap signal (no update, no checkpoint)
  std::vector<TraceEvent> trace;   // rank 0: every rank's events of the traced step
  // [rank][i]: every rank's own StepMetrics of this run's steps (its time split and wall time;
  // the loss fields are the step's, equal on every rank), gathered to rank 0 by one all_gather
  // at the end of the run: per-rank figures such as a pipeline stage's idle time.
  std::vector<std::vector<StepMetrics>> rank_steps;
};

struct TrainHooks {
  // Called on rank 0 after every step (from rank 0's thread).
  std::function<void(const StepMetrics&)> on_step;
  // Not null: continue from this checkpoint (fingerprint already verified; check_resume is
  // applied again before it is loaded).
  const Checkpoint* resume = nullptr;
  // Not null: the data every rank reads (created once by the caller; const methods are
  // thread-safe). Null: each rank creates its own from the config.
  const DataSource* data = nullptr;
  // Not null: the recorder the traced step records into (the caller may also give it to the
  // mpi communicator, MpiOptions::trace, so the exchanges' transfers appear). Null: the
  // trainer uses its own. Used only when TrainConfig::trace is set.
  TraceRecorder* trace = nullptr;
};

// The mode as reports name it: "cad pingpong", "colocated", "wlb", "wlb cp 2", "percp cp 2".
std::string mode_label(const TrainConfig& config);
// max / mean of per-rank figures (TrainResult::buffer_bytes); 1 when empty or all zero.
double max_over_mean(const std::vector<int64_t>& values);

// The longest a step waits for a plan made ahead before the run fails (a stuck planner).
inline constexpr double kPlanWaitLimitS = 300;

// One rank's training loop. comm.size() must equal config.ranks. `result` (may be null) is
// filled on rank 0. Errors from collectives come back as Status (the caller fails the group).
Status run_training(const TrainConfig& config, comm::Communicator& comm, const TrainHooks& hooks,
                    TrainResult* result);

// config.ranks ranks as threads (local backend); returns rank 0's result.
Status run_training_local(const TrainConfig& config, const TrainHooks& hooks, TrainResult* result);

}  // namespace distca::train
