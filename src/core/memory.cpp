#include "distca/core/memory.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace distca {
namespace {
std::atomic<uint64_t> g_limit_override{0};
}  // namespace

bool reset_peak_resident() {
  malloc_trim(0);
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

int64_t peak_resident_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;  // kB
  }
  return 0;
}

uint64_t available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "re");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long v = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &v) == 1) {
      kib = v;
      break;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

void set_memory_limit(uint64_t bytes) { g_limit_override.store(bytes); }

uint64_t memory_limit_bytes() {
  const uint64_t o = g_limit_override.load();
  return o != 0 ? o : available_memory_bytes();
}

namespace {
constexpr std::string_view kHugetlbTunable = "glibc.malloc.hugetlb";

// The value of `name` in a GLIBC_TUNABLES string, nullopt when it is not named.
std::optional<std::string> tunable_value(std::string_view tunables, std::string_view name) {
  while (!tunables.empty()) {
    const size_t end = std::min(tunables.find(':'), tunables.size());
    const std::string_view item = tunables.substr(0, end);
    const size_t eq = item.find('=');
    if (item.substr(0, eq) == name) return std::string(eq == std::string_view::npos ? "" : item.substr(eq + 1));
    tunables.remove_prefix(std::min(end + 1, tunables.size()));
  }
  return std::nullopt;
}
}  // namespace

std::optional<std::string> with_malloc_hugetlb(std::string_view tunables) {
  if (tunable_value(tunables, kHugetlbTunable)) return std::nullopt;
  std::string out(tunables);
  if (!out.empty() && out.back() != ':') out += ':';
  return out + std::string(kHugetlbTunable) + "=1";
}

std::string malloc_hugetlb_tunable() {
  const char* v = std::getenv("GLIBC_TUNABLES");
  return v == nullptr ? "" : tunable_value(v, kHugetlbTunable).value_or("");
}

bool transparent_huge_pages_available() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  if (!std::getline(f, modes)) return false;
  return modes.find("[always]") != std::string::npos || modes.find("[madvise]") != std::string::npos;
}

bool malloc_on_huge_pages() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
  return malloc_hugetlb_tunable() == "1" && transparent_huge_pages_available();
#else
  return false;
#endif
}

std::string format_bytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[u]);
  return buf;
}

Status check_memory(double need_bytes, const std::string& what) {
  const uint64_t limit = memory_limit_bytes();
  if (limit == 0) return {};
  if (!(need_bytes <= static_cast<double>(limit))) {
    const bool overridden = g_limit_override.load() != 0;
    return Status::out_of_memory(what + " needs about " + format_bytes(need_bytes) + ", more than the " +
                                 format_bytes(static_cast<double>(limit)) +
                                 (overridden ? " allowed by --max-memory" : " available (--max-memory overrides)"));
  }
  return {};
}

Result<uint64_t> parse_byte_size(const std::string& text) {
  const std::string bad = "--max-memory: expected a size such as 512M or 8G (got '" + text + "')";
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return Status::invalid_argument(bad);
  const std::string num = text.substr(0, i);
  if (num.find_first_of('.') != num.find_last_of('.') || num == ".") return Status::invalid_argument(bad);
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (!unit.empty() && unit != "B") {
    const char u = unit[0];
    const std::string rest = unit.substr(1);
    if (rest != "" && rest != "B" && rest != "IB") return Status::invalid_argument(bad);
    switch (u) {
      case 'K': mult = 1024.0; break;
      case 'M': mult = 1024.0 * 1024; break;
      case 'G': mult = 1024.0 * 1024 * 1024; break;
      case 'T': mult = 1024.0 * 1024 * 1024 * 1024; break;
      default: return Status::invalid_argument(bad);
    }
  }
  const double v = std::strtod(num.c_str(), nullptr) * mult;
  if (!std::isfinite(v) || v < 1 || v > 9.0e18) return Status::invalid_argument(bad);
  return static_cast<uint64_t>(v);
}

}  // namespace distca
