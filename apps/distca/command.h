// Subcommand registry of the `distca` CLI.
//
// Each cmd_<name>.cpp defines one command and registers it at static-initialisation time:
//
//   DISTCA_REGISTER_COMMAND(workload, {"workload", "", "Draw and pack ...", 10, &setup});
//
// setup(sub) declares the command's flags on `sub` and returns the function main() runs after
// a successful parse; that function returns the process exit code. A command with a non-empty
// `parent` becomes a subcommand of that parent (`distca bench plan`).
//
// Exit codes: 0 success, 1 the work failed (I/O, a lower layer), 2 bad input (flags, files).
// Errors go to stderr as one line "distca: error: ..." (see fail()).
#pragma once

#include "flags.h"  // first: it must precede CLI11 (see there)

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "distca/core/io.h"
#include "distca/core/specs.h"
#include "distca/core/status.h"

namespace distca::cli {

using Runner = std::function<int()>;

struct Command {
  std::string name;
  std::string parent;  // empty for a top-level command
  std::string description;
  int order = 100;     // position in --help
  std::function<Runner(CLI::App&)> setup;
};

bool register_command(Command command);
const std::vector<Command>& registered_commands();

// The whole command tree, built from a list of commands (defined in flags.cpp, without the
// registry, so that the flag-parsing fuzzer can build it alone).
struct CliApp {
  CLI::App app{"distca: core attention disaggregation (CAD) for long-context LLM training"};
  // Every leaf subcommand (one that runs) with what its setup() returned.
  std::vector<std::pair<CLI::App*, Runner>> leaves;
  // --max-memory as given to the leaf that was parsed ("" when not given); already checked
  // by parse_byte_size during parsing.
  std::string max_memory;
};

// Runs every command's setup() (in `order`), groups commands with a parent under it, adds
// --max-memory to every leaf, and makes every numeric option strict (flags.h).
std::unique_ptr<CliApp> build_cli(std::vector<Command> commands);

// The first word of argv that should name a (sub)command but names none, as
// "unknown command 'bench frob'"; "" when there is none. CLI11 would instead report that a
// subcommand is required. Assumes, as is the case, that levels with subcommands take no option
// values, only flags such as --help.
std::string find_unknown_command(CLI::App& app, int argc, const char* const* argv);

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

// The exit code for a status: 0 when OK, 2 for bad input (invalid argument, not found, corrupt
// input, a memory estimate over the limit), 1 otherwise.
int exit_code(const Status& status);
// Prints "distca: error: <message>" to stderr and returns exit_code(status).
int fail(const Status& status);
// Same, for a plain message about bad input (exit 2).
int fail_input(const std::string& message);

// An output flag that takes FILE or - (stdout): OK when `path` is empty or "-", else
// check_output_path's refusal prefixed with the flag ("--json: ...").
Status check_output_flag(const std::string& flag, const std::string& path);
// Every output flag of a command, before any work: no two land in the same file
// (check_distinct_outputs), then each given path in turn can be written (check_output_path;
// "-" is stdout where dash_is_stdout), a refusal prefixed with its flag ("--trace: ...").
Status check_outputs(const std::vector<NamedOutput>& outputs);
// Writes `text` to stdout when `path` is "-", else to the file atomically; nothing when empty.
Status write_output_flag(const std::string& path, const std::string& text);
// --model NAME: the preset; a refusal starts "--model: ".
Result<ModelSpec> model_flag(const std::string& name);

// printf into `out`: a command builds its report in a string and writes it at the end with
// write_stdout (core/io.h), which fails on a full or closed stdout.
void appendf(std::string& out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// `bytes` in MiB with `decimals` decimals, no unit ("12.5").
std::string mib(double bytes, int decimals);
// `bytes` in the largest unit below it, "0 B" or "1.50 KiB": powers of 1024 (B, KiB, ... TiB)
// with base 1024, of 1000 (B, KB, ... PB) with base 1000.
std::string human_bytes(double bytes, int base);

// "heap on 2 MiB pages" when this process's malloc advises transparent huge pages
// (core/memory.h, malloc_on_huge_pages), else "heap on 4 KiB pages": the benchmark headers say
// which, since on a virtual machine it moves step times by a few percent.
const char* heap_pages();

// True when stderr is a terminal: progress lines are shown only then.
bool stderr_is_terminal();

}  // namespace distca::cli

#define DISTCA_REGISTER_COMMAND(ident, ...) \
  static const bool distca_command_##ident##_registered = ::distca::cli::register_command(__VA_ARGS__)
