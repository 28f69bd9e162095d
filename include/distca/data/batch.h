// A packed batch: which pieces of which documents each rank holds.
//
// Every rank holds `tokens_per_rank` token slots; a document larger than what is left on a
// rank continues on the next rank and keeps its logical positions (Piece::offset is the
// piece's start within its document). In the head-tail layout a rank may hold two pieces of
// one document (one from the front, the mirrored one from the back).
//
// JSON (what `distca workload --json --full` prints under "batch" and every `--batch FILE`
// reads): {"ranks": N, "tokens_per_rank": T,
//          "per_rank": [[{"doc": ID, "offset": START, "len": LEN, "doc_len": FULL}, ...], ...]}
// Readers ignore keys they do not know and validate the rest (see Batch::validate).
//
// Thread safety: plain value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/status.h"

namespace distca {

struct Piece {
  int64_t doc = 0;      // document id, unique within the batch
  int64_t offset = 0;   // first token's position within the document
  int64_t len = 0;      // tokens in this piece (> 0)
  int64_t doc_len = 0;  // the whole document's length
  bool operator==(const Piece&) const = default;
};

struct Batch {
  int64_t ranks = 0;
  int64_t tokens_per_rank = 0;
  std::vector<std::vector<Piece>> per_rank;  // [ranks][pieces in rank order]

  // Number of distinct documents.
  int64_t num_documents() const;
  // Tokens held by rank r.
  int64_t rank_tokens(int64_t r) const;
  // ranks > 0, tokens_per_rank > 0, per_rank.size() == ranks, no rank overfilled, every
  // piece inside its document, each document's doc_len consistent, and each document's pieces
  // tile [0, doc_len) exactly (no gap, no overlap). The message names the rank and document.
  Status validate() const;
  bool operator==(const Batch&) const = default;
};

nlohmann::json batch_to_json(const Batch& b);
// Parses and validates; the message names the offending field.
Result<Batch> batch_from_json(const nlohmann::json& j);
// The batches of a batch file (what `--batch FILE` reads): a bare batch, any object with a
// "batch" key holding one, or any object with a non-empty "batches" array of either. Every
// message starts with `context` ("--batch FILE: batches[2]: ...").
Result<std::vector<Batch>> batches_from_json(const nlohmann::json& j, const std::string& context);

}  // namespace distca
