#include "distca/train/data.h"

#include <algorithm>
#include <filesystem>

#include "distca/core/check.h"
#include "distca/core/io.h"
#include "distca/core/rng.h"

namespace distca::train {
namespace {

constexpr uint64_t kCopySalt = 0xC0B1C0B1D15C0A11ULL;
constexpr uint64_t kTextSalt = 0x7E47DA7A5EEDF00DULL;

}  // namespace

Result<DataSource> DataSource::create(const TrainConfig& config, int64_t vocab) {
  DataSource s;
  s.vocab_ = config.copy_vocab > 0 ? std::min(config.copy_vocab, vocab) : vocab;
  s.workload_.dist = config.dist;
  s.workload_.ranks = config.dp();  // a micro-batch is packed over the data-parallel replicas
  s.workload_.tokens_per_rank = config.tokens_per_rank;
  s.workload_.max_doc_len = config.max_doc_len;
  s.workload_.seed = config.seed;
  s.workload_.batches = 1;
  DISTCA_RETURN_IF_ERROR(s.workload_.validate());
  const std::string dir = config.text_dir();
  if (dir.empty()) {
    DISTCA_ASSIGN_OR_RETURN(LengthDistribution d, LengthDistribution::create(s.workload_));
    s.dist_ = std::make_shared<LengthDistribution>(std::move(d));
    return s;
  }
  DISTCA_ASSIGN_OR_RETURN(TextCorpus corpus, scan_text_corpus(dir));
  for (const std::string& p : corpus.paths) {
    DISTCA_ASSIGN_OR_RETURN(std::string bytes, read_file(p));
    if (bytes.empty()) continue;  // may have been emptied since the scan
    // Truncated to max_doc_len before converting: a large file costs its bytes once, briefly.
    size_t keep = bytes.size() + 1;
    if (config.max_doc_len > 0) keep = std::min(keep, static_cast<size_t>(config.max_doc_len));
    std::vector<int32_t> doc;
    doc.reserve(keep);
    for (size_t i = 0; i < bytes.size() && doc.size() < keep; ++i) {
      doc.push_back(static_cast<int32_t>(static_cast<unsigned char>(bytes[i])));
    }
    if (doc.size() < keep) doc.push_back(kEndOfDocument);
    s.text_.push_back(std::move(doc));
  }
  if (s.text_.empty()) return Status::invalid_argument("--data text:" + dir + ": every file is empty");
  return s;
}

Result<DataSource> DataSource::fixed(const Batch& batch, int64_t copy_vocab, uint64_t seed) {
  return fixed(std::vector<Batch>{batch}, copy_vocab, seed);
}

Result<DataSource> DataSource::fixed(const std::vector<Batch>& batches, int64_t copy_vocab, uint64_t seed) {
  if (batches.empty()) return Status::invalid_argument("fixed batch: the list of batches is empty");
  for (size_t i = 0; i < batches.size(); ++i) {
    const Batch& batch = batches[i];
    const std::string name = batches.size() == 1 ? "fixed batch" : "fixed batch " + std::to_string(i);
    if (Status st = batch.validate(); !st.ok()) {
      return batches.size() == 1 ? st : Status(st.code(), name + ": " + st.message());
    }
    if (batch.ranks != batches[0].ranks || batch.tokens_per_rank != batches[0].tokens_per_rank) {
      return Status::invalid_argument(name + ": " + std::to_string(batch.ranks) + " ranks of " +
                                      std::to_string(batch.tokens_per_rank) + " tokens, unlike batch 0's " +
                                      std::to_string(batches[0].ranks) + " of " +
                                      std::to_string(batches[0].tokens_per_rank));
    }
    for (int64_t r = 0; r < batch.ranks; ++r) {
      // The model's buffers and the plans assume every rank's slots are filled.
      if (batch.rank_tokens(r) != batch.tokens_per_rank) {
        return Status::invalid_argument(name + ": rank " + std::to_string(r) + " holds " +
                                        std::to_string(batch.rank_tokens(r)) + " of its " +
                                        std::to_string(batch.tokens_per_rank) + " tokens");
      }
    }
  }
  if (copy_vocab < 2) return Status::invalid_argument("fixed batch: the copy alphabet needs at least 2 tokens");
  DataSource s;
  s.vocab_ = copy_vocab;
  s.workload_.ranks = batches[0].ranks;
  s.workload_.tokens_per_rank = batches[0].tokens_per_rank;
  s.workload_.seed = seed;
  s.fixed_ = batches;
  return s;
}

Result<TextCorpus> scan_text_corpus(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string name = "--data text:" + dir;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) return Status::invalid_argument(name + ": no such directory");
  if (!fs::is_directory(st)) return Status::invalid_argument(name + ": not a directory");
  TextCorpus c;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const auto size = static_cast<int64_t>(it->file_size(ec));
    if (ec) break;
    if (size == 0) continue;  // an empty document has nothing to predict
    c.paths.push_back(it->path().string());
    c.bytes += size;
    c.largest = std::max(c.largest, size);
  }
  if (ec) return Status::invalid_argument(name + ": " + ec.message());
  if (c.paths.empty()) return Status::invalid_argument(name + ": no non-empty regular file in the directory");
  std::sort(c.paths.begin(), c.paths.end());
  return c;
}

