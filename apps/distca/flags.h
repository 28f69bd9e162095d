// Strict number parsing for every flag of the `distca` CLI (docs/development.md, "Input and
// output rules").
//
// CLI11 reads integers with strtoll(..., base 0): "010" is octal 8, "0x10" is 16, "-1" into an
// unsigned flag wraps to 2^64-1, values past the type saturate silently; floats accept "nan",
// "inf" and hex floats. The rules here instead:
//   * integers: decimal digits only, an optional leading '-' for signed types, no leading zeros
//     except "0" itself, no '+', no 0x/0o/0b prefix, no suffix; a value outside the bound
//     type's range is refused: "--steps: 2147483648 is out of range (at most 2147483647)";
//   * floats: plain decimal or scientific ("0.5", ".5", "1e-3"), finite only: nan, inf, hex
//     floats and values that overflow the type are refused.
// Each refusal is one CLI::ValidationError naming the flag, which the CLI prints as one line
// and exits 2.
//
// How: CLI11 converts every value through unqualified calls to CLI::detail::lexical_cast. The
// non-template overloads declared below, seen before CLI11's own templates, win overload
// resolution for the built-in integer and float types, so every `add_option(name, int_var)` in
// every cmd_*.cpp is strict without that file doing anything. This header must therefore be
// the first thing every translation unit of the CLI sees: apps/CMakeLists.txt force-includes
// it (-include), and it refuses to compile after CLI11 (a translation unit that instantiated
// CLI11's templates without these overloads would break the one-definition rule silently).
// The conversion itself does not know the flag's name; build_cli() (command.h) adds to every
// option a first validator that records the name, and a last one that marks "now converting",
// so the conversion can name the flag in its error.
//
// Thread safety: parsing is single-threaded (the recorded flag name is per thread).
#pragma once

#if defined(CLI11_VERSION)
#error "apps/distca/flags.h must be included before CLI11 (it overloads CLI::detail::lexical_cast)"
#endif

#include <string>
#include <vector>

namespace CLI::detail {
bool lexical_cast(const std::string& input, short& output);
bool lexical_cast(const std::string& input, unsigned short& output);
bool lexical_cast(const std::string& input, int& output);
bool lexical_cast(const std::string& input, unsigned int& output);
bool lexical_cast(const std::string& input, long& output);
bool lexical_cast(const std::string& input, unsigned long& output);
bool lexical_cast(const std::string& input, long long& output);
bool lexical_cast(const std::string& input, unsigned long long& output);
bool lexical_cast(const std::string& input, float& output);
bool lexical_cast(const std::string& input, double& output);
bool lexical_cast(const std::string& input, long double& output);
}  // namespace CLI::detail

#include <CLI/CLI.hpp>

namespace distca::cli {

// Adds --mpi-timeout SECONDS, with one rule for every command that runs under mpirun: a finite
// number in (0, 1e6] ("--mpi-timeout: must be in (0, 1e6] seconds (got 0)"); 0 would mean no
// timeout, and every wait is bounded. `help` follows "seconds without progress after which a
// silent rank ends the job".
CLI::Option* add_mpi_timeout(CLI::App& app, double& seconds, const std::string& when = "under mpirun");

// The items of a comma-separated flag value, empty ones kept ("" is one empty item), for the
// caller to check each by its own rule.
std::vector<std::string> split_list(const std::string& list);

// Parses with app.parse(argc, argv) and forgets the recorded flag name afterwards, even when
// parsing throws (later conversions, such as Option::as<T>(), then fail the plain CLI11 way).
void parse_strict(CLI::App& app, int argc, const char* const* argv);

}  // namespace distca::cli
