// Shared state of the communication-aware schedulers (cad_state.h).
#include "cad_state.h"

#include <algorithm>
#include <cmath>
#include <limits>
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

void State::reset() {
  work_ = Work(nullptr);
  model_ = nullptr;
  weight_.clear();
  ranks_ = s_q_ = s_kv_ = 0;
  doc_id_.clear();
  doc_len_.clear();
  runs_.clear();
  load_.clear();
  rank_version_.clear();
  total_ = 0;
  by_load_.clear();
  segs_.clear();
  seg_next_.clear();
  doc_seg_head_.clear();
  chunks_.clear();
  chunk_next_.clear();
  doc_chunk_head_.clear();
  for (auto& v : rank_segs_) v.clear();
  for (auto& v : server_docs_) v.clear();
  bytes_ = bytes_start_ = Priced{};
  moves_ = 0;
  host_.clear();
  inter_price_ = 1;
}

namespace {

Status check_inputs(const Batch& batch, const ScheduleOptions& options) {
  DISTCA_RETURN_IF_ERROR(options.model.validate().with_context("--model"));
  if (options.dtype_bytes != 2 && options.dtype_bytes != 4) {
    return Status::invalid_argument("--dtype: activation bytes must be 2 (bf16) or 4 (fp32), got " +
                                    std::to_string(options.dtype_bytes));
  }
  DISTCA_RETURN_IF_ERROR(check_align_rows(options.align_rows));
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
  DISTCA_RETURN_IF_ERROR(check_doc_weights(options.doc_weights));
  DISTCA_RETURN_IF_ERROR(options.topology.validate(batch.ranks));
  return {};
}

Status check_piece(const Piece& p, int64_t r, size_t i) {
  if (p.doc < 0) return Status::invalid_argument(piece_where(r, i) + ": 'doc' must be >= 0");
  if (p.len <= 0) return Status::invalid_argument(piece_where(r, i) + ": 'len' must be positive");
  if (p.offset < 0) return Status::invalid_argument(piece_where(r, i) + ": 'offset' must be >= 0");
  if (p.doc_len <= 0) return Status::invalid_argument(piece_where(r, i) + ": 'doc_len' must be positive");
  if (p.offset > p.doc_len - p.len) {
    return Status::invalid_argument(piece_where(r, i) + ": piece lies outside document " +
                                    std::to_string(p.doc) + " of length " + std::to_string(p.doc_len));
  }
  return {};
}

// Document id -> slot while the pieces are read. The packer numbers documents 0, 1, ... in
// order of first appearance, so the slot is the id until a piece says otherwise; then ids are
// mapped through a dense table when they are small, else through a sorted list.
struct SlotIndex {
  bool identity = true, use_dense = false;
  std::vector<int32_t> dense;
  std::vector<std::pair<int64_t, int32_t>> sparse;  // (id, slot), sorted by id

  // The slot of document `doc`, -1 when it has none yet (`slots` so far).
  int32_t find(int64_t doc, size_t slots) const {
    if (identity) return doc < static_cast<int64_t>(slots) ? static_cast<int32_t>(doc) : -1;
    if (use_dense) return dense[static_cast<size_t>(doc)];
    auto it = std::lower_bound(sparse.begin(), sparse.end(), std::make_pair(doc, int32_t{-1}));
    return it != sparse.end() && it->first == doc ? it->second : -1;
  }
  // Leaves the identity: slots 0..slots-1 are their own ids.
  void leave_identity(const Batch& batch, size_t pieces, size_t slots) {
    identity = false;
    int64_t max_id = 0;
    for (const auto& qs : batch.per_rank) {
      for (const Piece& q : qs) max_id = std::max(max_id, q.doc);
    }
    use_dense = max_id < 4 * static_cast<int64_t>(pieces) + 1024;
    if (use_dense) {
      dense.assign(static_cast<size_t>(max_id + 1), -1);
      for (size_t j = 0; j < slots; ++j) dense[j] = static_cast<int32_t>(j);
    } else {
      for (size_t j = 0; j < slots; ++j) sparse.emplace_back(static_cast<int64_t>(j), static_cast<int32_t>(j));
    }
  }
  void add(int64_t doc, int32_t slot) {
    if (use_dense) {
      dense[static_cast<size_t>(doc)] = slot;
    } else {
      sparse.insert(std::lower_bound(sparse.begin(), sparse.end(), std::make_pair(doc, slot)), std::make_pair(doc, slot));
    }
  }
};

}  // namespace

