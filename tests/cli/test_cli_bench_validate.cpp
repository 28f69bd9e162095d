// `distca bench simulate --validate --replay DIR` on the run recorded in tests/sim/data/validate
// (hw-N.json profiles and bench train's <config>.json files): the table's numbers against the
// recorded measurements and against a prediction computed here by hand; and every refusal of
// --validate (exit 2, one line, no output file). Numbers only, never clocks: the replay runs
// nothing.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cli_fixture.h"

namespace distca::testing {
namespace {

const std::string kData = std::string(DISTCA_SOURCE_DIR) + "/tests/sim/data/validate";

class CliBenchValidateTest : public CliFixture {
 protected:
  CliBenchValidateTest() : CliFixture("cli_bench_validate", "bench simulate --validate") {}

  nlohmann::json replay_json() const {
    const std::string out = (dir_ / "table.json").string();
    const CliRun r = run("--replay " + kData + " --json " + out, 120);
    EXPECT_EQ(r.code, 0) << r.err << r.out;
    return nlohmann::json::parse(slurp(out));
  }
};

nlohmann::json load(const std::string& path) { return nlohmann::json::parse(slurp(path)); }

double mean(const nlohmann::json& a) {
  double s = 0;
  for (const nlohmann::json& x : a) s += x.get<double>();
  return a.empty() ? 0 : s / static_cast<double>(a.size());
}

// The recorded files the replay reads: every configuration's JSON, by name.
std::map<std::string, nlohmann::json> recorded_runs() {
  std::map<std::string, nlohmann::json> out;
  for (const auto& e : fs::directory_iterator(kData)) {
    const std::string f = e.path().filename().string();
    if (f.rfind("hw-", 0) != 0 && e.path().extension() == ".json") out[e.path().stem().string()] = load(e.path().string());
  }
  return out;
}

// Every row's measured figures are the recorded run's (median step, mean of the per-rank idle
// and exposed communication, per-stage idle), the ratio is predicted / measured, and the goal
// columns follow from the numbers.
TEST_F(CliBenchValidateTest, ReplayRowsAreTheRecordedMeasurementsAndTheirRatios) {
  const nlohmann::json t = replay_json();
  const auto runs = recorded_runs();
  ASSERT_FALSE(runs.empty());
  size_t expected_rows = 0;
  for (const auto& [name, j] : runs) expected_rows += j.at("modes").size();
  ASSERT_EQ(t.at("rows").size(), expected_rows);
  int step_ok = 0, idle_ok = 0;
  for (const nlohmann::json& r : t["rows"]) {
    const std::string config = r.at("config");
    ASSERT_TRUE(runs.count(config)) << config;
    const nlohmann::json& run = runs.at(config);
    const auto mode = std::find_if(run["modes"].begin(), run["modes"].end(),
                                   [&](const nlohmann::json& m) { return m.at("name") == r.at("mode"); });
    ASSERT_NE(mode, run["modes"].end()) << config << " " << r.at("mode");
    EXPECT_EQ(r.at("np").get<int64_t>(), run.at("ranks").get<int64_t>());
    EXPECT_EQ(r.at("workload"), run.at("bench_flags").at("workload"));
    const double meas = r.at("measured_s"), pred = r.at("predicted_s");
    EXPECT_DOUBLE_EQ(meas, mode->at("median_s").get<double>()) << config;
    ASSERT_GT(pred, 0) << config;
    EXPECT_DOUBLE_EQ(r.at("ratio").get<double>(), pred / meas) << config;
    EXPECT_NEAR(r.at("idle_measured").get<double>(), mean(mode->at("rank_idle")), 1e-12) << config;
    EXPECT_NEAR(r.at("exposed_measured").get<double>(), mean(mode->at("rank_exposed")), 1e-12) << config;
    const double idle_gap = std::abs(r.at("idle_predicted").get<double>() - r.at("idle_measured").get<double>());
    bool idle = idle_gap <= 0.05;
    if (r.at("pp").get<int64_t>() > 1) {
      ASSERT_EQ(r.at("stage_idle_measured"), mode->at("stage_idle")) << config;
      ASSERT_EQ(r.at("stage_idle_predicted").size(), r.at("stage_idle_measured").size()) << config;
      for (size_t s = 0; s < r["stage_idle_measured"].size(); ++s) {
        idle = idle && std::abs(r["stage_idle_predicted"][s].get<double>() - r["stage_idle_measured"][s].get<double>()) <= 0.05;
      }
    }
    EXPECT_EQ(r.at("step_ok").get<bool>(), std::abs(pred / meas - 1.0) <= 0.15) << config;
    EXPECT_EQ(r.at("idle_ok").get<bool>(), idle) << config;
    step_ok += r["step_ok"].get<bool>() ? 1 : 0;
    idle_ok += r["idle_ok"].get<bool>() ? 1 : 0;
  }
  EXPECT_EQ(t.at("step_ok").get<int>(), step_ok);
  EXPECT_EQ(t.at("idle_ok").get<int>(), idle_ok);
}

// One rank, colocated, skewed (one document of T tokens): the step is every linear product's
// seconds per token (the profile's seconds_alone over its rows: one unit runs alone) times T,
// for each layer and the LM head, plus each layer's forward + backward attention at the grid
// point (T, T), plus the element-wise work per token of every layer and of the loss, plus the
// optimizer step over every parameter (per layer h (q + 2 kv) + q h + 3 h ffn + 2 h, the
// embedding and the LM head v h each, the final norm h); nothing is exchanged, so the
// prediction has no idle and no exposed time.
TEST_F(CliBenchValidateTest, OneRankColocatedStepIsTheProfilesGemmsAndAttentionByHand) {
  const nlohmann::json hw = load(kData + "/hw-1.json");
  const nlohmann::json run = load(kData + "/dp1-skewed.json");
  const auto T = run.at("bench_flags").at("tokens_per_rank").get<int64_t>();
  const auto L = run["bench_flags"].at("layers").get<int64_t>();
  ASSERT_EQ(run["bench_flags"].at("long_doc").get<int64_t>(), T);  // one document per rank
  ASSERT_EQ(hw.at("model").at("hidden"), run.at("model").at("hidden"));
  const auto rows = hw["model"].at("tokens").get<double>();
  double layer_per_token = 0, head_per_token = 0;
  ASSERT_EQ(hw.at("gemm").size(), 24u);
  for (const nlohmann::json& g : hw["gemm"]) {
    // Every product's FLOPs per row are 2 in out; its rate 2 m n k / s; so s / rows per token.
    (g.at("layer") == "lm_head" ? head_per_token : layer_per_token) += g.at("seconds_alone").get<double>() / rows;
  }
  const nlohmann::json& a = hw.at("attention");
  ASSERT_EQ(a.at("n_heads"), run["model"].at("n_heads"));  // the table's heads are the model's
  const auto qi = std::find(a.at("q_lens").begin(), a["q_lens"].end(), T) - a["q_lens"].begin();
  const auto ki = std::find(a.at("kv_lens").begin(), a["kv_lens"].end(), T) - a["kv_lens"].begin();
  ASSERT_LT(static_cast<size_t>(qi), a["q_lens"].size());
  ASSERT_LT(static_cast<size_t>(ki), a["kv_lens"].size());
  // cost/profiled.h's rule: the grid point's forward + backward seconds, unless every corner of
  // the cell ending there (a corner with q > kv taking its column's diagonal) runs at >= 0.9 of
  // the grid's peak throughput: then the peak's (throughput = causal pairs / seconds; the
  // FLOPs per pair cancel).
  ASSERT_GT(qi, 0);
  ASSERT_EQ(qi, ki);  // (T, T) on the diagonal
  auto total = [&](size_t i, size_t j) {
    return a["forward_seconds"][i][j].get<double>() + a["backward_seconds"][i][j].get<double>();
  };
  auto pairs = [](double q, double kv) { return 0.5 * q * (2 * kv - q + 1); };
  auto tput = [&](size_t i, size_t j) {
    const double q = a["q_lens"][i].get<double>(), kv = a["kv_lens"][j].get<double>();
    return pairs(q, kv) / total(i, j);
  };
  double peak = 0;
  for (size_t i = 0; i < a["q_lens"].size(); ++i) {
    for (size_t j = 0; j < a["kv_lens"].size(); ++j) {
      if (a["q_lens"][i].get<double>() <= a["kv_lens"][j].get<double>()) peak = std::max(peak, tput(i, j));
    }
  }
  const auto i1 = static_cast<size_t>(qi), i0 = i1 - 1;
  const double corners[] = {tput(i0, i0), tput(i0, i1), tput(i0, i0), tput(i1, i1)};  // (T, T/2) -> its diagonal
  const bool saturated = std::all_of(std::begin(corners), std::end(corners), [&](double t) { return t >= 0.9 * peak; });
  const double attention = saturated ? pairs(static_cast<double>(T), static_cast<double>(T)) / peak : total(i1, i1);
  const nlohmann::json& e = hw.at("elementwise");
  auto alone = [&](const char* key) { return e.at(key).at("alone").get<double>(); };
  const nlohmann::json& m = run.at("model");
  const auto h = m.at("hidden").get<double>(), ffn = m.at("ffn").get<double>(), v = m.at("vocab").get<double>();
  const double q = m.at("n_heads").get<double>() * m.at("head_dim").get<double>();
  const double kv = m.at("n_kv_heads").get<double>() * m.at("head_dim").get<double>();
  const double params = static_cast<double>(L) * (h * (q + 2 * kv) + q * h + 3 * h * ffn + 2 * h) + 2 * v * h + h;
  layer_per_token += alone("layer_forward_seconds_per_token") + alone("layer_backward_seconds_per_token");
  head_per_token += alone("loss_forward_seconds_per_token") + alone("loss_backward_seconds_per_token");
  const double step = static_cast<double>(T) * (static_cast<double>(L) * layer_per_token + head_per_token) +
                      static_cast<double>(L) * attention + params * alone("optimizer_seconds_per_param");

  const nlohmann::json t = replay_json();
  bool found = false;
  for (const nlohmann::json& r : t.at("rows")) {
    if (r.at("config") != "dp1-skewed" || r.at("mode") != "colocated") continue;
    found = true;
    EXPECT_NEAR(r.at("predicted_s").get<double>(), step, 1e-9 * step);
    EXPECT_NEAR(r.at("idle_predicted").get<double>(), 0.0, 1e-9);
    EXPECT_NEAR(r.at("exposed_predicted").get<double>(), 0.0, 1e-12);
    // Rank 0's split: the attention layers, and the rest of the step as linear work.
    EXPECT_NEAR(r.at("attention_predicted").get<double>(), static_cast<double>(L) * attention, 1e-9 * step);
    EXPECT_NEAR(r.at("linear_predicted").get<double>(), step - static_cast<double>(L) * attention, 1e-9 * step);
    EXPECT_GT(r.at("linear_measured").get<double>(), 0.0);
    EXPECT_GT(r.at("attention_measured").get<double>(), 0.0);
  }
  EXPECT_TRUE(found) << "no dp1-skewed colocated row";
}

// The model's accuracy on the recorded run (a quiet machine, 2026-12-01): where every rank has
// a core of its own (np <= machine.cores) every row meets both goals, step within 15% and
// idle within 5 points; with more ranks than cores the step stays within 0.80-1.20 (processor
// sharing; the idle there depends on the OS scheduler's time slices, docs/benchmarks.md).
// A model change that loses accuracy on measured runs fails here.
TEST_F(CliBenchValidateTest, RecordedQuietRunMeetsTheGoalsWhereEveryRankHasACore) {
  const nlohmann::json t = replay_json();
  int own_core_rows = 0;
  for (const nlohmann::json& r : t.at("rows")) {
    const auto np = r.at("np").get<int64_t>();
    const nlohmann::json hw = load(kData + "/hw-" + std::to_string(np) + ".json");
    const std::string what = r.at("config").get<std::string>() + " " + r.at("mode").get<std::string>();
    const double ratio = r.at("ratio").get<double>();
    if (np <= hw.at("machine").at("cores").get<int64_t>()) {
      ++own_core_rows;
      EXPECT_TRUE(r.at("step_ok").get<bool>()) << what << ": ratio " << ratio;
      EXPECT_TRUE(r.at("idle_ok").get<bool>()) << what;
    } else {
      EXPECT_GE(ratio, 0.80) << what;
      EXPECT_LE(ratio, 1.20) << what;
    }
  }
  EXPECT_GE(own_core_rows, 18);  // dp1, dp2 (both workloads), pp2x1 (both)
}

// The printed table: a header, one line per row with its config and mode, the goal footer.
TEST_F(CliBenchValidateTest, ReplayPrintsTheTable) {
  const CliRun r = run("--replay " + kData, 120);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* text : {"config", "pred s", "idle m", "dp1-skewed", "colocated", "cad pingpong", "goal: predicted step within 15%"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text << "\n" << r.out;
  }
  EXPECT_TRUE(r.err.empty()) << r.err;
}

// A copy of the recorded directory in the test's own directory, for the broken variants.
fs::path copy_data(const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(kData)) fs::copy_file(e.path(), to / e.path().filename());
  return to;
}

// Launches: dp2-skewed.launch2.json and .launch3.json beside the recorded run, every mode's
// step scaled (launch 2: x1.1, launch 3: x0.5) and its per-rank idle set apart (0.21, 0.31).
// Per mode the row is the launch with the median step, launch 1 (the recorded one), with its
// own idle; min and max are launch 3's and launch 2's steps. With launch 3 at x2 instead, the
// median is launch 2: its step and its idle. Other configurations keep one launch. A launch
// that ran other modes is refused; --launches is refused with --replay and outside 1..25.
TEST_F(CliBenchValidateTest, ReplayOfSeveralLaunchesTakesTheMedianLaunchPerMode) {
  const fs::path d = copy_data(dir_ / "launches");
  const nlohmann::json first = load((d / "dp2-skewed.json").string());
  auto write_launch = [&](int k, double scale, double idle) {
    nlohmann::json j = first;
    for (nlohmann::json& m : j["modes"]) {
      m["median_s"] = m["median_s"].get<double>() * scale;
      for (nlohmann::json& x : m["rank_idle"]) x = idle;
    }
    std::ofstream(d / ("dp2-skewed.launch" + std::to_string(k) + ".json")) << j.dump();
  };
  auto rows_of = [&](const std::string& config) {
    const std::string out = (dir_ / "launches.json").string();
    const CliRun r = run("--replay " + d.string() + " --json " + out, 120);
    EXPECT_EQ(r.code, 0) << r.err;
    const nlohmann::json table = load(out);
    std::vector<nlohmann::json> rows;
    for (const nlohmann::json& row : table.at("rows")) {
      if (row.at("config") == config) rows.push_back(row);
    }
    return rows;
  };
  write_launch(2, 1.1, 0.21);
  write_launch(3, 0.5, 0.31);
  std::vector<nlohmann::json> rows = rows_of("dp2-skewed");
  ASSERT_EQ(rows.size(), first.at("modes").size());
  for (size_t m = 0; m < rows.size(); ++m) {
    const nlohmann::json& mode = first["modes"][m];
    const double step = mode.at("median_s");
    EXPECT_EQ(rows[m].at("launches"), 3);
    EXPECT_DOUBLE_EQ(rows[m].at("measured_s").get<double>(), step);
    EXPECT_NEAR(rows[m].at("idle_measured").get<double>(), mean(mode.at("rank_idle")), 1e-12);
    EXPECT_DOUBLE_EQ(rows[m].at("measured_min_s").get<double>(), step * 0.5);
    EXPECT_DOUBLE_EQ(rows[m].at("measured_max_s").get<double>(), step * 1.1);
  }
  for (const nlohmann::json& row : rows_of("dp1-skewed")) EXPECT_EQ(row.at("launches"), 1);
  write_launch(3, 2.0, 0.31);
  rows = rows_of("dp2-skewed");
  for (size_t m = 0; m < rows.size(); ++m) {
    const double step = first["modes"][m].at("median_s");
    EXPECT_DOUBLE_EQ(rows[m].at("measured_s").get<double>(), step * 1.1);
    EXPECT_NEAR(rows[m].at("idle_measured").get<double>(), 0.21, 1e-12);
    EXPECT_DOUBLE_EQ(rows[m].at("ratio").get<double>(), rows[m].at("predicted_s").get<double>() / (step * 1.1));
  }
  nlohmann::json other = first;
  other["modes"][0]["name"] = "another mode";
  std::ofstream(d / "dp2-skewed.launch2.json") << other.dump();
  expect_refused("--replay " + d.string(), "ran different modes");
  expect_refused("--replay " + kData + " --launches 3", "--launches");
  expect_refused("--quick --launches 0", "--launches");
  expect_refused("--quick --launches 26", "--launches");
}

TEST_F(CliBenchValidateTest, RefusalsComeBeforeAnyWork) {
  // Flags: speed-benchmark flags with --validate, --validate's flags without it, bad values.
  expect_refused("--gpus 8", "--validate");
  expect_refused("--quick --ranks 0", "--ranks");
  expect_refused("--quick --ranks 1,x", "--ranks");
  expect_refused("--quick --ranks 5", "--ranks");          // no configuration on 5 processes
  expect_refused("--quick --timeout 0", "--timeout");
  expect_refused("--quick --mpirun " + (dir_ / "no-mpirun").string(), "--mpirun");
  expect_refused("--replay " + kData + " --quick", "--replay");
  // --out a file; --out under a missing directory.
  const fs::path file = dir_ / "a-file";
  std::ofstream(file) << "x";
  expect_refused("--quick --out " + file.string(), "--out");
  expect_refused("--quick --out " + (dir_ / "missing" / "deeper").string(), "--out");
  // --replay: not a directory, no configuration file, a missing profile, a foreign JSON, a
  // profile of another rank count.
  expect_refused("--replay " + file.string(), "--replay");
  const fs::path empty = dir_ / "empty";
  fs::create_directories(empty);
  expect_refused("--replay " + empty.string(), "no configuration file");
  const fs::path no_hw = copy_data(dir_ / "no_hw");
  fs::remove(no_hw / "hw-1.json");
  expect_refused("--replay " + no_hw.string(), "hw-1.json missing");
  const fs::path foreign = copy_data(dir_ / "foreign");
  std::ofstream(foreign / "dp1-skewed.json") << R"({"format": "something-else", "modes": []})";
  expect_refused("--replay " + foreign.string(), "not a distca bench train JSON");
  const fs::path not_json = copy_data(dir_ / "not_json");
  std::ofstream(not_json / "dp1-skewed.json") << "{ half";
  expect_refused("--replay " + not_json.string(), "is not valid JSON");
  // bench train's JSON without one of the flags a prediction needs.
  const fs::path no_width = copy_data(dir_ / "no_width");
  nlohmann::json j = load((no_width / "dp2-skewed.json").string());
  j["bench_flags"].erase("width");
  std::ofstream(no_width / "dp2-skewed.json") << j.dump();
  expect_refused("--replay " + no_width.string(), "bench_flags.width");
  const fs::path swapped = copy_data(dir_ / "swapped");
  fs::copy_file(swapped / "hw-2.json", swapped / "hw-1.json", fs::copy_options::overwrite_existing);
  expect_refused("--replay " + swapped.string(), "ranks");
}

// A flag given with an empty value is refused, never read as "not given" (an empty --ranks
// would start the whole matrix); --mpirun naming a directory and an --out that cannot be made
// are refused with exit 2 before anything is made or started.
TEST_F(CliBenchValidateTest, EmptyValuesAndUnusablePathsAreRefusedBeforeAnyWork) {
  // Each case also carries a flag that a build without the empty check refuses before it
  // starts anything, so that such a build fails here instead of running the matrix.
  const std::string no_mpirun = " --mpirun " + (dir_ / "no-mpirun").string();
  expect_refused("--quick --ranks ''" + no_mpirun, "--ranks: expected a value, got an empty one");
  expect_refused("--quick --out ''" + no_mpirun, "--out: expected a value, got an empty one");
  expect_refused("--quick --mpirun '' --ranks 0", "--mpirun: expected a value, got an empty one");
  expect_refused("--replay ''" + no_mpirun, "--replay: expected a value, got an empty one");
  expect_refused("--replay " + kData + " --timeout 5", "--timeout");
  const fs::path out = dir_ / "out";
  expect_refused("--quick --out " + out.string() + " --mpirun " + dir_.string(), "--mpirun");
  EXPECT_FALSE(fs::exists(out)) << "--out made before the --mpirun check";
  // A path whose parent is a directory but which cannot be made (/proc takes no new entries).
  expect_refused("--quick --out /proc/distca-validate-test --mpirun /bin/true", "--out");
}

// True while process `pid` exists and is not a zombie (an orphan's zombie may wait for a
// reaper that never comes in a container).
bool alive(pid_t pid) {
  const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

std::vector<fs::path> tmp_files(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".tmp") out.push_back(e.path());
  }
  return out;
}

