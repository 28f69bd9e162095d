// Token streams for training: the synthetic copy task and a directory of text files.
//
// Step b's batch (which documents, how long, packed onto which ranks) is a pure function of
// (config, b): copy draws lengths exactly as make_batches' batch b (Rng(seed, b), data/
// workload.h); text draws files with Rng(seed ^ kTextSalt, b). So the data position of a run
// is just its step, and a resumed run sees the same data as an uninterrupted one.
//
// Copy task: document d of step b (length L, a multiple of 16) has L/2 tokens drawn uniformly
// from [0, copy_vocab) (config.h) with Rng(seed ^ kCopySalt, b * 2^32 + d), then the same L/2 tokens again.
// Only attention across the document predicts the second half; report weights select the
// targets inside the second half (positions L/2 + 1 .. L-1), the loss the run reports.
// Text: every non-empty regular file under DIR (recursively, sorted by path) is one document of
// byte tokens followed by the end-of-document token 256 (cut to max_doc_len); report weights
// are 1 for every target. Empty files are skipped (a lone end-of-document has no target); a
// missing DIR, a file, or a directory without a non-empty file is refused.
//
// Per rank: the rank's pieces (Batch::per_rank[r]) concatenated; positions are offsets within
// the document; the target of a token is the next token of its document (-1 for the last).
//
// Thread safety: DataSource is immutable after create(); its const methods may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "distca/core/status.h"
#include "distca/data/batch.h"
#include "distca/data/workload.h"
#include "distca/model/llama.h"
#include "distca/train/config.h"

namespace distca::train {

inline constexpr int32_t kEndOfDocument = 256;  // text data

// One rank's inputs for one step; every vector has the rank's token count.
struct RankInputs {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<int32_t> targets;       // -1 where the document ends
  std::vector<float> report_weights;  // 1: counts in the reported loss
  model::StepInputs view() const { return {tokens, positions, targets, report_weights}; }
};

// An order-free checksum of tokens at their document positions (equal spans): the wrapping sum
// over i of a 64-bit mix of (tokens[i], positions[i]). A step's documents give the same sum
// however they are packed, cut or sharded over ranks, so runs that pack one step differently
// can show they trained on the same documents.
uint64_t inputs_checksum(std::span<const int32_t> tokens, std::span<const int32_t> positions);

// The files of a text corpus (non-empty regular files, sorted) and their sizes, found without
// reading them: the CLI's early check and memory estimate. Errors name --data.
struct TextCorpus {
  std::vector<std::string> paths;
  int64_t bytes = 0;    // sum of the file sizes
  int64_t largest = 0;  // the largest file's size
};
Result<TextCorpus> scan_text_corpus(const std::string& dir);

class DataSource {
 public:
  // Validates the data settings and reads the text directory (errors name --data / --dist).
  static Result<DataSource> create(const TrainConfig& config, int64_t vocab);
  // A copy-task source whose every step packs the same `batch` (which documents, how long, on
  // which rank): a workload imposed rather than drawn, e.g. a benchmark's fixed skew. The
  // tokens are the copy task's, drawn per (seed, step, document) from [0, copy_vocab) as above.
  // Preconditions of use: the run's config has batch.ranks ranks and batch.tokens_per_rank
  // tokens per rank, and its max_doc_len covers the batch's longest document (the memory
  // estimate's bound). Errors: an invalid batch (Batch::validate), a rank not full, copy_vocab < 2.
  static Result<DataSource> fixed(const Batch& batch, int64_t copy_vocab, uint64_t seed);
  // The same with a cycle of batches: batch(i) is batches[i % batches.size()], e.g. a
  // pipeline benchmark's skew per micro-batch (the trainer asks for batch(step * M + m)). Every
  // batch must have the same ranks and tokens_per_rank; errors as above (naming the batch's
  // index) and an empty list. One batch behaves exactly as fixed(batch, ...).
  static Result<DataSource> fixed(const std::vector<Batch>& batches, int64_t copy_vocab, uint64_t seed);

  // The packed batch of step `step`.
  Batch batch(int64_t step) const;
  // The tokens of document `doc` of step `step`'s batch (its first doc_len tokens).
  std::vector<int32_t> document(int64_t step, const Batch& batch, int64_t doc) const;
  // Rank `rank`'s inputs (see above).
  RankInputs rank_inputs(int64_t step, const Batch& batch, int64_t rank) const;
  bool is_copy() const { return text_.empty(); }
  int64_t num_text_documents() const { return static_cast<int64_t>(text_.size()); }

 private:
  DataSource() = default;
  WorkloadOptions workload_;
  int64_t vocab_ = 0;
  std::vector<std::vector<int32_t>> text_;  // text documents, EOD included
  std::shared_ptr<LengthDistribution> dist_;
  std::vector<Batch> fixed_;  // fixed(): step i's batch is fixed_[i % size] (empty: drawn)
};

}  // namespace distca::train
