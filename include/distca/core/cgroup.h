// Where the calling process's CPU cgroup lives, for the readers of its quota and counters
// (train/profile.h cgroup_cpu_quota; the mpi backend's DISTCA_WAIT_STATS record, src/comm).
// Linux only; a reader that cannot read a file sees nothing there.
//
// Thread safety: pure functions of what `read` returns.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace distca {

// A file's whole text, or nullopt when it cannot be read. Injectable so tests give a fake
// file system.
using ReadText = std::function<std::optional<std::string>(const std::string& path)>;

// The file system's reader (std::ifstream): ReadText's default.
std::optional<std::string> read_text_file(const std::string& path);

// The process's CPU cgroup in both hierarchies, from /proc/mounts and /proc/self/cgroup: v2
// the first cgroup2 mount and the "0::PATH" line's path; v1 the first mount of the hierarchy
// that carries the cpu controller and the process's path in it. A field is empty where that
// hierarchy is absent or a file cannot be read. A group's directory is mount + path.
struct CpuCgroupPaths {
  std::string v2_mount, v2_path;
  std::string v1_mount, v1_path;
};
CpuCgroupPaths cpu_cgroup_paths(const ReadText& read = {});

}  // namespace distca
