// Data-loader re-packing (include/distca/plan/chunking.h).
#include "distca/plan/chunking.h"

#include <algorithm>
#include <utility>

#include "distca/plan/doc_index.h"
#include "distca/plan/traffic.h"

namespace distca {
namespace {

double piece_work(const ChunkingOptions& o, int64_t offset, int64_t len) {
  return o.linear_per_token * static_cast<double>(len) + task_cost(o.cost, len, offset + len);
}

double max_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

// A re-pack in progress: the output batch and each rank's tokens and work.
struct Packing {
  const ChunkingOptions& o;
  int64_t cap;
  Batch out;
  std::vector<int64_t> used;
  std::vector<double> work;

  Packing(const ChunkingOptions& options, int64_t ranks, int64_t cap_tokens, int64_t tokens_per_rank)
      : o(options), cap(cap_tokens), used(static_cast<size_t>(ranks), 0), work(static_cast<size_t>(ranks), 0.0) {
    out.ranks = ranks;
    out.tokens_per_rank = tokens_per_rank;
    out.per_rank.assign(static_cast<size_t>(ranks), {});
  }
  int64_t room(int64_t r) const { return cap - used[static_cast<size_t>(r)]; }
  void place(int64_t r, int64_t id, int64_t begin, int64_t end, int64_t len) {
    const auto u = static_cast<size_t>(r);
    out.per_rank[u].push_back({id, begin, end - begin, len});
    used[u] += end - begin;
    work[u] += piece_work(o, begin, end - begin);
  }
  // The work head-tail shards of a whole document of length L add to rank i of a group.
  std::vector<double> shard_work(int64_t L, const std::vector<int64_t>& shares) const {
    Batch scratch;
    const auto C = static_cast<int64_t>(shares.size());
    scratch.ranks = C;
    scratch.per_rank.assign(static_cast<size_t>(C), {});
    shard_head_tail(0, 0, L, L, 0, shares, scratch);
    std::vector<double> w(static_cast<size_t>(C), 0.0);
    for (int64_t i = 0; i < C; ++i) {
      for (const Piece& p : scratch.per_rank[static_cast<size_t>(i)]) w[static_cast<size_t>(i)] += piece_work(o, p.offset, p.len);
    }
    return w;
  }
  // Shards the document over the best group with room; false when no group has room.
  bool place_sharded(int64_t id, int64_t L) {
    const int64_t C = o.cp;
    std::vector<int64_t> shares(static_cast<size_t>(C), L / C);
    for (int64_t i = 0; i < L % C; ++i) ++shares[static_cast<size_t>(i)];
    const std::vector<double> add = shard_work(L, shares);
    int64_t best = -1;
    double best_max = 0;
    for (int64_t g = 0; g < out.ranks / C; ++g) {
      bool fits = true;
      double mx = 0;
      for (int64_t i = 0; i < C; ++i) {
        fits = fits && room(g * C + i) >= shares[static_cast<size_t>(i)];
        mx = std::max(mx, work[static_cast<size_t>(g * C + i)] + add[static_cast<size_t>(i)]);
      }
      if (fits && (best < 0 || mx < best_max)) {
        best = g;
        best_max = mx;
      }
    }
    if (best < 0) return false;
    std::vector<size_t> before(static_cast<size_t>(C));
    for (int64_t i = 0; i < C; ++i) before[static_cast<size_t>(i)] = out.per_rank[static_cast<size_t>(best * C + i)].size();
    shard_head_tail(id, 0, L, L, best * C, shares, out);
    for (int64_t i = 0; i < C; ++i) {
      const auto u = static_cast<size_t>(best * C + i);
      for (size_t k = before[static_cast<size_t>(i)]; k < out.per_rank[u].size(); ++k) {
        const Piece& p = out.per_rank[u][k];
        used[u] += p.len;
        work[u] += piece_work(o, p.offset, p.len);
      }
    }
    return true;
  }
  // The whole document on the least-worked rank with room; false when none has room.
  bool place_whole(int64_t id, int64_t L) {
    int64_t best = -1;
    for (int64_t r = 0; r < out.ranks; ++r) {
      if (room(r) < L) continue;
      if (best < 0 || work[static_cast<size_t>(r)] < work[static_cast<size_t>(best)]) best = r;
    }
    if (best < 0) return false;
    place(best, id, 0, L, L);
    return true;
  }
  // Front to back over the ranks with the most room.
  void place_split(int64_t id, int64_t L) {
    for (int64_t pos = 0; pos < L;) {
      int64_t best = -1;
      for (int64_t r = 0; r < out.ranks; ++r) {
        if (room(r) <= 0) continue;
        if (best < 0 || room(r) > room(best) ||
            (room(r) == room(best) && work[static_cast<size_t>(r)] < work[static_cast<size_t>(best)])) {
          best = r;
        }
      }
      DISTCA_CHECK_MSG(best >= 0, "wlb: the token cap leaves no room (cap below the mean)");
      const int64_t take = std::min(L - pos, room(best));
      place(best, id, pos, pos + take, L);
      pos += take;
    }
  }
};

}  // namespace

std::vector<double> chunking_rank_work(const Batch& batch, const ChunkingOptions& options) {
  std::vector<double> work(static_cast<size_t>(batch.ranks), 0.0);
  for (int64_t r = 0; r < batch.ranks; ++r) {
    for (const Piece& p : batch.per_rank[static_cast<size_t>(r)]) work[static_cast<size_t>(r)] += piece_work(options, p.offset, p.len);
  }
  return work;
}

void shard_head_tail(int64_t doc, int64_t begin, int64_t end, int64_t doc_len, int64_t first_rank,
                     const std::vector<int64_t>& shares, Batch& out) {
  int64_t head = begin, tail = end;
  for (size_t i = 0; i < shares.size(); ++i) {
    const int64_t h = shares[i] / 2, t = shares[i] - h;
    auto& pieces = out.per_rank[static_cast<size_t>(first_rank) + i];
    if (h > 0) pieces.push_back({doc, head, h, doc_len});
    if (t > 0) pieces.push_back({doc, tail - t, t, doc_len});
    head += h;
    tail -= t;
  }
  DISTCA_CHECK(head == tail);
}

Result<Batch> wlb_repack(const Batch& batch, const ChunkingOptions& options) {
  DISTCA_RETURN_IF_ERROR(batch.validate());
  DISTCA_RETURN_IF_ERROR(options.validate(batch.ranks));
  const DocumentIndex index(batch);
  int64_t total = 0;
  std::vector<std::pair<int64_t, int64_t>> docs;  // (length, id)
  for (int64_t id : index.doc_ids()) {
    docs.emplace_back(index.doc_len(id), id);
    total += index.doc_len(id);
  }
  std::sort(docs.begin(), docs.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  const int64_t cap = chunking_rank_cap(total, batch.ranks, options.cap);
  Packing pk(options, batch.ranks, cap, std::max(batch.tokens_per_rank, cap));
  const int64_t threshold = cp_shard_threshold(options);
  for (const auto& [len, id] : docs) {
    if (options.cp > 1 && len > threshold && pk.place_sharded(id, len)) continue;
    if (pk.place_whole(id, len)) continue;
    pk.place_split(id, len);
  }
  DISTCA_RETURN_IF_ERROR(pk.out.validate().with_context("wlb re-pack"));
  bool input_fits = true;
  for (int64_t r = 0; r < batch.ranks; ++r) input_fits = input_fits && batch.rank_tokens(r) <= cap;
  if (input_fits && max_of(pk.work) > max_of(chunking_rank_work(batch, options))) return batch;
  return std::move(pk.out);
}

Result<Batch> percp_repack(const Batch& batch, int64_t cp) {
  DISTCA_RETURN_IF_ERROR(batch.validate());
  if (cp < 1 || batch.ranks % cp != 0) {
    return Status::invalid_argument("--cp " + std::to_string(cp) + " must divide the " + std::to_string(batch.ranks) +
                                    " data-parallel ranks");
  }
  Batch out;
  out.ranks = batch.ranks;
  out.tokens_per_rank = batch.tokens_per_rank;
  out.per_rank.assign(static_cast<size_t>(batch.ranks), {});
  for (int64_t g = 0; g < batch.ranks / cp; ++g) {
    std::vector<Piece> parts;  // the group's pieces in order, consecutive pieces of a document merged
    for (int64_t r = g * cp; r < (g + 1) * cp; ++r) {
      for (const Piece& p : batch.per_rank[static_cast<size_t>(r)]) {
        if (!parts.empty() && parts.back().doc == p.doc && parts.back().offset + parts.back().len == p.offset) {
          parts.back().len += p.len;
        } else {
          parts.push_back(p);
        }
      }
    }
    std::vector<int64_t> held(static_cast<size_t>(cp), 0);
    for (const Piece& part : parts) {
      std::vector<int64_t> shares(static_cast<size_t>(cp), part.len / cp);
      for (int64_t extra = part.len % cp; extra > 0; --extra) {
        int64_t least = 0;
        for (int64_t i = 1; i < cp; ++i) {
          const auto u = static_cast<size_t>(i), b = static_cast<size_t>(least);
          if (held[u] + shares[u] < held[b] + shares[b]) least = i;
        }
        ++shares[static_cast<size_t>(least)];
      }
      for (int64_t i = 0; i < cp; ++i) held[static_cast<size_t>(i)] += shares[static_cast<size_t>(i)];
      shard_head_tail(part.doc, part.offset, part.offset + part.len, part.doc_len, g * cp, shares, out);
    }
  }
  for (int64_t r = 0; r < out.ranks; ++r) out.tokens_per_rank = std::max(out.tokens_per_rank, out.rank_tokens(r));
  DISTCA_RETURN_IF_ERROR(out.validate().with_context("percp re-pack"));
  return out;
}

}  // namespace distca
