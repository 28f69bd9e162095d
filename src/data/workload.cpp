// Document-length generators and packing. docs/workloads.md explains where every constant
// comes from (fits to the reference corpora of ../shared/data, and the paper's recipes).
#include "distca/data/workload.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <string_view>

#include <nlohmann/json.hpp>

#include "distca/core/check.h"
#include "distca/core/io.h"
#include "distca/data/json_field.h"

namespace distca {
namespace {

// Limits that keep every product below 2^63 and every allocation sane.
constexpr int64_t kMaxRanks = int64_t{1} << 24;
constexpr int64_t kMaxBatchTokens = int64_t{1} << 40;
constexpr int64_t kMaxLength = int64_t{1} << 40;
constexpr int64_t kMaxBatches = 1000000;

// Recipe weights (the paper's Pretrain/ProLong sampling): keep half of the short documents,
// repeat the long ones four times.
constexpr double kShortWeight = 0.5;
constexpr double kLongWeight = 4.0;

// Pretrain-like: piecewise-uniform histogram fitted to doclens-pretrain.json.
constexpr std::array<double, 7> kPretrainEdges = {1, 6144, 8192, 16384, 32768, 65536, 131072};
constexpr std::array<double, 6> kPretrainWeights = {0.95544, 0.02084, 0.01036, 0.00451, 0.00355, 0.00531};

// ProLong-like: lognormal mixture body (rejected at or above kProlongBodyMax) plus a truncated
// Pareto tail, fitted to doclens-prolong.json.
constexpr std::array<double, 3> kProlongMu = {6.781, 7.294, 8.178};
constexpr std::array<double, 3> kProlongSigma = {0.170, 0.322, 0.594};
constexpr std::array<double, 3> kProlongMixWeights = {0.1144, 0.4077, 0.4779};
constexpr double kProlongBodyMax = 16384;
constexpr double kProlongTailShare = 0.0098;
constexpr double kProlongTailAlpha = 2.0;
constexpr double kProlongTailLo = 16384;
constexpr double kProlongTailHi = 524288;

enum class DistKind { kPretrain, kProlong, kFixed, kUniform, kFile };
struct DistSpec {
  DistKind kind = DistKind::kPretrain;
  int64_t a = 0, b = 0;
  std::string path;
};

const char* kDistHelp = "(expected pretrain, prolong, fixed:N, uniform:A:B, file:PATH)";

bool parse_positive(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end && out > 0;
}

Result<DistSpec> parse_dist(const std::string& dist) {
  DistSpec d;
  const std::string_view s = dist;
  if (s == "pretrain") return d;
  if (s == "prolong") {
    d.kind = DistKind::kProlong;
    return d;
  }
  if (s.starts_with("fixed:")) {
    d.kind = DistKind::kFixed;
    if (!parse_positive(s.substr(6), d.a) || d.a > kMaxLength) {
      return Status::invalid_argument("--dist " + dist + ": N must be a positive integer up to 2^40");
    }
    return d;
  }
  if (s.starts_with("uniform:")) {
    d.kind = DistKind::kUniform;
    const std::string_view rest = s.substr(8);
    const size_t colon = rest.find(':');
    if (colon == std::string_view::npos || !parse_positive(rest.substr(0, colon), d.a) ||
        !parse_positive(rest.substr(colon + 1), d.b) || d.b > kMaxLength) {
      return Status::invalid_argument("--dist " + dist + ": A and B must be positive integers up to 2^40");
    }
    if (d.a > d.b) return Status::invalid_argument("--dist " + dist + ": A must not exceed B");
    return d;
  }
  if (s.starts_with("file:")) {
    d.kind = DistKind::kFile;
    d.path = dist.substr(5);
    if (d.path.empty()) return Status::invalid_argument("--dist file:PATH: PATH is empty");
    return d;
  }
  return Status::invalid_argument("--dist: unknown distribution '" + dist + "' " + kDistHelp);
}

// Reads a length file: a JSON array of positive integers, or one positive integer per line
// (blank lines ignored). Errors name the file and the element or line.
Result<std::vector<int64_t>> read_lengths(const std::string& path) {
  const std::string ctx = "--dist file:" + path;
  auto text = read_file(path);
  if (!text.ok()) return Status(text.status().code(), ctx + ": cannot read (" + text.status().message() + ")");
  std::vector<int64_t> out;
  const std::string& t = *text;
  const size_t first = t.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && t[first] == '[') {
    auto parsed = parse_json_fields(t, path);
    if (!parsed.ok()) return Status(parsed.status().code(), ctx + ": " + parsed.status().message());
    const nlohmann::json& j = *parsed;
    if (!j.is_array()) return Status::invalid_argument(ctx + ": expected a JSON array of lengths");
    for (size_t i = 0; i < j.size(); ++i) {
      // Checked on the stored kind: get<int64_t> of an unsigned 2^63 would wrap negative, and a
      // float (2.5, 1e300) is not a length.
      bool fits = false;
      if (j[i].is_number_unsigned()) {
        fits = j[i].get<uint64_t>() >= 1 && j[i].get<uint64_t>() <= static_cast<uint64_t>(kMaxLength);
      } else if (j[i].is_number_integer()) {
        fits = j[i].get<int64_t>() >= 1 && j[i].get<int64_t>() <= kMaxLength;
      }
      if (!fits) {
        return Status::invalid_argument(ctx + ": element " + std::to_string(i) +
                                        " is not a positive integer up to 2^40");
      }
      out.push_back(j[i].get<int64_t>());
    }
  } else {
    size_t pos = 0;
    int64_t line_no = 0;
    while (pos < t.size()) {
      size_t nl = t.find('\n', pos);
      if (nl == std::string::npos) nl = t.size();
      std::string_view line(t.data() + pos, nl - pos);
      ++line_no;
      pos = nl + 1;
      const size_t b = line.find_first_not_of(" \t\r");
      if (b == std::string_view::npos) continue;
      const size_t e = line.find_last_not_of(" \t\r");
      int64_t v = 0;
      if (!parse_positive(line.substr(b, e - b + 1), v) || v > kMaxLength) {
        return Status::invalid_argument(ctx + ": line " + std::to_string(line_no) +
                                        " is not a positive integer up to 2^40");
      }
      out.push_back(v);
    }
  }
  if (out.empty()) return Status::invalid_argument(ctx + ": contains no lengths");
  return out;
}

int64_t round_up(int64_t x, int64_t q) { return (x + q - 1) / q * q; }

double pareto(Rng& rng, double alpha, double lo, double hi) {
  // Inverse CDF of the Pareto(alpha) law truncated to [lo, hi).
  const double la = std::pow(lo, -alpha), ha = std::pow(hi, -alpha);
  return std::pow(la - rng.uniform() * (la - ha), -1.0 / alpha);
}

// P(X >= x) for the truncated Pareto on [lo, hi), x inside.
double pareto_tail(double alpha, double lo, double hi, double x) {
  const double la = std::pow(lo, -alpha), ha = std::pow(hi, -alpha);
  return (std::pow(x, -alpha) - ha) / (la - ha);
}

double prolong_body(Rng& rng) {
  for (;;) {
    const double u = rng.uniform();
    size_t k = 0;
    double acc = kProlongMixWeights[0];
    while (k + 1 < kProlongMu.size() && u >= acc) acc += kProlongMixWeights[++k];
    const double x = std::exp(kProlongMu[k] + kProlongSigma[k] * rng.normal());
    if (x < kProlongBodyMax) return x;
  }
}

double prolong_base(Rng& rng) {
  if (rng.bernoulli(kProlongTailShare)) return pareto(rng, kProlongTailAlpha, kProlongTailLo, kProlongTailHi);
  return prolong_body(rng);
}

// A histogram draw restricted to bins [first, last).
double pretrain_bins(Rng& rng, size_t first, size_t last) {
  double total = 0;
  for (size_t i = first; i < last; ++i) total += kPretrainWeights[i];
  const double u = rng.uniform() * total;
  size_t i = first;
  double acc = kPretrainWeights[first];
  while (i + 1 < last && u >= acc) acc += kPretrainWeights[++i];
  return rng.uniform(kPretrainEdges[i], kPretrainEdges[i + 1]);
}

// Probability of the long class after the recipe's reweighting, given its base probability.
double reweighted_long_share(double p_long) {
  return kLongWeight * p_long / (kShortWeight * (1 - p_long) + kLongWeight * p_long);
}

}  // namespace

