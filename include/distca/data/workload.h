// Document-length workloads and packing (docs/workloads.md explains every number).
//
// A workload is drawn per batch: documents are sampled from a length distribution until the
// batch's ranks * tokens_per_rank token slots are full, then packed in order. Batch b of a
// seed uses random stream b, so asking for more batches never changes the earlier ones.
//
// Thread safety: functions are pure given their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distca/core/status.h"
#include "distca/data/batch.h"

namespace distca {

enum class Layout { kContiguous, kHeadTail };
Result<Layout> parse_layout(const std::string& s);  // "contiguous" | "head-tail"
const char* layout_name(Layout l);

struct WorkloadOptions {
  std::string dist = "prolong";  // pretrain | prolong | fixed:N | uniform:A:B | file:PATH
  int64_t ranks = 8;
  int64_t tokens_per_rank = 512 * 1024;
  Layout layout = Layout::kContiguous;
  int64_t max_doc_len = 0;  // 0: no cap; otherwise >= 16
  int64_t batches = 1;
  uint64_t seed = 42;
  // ProLong recipe: probability that a long (>= 64K before elongation) document is replaced by
  // one as long as a rank's batch (tokens_per_rank).
  double prolong_long_prob = 0.3;

  // Checks every field; the message names the flag (--ranks, --dist, ...).
  Status validate() const;
};

// Draws and packs options.batches batches. Errors: invalid options, unreadable length file.
Result<std::vector<Batch>> make_batches(const WorkloadOptions& options);

// Packs document lengths (already rounded and capped) into `ranks` ranks of `tokens_per_rank`
// slots in order. Documents past the last slot are dropped; the document that crosses the end
// of the batch is cut to fit (its doc_len becomes the length that fits). Lengths must be > 0.
Batch pack_documents(const std::vector<int64_t>& lengths, int64_t ranks, int64_t tokens_per_rank,
                     Layout layout);

}  // namespace distca