// Colocated bytes: each rank holding a document needs its context [0, E), E = the end of its
// last piece there; a document in one piece needs nothing from anyone.
Priced State::colocated_bytes() const {
  Priced bytes;
  const size_t D = doc_len_.size();
  for (size_t d = 0; d < D; ++d) {
    const int32_t head = doc_seg_head_[d];
    if (seg_next_[static_cast<size_t>(head)] < 0) continue;
    for (int32_t i = head; i >= 0; i = seg_next_[static_cast<size_t>(i)]) {
      const int64_t r = runs_[static_cast<size_t>(i)].rank;
      bool listed = false;  // counted at the rank's first piece in the list
      for (int32_t j = head; j != i && !listed; j = seg_next_[static_cast<size_t>(j)]) {
        listed = runs_[static_cast<size_t>(j)].rank == r;
      }
      if (listed) continue;
      int64_t e = 0;
      for (int32_t j = i; j >= 0; j = seg_next_[static_cast<size_t>(j)]) {
        if (runs_[static_cast<size_t>(j)].rank == r) e = std::max(e, runs_[static_cast<size_t>(j)].end);
      }
      const int64_t kv = rows_not_held(static_cast<int64_t>(d), 0, e, r);
      bytes.bytes += kv * s_kv_;
      bytes.cost += kv * s_kv_;
      // Each K/V row crossing to a host once (delta_bytes): counted at the host's first
      // piece in the list, up to the end of the host's context.
      if (!priced()) continue;
      bool host_listed = false;
      for (int32_t j = head; j != i && !host_listed; j = seg_next_[static_cast<size_t>(j)]) {
        host_listed = host_of(runs_[static_cast<size_t>(j)].rank) == host_of(r);
      }
      if (host_listed) continue;
      const int64_t eh = host_need(static_cast<int64_t>(d), host_of(r));
      bytes.cost += (inter_price_ - 1) * s_kv_ * rows_off_host(static_cast<int64_t>(d), 0, eh, host_of(r));
    }
  }
  return bytes;
}

void State::record_start() {
  for (int64_t r = 0; r < ranks_; ++r) {
    total_ += load_[static_cast<size_t>(r)];
    by_load_.emplace(load_[static_cast<size_t>(r)], r);
  }
  bytes_ = colocated_bytes();
  bytes_start_ = bytes_;
  // What restart() needs to undo the moves.
  load_start_ = load_;
  total_start_ = total_;
  server_docs_start_.resize(server_docs_.size());
  for (size_t r = 0; r < server_docs_.size(); ++r) server_docs_start_[r] = static_cast<int32_t>(server_docs_[r].size());
}

