// Workload flags shared by every command that needs batches (`workload`, `plan`, `simulate`).
//
// Usage in a command's setup():
//
//   auto flags = std::make_shared<WorkloadFlags>();
//   add_workload_flags(sub, *flags);
//   return [flags] {
//     auto batches = load_batches(*flags, bytes, what);  // every check first
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

#include <functional>
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

// The flags that drive the estimate, for check_memory's message:
// "--ranks 8 --tokens-per-rank 16 --batches 1" or "--batch FILE".
std::string shape_flags(const WorkloadFlags& flags);
// The batches, each check before the work it covers. Drawn: the options, then `check` (the
// command's own checks of the flags; may be empty), then the memory of bytes(the shape the
// flags give, docs/workloads.md "Memory"); a file: read_batch_file (data/batch_memory.h),
// then the memory of bytes(its batches' shape). `what` names the flags in a memory refusal
// (out_of_memory); the other errors name their flag.
Result<std::vector<Batch>> load_batches(const WorkloadFlags& flags, const std::function<double(const BatchShape&)>& bytes,
                                        const std::string& what, const std::function<Status()>& check = {});

}  // namespace distca::cli