namespace {

// The files drawn for a text step, in packing order, and their lengths.
void text_draw(const std::vector<std::vector<int32_t>>& text, uint64_t seed, int64_t step,
               int64_t slots, std::vector<int64_t>* ids, std::vector<int64_t>* lengths) {
  Rng rng(seed ^ kTextSalt, static_cast<uint64_t>(step));
  for (int64_t total = 0; total < slots;) {
    const auto id = static_cast<int64_t>(rng.uniform_int(text.size()));
    ids->push_back(id);
    lengths->push_back(static_cast<int64_t>(text[static_cast<size_t>(id)].size()));
    total += lengths->back();
  }
}

}  // namespace

uint64_t inputs_checksum(std::span<const int32_t> tokens, std::span<const int32_t> positions) {
  DISTCA_CHECK(tokens.size() == positions.size());
  uint64_t sum = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    // splitmix64's finaliser of (token, position): a changed token or position changes the
    // term unpredictably, so a different multiset of (token, position) pairs shows in the sum.
    uint64_t z = (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) << 32) ^
                 static_cast<uint64_t>(static_cast<uint32_t>(positions[i]));
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    sum += z ^ (z >> 31);
  }
  return sum;
}

Batch DataSource::batch(int64_t step) const {
  if (!fixed_.empty()) return fixed_[static_cast<size_t>(step) % fixed_.size()];
  const int64_t slots = workload_.ranks * workload_.tokens_per_rank;
  std::vector<int64_t> lengths;
  if (is_copy()) {
    // Exactly make_batches' batch `step` (data/workload.cpp).
    Rng rng(workload_.seed, static_cast<uint64_t>(step));
    for (int64_t total = 0; total < slots;) {
      lengths.push_back(dist_->sample(rng));
      total += lengths.back();
    }
  } else {
    std::vector<int64_t> ids;
    text_draw(text_, workload_.seed, step, slots, &ids, &lengths);
  }
  return pack_documents(lengths, workload_.ranks, workload_.tokens_per_rank, Layout::kContiguous);
}

std::vector<int32_t> DataSource::document(int64_t step, const Batch& batch, int64_t doc) const {
  int64_t doc_len = 0;
  for (const auto& rank : batch.per_rank) {
    for (const Piece& p : rank) {
      if (p.doc == doc) doc_len = p.doc_len;
    }
  }
  DISTCA_CHECK(doc_len > 0);
  std::vector<int32_t> out(static_cast<size_t>(doc_len));
  if (is_copy()) {
    // The packer may cut the last document to an odd length; the halves use the full length's
    // split so the cut document stays a prefix of a proper copy document.
    const int64_t half = (doc_len + 1) / 2;
    Rng rng(workload_.seed ^ kCopySalt, (static_cast<uint64_t>(step) << 32) | static_cast<uint64_t>(doc));
    for (int64_t i = 0; i < half; ++i) {
      out[static_cast<size_t>(i)] = static_cast<int32_t>(rng.uniform_int(static_cast<uint64_t>(vocab_)));
    }
    for (int64_t i = half; i < doc_len; ++i) out[static_cast<size_t>(i)] = out[static_cast<size_t>(i - half)];
  } else {
    std::vector<int64_t> ids, lengths;
    text_draw(text_, workload_.seed, step, workload_.ranks * workload_.tokens_per_rank, &ids, &lengths);
    const auto& src = text_[static_cast<size_t>(ids[static_cast<size_t>(doc)])];
    std::copy(src.begin(), src.begin() + doc_len, out.begin());
  }
  return out;
}

RankInputs DataSource::rank_inputs(int64_t step, const Batch& batch, int64_t rank) const {
  RankInputs in;
  for (const Piece& p : batch.per_rank[static_cast<size_t>(rank)]) {
    const std::vector<int32_t> doc = document(step, batch, p.doc);
    const int64_t half = (p.doc_len + 1) / 2;
    for (int64_t i = p.offset; i < p.offset + p.len; ++i) {
      in.tokens.push_back(doc[static_cast<size_t>(i)]);
      in.positions.push_back(static_cast<int32_t>(i));
      const bool has_next = i + 1 < p.doc_len;
      in.targets.push_back(has_next ? doc[static_cast<size_t>(i + 1)] : -1);
      // Copy: the target at position i + 1 is predictable once the second half has begun
      // (i + 1 > half: token half repeats token 0, which nothing announces).
      const bool report = !is_copy() || (has_next && i + 1 > half);
      in.report_weights.push_back(report ? 1.0f : 0.0f);
    }
  }
  return in;
}

}  // namespace distca::train
