// Schedulers: who serves which piece of core attention.
//
// A schedule is a list of CA-task placements. Every document's query rows [0, doc_len) are
// partitioned among its tasks; a task covers query rows [q_begin, q_end) of one document with
// context [0, q_end) (causal, bottom-right aligned in kernel terms), its query rows lie inside
// ONE piece of the batch held by rank `home` (Q leaves from there and O returns there), and it
// runs on rank `server` (every rank is an in-place attention server). K/V rows of the context
// come from whichever ranks hold them; docs/plan-format.md gives the byte rules.
//
// A rank's tokens never move: only their attention does. The exception is `wlb`, which models
// a data loader that re-packs documents before the step; its Schedule::batch is that re-packed
// batch and its homes refer to it.
//
// Determinism: every scheduler is a pure function of (batch, options): the same inputs give the
// same placements in the same order, on every platform.
// Thread safety: schedulers keep no global state; distinct calls may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/cost/cost_model.h"
#include "distca/data/batch.h"
#include "distca/plan/topology.h"

namespace distca {

struct TaskPlacement {
  int64_t doc = 0;
  int64_t q_begin = 0;  // first query row (position within the document)
  int64_t q_end = 0;    // one past the last query row; the context is [0, q_end)
  int64_t home = 0;     // rank holding these query rows
  int64_t server = 0;   // rank running the task
  bool operator==(const TaskPlacement&) const = default;
};

enum class SchedulerKind { kColocated, kWlb, kPerCp, kCad, kCadSymmetric };

struct SchedulerSpec {
  SchedulerKind kind = SchedulerKind::kCad;
  int64_t cp_degree = 1;  // percp:C only
  // "colocated", "wlb", "percp:4", "cad", "cad-symmetric".
  std::string name() const;
};
// Parses --scheduler; the message names the flag.
Result<SchedulerSpec> parse_scheduler(const std::string& text);

// A per-document load multiplier (ScheduleOptions::doc_weights).
struct DocWeight {
  int64_t doc = 0;
  double weight = 1;
  bool operator==(const DocWeight&) const = default;
};
inline constexpr double kMaxDocWeight = 1e6;

struct ScheduleOptions {
  ModelSpec model;                            // shapes, for byte counts
  int64_t dtype_bytes = 2;                    // activation bytes (2 = bf16, 4 = fp32)
  double tolerance = 0.05;                    // cad: every server within tolerance * mean
  const AttentionCostModel* cost = nullptr;   // work measure; nullptr means causal pairs
  double wlb_mem_cap = 1.2;                   // wlb: per-rank token cap over the mean
  // wlb: per-document context parallelism over groups of wlb_cp ranks for documents longer
  // than wlb_cp_threshold (0: the default rule), and the work of one token's linear layers in
  // the cost's units (plan/chunking.h, ChunkingOptions).
  int64_t wlb_cp = 1;
  int64_t wlb_cp_threshold = 0;
  double wlb_linear_per_token = 0;
  // cad: every cut it makes inside a document falls on a multiple of align_rows document
  // positions (a piece's own ends stay where packing put them). Set it to the attention
  // kernel's query tile (runtime::query_tile_rows) and no task pays tile padding; 1 means
  // any row. Other schedulers ignore it. >= 1.
  int64_t align_rows = 1;
  // cad, cad-symmetric: a task of document d weighs weight(d) x its cost while balancing
  // (pooled plans, plan/pool.h: a backward micro-batch's tasks weigh the backward time);
  // documents not listed weigh 1. Strictly ascending ids, weights finite in (0, kMaxDocWeight].
  // Empty (the default) plans exactly as without the hook. The plan's reported loads
  // (PlanMetrics) stay the unweighted cost; other schedulers ignore it.
  std::vector<DocWeight> doc_weights;
  // cad: which host each rank runs on, and the price of a byte between hosts (topology.h).
  // cad minimises priced bytes instead of bytes, and also tries the least loaded servers of
  // a donor's or receiver's own host. Empty, or a single host, plans exactly as without it;
  // other schedulers ignore it (the plan's metrics split every scheduler's bytes by host).
  HostTopology topology;
  Status validate(const Batch& batch, const SchedulerSpec& spec) const;
};

inline constexpr int64_t kMaxAlignRows = int64_t{1} << 20;
// The doc_weights rule of ScheduleOptions::validate alone (the cad planners check it too).
Status check_doc_weights(const std::vector<DocWeight>& weights);
// --tolerance TEXT: a number in [0, 1], or "auto" (nullopt: plan/auto_tolerance.h chooses).
// The message names `flag`.
Result<std::optional<double>> parse_tolerance(const std::string& text, const std::string& flag = "--tolerance");
// The align_rows rule of ScheduleOptions::validate alone (the cad planner checks it too); the
// message names --align-rows.
Status check_align_rows(int64_t align_rows);

// The planning flags of `distca plan` and distca.plan(), as given (--tolerance a number;
// `distca plan --tolerance auto` sets options.tolerance itself).
struct PlanFlags {
  std::string scheduler = "cad";
  std::string dtype = "bf16";
  double tolerance = 0.05;
  double wlb_mem_cap = 1.2;
  int64_t align_rows = 1;
  std::string cost_table;  // empty: causal pairs
};

// What the flags say. options.cost points into the object (pairs, or the loaded table), so it
// is filled in place and never copied or moved.
struct PlanSetup {
  SchedulerSpec spec;
  ScheduleOptions options;
  PairsCostModel pairs;
  std::unique_ptr<AttentionCostModel> table;  // --cost-table; null: pairs
  PlanSetup() = default;
  PlanSetup(const PlanSetup&) = delete;
  PlanSetup& operator=(const PlanSetup&) = delete;
};
// Fills `setup` for `model` from `flags`, checked in the CLI's order: the scheduler, the dtype,
// the cost table (load_cost_table_option), then the batch-independent checks of
// ScheduleOptions::validate (the batch's own come when it is known). Messages name the flags.
Status make_plan_setup(const ModelSpec& model, const PlanFlags& flags, PlanSetup& setup);

struct Schedule {
  std::vector<TaskPlacement> tasks;
  Batch batch;  // the batch the homes refer to (the input, or wlb's re-packed one)
};

Result<Schedule> schedule_colocated(const Batch& batch, const ScheduleOptions& options);
Result<Schedule> schedule_wlb(const Batch& batch, const ScheduleOptions& options);
Result<Schedule> schedule_percp(const Batch& batch, int64_t cp_degree, const ScheduleOptions& options);
// The number of tasks schedule_percp(batch, cp_degree) makes, counted without making them (for
// memory estimates: a document of L rows served by C' ranks gives up to 2C' + runs tasks, so
// large degrees on many documents make far more tasks than pieces). Preconditions: those of
// schedule_percp (a valid batch, cp_degree dividing its ranks).
int64_t percp_task_count(const Batch& batch, int64_t cp_degree);
Result<Schedule> schedule_cad(const Batch& batch, const ScheduleOptions& options);
Result<Schedule> schedule_cad_symmetric(const Batch& batch, const ScheduleOptions& options);
// Dispatches on spec.kind after validating options against the batch.
Result<Schedule> run_scheduler(const SchedulerSpec& spec, const Batch& batch, const ScheduleOptions& options);

}  // namespace distca