// SIGKILL to bench simulate --validate while a child runs: the child's "mpirun" (a script) and
// its "rank" (in a process group of its own, as Open MPI starts ranks, and deaf to SIGTERM)
// end with it, and the unfinished log is removed.
TEST_F(CliBenchValidateTest, ParentKilledTakesItsMpirunRanksAndTempLogWithIt) {
  const fs::path script = dir_ / "fake-mpirun", pid_file = dir_ / "rank.pid", out = dir_ / "run";
  std::ofstream(script) << "#!/bin/bash\nset -m\n(trap '' TERM; exec sleep 300) &\necho $! > " << pid_file.string()
                        << ".part && mv " << pid_file.string() << ".part " << pid_file.string() << "\nwait\n";
  fs::permissions(script, fs::perms::owner_all);
  const pid_t parent = fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    const std::string log = (dir_ / "parent.log").string();
    if (freopen(log.c_str(), "w", stdout) == nullptr || freopen(log.c_str(), "a", stderr) == nullptr) _exit(126);
    execl(DISTCA_CLI, DISTCA_CLI, "bench", "simulate", "--validate", "--quick", "--ranks", "1", "--out", out.c_str(),
          "--mpirun", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(pid_file) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(parent, SIGKILL);
  waitpid(parent, nullptr, 0);
  ASSERT_TRUE(fs::exists(pid_file)) << slurp(dir_ / "parent.log");
  const pid_t rank = static_cast<pid_t>(std::stol(slurp(pid_file)));
  ASSERT_GT(rank, 1);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((alive(rank) || !tmp_files(out).empty()) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const bool rank_alive = alive(rank);
  if (rank_alive) kill(rank, SIGKILL);  // leave nothing behind, whatever the outcome
  EXPECT_FALSE(rank_alive) << "the rank outlived its killed parent";
  EXPECT_TRUE(tmp_files(out).empty()) << tmp_files(out).front();
}

// Without --validate its flags are refused too (the speed benchmark runs nothing with them).
class CliBenchSimulateTest : public CliFixture {
 protected:
  CliBenchSimulateTest() : CliFixture("cli_bench_simulate", "bench simulate") {}
};
TEST_F(CliBenchSimulateTest, ValidateFlagsNeedValidate) {
  expect_refused("--replay " + kData, "--replay");
  expect_refused("--quick", "--quick");
  expect_refused("--ranks 1", "--ranks");
  expect_refused("--launches 2", "--launches");
}

}  // namespace
}  // namespace distca::testing
