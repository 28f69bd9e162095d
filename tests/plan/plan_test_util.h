// Test helpers of the plan layer: small random batches (independent of the data layer's
// workload generator) and random schedules, all from distca::Rng with fixed seeds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "distca/core/check.h"
#include "distca/core/rng.h"
#include "distca/cost/analytic.h"
#include "distca/data/batch.h"
#include "distca/data/workload.h"
#include "distca/plan/schedule.h"

namespace distca::test {

enum class TestLayout { kContiguous, kScattered };

inline int64_t pick(Rng& rng, int64_t lo, int64_t hi) {  // uniform in [lo, hi]
  return lo + static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(hi - lo + 1)));
}

// A random small batch. Contiguous: documents packed in order, a document continuing on the
// next rank (the foundation's contiguous layout). Scattered: every document cut into 1-4
// pieces placed on random ranks with room (a rank may hold several, non-adjacent pieces of one
// document: covers the head-tail layout and more). Document ids are distinct, not 0..n-1.
inline Batch random_batch(uint64_t seed, TestLayout layout, int64_t max_ranks = 8,
                          int64_t max_tokens = 40) {
  Rng rng(seed, 7);
  static const int64_t kRanks[] = {1, 2, 3, 4, 6, 8};
  int64_t R = 0;
  do {
    R = kRanks[rng.uniform_int(6)];
  } while (R > max_ranks);
  const int64_t T = pick(rng, 4, max_tokens);
  const int64_t fill = R * T - pick(rng, 0, T / 2);
  std::vector<int64_t> lens;
  for (int64_t used = 0; used < fill;) {
    int64_t len = rng.bernoulli(0.25) ? pick(rng, T / 2 + 1, 3 * T) : pick(rng, 1, std::max<int64_t>(1, T / 3));
    len = std::min(len, fill - used);
    lens.push_back(len);
    used += len;
  }
  Batch b;
  b.ranks = R;
  b.tokens_per_rank = T;
  b.per_rank.assign(static_cast<size_t>(R), {});
  const int64_t id_base = pick(rng, 0, 1000);
  std::vector<int64_t> room(static_cast<size_t>(R), T);
  int64_t rank = 0;
  for (size_t d = 0; d < lens.size(); ++d) {
    const int64_t id = id_base + 3 * static_cast<int64_t>(lens.size() - d);  // descending ids
    const int64_t L = lens[d];
    if (layout == TestLayout::kContiguous) {
      for (int64_t pos = 0; pos < L;) {
        while (room[static_cast<size_t>(rank)] == 0) ++rank;
        const int64_t take = std::min(L - pos, room[static_cast<size_t>(rank)]);
        b.per_rank[static_cast<size_t>(rank)].push_back({id, pos, take, L});
        room[static_cast<size_t>(rank)] -= take;
        pos += take;
      }
    } else {
      // Cut points, then each piece to a random rank with room (split further if needed).
      std::vector<int64_t> cuts{0, L};
      const int64_t n_cuts = std::min<int64_t>(L - 1, pick(rng, 0, 3));
      for (int64_t c = 0; c < n_cuts; ++c) cuts.push_back(pick(rng, 1, L - 1));
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        for (int64_t pos = cuts[c]; pos < cuts[c + 1];) {
          int64_t r = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(R)));
          while (room[static_cast<size_t>(r)] == 0) r = (r + 1) % R;
          const int64_t take = std::min(cuts[c + 1] - pos, room[static_cast<size_t>(r)]);
          b.per_rank[static_cast<size_t>(r)].push_back({id, pos, take, L});
          room[static_cast<size_t>(r)] -= take;
          pos += take;
        }
      }
    }
  }
  return b;
}

