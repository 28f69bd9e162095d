// Batch::validate against a row-by-row reference on small random batches: in the generator's
// contiguous order (documents met in ascending id, each one's pieces in order, the order
// Batch::validate recognises in one pass), reordered, and corrupted.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "distca/core/rng.h"
#include "distca/data/batch.h"

namespace distca {
namespace {

int64_t pick(Rng& rng, int64_t lo, int64_t hi) {  // uniform in [lo, hi]
  return lo + static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(hi - lo + 1)));
}

// Valid by the rules of batch.h, checked one row at a time.
bool reference_valid(const Batch& b) {
  if (b.ranks <= 0 || b.tokens_per_rank <= 0 || static_cast<int64_t>(b.per_rank.size()) != b.ranks) return false;
  std::map<int64_t, int64_t> len;
  std::map<std::pair<int64_t, int64_t>, int> held;  // (doc, row) -> pieces holding it
  for (const auto& rank : b.per_rank) {
    int64_t used = 0;
    for (const Piece& p : rank) {
      if (p.doc < 0 || p.len <= 0 || p.offset < 0 || p.doc_len <= 0 || p.offset + p.len > p.doc_len) return false;
      used += p.len;
      if (used > b.tokens_per_rank) return false;
      if (len.count(p.doc) && len[p.doc] != p.doc_len) return false;
      len[p.doc] = p.doc_len;
      for (int64_t i = p.offset; i < p.offset + p.len; ++i) {
        if (++held[{p.doc, i}] > 1) return false;
      }
    }
  }
  for (const auto& [doc, n] : len) {
    for (int64_t i = 0; i < n; ++i) {
      if (!held.count({doc, i})) return false;
    }
  }
  return true;
}

// Documents of random lengths packed in order (ids `first`, `first + step`, ...), a document
// continuing on the next rank.
Batch packed(Rng& rng, int64_t first, int64_t step) {
  Batch b;
  b.ranks = pick(rng, 1, 4);
  b.tokens_per_rank = pick(rng, 4, 20);
  b.per_rank.assign(static_cast<size_t>(b.ranks), {});
  int64_t rank = 0, room = b.tokens_per_rank, id = first;
  while (rank < b.ranks) {
    const int64_t len = pick(rng, 1, 2 * b.tokens_per_rank);
    for (int64_t pos = 0; pos < len && rank < b.ranks;) {
      const int64_t take = std::min(len - pos, room);
      b.per_rank[static_cast<size_t>(rank)].push_back({id, pos, take, len});
      pos += take;
      room -= take;
      if (room == 0) {
        ++rank;
        room = b.tokens_per_rank;
      }
      if (pos < len && rank == b.ranks) {
        // The batch ends inside the document: it keeps the rows that fit (as the packer does).
        for (auto& r : b.per_rank) for (Piece& p : r) if (p.doc == id) p.doc_len = pos;
      }
    }
    id += step;
  }
  return b;
}

void corrupt(Rng& rng, Batch& b) {
  auto& rank = b.per_rank[rng.uniform_int(b.per_rank.size())];
  if (rank.empty()) return;
  const size_t i = rng.uniform_int(rank.size());
  Piece& p = rank[i];
  switch (rng.uniform_int(8)) {
    case 0: p.offset += rng.bernoulli(0.5) ? 1 : -1; break;
    case 1: p.len += rng.bernoulli(0.5) ? 1 : -1; break;
    case 2: p.doc_len += rng.bernoulli(0.5) ? 1 : -1; break;
    case 3: p.doc = b.per_rank[0][0].doc; break;  // another document's id (or its own)
    case 4: p.doc += 1; break;
    case 5: rank.erase(rank.begin() + static_cast<std::ptrdiff_t>(i)); break;
    case 6: rank.push_back(p); break;
    default: {  // move the piece to the front of another rank: reordered, often still valid
      const Piece moved = p;
      rank.erase(rank.begin() + static_cast<std::ptrdiff_t>(i));
      auto& other = b.per_rank[rng.uniform_int(b.per_rank.size())];
      other.insert(other.begin(), moved);
    }
  }
}

TEST(BatchValidate, AgreesWithARowByRowReference) {
  Rng rng(2026);
  int valid = 0, invalid = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    // Ascending ids (the one-pass order), sparse ascending ids, or descending ids.
    const int kind = trial % 3;
    Batch b = packed(rng, kind == 2 ? 1000 : pick(rng, 0, 5), kind == 0 ? 1 : (kind == 1 ? 1000003 : -7));
    const int faults = static_cast<int>(rng.uniform_int(3));
    for (int f = 0; f < faults; ++f) corrupt(rng, b);
    const bool want = reference_valid(b);
    const Status st = b.validate();
    ASSERT_EQ(st.ok(), want) << "trial " << trial << ": " << st.to_string();
    if (!st.ok()) {
      EXPECT_EQ(st.message().find('\n'), std::string::npos);
    }
    (want ? valid : invalid) += 1;
  }
  EXPECT_GT(valid, 5000);
  EXPECT_GT(invalid, 5000);
}

}  // namespace
}  // namespace distca
