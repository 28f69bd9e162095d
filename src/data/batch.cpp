#include "distca/data/batch.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace distca {
namespace {

std::string where(int64_t rank, size_t index) {
  return "per_rank[" + std::to_string(rank) + "][" + std::to_string(index) + "]";
}

Result<int64_t> get_int(const nlohmann::json& obj, const char* key, const std::string& ctx) {
  if (!obj.is_object() || !obj.contains(key)) {
    return Status::invalid_argument(ctx + ": missing field '" + key + "'");
  }
  const auto& v = obj.at(key);
  if (!v.is_number_integer()) {
    return Status::invalid_argument(ctx + ": field '" + key + "' must be an integer");
  }
  // nlohmann stores 2^63 .. 2^64-1 as unsigned; get<int64_t> would wrap it negative.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return Status::invalid_argument(ctx + ": field '" + key + "' is beyond int64");
  }
  return v.get<int64_t>();
}

// The pieces document by document (ascending id), by offset within a document: the order
// the document-level checks walk. Generator ids are 0 .. documents - 1, so a counting sort by
// id (O(pieces)) replaces the general sort whenever the ids span at most about twice the
// pieces; either way the order is the same (offset ties, only in an invalid batch, keep their
// input order). Pointers, not copies: this runs on every plan of batches with ~10^5 pieces.
// The common case in one pass: dense ids and every document's pieces met in order of offset
// when the ranks are read in order (the contiguous layout), each continuing where the last
// ended, every document ending at its doc_len with one doc_len. True means the documents are
// tiled exactly; false means "not shown": the general walk below decides, and names the fault.
bool tiles_in_order(const std::vector<std::vector<Piece>>& per_rank, size_t total, int64_t lo, int64_t hi) {
  if (total == 0 || hi - lo >= static_cast<int64_t>(2 * total + 1024)) return false;
  const auto n = static_cast<size_t>(hi - lo) + 1;
  std::vector<int64_t> next(n, 0), len(n, 0);  // len 0: not met yet
  for (const auto& rank : per_rank) {
    for (const Piece& p : rank) {
      const auto d = static_cast<size_t>(p.doc - lo);
      if (len[d] == 0) len[d] = p.doc_len;
      if (p.offset != next[d] || p.doc_len != len[d]) return false;
      next[d] = p.offset + p.len;
    }
  }
  for (size_t d = 0; d < n; ++d) {
    if (next[d] != len[d]) return false;
  }
  return true;
}

// `lo` and `hi`: the smallest and largest id (all >= 0).
std::vector<const Piece*> by_document(const std::vector<std::vector<Piece>>& per_rank, size_t total, int64_t lo,
                                      int64_t hi) {
  std::vector<const Piece*> out;
  out.reserve(total);
  auto by_offset = [](const Piece* a, const Piece* b) { return a->offset < b->offset; };
  if (total == 0) return out;
  if (hi - lo >= static_cast<int64_t>(2 * total + 1024)) {
    for (const auto& rank : per_rank) for (const Piece& p : rank) out.push_back(&p);
    std::stable_sort(out.begin(), out.end(), [](const Piece* a, const Piece* b) {
      return a->doc != b->doc ? a->doc < b->doc : a->offset < b->offset;
    });
    return out;
  }
  // start[d] counts, then (prefix sums) begins; used as cursors, then shifted back.
  std::vector<size_t> start(static_cast<size_t>(hi - lo) + 1, 0);
  for (const auto& rank : per_rank) for (const Piece& p : rank) ++start[static_cast<size_t>(p.doc - lo)];
  size_t at = 0;
  for (size_t& c : start) {
    const size_t n = c;
    c = at;
    at += n;
  }
  out.resize(total);
  for (const auto& rank : per_rank) for (const Piece& p : rank) out[start[static_cast<size_t>(p.doc - lo)]++] = &p;
  // start[d] is now the end of document d, i.e. the begin of the next one.
  size_t begin = 0;
  for (const size_t end : start) {
    const size_t n = end - begin;
    const Piece** g = out.data() + begin;
    begin = end;
    if (n < 2) continue;
    if (n > 16) {
      std::stable_sort(g, g + n, by_offset);
      continue;
    }
    for (size_t i = 1; i < n; ++i) {  // insertion sort: a document has a few pieces
      for (size_t j = i; j > 0 && by_offset(g[j], g[j - 1]); --j) std::swap(g[j], g[j - 1]);
    }
  }
  return out;
}

}  // namespace