Result<Layout> parse_layout(const std::string& s) {
  if (s == "contiguous") return Layout::kContiguous;
  if (s == "head-tail") return Layout::kHeadTail;
  return Status::invalid_argument("--layout: unknown layout '" + s + "' (expected contiguous or head-tail)");
}


Status WorkloadOptions::validate() const {
  DISTCA_ASSIGN_OR_RETURN(DistSpec spec, parse_dist(dist));
  (void)spec;
  if (ranks <= 0) return Status::invalid_argument("--ranks must be positive (got " + std::to_string(ranks) + ")");
  if (ranks > kMaxRanks) {
    return Status::invalid_argument("--ranks must be at most 16777216 (got " + std::to_string(ranks) + ")");
  }
  if (tokens_per_rank <= 0 || tokens_per_rank % kLengthQuantum != 0) {
    return Status::invalid_argument("--tokens-per-rank must be a positive multiple of 16 (got " +
                                    std::to_string(tokens_per_rank) + ")");
  }
  if (tokens_per_rank > kMaxBatchTokens / ranks) {
    return Status::invalid_argument("--ranks (" + std::to_string(ranks) + ") times --tokens-per-rank (" +
                                    std::to_string(tokens_per_rank) + ") exceeds 2^40 tokens per batch");
  }
  if (max_doc_len < 0 || (max_doc_len > 0 && max_doc_len < kLengthQuantum)) {
    return Status::invalid_argument("--max-doc-len must be at least 16, or 0 for no cap (got " +
                                    std::to_string(max_doc_len) + ")");
  }
  if (batches <= 0 || batches > kMaxBatches) {
    return Status::invalid_argument("--batches must be in [1, 1000000] (got " + std::to_string(batches) + ")");
  }
  if (!(prolong_long_prob >= 0.0 && prolong_long_prob <= 1.0)) {
    char got[32];
    std::snprintf(got, sizeof got, "%g", prolong_long_prob);
    return Status::invalid_argument(std::string("--long-prob must be in [0, 1] (got ") + got + ")");
  }
  return {};
}

