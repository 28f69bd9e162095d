#include "distca/plan/doc_index.h"

#include <algorithm>

#include "distca/core/check.h"

namespace distca {

DocumentIndex::DocumentIndex(const Batch& batch) : ranks_(batch.ranks) {
  size_t pieces = 0;
  int64_t lo = 0, hi = -1;
  for (const auto& rank : batch.per_rank) {
    for (const Piece& p : rank) {
      if (pieces == 0) lo = hi = p.doc;
      lo = std::min(lo, p.doc);
      hi = std::max(hi, p.doc);
      ++pieces;
    }
  }
  // A table of slots when the ids span at most about twice the pieces (the generator's ids
  // are 0 .. documents - 1): O(1) look-ups, O(pieces) to build. Compared unsigned, so a huge
  // span cannot overflow.
  const bool dense = pieces > 0 && static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) < 2 * pieces + 1024;
  if (dense) {
    min_id_ = lo;
    dense_.assign(static_cast<size_t>(hi - lo) + 1, -1);
    for (const auto& rank : batch.per_rank) {
      for (const Piece& p : rank) dense_[static_cast<size_t>(p.doc - lo)] = 0;
    }
    for (size_t i = 0; i < dense_.size(); ++i) {
      if (dense_[i] < 0) continue;
      dense_[i] = static_cast<int64_t>(ids_.size());
      ids_.push_back(lo + static_cast<int64_t>(i));
    }
  } else {
    ids_.reserve(pieces);
    for (const auto& rank : batch.per_rank) {
      for (const Piece& p : rank) ids_.push_back(p.doc);
    }
    std::sort(ids_.begin(), ids_.end());
    ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
  }
  // Runs grouped by slot (a counting sort; run_start_[s] serves as slot s's cursor, then is
  // shifted back), then each slot's few runs sorted by begin.
  lens_.assign(ids_.size(), 0);
  run_start_.assign(ids_.size() + 1, 0);
  for (const auto& rank : batch.per_rank) {
    for (const Piece& p : rank) ++run_start_[static_cast<size_t>(slot(p.doc))];
  }
  size_t at = 0;
  for (size_t& c : run_start_) {
    const size_t n = c;
    c = at;
    at += n;
  }
  runs_.resize(pieces);
  for (int64_t r = 0; r < static_cast<int64_t>(batch.per_rank.size()); ++r) {
    int64_t local = 0;
    for (const Piece& p : batch.per_rank[static_cast<size_t>(r)]) {
      const auto s = static_cast<size_t>(slot(p.doc));
      lens_[s] = p.doc_len;
      runs_[run_start_[s]++] = {p.offset, p.offset + p.len, r, local};
      local += p.len;
    }
  }
  for (size_t s = ids_.size(); s > 0; --s) run_start_[s] = run_start_[s - 1];
  run_start_[0] = 0;
  for (size_t s = 0; s < ids_.size(); ++s) {
    if (run_start_[s + 1] - run_start_[s] < 2) continue;
    std::sort(runs_.begin() + static_cast<std::ptrdiff_t>(run_start_[s]),
              runs_.begin() + static_cast<std::ptrdiff_t>(run_start_[s + 1]),
              [](const HeldRun& a, const HeldRun& b) { return a.begin < b.begin; });
  }
}

int64_t DocumentIndex::sparse_slot(int64_t doc) const {
  auto it = std::lower_bound(ids_.begin(), ids_.end(), doc);
  if (it == ids_.end() || *it != doc) return -1;
  return it - ids_.begin();
}

int64_t DocumentIndex::doc_len(int64_t doc) const {
  const int64_t s = slot(doc);
  DISTCA_CHECK_MSG(s >= 0, "unknown document " + std::to_string(doc));
  return lens_[static_cast<size_t>(s)];
}

std::span<const HeldRun> DocumentIndex::runs(int64_t doc) const {
  const int64_t s = slot(doc);
  DISTCA_CHECK_MSG(s >= 0, "unknown document " + std::to_string(doc));
  return slot_runs(s);
}

const HeldRun& DocumentIndex::run_at_slot(int64_t slot, int64_t pos) const {
  const auto rs = slot_runs(slot);
  // The last run whose begin <= pos.
  auto it = std::upper_bound(rs.begin(), rs.end(), pos,
                             [](int64_t p, const HeldRun& r) { return p < r.begin; });
  DISTCA_CHECK(it != rs.begin());
  --it;
  DISTCA_CHECK(pos < it->end);
  return *it;
}

const HeldRun& DocumentIndex::run_at(int64_t doc, int64_t pos) const {
  const int64_t s = slot(doc);
  DISTCA_CHECK_MSG(s >= 0, "unknown document " + std::to_string(doc));
  return run_at_slot(s, pos);
}

int64_t DocumentIndex::local_row(int64_t rank, int64_t doc, int64_t pos) const {
  const int64_t s = slot(doc);
  if (s < 0 || pos < 0 || pos >= lens_[static_cast<size_t>(s)]) return -1;
  const HeldRun& r = run_at_slot(s, pos);
  if (r.rank != rank) return -1;
  return r.local_row + (pos - r.begin);
}

}  // namespace distca
