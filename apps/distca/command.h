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

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

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

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

// Prints "distca: error: <message>" to stderr and returns the exit code for the status
// (2 for invalid argument / not found / corrupt input, 1 otherwise).
int fail(const Status& status);
// Same, for a plain message about bad input (exit 2).
int fail_input(const std::string& message);

// True when stdout (or stderr) is a terminal: progress lines are shown only then.
bool stdout_is_terminal();
bool stderr_is_terminal();

}  // namespace distca::cli

#define DISTCA_REGISTER_COMMAND(ident, ...) \
  static const bool distca_command_##ident##_registered = ::distca::cli::register_command(__VA_ARGS__)