Result<LengthDistribution> LengthDistribution::create(const WorkloadOptions& options) {
  DISTCA_RETURN_IF_ERROR(options.validate());
  DISTCA_ASSIGN_OR_RETURN(DistSpec spec, parse_dist(options.dist));
  LengthDistribution d;
  d.tokens_per_rank_ = options.tokens_per_rank;
  d.cap_ = options.max_doc_len / kLengthQuantum * kLengthQuantum;
  d.long_prob_ = options.prolong_long_prob;
  d.elongation_ = static_cast<double>(options.tokens_per_rank) / static_cast<double>(kRecipeContext);
  d.a_ = spec.a;
  d.b_ = spec.b;
  switch (spec.kind) {
    case DistKind::kPretrain: {
      d.kind_ = Kind::kPretrain;
      double total = 0;
      for (double w : kPretrainWeights) total += w;
      d.long_share_ = reweighted_long_share(kPretrainWeights.back() / total);
      break;
    }
    case DistKind::kProlong:
      d.kind_ = Kind::kProlong;
      // The paper's ProLong recipe elongates only through the replacement documents (as long
      // as a whole rank's batch); the others keep their corpus lengths. The README's check
      // figure (about 39 documents per 128K batch) holds only without elongation.
      d.elongation_ = 1.0;
      d.long_share_ = reweighted_long_share(
          kProlongTailShare * pareto_tail(kProlongTailAlpha, kProlongTailLo, kProlongTailHi, kRecipeContext));
      break;
    case DistKind::kFixed:
      d.kind_ = Kind::kFixed;
      d.elongation_ = 1.0;
      break;
    case DistKind::kUniform:
      d.kind_ = Kind::kUniform;
      d.elongation_ = 1.0;
      break;
    case DistKind::kFile: {
      d.kind_ = Kind::kFile;
      DISTCA_ASSIGN_OR_RETURN(std::vector<int64_t> lengths, read_lengths(spec.path));
      for (int64_t l : lengths) (l >= kRecipeContext ? d.long_ : d.short_).push_back(l);
      const double ns = static_cast<double>(d.short_.size()), nl = static_cast<double>(d.long_.size());
      d.long_share_ = reweighted_long_share(nl / (ns + nl));
      break;
    }
  }
  return d;
}

