// The MPI launcher's environment and the programs the CLI starts (launcher.h).
#include "launcher.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

namespace distca::cli {

int64_t env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return *end == '\0' && x >= 0 ? x : -1;
}

int64_t mpi_local_ranks(int64_t ranks) {
  const int64_t v = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
  return v >= 1 ? v : ranks;
}

std::string find_executable(const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (name.find('/') != std::string::npos) {
    return fs::is_regular_file(name, ec) && access(name.c_str(), X_OK) == 0 ? fs::absolute(name).string() : "";
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "";
  size_t pos = 0;
  while (pos <= dirs.size()) {
    const size_t colon = dirs.find(':', pos);
    const std::string d = dirs.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    const fs::path cand = fs::path(d.empty() ? "." : d) / name;
    if (fs::is_regular_file(cand, ec) && access(cand.c_str(), X_OK) == 0) return fs::absolute(cand).string();
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return "";
}

Launcher detect_launcher() {
  Launcher l;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"}) {
    if (std::getenv(name) != nullptr) l.present = true;
  }
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (l.size < 0) l.size = env_int(name);
  }
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (l.rank < 0) l.rank = env_int(name);
  }
  return l;
}

}  // namespace distca::cli
