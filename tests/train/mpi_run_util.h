// Helpers of the tests that run `distca train` under mpirun and compare its JSONL metrics:
// a scratch path per test program, a shell command whose output goes to that program's
// log.txt, and the per-step losses of a metrics file.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace distca::train::testing {

// temp_directory_path()/<prefix><name>.
inline std::filesystem::path scratch(const std::string& prefix, const std::string& name) {
  return std::filesystem::temp_directory_path() / (prefix + name);
}

// Runs `cmd` with stdout and stderr in `log`; the exit status.
inline int run_logged(const std::string& cmd, const std::filesystem::path& log) {
  const int st = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
  return WEXITSTATUS(st);
}

// The "loss" of every line of a JSONL metrics file.
inline std::vector<double> metric_losses(const std::filesystem::path& path) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

}  // namespace distca::train::testing