Status State::init(const Batch& batch, const ScheduleOptions& options) {
  reset();
  DISTCA_RETURN_IF_ERROR(check_inputs(batch, options));
  if (options.topology.multi_host()) {
    for (const int64_t h : options.topology.host) host_.push_back(static_cast<int32_t>(h));
    inter_price_ = options.topology.inter_host_price;
  }
  work_ = Work(options.cost);
  model_ = options.cost;
  const auto& weights = options.doc_weights;
  ranks_ = batch.ranks;
  const RowBytes rb = row_bytes(options.model, options.dtype_bytes);
  s_q_ = rb.q + rb.o + rb.lse;
  s_kv_ = rb.kv;
  const auto R = static_cast<size_t>(ranks_);

  size_t pieces = 0;
  for (const auto& ps : batch.per_rank) pieces += ps.size();
  // 32-bit segment and slot ids (cad_state.h).
  if (pieces > (size_t{1} << 28) || ranks_ > (int64_t{1} << 28)) {
    return Status::invalid_argument("batch: more than 2^28 pieces or ranks");
  }

  // One pass over the pieces: checks, document slots, the colocated start (one segment per
  // piece, ids in batch order), loads, each rank's documents. Slots are in order of first
  // appearance (SlotIndex). Errors are reported in the order of separate passes: piece and
  // rank errors first, then an inconsistent doc_len, then tiling.
  load_.assign(R, 0.0);
  rank_version_.assign(R, 0);
  rank_segs_.resize(R);  // inner vectors empty (reset), capacity kept
  server_docs_.resize(R);
  // Moves that leave two remainders add segments; a few per server is typical.
  segs_.reserve(pieces + 4 * R + 1024);
  seg_next_.reserve(pieces + 4 * R + 1024);
  runs_.reserve(pieces);
  SlotIndex slots;
  std::string doc_error;  // the first inconsistent doc_len
  for (int64_t r = 0; r < ranks_; ++r) {
    int64_t used = 0;
    const auto& ps = batch.per_rank[static_cast<size_t>(r)];
    auto& docs = server_docs_[static_cast<size_t>(r)];
    rank_segs_[static_cast<size_t>(r)].reserve(ps.size());
    docs.reserve(ps.size());
    double load = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      const Piece& p = ps[i];
      DISTCA_RETURN_IF_ERROR(check_piece(p, r, i));
      used += p.len;
      int32_t slot = slots.find(p.doc, doc_len_.size());
      if (slot < 0) {
        slot = static_cast<int32_t>(doc_len_.size());
        if (slots.identity && p.doc != slot) {
          // Leave the identity: every slot so far is its own id.
          doc_id_.resize(doc_len_.size());
          for (size_t j = 0; j < doc_id_.size(); ++j) doc_id_[j] = static_cast<int64_t>(j);
          slots.leave_identity(batch, pieces, doc_id_.size());
        }
        doc_len_.push_back(p.doc_len);
        if (!weights.empty()) {
          auto wi = std::lower_bound(weights.begin(), weights.end(), p.doc,
                                     [](const DocWeight& w, int64_t doc) { return w.doc < doc; });
          weight_.push_back(wi != weights.end() && wi->doc == p.doc ? wi->weight : 1.0);
        }
        doc_seg_head_.push_back(-1);
        doc_chunk_head_.push_back(-1);
        if (!slots.identity) {
          doc_id_.push_back(p.doc);
          slots.add(p.doc, slot);
        }
      } else if (doc_len_[static_cast<size_t>(slot)] != p.doc_len && doc_error.empty()) {
        doc_error = "batch: document " + std::to_string(p.doc) + " has inconsistent 'doc_len' (" +
                    std::to_string(doc_len_[static_cast<size_t>(slot)]) + " and " + std::to_string(p.doc_len) + ")";
      }
      new_seg(slot, p.offset, p.offset + p.len, r);
      runs_.push_back({p.offset, p.offset + p.len, r});
      load += work(slot)(p.offset, p.offset + p.len);
      // doc_chunk_head_ doubles as "the last rank that listed the document" until the end.
      int32_t& seen = doc_chunk_head_[static_cast<size_t>(slot)];
      if (seen != static_cast<int32_t>(r)) docs.push_back(slot);
      seen = static_cast<int32_t>(r);
    }
    if (used > batch.tokens_per_rank) {
      return Status::invalid_argument("batch: rank " + std::to_string(r) + " holds " + std::to_string(used) +
                                      " tokens, more than tokens_per_rank " +
                                      std::to_string(batch.tokens_per_rank));
    }
    load_[static_cast<size_t>(r)] = load;
  }
  if (!doc_error.empty()) return Status::invalid_argument(doc_error);
  std::fill(doc_chunk_head_.begin(), doc_chunk_head_.end(), -1);
  DISTCA_RETURN_IF_ERROR(check_tiling());

  record_start();
  return Status::ok_status();
}

