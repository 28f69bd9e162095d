// The nano-batch split of ping-pong (include/distca/plan/nano_split.h).
#include "distca/plan/nano_split.h"

#include <algorithm>
#include <cmath>

#include "distca/core/check.h"
#include "distca/cost/analytic.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/schedule.h"

namespace distca {
namespace {

// Exact: squares of lengths up to 2^41 and per-rank pair sums up to 2^80 (a batch holds at
// most 2^40 tokens) overflow int64.
__extension__ using I128 = __int128;

// m <= L / sqrt(2), exactly: 2 m^2 <= L^2.
bool at_or_below(int64_t m, int64_t len) { return 2 * static_cast<I128>(m) * m <= static_cast<I128>(len) * len; }

}  // namespace

int64_t NanoSplit::cut_of(int64_t doc) const {
  auto it = std::lower_bound(cuts.begin(), cuts.end(), doc,
                             [](const std::pair<int64_t, int64_t>& c, int64_t d) { return c.first < d; });
  DISTCA_CHECK_MSG(it != cuts.end() && it->first == doc, "NanoSplit::cut_of: unknown document");
  return it->second;
}

int64_t nano_cut_long(int64_t doc_len, int64_t align_rows) {
  const int64_t T = align_rows, L = doc_len;
  DISTCA_CHECK(T >= 1 && L >= 2 * T);
  // k = floor(L / (sqrt(2) T)): a double estimate, then corrected with exact comparisons.
  int64_t k = static_cast<int64_t>(static_cast<double>(L) / (std::sqrt(2.0) * static_cast<double>(T)));
  while (k > 0 && !at_or_below(k * T, L)) --k;
  while (at_or_below((k + 1) * T, L)) ++k;
  // kT <= x = L/sqrt(2) < (k+1)T. (k+1)T is nearer iff (2k+1)T < 2x, i.e. ((2k+1)T)^2 < 2L^2
  // (both sides positive; equality is impossible, so ties never arise).
  const I128 mid = static_cast<I128>(2 * k + 1) * T;
  if (mid * mid < 2 * static_cast<I128>(L) * L) ++k;
  const int64_t hi = (L - 1) / T * T;  // the largest multiple of T below L (>= T as L >= 2T)
  return std::clamp(k * T, T, hi);
}

int64_t nano_cut_fraction(int64_t doc_len, int64_t align_rows, double fraction) {
  const int64_t T = align_rows, L = doc_len;
  DISTCA_CHECK(T >= 1 && L >= 2 * T && fraction > 0 && fraction <= 1);
  if (fraction == 1) return L;
  const double k = std::ceil(fraction * static_cast<double>(L) / static_cast<double>(T) - 0.5);
  return std::clamp(static_cast<int64_t>(k) * T, T, (L - 1) / T * T);
}

Result<NanoSplit> split_nano_batches(const Batch& batch, int64_t align_rows, double cut_fraction) {
  DISTCA_RETURN_IF_ERROR(check_align_rows(align_rows));
  if (!(cut_fraction == 0 || (cut_fraction > 0 && cut_fraction <= 1))) {
    return Status::invalid_argument("nano-batch cut fraction must be 0 (the L/sqrt(2) rule) or in (0, 1]");
  }
  DISTCA_RETURN_IF_ERROR(batch.validate());
  const int64_t T = align_rows;
  const DocumentIndex index(batch);
  const std::vector<int64_t>& ids = index.doc_ids();
  const size_t n_docs = ids.size();
  std::vector<int64_t> cut(n_docs, -1);
  std::vector<std::array<I128, 2>> pairs(static_cast<size_t>(batch.ranks), {0, 0});
  auto add_runs = [&](size_t slot, int64_t c) {
    for (const HeldRun& run : index.runs(ids[slot])) {
      auto& p = pairs[static_cast<size_t>(run.rank)];
      const int64_t mid = std::clamp(c, run.begin, run.end);
      p[0] += causal_pairs(run.begin, mid);
      p[1] += causal_pairs(mid, run.end);
    }
  };
  std::vector<size_t> short_docs;
  for (size_t s = 0; s < n_docs; ++s) {
    const int64_t L = index.doc_len(ids[s]);
    if (L >= 2 * T) {
      cut[s] = cut_fraction == 0 ? nano_cut_long(L, T) : nano_cut_fraction(L, T, cut_fraction);
      add_runs(s, cut[s]);
    } else {
      short_docs.push_back(s);
    }
  }
  std::sort(short_docs.begin(), short_docs.end(), [&](size_t a, size_t b) {
    const int64_t la = index.doc_len(ids[a]), lb = index.doc_len(ids[b]);
    return la != lb ? la > lb : ids[a] < ids[b];
  });
  for (size_t s : short_docs) {
    const int64_t L = index.doc_len(ids[s]);
    const auto& p = pairs[static_cast<size_t>(index.runs(ids[s]).front().rank)];
    cut[s] = p[1] < p[0] ? 0 : L;
    add_runs(s, cut[s]);
  }

  NanoSplit out;
  out.batch.ranks = batch.ranks;
  out.batch.tokens_per_rank = batch.tokens_per_rank;
  out.batch.per_rank.assign(static_cast<size_t>(batch.ranks), {});
  out.tokens.assign(static_cast<size_t>(batch.ranks), {0, 0});
  for (size_t r = 0; r < static_cast<size_t>(batch.ranks); ++r) {
    for (int x = 0; x < 2; ++x) {
      for (const Piece& p : batch.per_rank[r]) {
        const int64_t c = cut[static_cast<size_t>(index.slot(p.doc))];
        const int64_t end = p.offset + p.len, mid = std::clamp(c, p.offset, end);
        const int64_t lo = x == 0 ? p.offset : mid, hi = x == 0 ? mid : end;
        if (hi <= lo) continue;
        out.batch.per_rank[r].push_back({p.doc, lo, hi - lo, p.doc_len});
        out.tokens[r][static_cast<size_t>(x)] += hi - lo;
      }
    }
  }
  out.cuts.reserve(n_docs);
  for (size_t s = 0; s < n_docs; ++s) out.cuts.emplace_back(ids[s], cut[s]);
  return out;
}

}  // namespace distca