double LengthDistribution::sample_class(Rng& rng, bool long_doc) const {
  switch (kind_) {
    case Kind::kPretrain:
      return long_doc ? pretrain_bins(rng, kPretrainWeights.size() - 1, kPretrainWeights.size())
                      : pretrain_bins(rng, 0, kPretrainWeights.size() - 1);
    case Kind::kProlong:
      // The tail conditioned on >= 64K is the same Pareto truncated to [64K, hi). The short
      // class rejects the rare (0.06%) base draws at or above 64K.
      if (long_doc) return pareto(rng, kProlongTailAlpha, static_cast<double>(kRecipeContext), kProlongTailHi);
      for (;;) {
        const double x = prolong_base(rng);
        if (x < static_cast<double>(kRecipeContext)) return x;
      }
    case Kind::kFile: {
      const auto& v = long_doc ? long_ : short_;
      return static_cast<double>(v[rng.uniform_int(v.size())]);
    }
    case Kind::kFixed:
    case Kind::kUniform:
      break;
  }
  DISTCA_CHECK_MSG(false, "sample_class on a distribution without classes");
  return 0;
}

int64_t LengthDistribution::sample_base(Rng& rng) const {
  switch (kind_) {
    case Kind::kPretrain:
      return static_cast<int64_t>(std::ceil(pretrain_bins(rng, 0, kPretrainWeights.size())));
    case Kind::kProlong:
      return static_cast<int64_t>(std::ceil(prolong_base(rng)));
    case Kind::kFixed:
      return a_;
    case Kind::kUniform:
      return a_ + static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(b_ - a_ + 1)));
    case Kind::kFile: {
      const uint64_t i = rng.uniform_int(short_.size() + long_.size());
      return i < short_.size() ? short_[i] : long_[i - short_.size()];
    }
  }
  return 0;
}

int64_t LengthDistribution::sample(Rng& rng) const {
  int64_t len = 0;
  if (kind_ == Kind::kFixed || kind_ == Kind::kUniform) {
    len = sample_base(rng);
  } else {
    bool long_doc = rng.bernoulli(long_share_);
    if (long_doc && kind_ == Kind::kFile && long_.empty()) long_doc = false;
    if (!long_doc && kind_ == Kind::kFile && short_.empty()) long_doc = true;
    const double x = std::ceil(sample_class(rng, long_doc));
    if (kind_ == Kind::kProlong && long_doc && rng.bernoulli(long_prob_)) {
      len = tokens_per_rank_;
    } else {
      len = static_cast<int64_t>(std::ceil(x * elongation_));
    }
  }
  len = round_up(std::max<int64_t>(len, 1), kLengthQuantum);
  if (cap_ > 0) len = std::min(len, cap_);
  return len;
}

Batch pack_documents(const std::vector<int64_t>& lengths, int64_t ranks, int64_t tokens_per_rank, Layout layout) {
  DISTCA_CHECK(ranks > 0 && tokens_per_rank > 0);
  Batch b;
  b.ranks = ranks;
  b.tokens_per_rank = tokens_per_rank;
  b.per_rank.resize(static_cast<size_t>(ranks));
  int64_t r = 0, used = 0;
  for (size_t i = 0; i < lengths.size() && r < ranks; ++i) {
    DISTCA_CHECK_MSG(lengths[i] > 0, "document lengths must be positive");
    const int64_t left = (ranks - r) * tokens_per_rank - used;
    const int64_t doc_len = std::min(lengths[i], left);
    for (int64_t off = 0; off < doc_len;) {
      const int64_t take = std::min(doc_len - off, tokens_per_rank - used);
      b.per_rank[static_cast<size_t>(r)].push_back({static_cast<int64_t>(i), off, take, doc_len});
      off += take;
      used += take;
      if (used == tokens_per_rank) {
        ++r;
        used = 0;
      }
    }
  }
  if (layout == Layout::kContiguous) return b;

  // Head-tail: a document whose contiguous pieces land on k >= 2 ranks (n_j tokens on the
  // j-th) gives the j-th rank a head chunk of floor(n_j / 2) rounded down to 16 from the
  // document's front and the rest as a tail chunk from its back. Heads are laid front to back
  // in rank order and tails back to front, so the first rank pairs the first head with the
  // last tail; the last rank's head and tail meet in the middle and become one piece. Each
  // rank keeps exactly its contiguous token count.
  struct Span {
    int64_t ranks = 0;
    int64_t head_next = 0;  // next head offset
    int64_t tail_next = 0;  // end of the next tail chunk
  };
  std::vector<Span> spans(lengths.size());
  for (const auto& pieces : b.per_rank) {
    for (const Piece& p : pieces) {
      Span& s = spans[static_cast<size_t>(p.doc)];
      ++s.ranks;
      s.tail_next = p.doc_len;
    }
  }
  for (auto& pieces : b.per_rank) {
    std::vector<Piece> out;
    out.reserve(pieces.size() + 2);
    for (const Piece& p : pieces) {
      Span& s = spans[static_cast<size_t>(p.doc)];
      if (s.ranks < 2) {
        out.push_back(p);
        continue;
      }
      const int64_t head = p.len / 2 / kLengthQuantum * kLengthQuantum;
      const int64_t tail = p.len - head;
      const Piece h{p.doc, s.head_next, head, p.doc_len};
      const Piece t{p.doc, s.tail_next - tail, tail, p.doc_len};
      s.head_next += head;
      s.tail_next -= tail;
      if (h.len > 0 && h.offset + h.len == t.offset) {
        out.push_back({p.doc, h.offset, h.len + t.len, p.doc_len});
        continue;
      }
      if (h.len > 0) out.push_back(h);
      out.push_back(t);
    }
    pieces = std::move(out);
  }
  return b;
}

