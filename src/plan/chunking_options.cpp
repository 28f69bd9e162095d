// The re-pack's options and caps (include/distca/plan/chunking.h): apart from the re-packs so
// that code checking options alone (the config, the fuzzed parsers) links no scheduler.
#include "distca/plan/chunking.h"

#include <cmath>
#include <sstream>
#include <string>

namespace distca {

Status ChunkingOptions::validate(int64_t ranks) const {
  if (!std::isfinite(cap) || cap < 1) {
    std::ostringstream got;
    got << cap;
    return Status::invalid_argument("--wlb-cap must be >= 1 (got " + got.str() + ")");
  }
  if (cp < 1 || ranks % cp != 0) {
    return Status::invalid_argument("--cp " + std::to_string(cp) + " must divide the " + std::to_string(ranks) +
                                    " data-parallel ranks");
  }
  if (cp_threshold < 0) {
    return Status::invalid_argument("--cp-threshold must be >= 0 (got " + std::to_string(cp_threshold) + ")");
  }
  if (tile_rows < 1) return Status::invalid_argument("chunking: tile_rows must be >= 1");
  if (!std::isfinite(linear_per_token) || linear_per_token < 0) {
    return Status::invalid_argument("chunking: linear_per_token must be finite and >= 0");
  }
  return Status::ok_status();
}

ChunkingOptions wlb_chunking_options(const ScheduleOptions& options) {
  ChunkingOptions co;
  co.cap = options.wlb_mem_cap;
  co.cp = options.wlb_cp;
  co.cp_threshold = options.wlb_cp_threshold;
  co.tile_rows = options.align_rows;
  co.linear_per_token = options.wlb_linear_per_token;
  co.cost = options.cost;
  return co;
}

int64_t chunking_rank_cap(int64_t total, int64_t ranks, double cap) {
  const int64_t even = (total + ranks - 1) / ranks;
  return std::max(even, static_cast<int64_t>(cap * static_cast<double>(total) / static_cast<double>(ranks)));
}

int64_t cp_shard_threshold(const ChunkingOptions& o) {
  return o.cp_threshold > 0 ? o.cp_threshold : 2 * o.cp * o.tile_rows - 1;
}

}  // namespace distca
