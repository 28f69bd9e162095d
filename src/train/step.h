// One optimizer step of one rank (internal to the train layer; trainer.h documents the
// behaviour). A rank is stage `stage` of data-parallel replica `replica`: ranks are numbered
// stage-major, rank = stage * dp + replica, so a stage's data-parallel group is the dp
// consecutive ranks [stage * dp, (stage + 1) * dp) and replica d's pipeline is the ranks
// d, dp + d, 2 dp + d, ...
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/comm/group.h"
#include "distca/core/trace.h"
#include "distca/model/llama.h"
#include "distca/model/optimizer.h"
#include "distca/plan/auto_tolerance.h"
#include "distca/plan/schedule.h"
#include "distca/runtime/dispatcher.h"
#include "distca/runtime/pingpong.h"
#include "distca/train/config.h"
#include "distca/train/data.h"
#include "distca/train/trainer.h"
#include "planner.h"
#include "timed_comm.h"

namespace distca::train {

// Point-to-point tags (comm/communicator.h): a micro-batch's activations 2m, their gradient
// 2m + 1; the stage's data-parallel group kGroupTag (never a micro-batch tag); the gather of
// a stage's vectors to rank 0 kGatherTag + k.
inline constexpr int kGroupTag = 1 << 19;
inline constexpr int kGatherTag = (1 << 19) + 16;
// The TP groups and the groups of one TP index (tensor parallelism; trainer.cpp).
inline constexpr int kTpTag = (1 << 19) + 64;
inline constexpr int kTpSliceTag = (1 << 19) + 65;
// The overlapped TP collectives' point-to-point messages use model::kTpOverlapTag
// (kP2pTagLimit - 1) on the TP group, forwarded to the world: no other tag may take it.
// wlb and percp: the stage's CP group (cp consecutive data-parallel ranks).
inline constexpr int kCpTag = (1 << 19) + 32;

// Everything a rank builds before its first step.
struct RankSetup {
  ModelSpec spec;
  std::optional<DataSource> own_data;  // when the hooks bring none
  const DataSource* data = nullptr;
  std::optional<model::Llama<float>> model;  // this stage's layers
  std::optional<model::AdamW> opt;           // over this stage's parameters
  model::LrSchedule sched;
  SchedulerSpec sspec;
  ScheduleOptions sopt;
  // --tolerance auto: the model and its cost table (PlanContext shares them), else null.
  std::shared_ptr<const AttentionCostModel> auto_table;
  std::shared_ptr<const AutoToleranceModel> auto_model;
  bool tolerance_auto = false;  // auto_model chooses the band (else it serves --kv-once auto only)
  std::string kv_once = "on";   // TrainConfig::kv_once
  ChunkingOptions chunking;  // wlb, percp: the re-pack's options (planner.h, PlanContext)
  std::shared_ptr<const AttentionCostModel> chunking_table;  // wlb --hardware: what chunking.cost points to
  runtime::AttentionDims dims;
  runtime::OverlapMode overlap = runtime::OverlapMode::kSingleStream;  // colocated: one exchange per layer
  int64_t start = 0;  // first step to run
  int64_t peak_tokens = 0;  // the most rows this rank has held in one micro-batch so far
  // Pipeline placement.
  int64_t pp = 1, dp = 1, stage = 0, replica = 0, micro_batches = 1;
  model::StageRange layers;
  std::vector<int64_t> full_tensor_index;  // [model.layout() entry] its index in param_layout(spec)
  std::vector<std::vector<float>> lse;  // cad pipelines: [slot] the forward's LSE, (layers, tokens, heads)
  std::unique_ptr<comm::GroupCommunicator> dp_comm;  // this stage's data-parallel ranks
  std::unique_ptr<comm::GroupCommunicator> cp_comm;  // wlb, percp: this rank's CP group of dp_comm's ranks
  // Tensor parallelism (config.tp > 1): the rank's TP group, whose ranks hold the same
  // replica's shards; null without TP. The trainer's other communicators then span the ranks
  // of the same TP index (trainer.cpp, run_training).
  comm::Communicator* tp = nullptr;
  const TimedCommunicator* tp_timed = nullptr;  // the same communicator: its collectives' time and bytes
  bool lead = false;  // world rank 0: reports, writes checkpoints
  // The plans of steps [start, steps) (planner.h). Declared last, so it is destroyed (its
  // thread joined) first, before the data source it reads.
  std::unique_ptr<StepPlanner> planner;
};

// [first, end) of stage k's parameters in the whole model's buffer (model/llama.h layout).
struct ParamRange {
  int64_t first = 0, end = 0;
  int64_t size() const { return end - first; }
};
ParamRange stage_param_range(const ModelSpec& spec, int64_t pp, int64_t k);

// Runs the stage's program (plan/pipeline_schedule.h, one_f_one_b_programs: its 1F1B order,
// each op with the message it receives before it and the one it posts after it; one stage:
// each micro-batch forward then backward) tick by tick through the runner (step.cpp explains
// the two ways of planning: per micro-batch, or pooled ticks for cad with pp > 1), taking the
// plans from `planner` (planner.h), all-reduces the gradients over the stage's data-parallel
// group, reduces the losses and the global gradient norm over every rank, clips, takes the
// AdamW step (not in signal mode). Fills the metrics but the step's total time.
// `peak_dispatch`: the largest dispatcher row bytes of any step so far.
Status run_step(const TrainConfig& config, comm::Communicator& world, RankSetup& s, StepPlanner& planner,
                int64_t step, StepMetrics& m, int64_t& peak_dispatch, TraceRecorder* trace);

}  // namespace distca::train
