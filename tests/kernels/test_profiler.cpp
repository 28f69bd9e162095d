// The attention profile's measurement discipline (kernels/profiler.h): the repetition count,
// the ranks measuring in step, the neighbours' fit and the guard that re-measures a cell off
// it, each against a hand computation or an injected clock/timer.
#include "distca/kernels/profiler.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace distca::kernels {
namespace {

TEST(ProfileRepetitions, AtLeastThreeUpToRepeatsAndMinSecondsBetween) {
  // A 75 ms cell under --min-seconds 0.05 (the compare scripts' profiles): the old rule timed
  // it once; three now, so one disturbed repetition is outvoted.
  EXPECT_EQ(profile_repetitions(0.075, 3, 0.05), 3);
  EXPECT_EQ(profile_repetitions(0.001, 3, 0.5), 3);          // capped by repeats
  EXPECT_EQ(profile_repetitions(0.1, 10, 0.5), 4);           // 0.1 warm + 4 x 0.1 = 0.5
  EXPECT_EQ(profile_repetitions(0.1, 10, 0.55), 5);          // ceil(4.5)
  EXPECT_EQ(profile_repetitions(20.0, 10, 0.5), 3);          // a long cell: the floor
  EXPECT_EQ(profile_repetitions(20.0, 1, 0.5), 1);           // --repeats 1 is obeyed
  EXPECT_EQ(profile_repetitions(0.0, 7, 0.5), 7);            // no warm-up reading: all of them
}

TEST(TimeKernelsInStep, BarrierBeforeEveryRepetitionCountAndFigureFromTheSlowestRank) {
  AttentionProblem prob = make_problem({{16, 16}}, 1, 1, 64, 3);
  double tick = 0;
  auto clock = [&] { return tick += 1.0; };  // every reading 1 s after the last
  int barriers = 0;
  std::vector<double> gathered;
  ProfileSync sync;
  sync.barrier = [&]() -> Status {
    ++barriers;
    return {};
  };
  // A second rank that reads three times this rank's figure.
  sync.all_gather = [&](double mine) -> Result<std::vector<double>> {
    gathered.push_back(mine);
    return std::vector<double>{mine, 3 * mine};
  };
  const Result<KernelTiming> t = time_kernels_in_step(prob, 5, 0.05, sync, clock);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // Warm-up 1 s here, 3 s on the other rank: profile_repetitions(3, 5, 0.05) = 3 repetitions,
  // each behind a barrier (plus the one before the warm-up).
  EXPECT_EQ(barriers, 1 + 3);
  ASSERT_EQ(gathered.size(), 3u);  // the warm-up, then the two passes' medians
  EXPECT_DOUBLE_EQ(gathered[0], 1.0);
  EXPECT_DOUBLE_EQ(t.value().forward_seconds, 3.0);  // the slowest of {1, 3}
  EXPECT_DOUBLE_EQ(t.value().backward_seconds, 3.0);
  EXPECT_GT(t.value().forward_flops, 0);
}

TEST(SlowestOverRanks, TheLargestOfTheRanksFiguresOrTheOwnAlone) {
  ProfileSync sync;
  EXPECT_DOUBLE_EQ(slowest_over_ranks(sync, 0.25).value(), 0.25);  // one process: no all-gather
  // Four ranks, one persistently slower: the median (1.05) would hide it, the step waits for it.
  sync.all_gather = [](double mine) -> Result<std::vector<double>> { return std::vector<double>{mine, 1.0, 1.3, 1.1}; };
  EXPECT_DOUBLE_EQ(slowest_over_ranks(sync, 0.9).value(), 1.3);
  EXPECT_DOUBLE_EQ(slowest_over_ranks(sync, 1.5).value(), 1.5);
  sync.all_gather = [](double) -> Result<std::vector<double>> { return Status::internal("peer gone"); };
  EXPECT_EQ(slowest_over_ranks(sync, 1.0).status().code(), StatusCode::kInternal);
}

TEST(TimeKernelsInStep, SyncErrorStopsTheCell) {
  AttentionProblem prob = make_problem({{16, 16}}, 1, 1, 64, 3);
  ProfileSync sync;
  sync.barrier = [] { return Status::internal("peer gone"); };
  const Result<KernelTiming> t = time_kernels_in_step(prob, 3, 0.0, sync);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("peer gone"), std::string::npos);
}

double pairs(double q, double kv) { return q * (kv - q) + q * (q + 1) / 2; }

TEST(NeighbourFit, MedianOfNeighboursScaledByWork) {
  CostTable t;
  t.q_lens = {128, 256};
  t.kv_lens = {128, 256};
  t.seconds = {{1.0, 3.0}, {0.0, 5.0}};  // (256, 128) is not measured (q > kv)
  const auto fit = neighbour_fit(t);
  // Work by hand: pairs + 64 per query row.
  const double w00 = pairs(128, 128) + 64 * 128, w01 = pairs(128, 256) + 64 * 128, w11 = pairs(256, 256) + 64 * 256;
  EXPECT_DOUBLE_EQ(guard_work(128, 256), w01);
  EXPECT_DOUBLE_EQ(fit[0][0], 0.5 * (3.0 * w00 / w01 + 5.0 * w00 / w11));
  EXPECT_DOUBLE_EQ(fit[0][1], 0.5 * (1.0 * w01 / w00 + 5.0 * w01 / w11));
  EXPECT_DOUBLE_EQ(fit[1][1], 0.5 * (1.0 * w11 / w00 + 3.0 * w11 / w01));
  EXPECT_EQ(fit[1][0], 0.0);
  CostTable one;
  one.q_lens = one.kv_lens = {128};
  one.seconds = {{1.0}};
  EXPECT_EQ(neighbour_fit(one)[0][0], 0.0);  // nothing to compare with
}

