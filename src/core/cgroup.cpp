// The process's CPU cgroup (core/cgroup.h).
#include "distca/core/cgroup.h"

#include <fstream>
#include <sstream>
#include <vector>

namespace distca {
namespace {

// The `sep`-separated fields of every line of `text`.
std::vector<std::vector<std::string>> fields_of(const std::string& text, char sep) {
  std::vector<std::vector<std::string>> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f;
    std::istringstream ls(line);
    for (std::string x; std::getline(ls, x, sep);) f.push_back(x);
    out.push_back(std::move(f));
  }
  return out;
}

// `word` is one of the comma-separated items of `list` (a mount's options, a line's controllers).
bool has_item(const std::string& list, const std::string& word) {
  return ("," + list + ",").find("," + word + ",") != std::string::npos;
}

}  // namespace

std::optional<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

CpuCgroupPaths cpu_cgroup_paths(const ReadText& read_given) {
  const ReadText read = read_given ? read_given : ReadText(read_text_file);
  CpuCgroupPaths p;
  const std::optional<std::string> cgroup = read("/proc/self/cgroup"), mounts = read("/proc/mounts");
  if (!cgroup || !mounts) return p;
  for (const auto& m : fields_of(*mounts, ' ')) {
    if (m.size() < 4) continue;
    if (m[2] == "cgroup2" && p.v2_mount.empty()) p.v2_mount = m[1];
    if (m[2] == "cgroup" && has_item(m[3], "cpu") && p.v1_mount.empty()) p.v1_mount = m[1];
  }
  // "ID:CONTROLLERS:PATH"; the path may itself hold ':'.
  std::istringstream lines(*cgroup);
  for (std::string line; std::getline(lines, line);) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) p.v2_path = path;
    if (has_item(controllers, "cpu")) p.v1_path = path;
  }
  return p;
}

}  // namespace distca
