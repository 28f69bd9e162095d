// libFuzzer target: the CLI's flag parsing (apps/distca/flags.h). The input is split into argv
// words (at NUL, newline, tab and space); a command tree with every kind of flag the real
// commands declare (signed and unsigned integers of each width, floats, vectors, strings,
// flags, CLI11's Range / PositiveNumber checks, a parent with leaves, --max-memory) is built by
// the same build_cli() as the binary and parsed. No command ever runs.
//
// What must hold: parsing either succeeds or throws CLI::ParseError (the CLI prints it as one
// line, exit 2); nothing else escapes. After a successful parse every integer flag holds
// exactly the decimal number it was given (the strict rule admits one spelling per value, so
// printing the value gives the word back), every float flag is finite, a string option that
// was given holds a non-empty value (the word '' stands for an empty argument), and
// --mpi-timeout (add_mpi_timeout) is in (0, 1e6].
//
// Build alone (the fuzz/ CMake targets do the same):
//   clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address -I include -I apps/distca \
//     fuzz/fuzz_cli_flags.cpp apps/distca/flags.cpp src/core/memory.cpp src/core/status.cpp
#include "flags.h"  // first: before CLI11

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "distca/core/memory.h"

namespace {

using distca::cli::Command;
using distca::cli::Runner;

struct Values {
  int64_t ranks = 8;
  uint64_t seed = 42;
  double prob = 0.3;
  std::string name;
  bool flag = false;
  int heads = 4;
  int repeats = 3;
  std::vector<int64_t> dims;
  double secs = 0.5;
  double timeout = 300;
  int64_t len = 32;
  short small = 1;
  unsigned int count = 1;
  float scale = 1.0f;
};

Runner never_runs() {
  return [] {
    std::abort();  // the fuzzer parses only
    return 0;
  };
}

std::vector<Command> commands(Values& v) {
  std::vector<Command> c;
  c.push_back({"work", "", "integers, a float, a string, a flag", 1, [&v](CLI::App& app) {
                 app.add_option("--ranks", v.ranks, "int64")->capture_default_str();
                 app.add_option("--seed", v.seed, "uint64")->capture_default_str();
                 app.add_option("--prob", v.prob, "double");
                 app.add_option("--name", v.name, "string");
                 app.add_flag("--flag", v.flag, "bool");
                 distca::cli::add_mpi_timeout(app, v.timeout);
                 return never_runs();
               }});
  c.push_back({"att", "bench", "CLI11 validators", 2, [&v](CLI::App& app) {
                 app.add_option("--heads", v.heads, "int, positive")->check(CLI::PositiveNumber);
                 app.add_option("--repeats", v.repeats, "int in range")->check(CLI::Range(1, 1000));
                 app.add_option("--dims", v.dims, "int64 vector")->check(CLI::PositiveNumber);
                 app.add_option("--secs", v.secs, "double >= 0")->check(CLI::NonNegativeNumber);
                 app.add_option("--len", v.len, "int64 range")->check(CLI::Range(int64_t{16}, int64_t{1} << 22));
                 return never_runs();
               }});
  c.push_back({"tiny", "bench", "narrow types", 3, [&v](CLI::App& app) {
                 app.add_option("--small", v.small, "short");
                 app.add_option("--count", v.count, "unsigned int");
                 app.add_option("--scale", v.scale, "float");
                 return never_runs();
               }});
  return c;
}

std::vector<std::string> split(const uint8_t* data, size_t size) {
  std::vector<std::string> words;
  std::string cur;
  for (size_t i = 0; i < size && words.size() < 64; ++i) {
    const char ch = static_cast<char>(data[i]);
    if (ch == '\0' || ch == '\n' || ch == '\t' || ch == ' ') {
      if (cur == "''") {
        words.emplace_back();  // an empty argument, as a shell passes ''
      } else if (!cur.empty()) {
        words.push_back(cur);
      }
      cur.clear();
    } else {
      cur.push_back(ch);
    }
  }
  if (words.size() < 64 && cur == "''") words.emplace_back();
  if (words.size() < 64 && !cur.empty() && cur != "''") words.push_back(cur);
  return words;
}

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "fuzz_cli_flags: %s\n", what.c_str());
  std::abort();
}

// The last value given to `name`, when it was given and its word round-trips.
template <typename T>
void expect_exact(CLI::App& app, const std::string& name, T value) {
  CLI::Option* opt = app.get_option_no_throw(name);
  if (opt == nullptr || opt->count() == 0) return;
  const std::string given = opt->results().back();
  const std::string printed = std::to_string(value);
  if (given != printed && !(given == "-0" && printed == "0")) broken(name + " " + given + " became " + printed);
}

void check(CLI::App& root, const Values& v) {
  CLI::App* bench = root.get_subcommand("bench");
  for (CLI::App* leaf : {root.get_subcommand("work"), bench->get_subcommand("att"), bench->get_subcommand("tiny")}) {
    if (!leaf->parsed()) continue;
    expect_exact(*leaf, "--ranks", v.ranks);
    expect_exact(*leaf, "--seed", v.seed);
    expect_exact(*leaf, "--heads", v.heads);
    expect_exact(*leaf, "--repeats", v.repeats);
    expect_exact(*leaf, "--len", v.len);
    expect_exact(*leaf, "--small", v.small);
    expect_exact(*leaf, "--count", v.count);
    CLI::Option* name = leaf->get_option_no_throw("--name");
    if (name != nullptr && name->count() > 0 && v.name.empty()) broken("--name took an empty value");
    CLI::Option* dims = leaf->get_option_no_throw("--dims");
    if (dims != nullptr && dims->count() > 0) {
      const std::vector<std::string>& r = dims->results();
      if (r.size() != v.dims.size()) broken("--dims count");
      for (size_t i = 0; i < r.size(); ++i) {
        if (r[i] != std::to_string(v.dims[i])) broken("--dims " + r[i] + " became " + std::to_string(v.dims[i]));
      }
    }
  }
  if (!std::isfinite(v.prob) || !std::isfinite(v.secs) || !std::isfinite(v.scale)) broken("a float is not finite");
  if (v.secs < 0) broken("--secs negative");
  if (!(v.timeout > 0 && v.timeout <= 1e6)) broken("--mpi-timeout outside (0, 1e6]");
  if (v.heads <= 0) broken("--heads not positive");
  if (v.repeats < 1 || v.repeats > 1000) broken("--repeats out of its range");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> words = split(data, size);
  words.insert(words.begin(), "distca");
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  argv.push_back(nullptr);
  const int argc = static_cast<int>(words.size());

  Values v;
  std::unique_ptr<distca::cli::CliApp> cli = distca::cli::build_cli(commands(v));
  if (!distca::cli::find_unknown_command(cli->app, argc, argv.data()).empty()) return 0;
  try {
    distca::cli::parse_strict(cli->app, argc, argv.data());
  } catch (const CLI::ParseError&) {
    return 0;  // refused (or --help / --version): the CLI prints one line
  }
  if (!cli->max_memory.empty() && !distca::parse_byte_size(cli->max_memory).ok()) broken("--max-memory let through");
  check(cli->app, v);
  return 0;
}
