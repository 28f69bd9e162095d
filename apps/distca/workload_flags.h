// Workload flags shared by every command that needs batches (`workload`, `plan`, `simulate`).
//
// Usage in a command's setup():
//
//   auto flags = std::make_shared<WorkloadFlags>();
//   add_workload_flags(sub, *flags);
//   return [flags] {
//     auto batches = resolve_batches(*flags);
//     if (!batches.ok()) return cli::fail(batches.status());  // one line, exit 2
//     ...
//   };
//
// Flags declared: --dist --ranks --tokens-per-rank --layout --max-doc-len --batches --seed
// --long-prob (generate batches, docs/workloads.md) and --batch FILE (read them instead).
// --batch excludes every generating flag (CLI11 refuses the combination at parse time).
// A batch file is one of:
//   * a bare batch object {"ranks", "tokens_per_rank", "per_rank": [[piece...]...]};
//   * any object with a "batch" key holding one (`distca workload --json --full` output);
//   * any object with a "batches" array whose entries are either of the above
//     (`distca workload --batches B --json --full` output).
// Every batch read is validated (Batch::validate); errors name "--batch FILE".
//
// Thread safety: call from the CLI's main thread.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/data/batch.h"
#include "distca/data/batch_memory.h"
#include "distca/data/workload.h"
#include "command.h"

namespace distca::cli {

struct WorkloadFlags {
  WorkloadOptions options;  // filled by the generating flags (defaults as in workload.h)
  std::string layout = "contiguous";  // --layout, parsed by resolve_batches
  std::string batch_file;             // --batch FILE; empty: generate from `options`
};

// Declares the flags above on `app`, bound to `flags` (which must outlive the parse).
void add_workload_flags(CLI::App& app, WorkloadFlags& flags);

// Generates (validating the options first, before any work) or reads the batches.
// Errors are one line naming the flag (--ranks, --dist, --batch ...).
Result<std::vector<Batch>> resolve_batches(const WorkloadFlags& flags);

// Memory estimates (docs/workloads.md, "Memory"; data/batch_memory.h). Generated batches are
// estimated from the flags alone; batches read from --batch are measured once read (their
// file was bounded first by check_batch_file_memory).
// Precondition: flags.batch_file is empty and flags.options.validate() is OK.
Result<BatchShape> estimate_shape(const WorkloadFlags& flags);
// The flags that drive the estimate, for check_memory's message:
// "--ranks 8 --tokens-per-rank 16 --batches 1" or "--batch FILE".
std::string shape_flags(const WorkloadFlags& flags);
// --batch FILE: the parsed document of the file (about 16 bytes of memory per byte of JSON)
// must fit before it is read. OK when no file is given.
Status check_batch_file_memory(const WorkloadFlags& flags);

// A refusal before any work: a memory estimate over the limit is bad input (exit 2, the
// message names the flags), anything else goes through cli::fail.
int fail_before_work(const Status& status);

}  // namespace distca::cli
