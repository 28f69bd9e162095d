// Shared state of the communication-aware schedulers (cad_state.h).
#include "cad_state.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "distca/core/check.h"
#include "distca/plan/split.h"

namespace distca::cad_internal {

int64_t Work::start_for(int64_t lo, int64_t y, double w) const {
  DISTCA_CHECK(0 <= lo && lo < y);
  if (model_ == nullptr) {
    // Exact: pairs are integers; a fractional target rounds up.
    const double wc = std::ceil(w);
    if (wc <= 0) return y - 1 >= lo ? y - 1 : lo;
    const int64_t x = chunk_start_for_pairs(y, static_cast<int64_t>(wc));
    return std::max(x, lo);
  }
  if ((*this)(lo, y) < w) return lo;
  int64_t good = lo, bad = y;  // cost(good, y) >= w; cost(bad, y) = 0 < w
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    if ((*this)(mid, y) >= w) {
      good = mid;
    } else {
      bad = mid;
    }
  }
  return good;
}

namespace {

std::string piece_where(int64_t r, size_t i) {
  return "batch: rank " + std::to_string(r) + " piece " + std::to_string(i);
}

}  // namespace

Status State::init(const Batch& batch, const ScheduleOptions& options) {
  DISTCA_RETURN_IF_ERROR(options.model.validate().with_context("--model"));
  if (options.dtype_bytes != 2 && options.dtype_bytes != 4) {
    return Status::invalid_argument("--dtype: activation bytes must be 2 (bf16) or 4 (fp32), got " +
                                    std::to_string(options.dtype_bytes));
  }
  if (!std::isfinite(options.tolerance) || options.tolerance < 0 || options.tolerance > 1) {
    return Status::invalid_argument("--tolerance must be in [0, 1] (got " +
                                    std::to_string(options.tolerance) + ")");
  }
  if (batch.ranks <= 0) return Status::invalid_argument("batch: 'ranks' must be positive");
  if (batch.tokens_per_rank <= 0) return Status::invalid_argument("batch: 'tokens_per_rank' must be positive");
  if (static_cast<int64_t>(batch.per_rank.size()) != batch.ranks) {
    return Status::invalid_argument("batch: 'per_rank' has " + std::to_string(batch.per_rank.size()) +
                                    " entries but 'ranks' is " + std::to_string(batch.ranks));
  }
  work_ = Work(options.cost);
  ranks_ = batch.ranks;
  const RowBytes rb = row_bytes(options.model, options.dtype_bytes);
  s_q_ = rb.q + rb.o + rb.lse;
  s_kv_ = rb.kv;
  const auto R = static_cast<size_t>(ranks_);

  // Pass 1: per-piece checks, document slots in order of first appearance. Ids are mapped
  // through a dense table when they are small (the packer numbers documents 0, 1, ...), else
  // through a sorted list.
  int64_t max_id = -1;
  size_t pieces = 0;
  for (int64_t r = 0; r < ranks_; ++r) {
    int64_t used = 0;
    const auto& ps = batch.per_rank[static_cast<size_t>(r)];
    for (size_t i = 0; i < ps.size(); ++i) {
      const Piece& p = ps[i];
      if (p.doc < 0) return Status::invalid_argument(piece_where(r, i) + ": 'doc' must be >= 0");
      if (p.len <= 0) return Status::invalid_argument(piece_where(r, i) + ": 'len' must be positive");
      if (p.offset < 0) return Status::invalid_argument(piece_where(r, i) + ": 'offset' must be >= 0");
      if (p.doc_len <= 0) return Status::invalid_argument(piece_where(r, i) + ": 'doc_len' must be positive");
      if (p.offset > p.doc_len - p.len) {
        return Status::invalid_argument(piece_where(r, i) + ": piece lies outside document " +
                                        std::to_string(p.doc) + " of length " + std::to_string(p.doc_len));
      }
      used += p.len;
      max_id = std::max(max_id, p.doc);
    }
    if (used > batch.tokens_per_rank) {
      return Status::invalid_argument("batch: rank " + std::to_string(r) + " holds " + std::to_string(used) +
                                      " tokens, more than tokens_per_rank " +
                                      std::to_string(batch.tokens_per_rank));
    }
    pieces += ps.size();
  }
  std::vector<int64_t> dense;
  std::vector<std::pair<int64_t, int64_t>> sparse;  // (id, slot), sorted by id
  const bool use_dense = max_id < 4 * static_cast<int64_t>(pieces) + 1024;
  if (use_dense) dense.assign(static_cast<size_t>(max_id + 1), -1);
  std::vector<int64_t> piece_slot;
  piece_slot.reserve(pieces);
  for (int64_t r = 0; r < ranks_; ++r) {
    for (const Piece& p : batch.per_rank[static_cast<size_t>(r)]) {
      int64_t slot = -1;
      if (use_dense) {
        slot = dense[static_cast<size_t>(p.doc)];
      } else {
        auto it = std::lower_bound(sparse.begin(), sparse.end(), std::make_pair(p.doc, int64_t{-1}));
        if (it != sparse.end() && it->first == p.doc) slot = it->second;
      }
      if (slot < 0) {
        slot = static_cast<int64_t>(doc_id_.size());
        doc_id_.push_back(p.doc);
        doc_len_.push_back(p.doc_len);
        if (use_dense) {
          dense[static_cast<size_t>(p.doc)] = slot;
        } else {
          sparse.insert(std::lower_bound(sparse.begin(), sparse.end(), std::make_pair(p.doc, slot)),
                        std::make_pair(p.doc, slot));
        }
      } else if (doc_len_[static_cast<size_t>(slot)] != p.doc_len) {
        return Status::invalid_argument("batch: document " + std::to_string(p.doc) +
                                        " has inconsistent 'doc_len' (" +
                                        std::to_string(doc_len_[static_cast<size_t>(slot)]) + " and " +
                                        std::to_string(p.doc_len) + ")");
      }
      piece_slot.push_back(slot);
    }
  }
  // Pass 2: runs per document (CSR), sorted by begin; they must tile [0, doc_len).
  const size_t D = doc_id_.size();
  run_start_.assign(D + 1, 0);
  for (int64_t slot : piece_slot) ++run_start_[static_cast<size_t>(slot) + 1];
  for (size_t d = 0; d < D; ++d) run_start_[d + 1] += run_start_[d];
  runs_.resize(pieces);
  {
    std::vector<int64_t> fill(run_start_.begin(), run_start_.end() - 1);
    size_t k = 0;
    for (int64_t r = 0; r < ranks_; ++r) {
      for (const Piece& p : batch.per_rank[static_cast<size_t>(r)]) {
        runs_[static_cast<size_t>(fill[static_cast<size_t>(piece_slot[k++])]++)] = {p.offset, p.offset + p.len, r};
      }
    }
  }
  for (size_t d = 0; d < D; ++d) {
    const auto first = runs_.begin() + run_start_[d], last = runs_.begin() + run_start_[d + 1];
    if (last - first > 1) {
      std::sort(first, last, [](const Run& x, const Run& y) { return x.begin < y.begin; });
    }
    int64_t pos = 0;
    for (auto it = first; it != last; ++it) {
      if (it->begin != pos) {
        return Status::invalid_argument("batch: document " + std::to_string(doc_id_[d]) +
                                        (it->begin < pos ? " has overlapping pieces at row "
                                                         : " has a gap before row ") +
                                        std::to_string(it->begin));
      }
      pos = it->end;
    }
    if (pos != doc_len_[d]) {
      return Status::invalid_argument("batch: document " + std::to_string(doc_id_[d]) + " covers " +
                                      std::to_string(pos) + " of its " + std::to_string(doc_len_[d]) +
                                      " rows");
    }
  }

  // The colocated start: one segment per piece.
  load_.assign(R, 0.0);
  rank_segs_.assign(R, {});
  server_docs_.assign(R, {});
  doc_seg_head_.assign(D, -1);
  doc_chunk_head_.assign(D, -1);
  segs_.reserve(pieces + pieces / 4);
  seg_next_.reserve(pieces + pieces / 4);
  size_t k = 0;
  std::vector<int64_t> seen(D, -1);  // last rank that listed the document
  for (int64_t r = 0; r < ranks_; ++r) {
    auto& docs = server_docs_[static_cast<size_t>(r)];
    rank_segs_[static_cast<size_t>(r)].reserve(batch.per_rank[static_cast<size_t>(r)].size());
    for (const Piece& p : batch.per_rank[static_cast<size_t>(r)]) {
      const int64_t d = piece_slot[k++];
      new_seg(d, p.offset, p.offset + p.len, r);
      load_[static_cast<size_t>(r)] += work_(p.offset, p.offset + p.len);
      if (seen[static_cast<size_t>(d)] != r) docs.push_back(d);
      seen[static_cast<size_t>(d)] = r;
    }
  }
  for (int64_t r = 0; r < ranks_; ++r) {
    total_ += load_[static_cast<size_t>(r)];
    by_load_.emplace(load_[static_cast<size_t>(r)], r);
    for (int64_t d : server_docs_[static_cast<size_t>(r)]) {
      bytes_ += rows_not_held(d, 0, need(d, r), r) * s_kv_;
    }
  }
  bytes_start_ = bytes_;
  return Status::ok_status();
}

