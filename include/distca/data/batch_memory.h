// Memory estimates of batches (docs/workloads.md, "Memory"), for refusing a run before it
// draws or reads them (core/memory.h check_memory). Shared by the CLI's commands and the
// Python module, so both refuse the same inputs.
//
// Thread safety: plain functions of their arguments (check_json_file_memory reads the file's
// size and the memory limit).
#pragma once

#include <string>
#include <vector>

#include "distca/core/status.h"
#include "distca/data/batch.h"
#include "distca/data/workload.h"

namespace distca {

// The shape of the batches a caller will hold: how many, and per batch the ranks and an
// upper bound of the pieces.
struct BatchShape {
  double batches = 1;
  double ranks = 0;   // the largest batch's
  double pieces = 0;  // the largest batch's (an upper bound when estimated)
};

// The batches make_batches(options) draws, estimated from the options alone
// (estimate_batch_pieces). Precondition: options.validate() is OK.
Result<BatchShape> estimate_shape(const WorkloadOptions& options);
// The shape of batches already held.
BatchShape shape_of(const std::vector<Batch>& batches);
BatchShape shape_of(const Batch& batch);
// Bytes of the Batch values themselves (pieces and per-rank lists, lengths while drawing),
// plus the process itself (16 MiB).
double batches_bytes(const BatchShape& shape);

// One batch of `shape` as JSON (batch_to_json: every piece an object) and its text.
double batch_json_bytes(const BatchShape& shape);

// A JSON file about to be parsed into a document (about 16 bytes of memory per byte of text)
// must fit: check_memory naming `what` ("--batch FILE"). OK when the file cannot be
// examined (its reader then says why).
Status check_json_file_memory(const std::string& path, const std::string& what);

// `--batch FILE` as the CLI and Python read it: the file's kind (check_input_file), the memory
// of its parsed document (check_json_file_memory), then its batches (batches_from_json, each
// validated). Errors name "--batch" and the file.
Result<std::vector<Batch>> read_batch_file(const std::string& path);

}  // namespace distca