// A random valid schedule: every piece cut into random runs, each served by a random rank
// (so documents often have several tasks on one server: exercises the K/V dedup).
inline std::vector<TaskPlacement> random_tasks(const Batch& b, uint64_t seed) {
  Rng rng(seed, 11);
  std::vector<TaskPlacement> tasks;
  for (int64_t r = 0; r < b.ranks; ++r) {
    for (const Piece& p : b.per_rank[static_cast<size_t>(r)]) {
      for (int64_t a = p.offset; a < p.offset + p.len;) {
        const int64_t e = std::min(p.offset + p.len, a + pick(rng, 1, std::max<int64_t>(1, p.len / 2)));
        const int64_t server = rng.bernoulli(0.3) ? r : static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(b.ranks)));
        tasks.push_back({p.doc, a, e, r, server});
        a = e;
      }
    }
  }
  // Shuffle (Fisher-Yates with Rng) so servers see tasks in arbitrary order.
  for (size_t i = tasks.size(); i > 1; --i) std::swap(tasks[i - 1], tasks[rng.uniform_int(i)]);
  return tasks;
}

// Every message of `tasks`, row by row, straight from the rules in docs/plan-format.md:
// msg(from, to, bytes, forward) for each Q, O+LSE, dO and dQ row of a task away from home, and
// kv(doc, row, holder, server) for each K/V row a server needs (holder == server included),
// in (doc, row, server) order.
template <class Msg, class Kv>
void for_each_row_message(const Batch& b, const std::vector<TaskPlacement>& tasks, const RowBytes& rb, Msg msg, Kv kv) {
  std::map<std::pair<int64_t, int64_t>, int64_t> holder;  // (doc, row) -> rank
  for (int64_t r = 0; r < b.ranks; ++r) {
    for (const Piece& p : b.per_rank[static_cast<size_t>(r)]) {
      for (int64_t i = p.offset; i < p.offset + p.len; ++i) holder[{p.doc, i}] = r;
    }
  }
  std::set<std::tuple<int64_t, int64_t, int64_t>> kv_rows;  // (doc, row, server) needed
  for (const auto& t : tasks) {
    for (int64_t i = t.q_begin; i < t.q_end; ++i) {
      msg(t.home, t.server, rb.q, true);
      msg(t.server, t.home, rb.o + rb.lse, true);
      msg(t.home, t.server, rb.o, false);
      msg(t.server, t.home, rb.q, false);
    }
    for (int64_t k = 0; k < t.q_end; ++k) kv_rows.insert({t.doc, k, t.server});
  }
  for (const auto& [doc, row, server] : kv_rows) kv(doc, row, holder.at({doc, row}), server);
}

// The same with the K/V (dK/dV) rows as messages too: from (to) the rank holding the row.
template <class Msg>
void for_each_row_message(const Batch& b, const std::vector<TaskPlacement>& tasks, const RowBytes& rb, Msg msg) {
  for_each_row_message(b, tasks, rb, msg, [&](int64_t, int64_t, int64_t h, int64_t server) {
    msg(h, server, rb.kv, true);
    msg(server, h, rb.kv, false);
  });
}

// Naive byte recount (forward, backward totals and per-rank sent+received forward).
struct NaiveBytes {
  int64_t fwd = 0, bwd = 0;
  std::vector<int64_t> fwd_rank;  // sent + received
};
inline NaiveBytes naive_bytes(const Batch& b, const std::vector<TaskPlacement>& tasks, const RowBytes& rb) {
  NaiveBytes n;
  n.fwd_rank.assign(static_cast<size_t>(b.ranks), 0);
  for_each_row_message(b, tasks, rb, [&](int64_t from, int64_t to, int64_t bytes, bool fwd) {
    if (from == to) return;
    (fwd ? n.fwd : n.bwd) += bytes;
    if (fwd) {
      n.fwd_rank[static_cast<size_t>(from)] += bytes;
      n.fwd_rank[static_cast<size_t>(to)] += bytes;
    }
  });
  return n;
}

// `count` batches drawn from `dist` (make_batches) over `ranks` ranks of `tokens`, with `seed`.
inline std::vector<Batch> drawn_batches(const char* dist, int64_t ranks, int64_t tokens, int64_t count, uint64_t seed) {
  auto b = make_batches({.dist = dist, .ranks = ranks, .tokens_per_rank = tokens, .batches = count, .seed = seed});
  DISTCA_CHECK(b.ok());
  return std::move(b).value();
}

inline ModelSpec test_model() {
  ModelSpec m;
  m.name = "test";
  m.n_layers = 2;
  m.hidden = 64;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.head_dim = 16;
  m.ffn = 128;
  m.vocab = 256;
  return m;
}

}  // namespace distca::test
