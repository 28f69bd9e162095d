// DocumentIndex: where every row of every document of a batch lives.
//
// A rank's token buffer is the concatenation of its pieces in Batch::per_rank order, so row
// `pos` of document `doc` held by piece P (P.offset <= pos < P.offset + P.len) on rank r sits
// at local row (sum of the lengths of r's pieces before P) + (pos - P.offset). Every layout
// of the plan (docs/plan-format.md) refers to rows through this mapping.
//
// Cost: the planner builds one per plan and asks it a few questions per task, so it is flat
// (one array of runs, one of lengths) and a document's slot is a table look-up when the ids
// are dense (the workload generator numbers documents 0, 1, ...: ids within a range of about
// twice the pieces), a binary search otherwise. Construction is O(pieces) for dense ids,
// O(pieces log pieces) otherwise.
//
// Thread safety: immutable after construction; const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "distca/data/batch.h"

namespace distca {

// Document rows [begin, end) held by `rank`, the first of them at local row `local_row` of
// that rank's token buffer (one run per piece).
struct HeldRun {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t rank = 0;
  int64_t local_row = 0;
  bool operator==(const HeldRun&) const = default;
};

class DocumentIndex {
 public:
  // Precondition: batch.validate() is OK (pieces of each document tile [0, doc_len)).
  explicit DocumentIndex(const Batch& batch);

  int64_t ranks() const { return ranks_; }
  // Document ids, ascending.
  const std::vector<int64_t>& doc_ids() const { return ids_; }
  bool contains(int64_t doc) const { return slot(doc) >= 0; }
  // Position of `doc` in doc_ids(); -1 if absent.
  int64_t slot(int64_t doc) const {
    if (!dense_.empty()) {
      if (doc < min_id_ || doc - min_id_ >= static_cast<int64_t>(dense_.size())) return -1;
      return dense_[static_cast<size_t>(doc - min_id_)];
    }
    return sparse_slot(doc);
  }
  // Preconditions below: contains(doc).
  int64_t doc_len(int64_t doc) const;
  // The document's runs sorted by begin; they tile [0, doc_len). The span stays valid as long
  // as the index.
  std::span<const HeldRun> runs(int64_t doc) const;
  // The run containing row pos. Precondition: 0 <= pos < doc_len(doc).
  const HeldRun& run_at(int64_t doc, int64_t pos) const;
  // Local row of (doc, pos) on `rank`, or -1 when that rank does not hold it.
  int64_t local_row(int64_t rank, int64_t doc, int64_t pos) const;

  // The same, by slot (no look-up). Preconditions: 0 <= slot < doc_ids().size(), and for
  // run_at_slot 0 <= pos < slot_len(slot).
  int64_t slot_len(int64_t slot) const { return lens_[static_cast<size_t>(slot)]; }
  std::span<const HeldRun> slot_runs(int64_t slot) const {
    const auto s = static_cast<size_t>(slot);
    return {runs_.data() + run_start_[s], runs_.data() + run_start_[s + 1]};
  }
  const HeldRun& run_at_slot(int64_t slot, int64_t pos) const;
  // Runs are numbered 0 .. num_runs() - 1, slot by slot in doc_ids() order and by begin within
  // a slot: run i of slot s is number first_run(s) + i (scratch arrays indexed by run).
  size_t num_runs() const { return runs_.size(); }
  size_t first_run(int64_t slot) const { return run_start_[static_cast<size_t>(slot)]; }

 private:
  int64_t sparse_slot(int64_t doc) const;

  int64_t ranks_ = 0;
  std::vector<int64_t> ids_;        // ascending
  std::vector<int64_t> lens_;       // [slot]
  std::vector<size_t> run_start_;   // [slot + 1] into runs_
  std::vector<HeldRun> runs_;       // slot by slot, sorted by begin within a slot
  int64_t min_id_ = 0;
  std::vector<int64_t> dense_;      // [id - min_id_] slot or -1; empty when ids are sparse
};

}  // namespace distca