Result<double> estimate_batch_pieces(const WorkloadOptions& options) {
  DISTCA_ASSIGN_OR_RETURN(LengthDistribution dist, LengthDistribution::create(options));
  DISTCA_ASSIGN_OR_RETURN(DistSpec spec, parse_dist(options.dist));
  const double slots = static_cast<double>(options.ranks) * static_cast<double>(options.tokens_per_rank);
  double mean = 0;
  if (spec.kind == DistKind::kFixed) {
    // Every length (rounded up to the quantum, capped) is the same: the count is exact.
    int64_t shortest = (spec.a + kLengthQuantum - 1) / kLengthQuantum * kLengthQuantum;
    const int64_t cap = options.max_doc_len / kLengthQuantum * kLengthQuantum;
    if (cap > 0) shortest = std::min(shortest, cap);
    mean = static_cast<double>(shortest);
  } else {
    // The mean of a fixed set of draws, halved: documents fill the slots one after another,
    // so their count concentrates around slots / mean, and the margin covers the sampling
    // error of a heavy-tailed mean.
    Rng rng(0x6d656d, 0);
    constexpr int kDraws = 4096;
    double sum = 0;
    for (int i = 0; i < kDraws; ++i) sum += static_cast<double>(dist.sample(rng));
    // uniform is bounded, so 4096 draws pin its mean within about 1%.
    mean = (spec.kind == DistKind::kUniform ? 0.9 : 0.5) * sum / kDraws;
  }
  const double docs = std::min(slots / std::max<double>(mean, kLengthQuantum), slots / kLengthQuantum) + 1;
  const double ranks = static_cast<double>(options.ranks);
  // Contiguous: every rank boundary cuts at most one document. Head-tail re-splits a document
  // spanning k >= 2 ranks into 2k <= 4(k - 1) pieces, and the k - 1 summed over documents is
  // at most the ranks.
  return options.layout == Layout::kHeadTail ? docs + 4 * ranks : docs + ranks;
}

Result<std::vector<Batch>> make_batches(const WorkloadOptions& options) {
  DISTCA_ASSIGN_OR_RETURN(LengthDistribution dist, LengthDistribution::create(options));
  const int64_t slots = options.ranks * options.tokens_per_rank;
  std::vector<Batch> out;
  out.reserve(static_cast<size_t>(options.batches));
  for (int64_t bi = 0; bi < options.batches; ++bi) {
    Rng rng(options.seed, static_cast<uint64_t>(bi));
    std::vector<int64_t> lengths;
    for (int64_t total = 0; total < slots;) {
      lengths.push_back(dist.sample(rng));
      total += lengths.back();
    }
    out.push_back(pack_documents(lengths, options.ranks, options.tokens_per_rank, options.layout));
  }
  return out;
}

}  // namespace distca
