// Document-length workloads and packing (docs/workloads.md explains every number).
//
// A workload is drawn per batch: documents are sampled from a length distribution until the
// batch's ranks * tokens_per_rank token slots are full, then packed in order. Batch b of a
// seed uses random stream b, so asking for more batches never changes the earlier ones.
//
// Thread safety: functions are pure given their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distca/core/rng.h"
#include "distca/core/status.h"
#include "distca/data/batch.h"

namespace distca {

enum class Layout { kContiguous, kHeadTail };
Result<Layout> parse_layout(const std::string& s);  // "contiguous" | "head-tail"

struct WorkloadOptions {
  std::string dist = "prolong";  // pretrain | prolong | fixed:N | uniform:A:B | file:PATH
  int64_t ranks = 8;
  int64_t tokens_per_rank = 512 * 1024;  // a positive multiple of 16; ranks * it <= 2^40
  Layout layout = Layout::kContiguous;
  int64_t max_doc_len = 0;  // 0: no cap; otherwise >= 16 (rounded down to a multiple of 16)
  int64_t batches = 1;      // 1 .. 10^6; batch b uses Rng(seed, b)
  uint64_t seed = 42;
  // ProLong recipe: probability in [0, 1] that a long (>= 64K) document is replaced by one as
  // long as a rank's batch (tokens_per_rank).
  double prolong_long_prob = 0.3;

  // Checks every field; the message names the flag (--ranks, --dist, ...).
  Status validate() const;
};

// Lengths are in tokens. Every length a batch holds is a multiple of kLengthQuantum.
inline constexpr int64_t kLengthQuantum = 16;
// The reference context length of the recipes: documents >= this are "long", and lengths are
// elongated by tokens_per_rank / kRecipeContext.
inline constexpr int64_t kRecipeContext = 65536;

// A parsed --dist: draws document lengths one at a time (docs/workloads.md has the numbers).
// Thread safety: const methods may be called concurrently with distinct Rngs.
class LengthDistribution {
 public:
  // Parses options.dist (reading the file of file:PATH). Validates `options` first. Errors
  // name --dist (and the file and line for a malformed length file).
  static Result<LengthDistribution> create(const WorkloadOptions& options);

  // One base length before the recipe: pretrain/prolong draw from the fitted distribution of
  // the reference corpus (what ../shared/data/doclens-*.json hold), file:PATH draws one of the
  // file's lengths uniformly, fixed/uniform draw their own length. Not rounded, not capped.
  int64_t sample_base(Rng& rng) const;
  // One final length: the recipe's reweighting (documents < 64K weight 0.5, >= 64K weight 4;
  // for pretrain, prolong and file), ProLong's replacement of long documents, elongation by
  // elongation(), rounding up to kLengthQuantum, then the --max-doc-len cap.
  int64_t sample(Rng& rng) const;
  // tokens_per_rank / 65536 for pretrain and file; 1 for prolong (whose recipe elongates only
  // through the replacement documents of tokens_per_rank tokens), fixed and uniform.
  double elongation() const { return elongation_; }

 private:
  enum class Kind { kPretrain, kProlong, kFixed, kUniform, kFile };
  LengthDistribution() = default;
  // A base draw conditioned on being < 64K (long == false) or >= 64K (long == true).
  double sample_class(Rng& rng, bool long_doc) const;

  Kind kind_ = Kind::kPretrain;
  double elongation_ = 1.0;
  int64_t a_ = 0, b_ = 0;        // fixed: a_; uniform: [a_, b_]
  int64_t tokens_per_rank_ = 0;  // ProLong's replacement length
  int64_t cap_ = 0;              // 0: none; else a multiple of 16
  double long_prob_ = 0.0;       // ProLong replacement probability
  double long_share_ = 0.0;      // P(long) after the recipe's reweighting
  std::vector<int64_t> short_, long_;  // file: lengths < 64K and >= 64K
};

// Draws and packs options.batches batches: batch b draws lengths with Rng(seed, b) until its
// ranks * tokens_per_rank slots are full, then packs them. Errors (before any drawing): invalid
// options, unreadable or malformed length file.
Result<std::vector<Batch>> make_batches(const WorkloadOptions& options);

// An upper bound, with a margin, of the pieces ONE batch of `options` holds, for memory
// estimates before anything is drawn: documents <= slots / length for fixed; for the others
// slots / (a fraction of the mean of 4096 fixed draws of the distribution: half for the
// heavy-tailed pretrain, prolong and file, 0.9 for uniform), never more than slots / 16;
// pieces <= documents + ranks (a rank boundary cuts one document), documents + 4 * ranks for
// head-tail. Errors: those of LengthDistribution::create.
Result<double> estimate_batch_pieces(const WorkloadOptions& options);

// Packs document lengths (already rounded and capped) into `ranks` ranks of `tokens_per_rank`
// slots in order; document i gets id i. Documents past the last slot are dropped; the document
// that crosses the end of the batch is cut to fit (its doc_len becomes the length that fits).
// kHeadTail re-splits every document that spans k >= 2 ranks into a head chunk (from the front)
// and a tail chunk (from the back) per rank, keeping each rank's token count; see
// docs/workloads.md. Preconditions (checked): ranks > 0, tokens_per_rank > 0, lengths > 0.
Batch pack_documents(const std::vector<int64_t>& lengths, int64_t ranks, int64_t tokens_per_rank,
                     Layout layout);

}  // namespace distca
