// The hardware profile under CPU caps (docs/netlab.md, "Emulating devices with CPU caps"):
// every timed measurement spans many CFS periods, so a capped rank's figure is its share, not
// a short call's full-speed burst (an injected clock that models a CFS quota); and the quota
// the profile records is read from the process's cgroup (a fake file system).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "distca/core/clock.h"
#include "distca/kernels/profiler.h"
#include "distca/train/profile.h"

namespace distca::train {
namespace {

// One core under a CFS quota of kQuota per kPeriod (rank-cap.sh --cpus 0.5, its default
// period), in integer nanoseconds: `run` spends CPU time, held back whenever the period's quota
// is spent; `idle` lets wall time pass (a rank asleep in a barrier).
struct CappedCore {
  static constexpr int64_t kPeriod = 2'000'000, kQuota = 1'000'000;
  int64_t wall = 0, period = -1, used = 0;
  void run(int64_t cpu) {
    while (cpu > 0) {
      const int64_t k = wall / kPeriod;
      if (k != period) period = k, used = 0;
      if (used >= kQuota) {
        wall = (k + 1) * kPeriod;  // throttled until the next period
        continue;
      }
      const int64_t d = std::min({cpu, kQuota - used, (k + 1) * kPeriod - wall});
      wall += d, used += d, cpu -= d;
    }
  }
  void idle(int64_t ns) { wall += ns; }
  double seconds() const { return static_cast<double>(wall) * 1e-9; }
};

// A clock on a CappedCore: the first reading after a barrier marks the start of a timed
// measurement; every later reading ends one call of kCallCpu nanoseconds of CPU (a call far
// shorter than the quota, as the profile's small attention cells and element-wise runs are).
// The barrier waits kBarrierIdle asleep, so every measurement starts with the quota full.
struct CappedClock {
  static constexpr int64_t kCallCpu = 300'000, kBarrierIdle = 5'000'000;
  CappedCore core;
  bool fresh = true;
  double now() {
    if (!fresh) core.run(kCallCpu);
    fresh = false;
    return core.seconds();
  }
  Status barrier() {
    core.idle(kBarrierIdle);
    fresh = true;
    return {};
  }
};

// The share: half a core, so a call takes twice its CPU time.
constexpr double kShareSeconds = 2 * CappedClock::kCallCpu * 1e-9;

TEST(ProfileUnderCaps, AttentionFiguresAreTheCapsShareNotAShortCallsBurst) {
  kernels::AttentionProblem prob = kernels::make_problem({{16, 16}}, 1, 1, 64, 3);
  CappedClock cc;
  kernels::ProfileSync sync;
  sync.barrier = [&] { return cc.barrier(); };
  auto clock = [&] { return cc.now(); };
  // The profile's default: each pass timed over 20 ms of back-to-back calls.
  Result<kernels::KernelTiming> t =
      kernels::time_kernels_in_step(prob, 3, 0.0, sync, clock, kernels::kDefaultMinCallSeconds);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_NEAR(t->forward_seconds, kShareSeconds, 0.1 * kShareSeconds);
  EXPECT_NEAR(t->backward_seconds, kShareSeconds, 0.1 * kShareSeconds);
  // One call per timing (what the profile did before): each call fits the fresh quota and
  // reads the whole core's speed, half the share's seconds.
  t = kernels::time_kernels_in_step(prob, 3, 0.0, sync, clock, 0.0);
  ASSERT_TRUE(t.ok());
  EXPECT_NEAR(t->forward_seconds, kShareSeconds / 2, 1e-12);
}

TEST(ProfileUnderCaps, GemmFiguresAreTheCapsShare) {
  GemmRecord g{"wq", GemmPass::kForward, 8, 8, 8, 0, 0};
  CappedClock cc;
  auto clock = [&] { return cc.now(); };
  Result<double> s = kernels::time_profile_gemm(g, 5, [&] { return cc.barrier(); }, 1, kernels::kDefaultMinCallSeconds,
                                                clock);
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(*s, kShareSeconds, 0.1 * kShareSeconds);
  s = kernels::time_profile_gemm(g, 5, [&] { return cc.barrier(); }, 1, 0.0, clock);
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(*s, kShareSeconds / 2, 1e-12);
}

TEST(ProfileUnderCaps, TimeCallsRunsAtLeastOnceAndDividesByTheCalls) {
  double t = 10;
  int calls = 0;
  const CallTiming c = time_calls([&] { ++calls; }, 0.35, [&] { return t += 0.1; }, t);
  EXPECT_EQ(calls, 4);  // 0.1, 0.2, 0.3 < 0.35 <= 0.4
  EXPECT_EQ(c.calls, 4);
  EXPECT_NEAR(c.per_call, 0.1, 1e-12);
  EXPECT_NEAR(c.end, 10.4, 1e-12);
  calls = 0;
  EXPECT_EQ(time_calls([&] { ++calls; }, 0.0, [&] { return t += 0.1; }, t).calls, 1);
}

// A fake file system for cgroup_cpu_quota.
ReadText files(std::map<std::string, std::string> f) {
  return [f = std::move(f)](const std::string& path) -> std::optional<std::string> {
    const auto it = f.find(path);
    if (it == f.end()) return std::nullopt;
    return it->second;
  };
}

const char* const kMounts =
    "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n"
    "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
    "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";

TEST(CgroupCpuQuota, V1QuotaOverPeriodTheLeastAlongThePath) {
  // rank-cap.sh's v1 cgroup: 1000 us per 2000 us; its parent caps at 1.5 cores.
  const std::string g = "/sys/fs/cgroup/cpu/batch/distca-cap.1.0.42";
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota(files({{"/proc/self/cgroup", "4:memory:/x\n1:cpu:/batch/distca-cap.1.0.42\n0::/\n"},
                                           {"/proc/mounts", kMounts},
                                           {g + "/cpu.cfs_quota_us", "1000\n"},
                                           {g + "/cpu.cfs_period_us", "2000\n"},
                                           {"/sys/fs/cgroup/cpu/batch/cpu.cfs_quota_us", "150000\n"},
                                           {"/sys/fs/cgroup/cpu/batch/cpu.cfs_period_us", "100000\n"},
                                           {"/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n"},
                                           {"/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"}})),
                   0.5);
  // No quota anywhere (-1), or nothing readable: 0.
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota(files({{"/proc/self/cgroup", "1:cpu:/\n0::/\n"},
                                           {"/proc/mounts", kMounts},
                                           {"/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n"},
                                           {"/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"}})),
                   0.0);
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota(files({})), 0.0);
}

TEST(CgroupCpuQuota, V2CpuMax) {
  const std::string mounts = "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n";
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota(files({{"/proc/self/cgroup", "0::/distca-cap.1.2.7\n"},
                                           {"/proc/mounts", mounts},
                                           {"/sys/fs/cgroup/distca-cap.1.2.7/cpu.max", "1000 2000\n"}})),
                   0.5);
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota(files({{"/proc/self/cgroup", "0::/a\n"},
                                           {"/proc/mounts", mounts},
                                           {"/sys/fs/cgroup/a/cpu.max", "max 100000\n"}})),
                   0.0);
}

}  // namespace
}  // namespace distca::train