void State::restart() {
  const auto pieces = static_cast<int32_t>(runs_.size());
  // Heads first (the segments moves created sit in front of the pieces in each document's list).
  for (size_t id = static_cast<size_t>(pieces); id < segs_.size(); ++id) {
    auto& head = doc_seg_head_[static_cast<size_t>(segs_[id].doc)];
    while (head >= pieces) head = seg_next_[static_cast<size_t>(head)];
  }
  segs_.resize(static_cast<size_t>(pieces));
  seg_next_.resize(static_cast<size_t>(pieces));
  for (const Chunk& c : chunks_) doc_chunk_head_[static_cast<size_t>(c.doc)] = -1;
  chunks_.clear();
  chunk_next_.clear();
  // Pieces are numbered rank by rank (init), so a rank's pieces are one run of ids.
  int32_t first = 0;
  for (size_t r = 0; r < static_cast<size_t>(ranks_); ++r) {
    int32_t end = first;
    while (end < pieces && runs_[static_cast<size_t>(end)].rank == static_cast<int64_t>(r)) ++end;
    if (rank_version_[r] != 0) {
      auto& ids = rank_segs_[r];
      ids.clear();
      for (int32_t i = first; i < end; ++i) {
        segs_[static_cast<size_t>(i)].a = runs_[static_cast<size_t>(i)].begin;
        segs_[static_cast<size_t>(i)].b = runs_[static_cast<size_t>(i)].end;
        ids.push_back(i);
      }
      rank_version_[r] = 0;
    }
    server_docs_[r].resize(static_cast<size_t>(server_docs_start_[r]));
    first = end;
  }
  load_ = load_start_;
  total_ = total_start_;
  by_load_.clear();
  for (int64_t r = 0; r < ranks_; ++r) by_load_.emplace(load_[static_cast<size_t>(r)], r);
  bytes_ = bytes_start_;
  moves_ = 0;
}

Status State::check_tiling() const {
  std::vector<Run> sorted;
  for (size_t d = 0; d < doc_len_.size(); ++d) {
    // Fast path: a contiguous packing lists a document's pieces in order, so the list (batch
    // order reversed) runs down from doc_len to 0, each piece ending where the previous began.
    int64_t expect = doc_len_[d];
    int32_t i = doc_seg_head_[d];
    for (; i >= 0 && runs_[static_cast<size_t>(i)].end == expect; i = seg_next_[static_cast<size_t>(i)]) {
      expect = runs_[static_cast<size_t>(i)].begin;
    }
    if (i < 0 && expect == 0) continue;
    // Otherwise sort by begin and name the first gap or overlap.
    sorted.clear();
    for (i = doc_seg_head_[d]; i >= 0; i = seg_next_[static_cast<size_t>(i)]) sorted.push_back(runs_[static_cast<size_t>(i)]);
    std::sort(sorted.begin(), sorted.end(), [](const Run& x, const Run& y) { return x.begin < y.begin; });
    int64_t pos = 0;
    for (const Run& run : sorted) {
      if (run.begin != pos) {
        return Status::invalid_argument("batch: document " + std::to_string(doc_id(static_cast<int64_t>(d))) +
                                        (run.begin < pos ? " has overlapping pieces at row " : " has a gap before row ") +
                                        std::to_string(run.begin));
      }
      pos = run.end;
    }
    if (pos != doc_len_[d]) {
      return Status::invalid_argument("batch: document " + std::to_string(doc_id(static_cast<int64_t>(d))) +
                                      " covers " + std::to_string(pos) + " of its " + std::to_string(doc_len_[d]) +
                                      " rows");
    }
  }
  return Status::ok_status();
}

int64_t State::rows_not_held(int64_t d, int64_t begin, int64_t end, int64_t rank) const {
  int64_t held = 0;
  const auto pieces = static_cast<int32_t>(runs_.size());
  for (int32_t i = doc_seg_head_[static_cast<size_t>(d)]; i >= 0; i = seg_next_[static_cast<size_t>(i)]) {
    if (i >= pieces) continue;  // a segment a move created; the pieces follow
    const Run& run = runs_[static_cast<size_t>(i)];
    if (run.rank == rank) held += std::max<int64_t>(0, std::min(end, run.end) - std::max(begin, run.begin));
  }
  // The pieces tile the document: every row not held by `rank` is held by exactly one other.
  return (end - begin) - held;
}

int64_t State::rows_off_host(int64_t d, int64_t begin, int64_t end, int64_t h) const {
  int64_t on = 0;
  const auto pieces = static_cast<int32_t>(runs_.size());
  for (int32_t i = doc_seg_head_[static_cast<size_t>(d)]; i >= 0; i = seg_next_[static_cast<size_t>(i)]) {
    if (i >= pieces) continue;
    const Run& run = runs_[static_cast<size_t>(i)];
    if (host_of(run.rank) == h) on += std::max<int64_t>(0, std::min(end, run.end) - std::max(begin, run.begin));
  }
  return (end - begin) - on;
}

