// The mpi backend's wait policy and its optional record (wait.h).
#include "wait.h"

#include "distca/core/cgroup.h"
#include "distca/core/io.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

namespace distca::comm {

Result<WaitPolicy> wait_policy_from_env() {
  const char* v = std::getenv("DISTCA_WAIT");
  if (v == nullptr || *v == '\0') return kDefaultWaitPolicy;
  if (std::strcmp(v, "spin") == 0) return WaitPolicy::kSpin;
  if (std::strcmp(v, "sleep") == 0) return WaitPolicy::kSleep;
  return Status::invalid_argument("DISTCA_WAIT must be spin or sleep (got '" + std::string(v) + "')");
}

const char* wait_policy_name(WaitPolicy policy) { return policy == WaitPolicy::kSpin ? "spin" : "sleep"; }

namespace mpi_detail {
namespace {

// The first "KEY VALUE" pair of a cgroup cpu.stat text whose key is `key`, or nullopt.
std::optional<uint64_t> stat_value(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return std::nullopt;
}

// A file's text, empty where it cannot be read.
std::string text(const std::string& path) { return read_text_file(path).value_or(""); }

// The CPU cgroup of this process (v1 with the cpu controller, else v2): its cpu.stat, kept
// open, and its CFS quota per period in seconds (0: none).
struct Cgroup {
  std::string dir;
  bool v2 = false;
  int fd = -1;
  double quota_s = 0;

  Cgroup() {
    const CpuCgroupPaths g = cpu_cgroup_paths();
    const std::string v1 = g.v1_mount + g.v1_path;
    if (!g.v1_mount.empty() && !g.v1_path.empty() && stat_value(text(v1 + "/cpu.stat"), "nr_throttled")) {
      dir = v1;
      const auto quota = stat_value("q " + text(dir + "/cpu.cfs_quota_us"), "q");  // -1 (none) fails
      const auto period = stat_value("p " + text(dir + "/cpu.cfs_period_us"), "p");
      if (quota && period) quota_s = static_cast<double>(*quota) * 1e-6;
    } else if (!g.v2_mount.empty() && !g.v2_path.empty()) {
      dir = g.v2_mount + g.v2_path;
      v2 = true;
      const auto quota = stat_value("q " + text(dir + "/cpu.max"), "q");  // "max": none
      if (quota) quota_s = static_cast<double>(*quota) * 1e-6;
    }
    if (!dir.empty()) fd = ::open((dir + "/cpu.stat").c_str(), O_RDONLY | O_CLOEXEC);
  }

