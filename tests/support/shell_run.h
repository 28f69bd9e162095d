// Test support for tests that run `distca` (or mpirun) through the shell and read what it
// wrote: a temporary path, a command whose output goes to a log file, a JSONL column.
//
// Thread safety: plain functions; tests call them from their own thread.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace distca::testing {

// <temp dir>/<prefix><name>.
inline std::filesystem::path temp_path(const std::string& prefix, const std::string& name) {
  return std::filesystem::temp_directory_path() / (prefix + name);
}

// Runs `cmd` with stdout and stderr into `log`; the command's exit status.
inline int run_logged(const std::string& cmd, const std::filesystem::path& log) {
  const int st = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
  return WEXITSTATUS(st);
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The number under `key` of every line of a JSONL file (the metrics print doubles round-trip
// exact, so equal values mean equal bits).
inline std::vector<double> jsonl_column(const std::filesystem::path& path, const std::string& key) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)[key].get<double>());
  return out;
}

}  // namespace distca::testing