int64_t State::host_need(int64_t d, int64_t h, int64_t skip_seg) const {
  int64_t e = 0;
  for (int64_t id = doc_seg_head_[static_cast<size_t>(d)]; id >= 0; id = seg_next_[static_cast<size_t>(id)]) {
    const Seg& g = segs_[static_cast<size_t>(id)];
    if (g.alive() && id != skip_seg && host_of(g.rank) == h) e = std::max(e, g.b);
  }
  for (int64_t c = doc_chunk_head_[static_cast<size_t>(d)]; c >= 0; c = chunk_next_[static_cast<size_t>(c)]) {
    const Chunk& k = chunks_[static_cast<size_t>(c)];
    if (host_of(k.server) == h) e = std::max(e, k.y);
  }
  return e;
}

int64_t State::crossing_change(int64_t id, int64_t dest, int64_t x, int64_t y) const {
  const Seg& g = segs_[static_cast<size_t>(id)];
  const int64_t hd = host_of(dest), hh = host_of(g.rank);
  // What stays of the segment at home: its top while it stays, else [a, x).
  const int64_t stays = y < g.b ? g.b : (x > g.a ? x : 0);
  auto on = [&](int64_t h) -> int64_t {
    const int64_t before = host_need(g.doc, h, -1);
    int64_t after = host_need(g.doc, h, id);
    if (h == hh) after = std::max(after, stays);
    if (h == hd) after = std::max(after, y);
    if (after > before) return rows_off_host(g.doc, before, after, h);
    if (after < before) return -rows_off_host(g.doc, after, before, h);
    return 0;
  };
  return hd == hh ? on(hd) : on(hd) + on(hh);
}

bool State::same_piece(int64_t d, int64_t rank, int64_t begin, int64_t end) const {
  const auto pieces = static_cast<int32_t>(runs_.size());
  for (int32_t i = doc_seg_head_[static_cast<size_t>(d)]; i >= 0; i = seg_next_[static_cast<size_t>(i)]) {
    if (i >= pieces) continue;
    const Run& run = runs_[static_cast<size_t>(i)];
    if (run.rank == rank && run.begin <= begin && end <= run.end) return true;
  }
  return false;
}

int64_t State::new_seg(int64_t doc, int64_t a, int64_t b, int64_t rank) {
  DISTCA_CHECK(segs_.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()));
  const auto id = static_cast<int32_t>(segs_.size());
  segs_.push_back({a, b, static_cast<int32_t>(doc), static_cast<int32_t>(rank)});
  seg_next_.push_back(doc_seg_head_[static_cast<size_t>(doc)]);
  doc_seg_head_[static_cast<size_t>(doc)] = id;
  rank_segs_[static_cast<size_t>(rank)].push_back(id);
  return id;
}

const std::vector<int32_t>& State::rank_segs(int64_t r) {
  auto& v = rank_segs_[static_cast<size_t>(r)];
  std::erase_if(v, [&](int32_t id) { return !segs_[static_cast<size_t>(id)].alive(); });
  return v;
}

void State::doc_segs(int64_t d, std::vector<int64_t>* out) const {
  out->clear();
  for (int64_t id = doc_seg_head_[static_cast<size_t>(d)]; id >= 0; id = seg_next_[static_cast<size_t>(id)]) {
    if (segs_[static_cast<size_t>(id)].alive()) out->push_back(id);
  }
}

void State::context_servers(int64_t d, std::vector<int64_t>* out) const {
  out->clear();
  for (int64_t id = doc_seg_head_[static_cast<size_t>(d)]; id >= 0; id = seg_next_[static_cast<size_t>(id)]) {
    if (segs_[static_cast<size_t>(id)].alive()) out->push_back(segs_[static_cast<size_t>(id)].rank);
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
    if (g.alive() && g.rank == s && id != skip_seg) e = std::max(e, g.b);
  }
  for (int64_t c = doc_chunk_head_[static_cast<size_t>(d)]; c >= 0; c = chunk_next_[static_cast<size_t>(c)]) {
    const Chunk& k = chunks_[static_cast<size_t>(c)];
    if (k.server == s) e = std::max(e, k.y);
  }
  return e;
}