int64_t Batch::num_documents() const {
  std::vector<int64_t> ids;
  for (const auto& rank : per_rank) {
    for (const auto& p : rank) ids.push_back(p.doc);
  }
  std::sort(ids.begin(), ids.end());
  return std::unique(ids.begin(), ids.end()) - ids.begin();
}

int64_t Batch::rank_tokens(int64_t r) const {
  DISTCA_CHECK(r >= 0 && r < static_cast<int64_t>(per_rank.size()));
  int64_t t = 0;
  for (const auto& p : per_rank[static_cast<size_t>(r)]) t += p.len;
  return t;
}

Status Batch::validate() const {
  if (ranks <= 0) return Status::invalid_argument("batch: 'ranks' must be positive");
  if (tokens_per_rank <= 0) return Status::invalid_argument("batch: 'tokens_per_rank' must be positive");
  if (static_cast<int64_t>(per_rank.size()) != ranks) {
    return Status::invalid_argument("batch: 'per_rank' has " + std::to_string(per_rank.size()) +
                                    " entries but 'ranks' is " + std::to_string(ranks));
  }
  // No per-piece allocation (messages are built only on failure).
  size_t total = 0;
  int64_t lo = INT64_MAX, hi = 0;
  // The generator's contiguous layout, shown in this pass without any array: each document's
  // pieces met one after another from offset 0, each continuing where the last ended, ending at
  // the one doc_len, and documents met in ascending id (so none is met twice). Otherwise the
  // walks below decide.
  bool in_order = true;
  int64_t cur = -1, cur_len = 0, cur_end = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    int64_t used = 0;
    const auto& pieces = per_rank[static_cast<size_t>(r)];
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      const char* bad = nullptr;
      if (p.doc < 0) bad = "'doc' must be >= 0";
      else if (p.len <= 0) bad = "'len' must be positive";
      else if (p.offset < 0) bad = "'offset' must be >= 0";
      else if (p.doc_len <= 0) bad = "'doc_len' must be positive";
      if (bad != nullptr) return Status::invalid_argument("batch: " + where(r, i) + ": " + bad);
      if (p.offset > p.doc_len - p.len) {
        // offset + len may overflow here, so the message quotes both separately.
        return Status::invalid_argument("batch: " + where(r, i) + ": piece at offset " + std::to_string(p.offset) +
                                        " of length " + std::to_string(p.len) + " lies outside document " +
                                        std::to_string(p.doc) + " of length " + std::to_string(p.doc_len));
      }
      // Compared before adding so that huge lengths cannot overflow the sum.
      if (p.len > tokens_per_rank - used) {
        return Status::invalid_argument("batch: rank " + std::to_string(r) + " holds more than tokens_per_rank " +
                                        std::to_string(tokens_per_rank) + " tokens");
      }
      used += p.len;
      ++total;
      lo = std::min(lo, p.doc);
      hi = std::max(hi, p.doc);
      if (p.doc == cur) {
        in_order = in_order && p.offset == cur_end && p.doc_len == cur_len;
      } else {
        in_order = in_order && cur_end == cur_len && p.doc > cur && p.offset == 0;
        cur = p.doc;
        cur_len = p.doc_len;
      }
      cur_end = p.offset + p.len;
    }
  }
  if (in_order && cur_end == cur_len) return {};
  if (tiles_in_order(per_rank, total, lo, hi)) return {};
  const std::vector<const Piece*> spans = by_document(per_rank, total, lo, hi);
  for (size_t i = 0; i < spans.size();) {
    const int64_t doc = spans[i]->doc;
    const int64_t len = spans[i]->doc_len;
    int64_t next = 0;
    for (; i < spans.size() && spans[i]->doc == doc; ++i) {
      const Piece& s = *spans[i];
      if (s.doc_len != len) {
        return Status::invalid_argument("batch: document " + std::to_string(doc) + " has inconsistent 'doc_len' (" +
                                        std::to_string(len) + " and " + std::to_string(s.doc_len) + ")");
      }
      if (s.offset != next) {
        return Status::invalid_argument("batch: document " + std::to_string(doc) + " is not tiled by its pieces (" +
                                        (s.offset < next ? "overlap" : "gap") + " at token " +
                                        std::to_string(std::min(s.offset, next)) + ")");
      }
      next = s.offset + s.len;
    }
    if (next != len) {
      return Status::invalid_argument("batch: document " + std::to_string(doc) + " pieces cover " +
                                      std::to_string(next) + " of its " + std::to_string(len) + " tokens");
    }
  }
  return {};
}

