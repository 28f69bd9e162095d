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

// A re-pack in progress: the output batch and each rank's tokens and work. The ranks form
// domains of `domain` consecutive ranks (micro-batches, wlb_repack_micro_batches); a document
// cut for want of room stays in one domain.
struct Packing {
  const ChunkingOptions& o;
  int64_t cap;
  int64_t domain;
  Batch out;
  std::vector<int64_t> used;
  std::vector<double> work;

  Packing(const ChunkingOptions& options, int64_t ranks, int64_t cap_tokens, int64_t tokens_per_rank, int64_t domain_ranks)
      : o(options), cap(cap_tokens), domain(domain_ranks), used(static_cast<size_t>(ranks), 0),
        work(static_cast<size_t>(ranks), 0.0) {
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
  // Front to back over the ranks with the most room, in the domain with the most room (ties:
  // the lowest); false when that domain cannot hold the document.
  bool place_split(int64_t id, int64_t L) {
    int64_t best_domain = 0, best_room = -1;
    for (int64_t d = 0; d < out.ranks / domain; ++d) {
      int64_t r_sum = 0;
      for (int64_t r = d * domain; r < (d + 1) * domain; ++r) r_sum += std::max<int64_t>(0, room(r));
      if (r_sum > best_room) {
        best_room = r_sum;
        best_domain = d;
      }
    }
    if (best_room < L) return false;
    for (int64_t pos = 0; pos < L;) {
      int64_t best = -1;
      for (int64_t r = best_domain * domain; r < (best_domain + 1) * domain; ++r) {
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
    return true;
  }
};

// wlb_repack over domains of `domain` ranks; false in *placed when a document found no domain
// with room (only possible with several domains).
Result<Batch> repack(const Batch& batch, const ChunkingOptions& options, int64_t domain, bool* placed) {
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
  Packing pk(options, batch.ranks, cap, std::max(batch.tokens_per_rank, cap), domain);
  const int64_t threshold = cp_shard_threshold(options);
  *placed = true;
  for (const auto& [len, id] : docs) {
    if (options.cp > 1 && len > threshold && pk.place_sharded(id, len)) continue;
    if (pk.place_whole(id, len)) continue;
    if (!pk.place_split(id, len)) {
      *placed = false;
      return batch;
    }
  }
  DISTCA_RETURN_IF_ERROR(pk.out.validate().with_context("wlb re-pack"));
  bool input_fits = true;
  for (int64_t r = 0; r < batch.ranks; ++r) input_fits = input_fits && batch.rank_tokens(r) <= cap;
  if (input_fits && max_of(pk.work) > max_of(chunking_rank_work(batch, options))) return batch;
  return std::move(pk.out);
}

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
  bool placed = true;
  Result<Batch> out = repack(batch, options, batch.ranks, &placed);
  // One domain: its room is the cap's, which holds the whole batch.
  DISTCA_CHECK_MSG(!out.ok() || placed, "wlb: the token cap leaves no room (cap below the mean)");
  return out;
}

Result<std::vector<Batch>> wlb_repack_micro_batches(const std::vector<Batch>& batches, const ChunkingOptions& options) {
  if (batches.empty()) return std::vector<Batch>{};
  const int64_t M = static_cast<int64_t>(batches.size()), R = batches.front().ranks;
  Batch flat;
  flat.ranks = M * R;
  for (int64_t m = 0; m < M; ++m) {
    const Batch& b = batches[static_cast<size_t>(m)];
    DISTCA_RETURN_IF_ERROR(b.validate().with_context("micro-batch " + std::to_string(m)));
    if (b.ranks != R) return Status::invalid_argument("wlb: micro-batches must have the same ranks");
    flat.tokens_per_rank = std::max(flat.tokens_per_rank, b.tokens_per_rank);
    for (const auto& pieces : b.per_rank) {
      flat.per_rank.push_back(pieces);
      for (Piece& p : flat.per_rank.back()) {
        if (p.doc < 0) return Status::invalid_argument("wlb: document ids must be >= 0");
        p.doc = micro_doc_id(p.doc, m, M);
      }
    }
  }
  bool placed = true;
  DISTCA_ASSIGN_OR_RETURN(Batch out, repack(flat, options, R, &placed));
  std::vector<Batch> result;
  for (int64_t m = 0; m < M; ++m) {
    if (!placed) {  // no micro-batch had room for a document that fits no rank: each alone
      DISTCA_ASSIGN_OR_RETURN(Batch alone, wlb_repack(batches[static_cast<size_t>(m)], options));
      for (auto& pieces : alone.per_rank) {
        for (Piece& p : pieces) p.doc = micro_doc_id(p.doc, m, M);
      }
      result.push_back(std::move(alone));
      continue;
    }
    Batch b;
    b.ranks = R;
    b.tokens_per_rank = out.tokens_per_rank;
    for (int64_t r = 0; r < R; ++r) b.per_rank.push_back(std::move(out.per_rank[static_cast<size_t>(m * R + r)]));
    DISTCA_RETURN_IF_ERROR(b.validate().with_context("wlb re-pack, micro-batch " + std::to_string(m)));
    result.push_back(std::move(b));
  }
  return result;
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
