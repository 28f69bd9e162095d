// DocumentIndex: where every row of every document of a batch lives.
//
// A rank's token buffer is the concatenation of its pieces in Batch::per_rank order, so row
// `pos` of document `doc` held by piece P (P.offset <= pos < P.offset + P.len) on rank r sits
// at local row (sum of the lengths of r's pieces before P) + (pos - P.offset). Every layout
// of the plan (docs/plan-format.md) refers to rows through this mapping.
//
// Thread safety: immutable after construction; const methods may be called concurrently.
#pragma once

#include <cstdint>
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
  int64_t slot(int64_t doc) const;
  // Preconditions below: contains(doc).
  int64_t doc_len(int64_t doc) const;
  // The document's runs sorted by begin; they tile [0, doc_len).
  const std::vector<HeldRun>& runs(int64_t doc) const;
  // The run containing row pos. Precondition: 0 <= pos < doc_len(doc).
  const HeldRun& run_at(int64_t doc, int64_t pos) const;
  // Rows of [begin, end) that `rank` holds / does not hold. Precondition: 0 <= begin <= end
  // <= doc_len(doc).
  int64_t rows_held_by(int64_t doc, int64_t begin, int64_t end, int64_t rank) const;
  int64_t rows_not_held_by(int64_t doc, int64_t begin, int64_t end, int64_t rank) const {
    return (end - begin) - rows_held_by(doc, begin, end, rank);
  }
  // Local row of (doc, pos) on `rank`, or -1 when that rank does not hold it.
  int64_t local_row(int64_t rank, int64_t doc, int64_t pos) const;

 private:
  int64_t ranks_ = 0;
  std::vector<int64_t> ids_;                 // ascending
  std::vector<int64_t> lens_;                // [slot]
  std::vector<std::vector<HeldRun>> runs_;   // [slot][runs sorted by begin]
};

}  // namespace distca