  // nr_throttled and the throttled time in ns; zeros where unreadable.
  std::pair<uint64_t, uint64_t> throttling() const {
    char buf[1024];
    const ssize_t n = fd < 0 ? -1 : ::pread(fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0) return {0, 0};
    const std::string text(buf, static_cast<std::size_t>(n));
    const uint64_t count = stat_value(text, "nr_throttled").value_or(0);
    if (v2) return {count, stat_value(text, "throttled_usec").value_or(0) * 1000};
    return {count, stat_value(text, "throttled_time").value_or(0)};
  }
};

// Never destroyed: write_wait_stats runs from MPI's environment at static destruction.
const Cgroup& cgroup() {
  static const Cgroup* c = new Cgroup;
  return *c;
}

// DISTCA_WAIT_STATS, read once.
const char* stats_dir() {
  static const char* dir = [] {
    const char* d = std::getenv("DISTCA_WAIT_STATS");
    return d != nullptr && *d != '\0' ? d : nullptr;
  }();
  return dir;
}

double now_s(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Totals {
  int64_t waits = 0, sleeps = 0;
  double wall_s = 0, cpu_s = 0;            // in waits: wall, and the waiting thread's CPU
  uint64_t throttles = 0, throttled_ns = 0;  // the cgroup's, during waits
  // A segment: from a wait's end to the same thread's next wait. "Short": it used less CPU
  // than one period's quota, so a rank that came out of its wait with its quota unspent
  // would not have been throttled in it.
  int64_t segments = 0, short_segments = 0, short_throttled = 0, segments_throttled = 0;
  double segment_wall_s = 0, segment_cpu_s = 0;
  uint64_t segment_throttled_ns = 0;
};

std::mutex g_mu;
Totals g_totals;
WaitPolicy g_policy = kDefaultWaitPolicy;  // the latest recorded wait's

// The previous recorded wait's end on this thread, for the segment after it.
struct LastEnd {
  bool valid = false;
  double wall_s = 0, cpu_s = 0;
  uint64_t throttles = 0, throttled_ns = 0;
};
thread_local LastEnd t_last;

}  // namespace

BlockingWait::BlockingWait(WaitPolicy policy) : policy_(policy), since_(std::chrono::steady_clock::now()) {
  if (stats_dir() == nullptr) return;
  recorded_ = true;
  start_wall_s_ = now_s(CLOCK_MONOTONIC);
  start_cpu_s_ = now_s(CLOCK_THREAD_CPUTIME_ID);
  std::tie(start_throttles_, start_throttled_ns_) = cgroup().throttling();
  if (!t_last.valid) return;
  std::lock_guard<std::mutex> lock(g_mu);
  Totals& t = g_totals;
  const double cpu = start_cpu_s_ - t_last.cpu_s;
  const bool throttled = start_throttles_ > t_last.throttles;
  ++t.segments;
  t.segment_wall_s += start_wall_s_ - t_last.wall_s;
  t.segment_cpu_s += cpu;
  t.segment_throttled_ns += start_throttled_ns_ - t_last.throttled_ns;
  t.segments_throttled += throttled;
  if (cgroup().quota_s > 0 && cpu < cgroup().quota_s) {
    ++t.short_segments;
    t.short_throttled += throttled;
  }
}

BlockingWait::~BlockingWait() {
  if (old_slack_ns_ >= 0) (void)prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(old_slack_ns_), 0, 0, 0);
  if (!recorded_) return;
  LastEnd end{true, now_s(CLOCK_MONOTONIC), now_s(CLOCK_THREAD_CPUTIME_ID), 0, 0};
  std::tie(end.throttles, end.throttled_ns) = cgroup().throttling();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Totals& t = g_totals;
    g_policy = policy_;
    ++t.waits;
    t.sleeps += sleeps_;
    t.wall_s += end.wall_s - start_wall_s_;
    t.cpu_s += end.cpu_s - start_cpu_s_;
    t.throttles += end.throttles - start_throttles_;
    t.throttled_ns += end.throttled_ns - start_throttled_ns_;
  }
  t_last = end;
}

void BlockingWait::idle() {
  using std::chrono::microseconds;
  const auto waited = std::chrono::steady_clock::now() - since_;
  if (policy_ == WaitPolicy::kSpin || waited < microseconds(kWaitSpinUs)) {
    std::this_thread::yield();  // the core may be a peer's or the rank's other thread's
    return;
  }
  if (old_slack_ns_ < 0) {
    old_slack_ns_ = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  }
  std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(waited / 8, microseconds(kWaitMaxSleepUs)));
  ++sleeps_;
}

Status write_wait_stats(int rank) {
  if (stats_dir() == nullptr) return Status::ok_status();
  Totals t;
  WaitPolicy policy;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    t = g_totals;
    policy = g_policy;
  }
  const Cgroup& c = cgroup();
  const std::string stat = c.fd < 0 ? "" : text(c.dir + "/cpu.stat");
  const auto [throttles, throttled_ns] = c.throttling();
  const std::string path = std::string(stats_dir()) + "/wait-stats." + std::to_string(rank) + ".json";
  std::vector<char> json(1024 + c.dir.size());  // the figures take under 1 KiB beside the cgroup path
  std::snprintf(json.data(), json.size(),
               "{\"rank\": %d, \"policy\": \"%s\", \"cgroup\": \"%s\", \"quota_s\": %.6f,\n"
               " \"waits\": %lld, \"sleeps\": %lld, \"wait_wall_s\": %.6f, \"wait_cpu_s\": %.6f,\n"
               " \"wait_throttles\": %llu, \"wait_throttled_s\": %.6f,\n"
               " \"segments\": %lld, \"segment_wall_s\": %.6f, \"segment_cpu_s\": %.6f,\n"
               " \"segments_throttled\": %lld, \"segment_throttled_s\": %.6f,\n"
               " \"short_segments\": %lld, \"short_segments_throttled\": %lld,\n"
               " \"cgroup_periods\": %llu, \"cgroup_throttles\": %llu, \"cgroup_throttled_s\": %.6f}\n",
               rank, wait_policy_name(policy), c.dir.c_str(), c.quota_s,
               static_cast<long long>(t.waits), static_cast<long long>(t.sleeps), t.wall_s, t.cpu_s,
               static_cast<unsigned long long>(t.throttles), 1e-9 * static_cast<double>(t.throttled_ns),
               static_cast<long long>(t.segments), t.segment_wall_s, t.segment_cpu_s,
               static_cast<long long>(t.segments_throttled), 1e-9 * static_cast<double>(t.segment_throttled_ns),
               static_cast<long long>(t.short_segments), static_cast<long long>(t.short_throttled),
               static_cast<unsigned long long>(stat_value(stat, "nr_periods").value_or(0)),
               static_cast<unsigned long long>(throttles), 1e-9 * static_cast<double>(throttled_ns));
  const Status st = write_file_atomic(path, json.data());
  return st.ok() ? st : Status::internal("DISTCA_WAIT_STATS: " + st.message());
}

}  // namespace mpi_detail
}  // namespace distca::comm