nlohmann::json batch_to_json(const Batch& b) {
  nlohmann::json per_rank = nlohmann::json::array();
  for (const auto& rank : b.per_rank) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const auto& p : rank) {
      pieces.push_back({{"doc", p.doc}, {"offset", p.offset}, {"len", p.len}, {"doc_len", p.doc_len}});
    }
    per_rank.push_back(std::move(pieces));
  }
  return {{"ranks", b.ranks}, {"tokens_per_rank", b.tokens_per_rank}, {"per_rank", std::move(per_rank)}};
}

Result<Batch> batch_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return Status::invalid_argument("batch: must be a JSON object");
  Batch b;
  DISTCA_ASSIGN_OR_RETURN(b.ranks, get_int(j, "ranks", "batch"));
  DISTCA_ASSIGN_OR_RETURN(b.tokens_per_rank, get_int(j, "tokens_per_rank", "batch"));
  if (!j.contains("per_rank") || !j["per_rank"].is_array()) {
    return Status::invalid_argument("batch: missing array field 'per_rank'");
  }
  if (b.ranks <= 0 || b.ranks > (int64_t{1} << 24)) {
    return Status::invalid_argument("batch: 'ranks' must be in [1, 16777216]");
  }
  for (size_t r = 0; r < j["per_rank"].size(); ++r) {
    const auto& rank = j["per_rank"][r];
    if (!rank.is_array()) return Status::invalid_argument("batch: per_rank[" + std::to_string(r) + "] must be an array");
    std::vector<Piece> pieces;
    pieces.reserve(rank.size());
    for (size_t i = 0; i < rank.size(); ++i) {
      const std::string ctx = "batch: " + where(static_cast<int64_t>(r), i);
      Piece p;
      DISTCA_ASSIGN_OR_RETURN(p.doc, get_int(rank[i], "doc", ctx));
      DISTCA_ASSIGN_OR_RETURN(p.offset, get_int(rank[i], "offset", ctx));
      DISTCA_ASSIGN_OR_RETURN(p.len, get_int(rank[i], "len", ctx));
      DISTCA_ASSIGN_OR_RETURN(p.doc_len, get_int(rank[i], "doc_len", ctx));
      pieces.push_back(p);
    }
    b.per_rank.push_back(std::move(pieces));
  }
  DISTCA_RETURN_IF_ERROR(b.validate());
  return b;
}

Result<std::vector<Batch>> batches_from_json(const nlohmann::json& j, const std::string& context) {
  // A `workload --json --full` summary wraps the batch under "batch"; a bare batch has
  // "per_rank" as an array of arrays.
  auto one = [](const nlohmann::json& x, const std::string& ctx) -> Result<Batch> {
    const nlohmann::json& b = (x.is_object() && x.contains("batch")) ? x.at("batch") : x;
    auto r = batch_from_json(b);
    if (!r.ok()) return Status(r.status().code(), ctx + ": " + r.status().message());
    return r;
  };
  std::vector<Batch> out;
  if (j.is_object() && j.contains("batches")) {
    const nlohmann::json& list = j.at("batches");
    if (!list.is_array() || list.empty()) {
      return Status::invalid_argument(context + ": 'batches' must be a non-empty array");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      DISTCA_ASSIGN_OR_RETURN(Batch b, one(list[i], context + ": batches[" + std::to_string(i) + "]"));
      out.push_back(std::move(b));
    }
  } else {
    DISTCA_ASSIGN_OR_RETURN(Batch b, one(j, context));
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace distca
