// Training checkpoints: one binary file holding everything a run needs to continue bitwise as
// if it had not stopped (docs/training.md, "Checkpoint format", gives the byte layout).
//
//   magic "DCACKPT\n" (8 bytes), version u32 = 1, fingerprint (u64 length + UTF-8 text),
//   step i64 (steps completed = the next step's index, which is also the data position: step
//   b's batch is a pure function of (seed, b)), seed u64, adam_step i64, n_params i64,
//   params, adam m, adam v (n_params fp32 each, little-endian), then FNV-1a 64 of every byte
//   before it (u64).
// The RNG state is (seed, step): every random draw of a step comes from Rng(seed', stream of
// the step), so no generator state outlives a step.
//
// Written with write_file_atomic (temporary file + rename), so a crash leaves either the old
// file or the new one. Reading verifies size, magic, version and checksum ("checksum mismatch
// (file corrupt)") and the caller compares the fingerprint.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distca/core/status.h"
#include "distca/train/config.h"

namespace distca::train {

struct Checkpoint {
  std::string fingerprint;  // fingerprint(config) of the run that wrote it
  int64_t step = 0;         // steps completed
  uint64_t seed = 0;
  int64_t adam_step = 0;
  std::vector<float> params, adam_m, adam_v;  // (n_params) each
};

// What must match for a resume: model dimensions, ranks, seed, data and workload settings,
// tokens per rank, optimiser settings and the step count (the schedule depends on it). One
// line of "key=value" pairs separated by spaces. Not the mode, backend or output paths: cad
// and colocated compute the same bits.
std::string fingerprint(const TrainConfig& config, const ModelSpec& spec);

uint64_t fnv1a64(const void* data, size_t bytes, uint64_t h = 0xcbf29ce484222325ULL);

std::string serialize_checkpoint(const Checkpoint& c);
// `name` names the file in messages ("--resume FILE").
Result<Checkpoint> parse_checkpoint(const std::string& bytes, const std::string& name);

// The name of the checkpoint written after `steps` steps: "step-NNNNNNNN.ckpt" (8 digits at
// least), and whether a file name has that shape.
std::string checkpoint_name(int64_t steps);
bool is_checkpoint_name(const std::string& name);

Status write_checkpoint(const std::string& path, const Checkpoint& c);
// Reads and verifies the file, then compares the fingerprint with `expected`:
// "--resume FILE: was written for <differing key=value>; this run has <key=value>".
Result<Checkpoint> read_checkpoint(const std::string& path, const std::string& expected_fingerprint);

// Whether a checkpoint whose bytes are intact can continue `config`'s run: 0 <= step < steps
// (a finished run has nothing to resume), adam_step == step (one optimizer step per training
// step), n_params parameters, every parameter and AdamW moment finite and every second moment
// >= 0. invalid_argument naming `name` ("--resume FILE") and what is impossible.
Status check_resume(const Checkpoint& c, const TrainConfig& config, int64_t n_params, const std::string& name);

}  // namespace distca::train
