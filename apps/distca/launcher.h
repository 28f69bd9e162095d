// The MPI launcher's environment (mpirun, mpiexec), read without initialising MPI: who started
// this process and how many siblings it has. The commands that can run under mpirun (train,
// bench train) decide from it, before any work, whether a flag combination makes sense (an
// mpirun that starts distca without --backend mpi would run that many independent jobs).
#pragma once

#include <cstdint>
#include <string>

#include "distca/comm/launch.h"

namespace distca::cli {

struct Launcher {
  bool present = false;  // some launcher variable is set
  int64_t size = -1;     // processes it started (-1: not said)
  int64_t rank = -1;     // this process's rank (-1: not said)
};
Launcher detect_launcher();

// A non-negative decimal integer from the environment; -1 when unset, empty or malformed.
int64_t env_int(const char* name);

// The rank processes mpirun put on this machine (Open MPI's local size); `ranks` when the
// launcher does not say.
int64_t mpi_local_ranks(int64_t ranks);

// `name` as execvp would find it, as an absolute path: itself when it has a slash and is an
// executable regular file (a directory is not), else the first executable regular file of
// that name in PATH (an empty entry is the current directory); "" when there is none. The
// programs the CLI starts (mpirun, gnuplot).
std::string find_executable(const std::string& name);

// The exit code of a command whose comm::launch failed: the process that speaks prints
// "distca: error: ..." (fail); every process exits with fail's code (main.cpp defines it).
int launch_failed(const comm::Launched& launched);

}  // namespace distca::cli
