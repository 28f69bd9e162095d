#include "distca/data/batch_memory.h"

#include <sys/stat.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/data/json_field.h"

namespace distca {

Result<BatchShape> estimate_shape(const WorkloadOptions& o) {
  BatchShape s;
  s.batches = static_cast<double>(o.batches);
  s.ranks = static_cast<double>(o.ranks);
  DISTCA_ASSIGN_OR_RETURN(s.pieces, estimate_batch_pieces(o));
  return s;
}

BatchShape shape_of(const Batch& b) {
  BatchShape s;
  s.ranks = static_cast<double>(b.ranks);
  for (const auto& rank : b.per_rank) s.pieces += static_cast<double>(rank.size());
  return s;
}

BatchShape shape_of(const std::vector<Batch>& batches) {
  BatchShape s;
  s.batches = static_cast<double>(batches.size());
  for (const Batch& b : batches) {
    const BatchShape one = shape_of(b);
    s.ranks = std::max(s.ranks, one.ranks);
    s.pieces = std::max(s.pieces, one.pieces);
  }
  return s;
}

double batches_bytes(const BatchShape& s) {
  // Measured: 42 bytes per piece (the Piece and the drawn length) and 24 per rank list, with
  // the allocator's overhead; rounded up for margin.
  // The process itself (binary, libraries, allocator arenas) adds about 10 MB.
  constexpr double kPerPiece = 64, kPerRank = 64, kProcess = 16 << 20;
  return kProcess + s.batches * (kPerPiece * s.pieces + kPerRank * s.ranks);
}

double batch_json_bytes(const BatchShape& s) {
  // Measured 1.06 KB per piece with its text; rounded up.
  constexpr double kPerPiece = 1600, kPerRank = 512;
  return kPerPiece * s.pieces + kPerRank * s.ranks;
}

Status check_json_file_memory(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::ok_status();
  // A parsed JSON document of small objects takes about 10x its text (each number a 16-byte
  // value in a map node); 16x leaves a margin.
  constexpr double kDomPerByte = 16;
  return check_memory(kDomPerByte * static_cast<double>(st.st_size), what);
}

Result<std::vector<Batch>> read_batch_file(const std::string& path) {
  DISTCA_RETURN_IF_ERROR(check_input_file(path).with_context("--batch"));
  const std::string ctx = "--batch " + path;
  DISTCA_RETURN_IF_ERROR(check_json_file_memory(path, ctx));
  auto j = read_json_fields(path);
  if (!j.ok()) return Status(j.status().code(), ctx + ": " + j.status().message());
  return batches_from_json(*j, ctx);
}

}  // namespace distca