// A synthetic machine: a cell costs a per-pair and a per-row term (not guard_work's constant,
// so the fit is only approximately right, as on a real table), and the first measurement of
// `slow_cell`'s backward reads `factor` times that, `slow_times` times over.
struct InjectedTimer {
  std::pair<int64_t, int64_t> slow_cell{2048, 2048};
  double factor = 1.63;
  int slow_times = 1;
  std::map<std::pair<int64_t, int64_t>, int> calls;

  static double clean_forward(int64_t q, int64_t kv) { return 1e-8 * (pairs(q, kv) + 45.0 * q); }
  static double clean_backward(int64_t q, int64_t kv) { return 2.4e-8 * (pairs(q, kv) + 38.0 * q); }

  CellTimer timer() {
    return [this](int64_t q, int64_t kv) -> Result<KernelTiming> {
      const int n = calls[{q, kv}]++;
      KernelTiming t;
      t.forward_seconds = clean_forward(q, kv);
      t.backward_seconds = clean_backward(q, kv);
      if (std::make_pair(q, kv) == slow_cell && n < slow_times) t.backward_seconds *= factor;
      return t;
    };
  }
};

ProfileOptions grid_to_2048() {
  ProfileOptions opt;
  opt.n_heads = 4;
  opt.n_kv_heads = 2;
  opt.head_dim = 64;
  opt.q_lens = opt.kv_lens = power_of_two_lengths(128, 2048);
  return opt;
}

TEST(ProfileGuard, SlowMeasurementIsMeasuredAgainAndReplaced) {
  InjectedTimer inj;
  std::vector<std::string> log;
  const auto g = profile_attention_grid(grid_to_2048(), inj.timer(), {}, [&](const std::string& s) { log.push_back(s); });
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const size_t last = 4;
  EXPECT_DOUBLE_EQ(g.value().backward.seconds[last][last], InjectedTimer::clean_backward(2048, 2048));
  EXPECT_DOUBLE_EQ(g.value().forward.seconds[last][last], InjectedTimer::clean_forward(2048, 2048));
  // Only the disturbed cell was measured again, once.
  for (const auto& [cell, n] : inj.calls) EXPECT_EQ(n, cell == inj.slow_cell ? 2 : 1) << cell.first << " x " << cell.second;
  int again = 0;
  for (const std::string& s : log) {
    if (s.find("measured again") != std::string::npos) {
      ++again;
      EXPECT_NE(s.find("attention q_len 2048 kv_len 2048 backward: "), std::string::npos) << s;
      EXPECT_NE(s.find("x its neighbours' fit"), std::string::npos) << s;
    }
  }
  EXPECT_EQ(again, 1);
}

TEST(ProfileGuard, CleanTableIsLeftAlone) {
  InjectedTimer inj;
  inj.factor = 1.0;
  const auto g = profile_attention_grid(grid_to_2048(), inj.timer(), {});
  ASSERT_TRUE(g.ok());
  for (const auto& [cell, n] : inj.calls) EXPECT_EQ(n, 1);
}

TEST(ProfileGuard, WithoutTheGuardTheSlowCellStays) {
  InjectedTimer inj;
  ProfileOptions opt = grid_to_2048();
  opt.guard_rounds = 0;
  const auto g = profile_attention_grid(opt, inj.timer(), {});
  ASSERT_TRUE(g.ok());
  EXPECT_DOUBLE_EQ(g.value().backward.seconds[4][4], 1.63 * InjectedTimer::clean_backward(2048, 2048));
}

TEST(ProfileGuard, PersistentSlowCellKeptAfterTheRoundsAndSaidSo) {
  InjectedTimer inj;
  inj.slow_cell = {512, 1024};  // an inner cell, slow on every measurement
  inj.slow_times = 100;
  std::vector<std::string> log;
  const auto g = profile_attention_grid(grid_to_2048(), inj.timer(), {}, [&](const std::string& s) { log.push_back(s); });
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(inj.calls[inj.slow_cell], 1 + 2);  // two rounds
  EXPECT_DOUBLE_EQ(g.value().backward.seconds[2][3], 1.63 * InjectedTimer::clean_backward(512, 1024));
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log.back().find("attention q_len 512 kv_len 1024 backward: "), std::string::npos) << log.back();
  EXPECT_NE(log.back().find("after 2 re-measurements: kept"), std::string::npos) << log.back();
}

TEST(ProfileGuard, TimerErrorIsReturned) {
  const CellTimer failing = [](int64_t, int64_t) -> Result<KernelTiming> { return Status::internal("rank 1 lost"); };
  const auto g = profile_attention_grid(grid_to_2048(), failing, {});
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("rank 1 lost"), std::string::npos);
}

}  // namespace
}  // namespace distca::kernels