Priced State::delta_bytes(int64_t id, int64_t dest, int64_t x, int64_t y) const {
  const Seg& g = segs_[static_cast<size_t>(id)];
  const int64_t nd = need(g.doc, dest);
  int64_t kv = y > nd ? rows_not_held(g.doc, nd, y, dest) : 0;
  if (y == g.b) {
    // The home's context shrinks only when the segment's top leaves.
    const int64_t other = need(g.doc, g.rank, id);
    const int64_t old_end = std::max(other, g.b);
    const int64_t new_end = std::max(other, x > g.a ? x : int64_t{0});
    if (new_end < old_end) kv -= rows_not_held(g.doc, new_end, old_end, g.rank);
  }
  const int64_t q = (y - x) * s_q_;
  Priced out{q + kv * s_kv_, q * (same_host(g.rank, dest) ? 1 : inter_price_) + kv * s_kv_};
  // Every K/V row at 1, and inter_host_price - 1 more for each row crossing to a host.
  if (priced()) out.cost += (inter_price_ - 1) * s_kv_ * crossing_change(id, dest, x, y);
  return out;
}

double State::home_loss(int64_t id, int64_t x, int64_t y) const {
  const Seg& g = segs_[static_cast<size_t>(id)];
  const Work w = work(g.doc);
  if (w.is_pairs()) return w(x, y);
  return w(g.a, g.b) - w(g.a, x) - w(y, g.b);
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
  DISTCA_CHECK(g.alive() && g.a <= x && x < y && y <= g.b && dest != g.rank);
  const Priced d = delta_bytes(id, dest, x, y);
  bytes_.bytes += d.bytes;
  bytes_.cost += d.cost;
  const double loss = home_loss(id, x, y);
  const double gain = dest_gain(g.doc, x, y);
  if (need(g.doc, dest) == 0) server_docs_[static_cast<size_t>(dest)].push_back(g.doc);
  if (x > g.a) {
    segs_[static_cast<size_t>(id)].b = x;
    if (y < g.b) new_seg(g.doc, y, g.b, g.rank);
  } else if (y < g.b) {
    segs_[static_cast<size_t>(id)].a = y;
  } else {
    segs_[static_cast<size_t>(id)].a = g.b;  // empty: dead
  }
  // A chunk that continues one already sent from the same piece to the same server extends it
  // (one task; the bytes are the same either way: the context below its top is already there).
  // Only when costs add up over adjacent rows (pairs, weighted or not): a cost model's task
  // cost has per-task terms, and the loads must stay those of the tasks written out.
  int32_t merged = -1;
  for (int32_t c = model_ == nullptr ? doc_chunk_head_[static_cast<size_t>(g.doc)] : -1; c >= 0 && merged < 0;
       c = chunk_next_[static_cast<size_t>(c)]) {
    const Chunk& k = chunks_[static_cast<size_t>(c)];
    if (k.server == dest && k.home == g.rank && (k.x == y || k.y == x) &&
        same_piece(g.doc, g.rank, std::min(k.x, x), std::max(k.y, y))) {
      merged = c;
    }
  }
  if (merged >= 0) {
    Chunk& k = chunks_[static_cast<size_t>(merged)];
    k.x = std::min(k.x, x);
    k.y = std::max(k.y, y);
  } else {
    chunk_next_.push_back(doc_chunk_head_[static_cast<size_t>(g.doc)]);
    doc_chunk_head_[static_cast<size_t>(g.doc)] = static_cast<int32_t>(chunks_.size());
    chunks_.push_back({g.doc, x, y, g.rank, dest});
  }
  set_load(g.rank, load(g.rank) - loss);
  set_load(dest, load(dest) + gain);
  ++rank_version_[static_cast<size_t>(g.rank)];
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
    for (int32_t id : rank_segs_[static_cast<size_t>(r)]) {
      const Seg& g = segs_[static_cast<size_t>(id)];
      if (g.alive()) out.push_back({doc_id(g.doc), g.a, g.b, r, r});
    }
    for (int64_t i = first[static_cast<size_t>(r)]; i < first[static_cast<size_t>(r) + 1]; ++i) {
      const Chunk& c = chunks_[static_cast<size_t>(order[static_cast<size_t>(i)])];
      out.push_back({doc_id(c.doc), c.x, c.y, c.home, c.server});
    }
  }
  return out;
}

}  // namespace distca::cad_internal
