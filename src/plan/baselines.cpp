// The baselines CAD must beat: colocated, wlb (the colocated schedule of wlb_repack's batch,
// plan/chunking.h) and percp:C; docs/scheduler.md gives each one's rules. Each is a pure
// function of (batch, options); ties are broken by the lowest rank and the lowest document id,
// so the output is the same on every platform.
#include <algorithm>
#include <numeric>

#include "distca/plan/chunking.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/plan.h"
#include "distca/plan/schedule.h"
#include "distca/plan/traffic.h"

namespace distca {
namespace {

std::vector<TaskPlacement> colocated_tasks(const Batch& batch) {
  std::vector<TaskPlacement> tasks;
  for (int64_t r = 0; r < batch.ranks; ++r) {
    for (const Piece& p : batch.per_rank[static_cast<size_t>(r)]) {
      tasks.push_back({p.doc, p.offset, p.offset + p.len, r, r});
    }
  }
  return tasks;
}

}  // namespace

Result<Schedule> schedule_colocated(const Batch& batch, const ScheduleOptions& options) {
  (void)options;
  DISTCA_RETURN_IF_ERROR(batch.validate());
  return Schedule{colocated_tasks(batch), batch};
}

Result<Schedule> schedule_wlb(const Batch& batch, const ScheduleOptions& options) {
  DISTCA_ASSIGN_OR_RETURN(Batch out, wlb_repack(batch, wlb_chunking_options(options)));
  return Schedule{colocated_tasks(out), std::move(out)};
}

int64_t percp_task_count(const Batch& batch, int64_t cp_degree) {
  const DocumentIndex index(batch);
  const auto groups = percp_groups(index, cp_degree);
  int64_t tasks = 0;
  for (size_t slot = 0; slot < groups.size(); ++slot) {
    const int64_t id = index.doc_ids()[slot];
    const int64_t L = index.doc_len(id);
    const auto C = static_cast<int64_t>(groups[slot].size()) * cp_degree;
    // schedule_percp's tasks are the pieces of the common refinement of the 2C chunks and the
    // held runs: one per distinct boundary inside (0, L), plus one.
    const auto& runs = index.runs(id);
    size_t j = 1;  // next run boundary: runs[j].begin
    int64_t k = 1;  // next chunk boundary: k * L / (2C)
    int64_t pieces = 1;
    while (j < runs.size() || k < 2 * C) {
      const int64_t chunk = k < 2 * C ? k * L / (2 * C) : L;
      const int64_t run = j < runs.size() ? runs[j].begin : L;
      const int64_t at = std::min(chunk, run);
      if (at > 0 && at < L) ++pieces;
      if (chunk == at) ++k;
      if (run == at) ++j;
      // Equal chunk boundaries (L < 2C) collapse into one.
      while (k < 2 * C && k * L / (2 * C) == at) ++k;
    }
    tasks += pieces;
  }
  return tasks;
}

Result<Schedule> schedule_percp(const Batch& batch, int64_t cp_degree, const ScheduleOptions& options) {
  (void)options;
  DISTCA_RETURN_IF_ERROR(batch.validate());
  if (cp_degree < 1 || batch.ranks % cp_degree != 0) {
    return Status::invalid_argument("--scheduler percp:" + std::to_string(cp_degree) +
                                    ": CP degree does not divide the " + std::to_string(batch.ranks) +
                                    " ranks");
  }
  const DocumentIndex index(batch);
  const auto groups = percp_groups(index, cp_degree);
  Schedule out;
  out.batch = batch;
  // Reserved exactly: at large degrees the tasks dominate memory, and growth by doubling
  // would hold up to three times their size at a reallocation (memory estimates count 40 B).
  out.tasks.reserve(static_cast<size_t>(percp_task_count(batch, cp_degree)));
  for (size_t slot = 0; slot < groups.size(); ++slot) {
    const int64_t id = index.doc_ids()[slot];
    const int64_t L = index.doc_len(id);
    std::vector<int64_t> servers;  // the ranks of the serving groups, ascending
    for (int64_t g : groups[slot]) for (int64_t r = g * cp_degree; r < (g + 1) * cp_degree; ++r) servers.push_back(r);
    const auto C = static_cast<int64_t>(servers.size());
    for (int64_t k = 0; k < 2 * C; ++k) {
      const int64_t lo = k * L / (2 * C);
      const int64_t hi = (k + 1) * L / (2 * C);
      const int64_t server = servers[static_cast<size_t>(k < C ? k : 2 * C - 1 - k)];
      for (const HeldRun& run : index.runs(id)) {
        const int64_t a = std::max(lo, run.begin);
        const int64_t b = std::min(hi, run.end);
        if (a < b) out.tasks.push_back({id, a, b, run.rank, server});
      }
    }
  }
  return out;
}

}  // namespace distca