int64_t State::rows_not_held(int64_t d, int64_t begin, int64_t end, int64_t rank) const {
  int64_t held = 0;
  for (int64_t i = run_start_[static_cast<size_t>(d)]; i < run_start_[static_cast<size_t>(d) + 1]; ++i) {
    const Run& run = runs_[static_cast<size_t>(i)];
    if (run.begin >= end) break;
    if (run.rank != rank) continue;
    const int64_t lo = std::max(begin, run.begin), hi = std::min(end, run.end);
    if (hi > lo) held += hi - lo;
  }
  return (end - begin) - held;
}

int64_t State::new_seg(int64_t doc, int64_t a, int64_t b, int64_t rank) {
  const auto id = static_cast<int64_t>(segs_.size());
  segs_.push_back({doc, a, b, rank, true});
  seg_next_.push_back(doc_seg_head_[static_cast<size_t>(doc)]);
  doc_seg_head_[static_cast<size_t>(doc)] = id;
  rank_segs_[static_cast<size_t>(rank)].push_back(id);
  return id;
}

const std::vector<int64_t>& State::rank_segs(int64_t r) {
  auto& v = rank_segs_[static_cast<size_t>(r)];
  std::erase_if(v, [&](int64_t id) { return !segs_[static_cast<size_t>(id)].alive; });
  return v;
}

