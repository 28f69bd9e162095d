// The MPI launcher's environment (launcher.h).
#include "launcher.h"

#include <cstdlib>

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
