#include "distca/plan/doc_index.h"

#include <algorithm>

#include "distca/core/check.h"

namespace distca {

DocumentIndex::DocumentIndex(const Batch& batch) : ranks_(batch.ranks) {
  for (const auto& pieces : batch.per_rank) {
    for (const Piece& p : pieces) ids_.push_back(p.doc);
  }
  std::sort(ids_.begin(), ids_.end());
  ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
  lens_.assign(ids_.size(), 0);
  runs_.assign(ids_.size(), {});
  for (int64_t r = 0; r < static_cast<int64_t>(batch.per_rank.size()); ++r) {
    int64_t local = 0;
    for (const Piece& p : batch.per_rank[static_cast<size_t>(r)]) {
      const auto s = static_cast<size_t>(slot(p.doc));
      lens_[s] = p.doc_len;
      runs_[s].push_back({p.offset, p.offset + p.len, r, local});
      local += p.len;
    }
  }
  for (auto& runs : runs_) {
    std::sort(runs.begin(), runs.end(),
              [](const HeldRun& a, const HeldRun& b) { return a.begin < b.begin; });
  }
}

int64_t DocumentIndex::slot(int64_t doc) const {
  auto it = std::lower_bound(ids_.begin(), ids_.end(), doc);
  if (it == ids_.end() || *it != doc) return -1;
  return it - ids_.begin();
}

int64_t DocumentIndex::doc_len(int64_t doc) const {
  const int64_t s = slot(doc);
  DISTCA_CHECK_MSG(s >= 0, "unknown document " + std::to_string(doc));
  return lens_[static_cast<size_t>(s)];
}

const std::vector<HeldRun>& DocumentIndex::runs(int64_t doc) const {
  const int64_t s = slot(doc);
  DISTCA_CHECK_MSG(s >= 0, "unknown document " + std::to_string(doc));
  return runs_[static_cast<size_t>(s)];
}

const HeldRun& DocumentIndex::run_at(int64_t doc, int64_t pos) const {
  const auto& rs = runs(doc);
  // The last run whose begin <= pos.
  auto it = std::upper_bound(rs.begin(), rs.end(), pos,
                             [](int64_t p, const HeldRun& r) { return p < r.begin; });
  DISTCA_CHECK(it != rs.begin());
  --it;
  DISTCA_CHECK(pos < it->end);
  return *it;
}

int64_t DocumentIndex::rows_held_by(int64_t doc, int64_t begin, int64_t end, int64_t rank) const {
  int64_t held = 0;
  for (const HeldRun& r : runs(doc)) {
    if (r.begin >= end) break;
    if (r.rank != rank) continue;
    const int64_t lo = std::max(begin, r.begin);
    const int64_t hi = std::min(end, r.end);
    if (hi > lo) held += hi - lo;
  }
  return held;
}

int64_t DocumentIndex::local_row(int64_t rank, int64_t doc, int64_t pos) const {
  if (!contains(doc) || pos < 0 || pos >= doc_len(doc)) return -1;
  const HeldRun& r = run_at(doc, pos);
  if (r.rank != rank) return -1;
  return r.local_row + (pos - r.begin);
}

}  // namespace distca