void State::doc_segs(int64_t d, std::vector<int64_t>* out) const {
  out->clear();
  for (int64_t id = doc_seg_head_[static_cast<size_t>(d)]; id >= 0; id = seg_next_[static_cast<size_t>(id)]) {
    if (segs_[static_cast<size_t>(id)].alive) out->push_back(id);
  }
}

void State::context_servers(int64_t d, std::vector<int64_t>* out) const {
  out->clear();
  for (int64_t id = doc_seg_head_[static_cast<size_t>(d)]; id >= 0; id = seg_next_[static_cast<size_t>(id)]) {
    if (segs_[static_cast<size_t>(id)].alive) out->push_back(segs_[static_cast<size_t>(id)].rank);
  }
  for (int64_t c = doc_chunk_head_[static_cast<size_t>(d)]; c >= 0; c = chunk_next_[static_cast<size_t>(c)]) {
    out->push_back(chunks_[static_cast<size_t>(c)].server);
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
}

int64_t State::need(int64_t d, int64_t s, int64_t skip_seg) const {
  int64_t e = 0;
  for (int64_t id = doc_seg_head_[static_cast<size_t>(d)]; id >= 0; id = seg_next_[static_cast<size_t>(id)]) {
    const Seg& g = segs_[static_cast<size_t>(id)];
    if (g.alive && g.rank == s && id != skip_seg) e = std::max(e, g.b);
  }
  for (int64_t c = doc_chunk_head_[static_cast<size_t>(d)]; c >= 0; c = chunk_next_[static_cast<size_t>(c)]) {
    const Chunk& k = chunks_[static_cast<size_t>(c)];
    if (k.server == s) e = std::max(e, k.y);
  }
  return e;
}

int64_t State::delta_bytes(int64_t id, int64_t dest, int64_t x, int64_t y) const {
  const Seg& g = segs_[static_cast<size_t>(id)];
  int64_t kv_rows = 0;
  const int64_t nd = need(g.doc, dest);
  if (y > nd) kv_rows += rows_not_held(g.doc, nd, y, dest);
  if (y == g.b) {
    // The home's context shrinks only when the segment's top leaves.
    const int64_t other = need(g.doc, g.rank, id);
    const int64_t old_end = std::max(other, g.b);
    const int64_t new_end = std::max(other, x > g.a ? x : int64_t{0});
    if (new_end < old_end) kv_rows -= rows_not_held(g.doc, new_end, old_end, g.rank);
  }
  return (y - x) * s_q_ + kv_rows * s_kv_;
}

double State::home_loss(int64_t id, int64_t x, int64_t y) const {
  const Seg& g = segs_[static_cast<size_t>(id)];
  if (work_.is_pairs()) return work_(x, y);
  return work_(g.a, g.b) - work_(g.a, x) - work_(y, g.b);
}

void State::set_load(int64_t r, double v) {
  auto& cur = load_[static_cast<size_t>(r)];
  by_load_.erase({cur, r});
  total_ += v - cur;
  cur = v;
  by_load_.emplace(cur, r);
}

void State::move(int64_t id, int64_t dest, int64_t x, int64_t y) {
  Seg g = segs_[static_cast<size_t>(id)];
  DISTCA_CHECK(g.alive && g.a <= x && x < y && y <= g.b && dest != g.rank);
  bytes_ += delta_bytes(id, dest, x, y);
  const double loss = home_loss(id, x, y);
  const double gain = dest_gain(x, y);
  if (need(g.doc, dest) == 0) server_docs_[static_cast<size_t>(dest)].push_back(g.doc);
  if (x > g.a) {
    segs_[static_cast<size_t>(id)].b = x;
    if (y < g.b) new_seg(g.doc, y, g.b, g.rank);
  } else if (y < g.b) {
    segs_[static_cast<size_t>(id)].a = y;
  } else {
    segs_[static_cast<size_t>(id)].alive = false;
  }
  chunk_next_.push_back(doc_chunk_head_[static_cast<size_t>(g.doc)]);
  doc_chunk_head_[static_cast<size_t>(g.doc)] = static_cast<int64_t>(chunks_.size());
  chunks_.push_back({g.doc, x, y, g.rank, dest});
  set_load(g.rank, load(g.rank) - loss);
  set_load(dest, load(dest) + gain);
  ++moves_;
}

std::vector<TaskPlacement> State::tasks() const {
  std::vector<TaskPlacement> out;
  out.reserve(segs_.size() + chunks_.size());
  std::vector<int64_t> first(static_cast<size_t>(ranks_) + 1, 0);  // chunks by server (CSR)
  for (const Chunk& c : chunks_) ++first[static_cast<size_t>(c.server) + 1];
  for (size_t r = 0; r < static_cast<size_t>(ranks_); ++r) first[r + 1] += first[r];
  std::vector<int64_t> order(chunks_.size());
  {
    std::vector<int64_t> fill(first.begin(), first.end() - 1);
    for (size_t c = 0; c < chunks_.size(); ++c) {
      order[static_cast<size_t>(fill[static_cast<size_t>(chunks_[c].server)]++)] = static_cast<int64_t>(c);
    }
  }
  for (int64_t r = 0; r < ranks_; ++r) {
    for (int64_t id : rank_segs_[static_cast<size_t>(r)]) {
      const Seg& g = segs_[static_cast<size_t>(id)];
      if (g.alive) out.push_back({doc_id_[static_cast<size_t>(g.doc)], g.a, g.b, r, r});
    }
    for (int64_t i = first[static_cast<size_t>(r)]; i < first[static_cast<size_t>(r) + 1]; ++i) {
      const Chunk& c = chunks_[static_cast<size_t>(order[static_cast<size_t>(i)])];
      out.push_back({doc_id_[static_cast<size_t>(c.doc)], c.x, c.y, c.home, c.server});
    }
  }
  return out;
}

}  // namespace distca::cad_internal
