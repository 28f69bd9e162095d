// `distca bench simulate --validate` (bench_validate.h): the matrix, the child runs and the
// comparison of every recorded run with the simulator's prediction.
#include "bench_validate.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <tuple>

#include "bench_train.h"
#include "child_session.h"
#include "distca/core/io.h"
#include "distca/cost/hardware_profile.h"

namespace distca::cli::validate {
namespace fs = std::filesystem;

std::string Config::name() const {
  if (tp > 1) return "tp" + std::to_string(tp) + "x" + std::to_string(np / tp) + "-" + workload;
  return (pp > 1 ? "pp" + std::to_string(pp) + "x" + std::to_string(np / pp) : "dp" + std::to_string(np)) + "-" + workload;
}

std::string launch_stem(const Config& c, int64_t k) { return k <= 1 ? c.name() : c.name() + ".launch" + std::to_string(k); }

Result<std::vector<Row>> pick_median_launch(const std::vector<std::vector<Row>>& launches, const std::string& what) {
  if (launches.empty()) return Status::invalid_argument(what + ": no launch");
  const size_t modes = launches[0].size();
  for (const std::vector<Row>& l : launches) {
    bool same = l.size() == modes;
    for (size_t m = 0; same && m < modes; ++m) same = l[m].mode == launches[0][m].mode;
    if (!same) return Status::invalid_argument(what + ": its launches ran different modes");
  }
  std::vector<Row> out;
  for (size_t m = 0; m < modes; ++m) {
    std::vector<size_t> order(launches.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return launches[a][m].measured_s < launches[b][m].measured_s; });
    Row r = launches[order[(order.size() - 1) / 2]][m];
    r.launches = static_cast<int64_t>(launches.size());
    r.measured_min_s = launches[order.front()][m].measured_s;
    r.measured_max_s = launches[order.back()][m].measured_s;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<Config> matrix(bool quick, const std::vector<int64_t>& ranks) {
  std::vector<Config> all;
  const std::vector<std::string> workloads = quick ? std::vector<std::string>{"skewed"} : std::vector<std::string>{"skewed", "uniform"};
  const bool want3 = std::find(ranks.begin(), ranks.end(), 3) != ranks.end();
  for (int64_t np : {1, 2, 3, 4}) {
    if (quick && np > 2) continue;
    if (np == 3 && !want3) continue;
    for (const std::string& w : workloads) {
      if (np == 1 && w == "uniform") continue;  // one rank: the same run as skewed
      all.push_back({np, 1, w});
    }
  }
  // Pipelines: PP 2 on 2 ranks, then PP 2 x DP 2 and PP 4 on 4 (quick: PP 2 alone).
  const std::vector<std::pair<int64_t, int64_t>> pipes =
      quick ? std::vector<std::pair<int64_t, int64_t>>{{2, 2}} : std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {4, 2}, {4, 4}};
  for (const auto& [np, pp] : pipes) {
    for (const std::string& w : workloads) all.push_back({np, pp, w});
  }
  // Tensor parallelism: TP 2 on 2 ranks, TP 2 x DP 2 on 4 (quick: TP 2 alone).
  for (int64_t np : quick ? std::vector<int64_t>{2} : std::vector<int64_t>{2, 4}) {
    for (const std::string& w : workloads) all.push_back({np, 1, w, 2});
  }
  if (ranks.empty()) return all;
  std::vector<Config> out;
  for (const Config& c : all) {
    if (std::find(ranks.begin(), ranks.end(), c.np) != ranks.end()) out.push_back(c);
  }
  return out;
}

namespace {

// The sizes: width 256 (4 heads of 64, 2 K/V), vocab 512, documents of 128 beside the long
// ones; data parallel 2 layers at 2048 tokens per rank, pipelines 4 layers (PP 4 needs a
// multiple of 4) at 1024 tokens per micro-batch (2P micro-batches: a step holds 2P x 1024
// tokens per replica). Every run 2 rounds x 2 steps, the first of each run discarded; quick
// halves the tokens. The profile's GEMMs run on the data-parallel row count and its attention
// grid reaches the longest document.
int64_t tokens(bool quick, bool pipeline = false) { return (quick ? 1024 : 2048) / (pipeline ? 2 : 1); }

}  // namespace

std::vector<std::string> bench_args(const Config& c, bool quick) {
  std::vector<std::string> a{"bench", "train", "--backend", "mpi", "--width", "256", "--head-dim", "64", "--vocab", "512",
                             "--tokens-per-rank", std::to_string(tokens(quick, c.pp > 1)), "--short-doc", "128",
                             "--workload", c.workload, "--rounds", "2", "--steps", "2",
                             "--warmup-steps", "1", "--layers", c.pp > 1 ? "4" : "2"};
  if (c.pp > 1) a.insert(a.end(), {"--pp", std::to_string(c.pp)});
  // The TP collectives blocking: the form the simulator's TP term models
  // (docs/simulation-model.md, "Tensor parallelism"); the overlapped default is not modelled.
  if (c.tp > 1) a.insert(a.end(), {"--tp", std::to_string(c.tp), "--tp-overlap", "off"});
  return a;
}

std::vector<std::string> profile_args(bool quick) {
  return {"profile", "--width", "256", "--head-dim", "64", "--vocab", "512", "--tokens", std::to_string(tokens(quick)),
          "--min-len", "128", "--max-len", std::to_string(tokens(quick)), "--min-seconds", quick ? "0.02" : "0.05",
          "--gemm-repeats", quick ? "3" : "5", "--link-repeats", quick ? "5" : "10"};
}

namespace {

Status bad(const std::string& what, const std::string& msg) { return Status::invalid_argument(what + ": " + msg); }

// The shared reader (core/io.h): bounded, regular files only, trailing bytes and NULs refused.
Result<nlohmann::json> read_json(const std::string& path) { return read_json_file(path); }

// A JSON array of `n` finite numbers, or an error naming `field`.
Result<std::vector<double>> numbers(const nlohmann::json& j, const char* field, size_t n, const std::string& what) {
  if (!j.contains(field) || !j[field].is_array() || j[field].size() != n) {
    return bad(what, std::string("\"") + field + "\" missing or not " + std::to_string(n) + " numbers");
  }
  std::vector<double> out;
  for (const nlohmann::json& x : j[field]) {
    if (!x.is_number() || !std::isfinite(x.get<double>())) return bad(what, std::string("\"") + field + "\" holds a non-number");
    out.push_back(x.get<double>());
  }
  return out;
}

}  // namespace

Result<std::vector<Row>> replay_one(const nlohmann::json& bench, const std::string& what, const std::string& hw_path) {
  if (!bench.is_object() || bench.value("format", std::string()) != bench_train::kBenchTrainFormat) {
    return bad(what, std::string("not a distca bench train JSON (\"format\" is not \"") + bench_train::kBenchTrainFormat + "\")");
  }
  if (!bench.contains("bench_flags")) return bad(what, "\"bench_flags\" missing");
  auto flags = bench_train::bench_flags_from_json(bench["bench_flags"]);
  if (!flags.ok()) return bad(what, flags.status().message());
  bench_train::TrainBenchFlags f = std::move(flags).value();
  f.backend = "mpi";
  f.hardware = hw_path;
  if (!bench.contains("ranks") || !bench["ranks"].is_number_integer()) return bad(what, "\"ranks\" missing or not an integer");
  const int64_t ranks = bench["ranks"].get<int64_t>();
  if (ranks < 1 || ranks > 4096 || ranks % f.pp != 0) return bad(what, "\"ranks\" out of range or not a multiple of pp");
  DISTCA_ASSIGN_OR_RETURN(std::vector<double> sgemm, numbers(bench, "sgemm_flops", static_cast<size_t>(ranks), what));
  for (double x : sgemm) {
    if (!(x > 0)) return bad(what, "\"sgemm_flops\" holds a rate that is not positive");
  }
  auto hp = load_hardware_profile(hw_path);
  if (!hp.ok()) return bad(hw_path, hp.status().message());
  if (hp->ranks != ranks) {
    return bad(hw_path, "measured with " + std::to_string(hp->ranks) + " ranks, but " + what + " ran " + std::to_string(ranks));
  }
  const auto hw = std::make_shared<const HardwareProfile>(std::move(hp).value());
  if (!bench.contains("modes") || !bench["modes"].is_array() || bench["modes"].empty()) return bad(what, "\"modes\" missing or empty");
  const std::vector<Batch> batches = bench_train::bench_batches(f, ranks);
  const double sgemm_mean = mean_of(sgemm);
  std::vector<Row> rows;
  for (const nlohmann::json& m : bench["modes"]) {
    for (const char* k : {"name", "mode", "overlap"}) {
      if (!m.contains(k) || !m[k].is_string()) return bad(what, std::string("a mode's \"") + k + "\" missing or not a string");
    }
    if (!m.contains("median_s") || !m["median_s"].is_number()) return bad(what, "a mode's \"median_s\" missing");
    Row r;
    r.mode = m["name"].get<std::string>();
    r.np = ranks;
    r.pp = f.pp;
    r.tp = f.tp;
    r.workload = f.workload;
    r.config = Config{ranks, f.pp, f.workload, f.tp}.name();
    r.measured_s = m["median_s"].get<double>();
    r.measured_min_s = r.measured_max_s = r.measured_s;
    if (m.contains("linear_s") && m["linear_s"].is_number()) r.linear_measured = m["linear_s"].get<double>();
    if (m.contains("attention_s") && m["attention_s"].is_number()) r.attention_measured = m["attention_s"].get<double>();
    DISTCA_ASSIGN_OR_RETURN(std::vector<double> idle, numbers(m, "rank_idle", static_cast<size_t>(ranks), what));
    DISTCA_ASSIGN_OR_RETURN(std::vector<double> exposed, numbers(m, "rank_exposed", static_cast<size_t>(ranks), what));
    r.idle_measured = mean_of(idle);
    r.exposed_measured = mean_of(exposed);
    if (f.pp > 1) {
      DISTCA_ASSIGN_OR_RETURN(r.stage_idle_measured, numbers(m, "stage_idle", static_cast<size_t>(f.pp), what));
    }
    const std::string name = r.mode, mode = m["mode"].get<std::string>(), overlap = m["overlap"].get<std::string>();
    const bench_train::Mode bm{name.c_str(), mode.c_str(), overlap.c_str()};
    const bench_train::SimFigures sim = bench_train::predict(f, ranks, bm, sgemm_mean, nullptr, hw, batches);
    if (!sim.ok) {
      r.error = sim.error;
    } else {
      r.predicted_s = sim.step_s;
      r.ratio = r.measured_s > 0 ? sim.step_s / r.measured_s : 0;
      r.idle_predicted = mean_of(sim.rank_idle);
      r.exposed_predicted = mean_of(sim.rank_blocked);
      if (!sim.rank_linear_s.empty()) {
        r.linear_predicted = sim.rank_linear_s[0];
        r.attention_predicted = sim.rank_attention_s[0];
      }
      if (f.pp > 1) r.stage_idle_predicted = sim.stage_idle;
      r.step_ok = r.measured_s > 0 && std::abs(r.ratio - 1.0) <= kStepGoal;
      r.idle_ok = std::abs(r.idle_predicted - r.idle_measured) <= kIdleGoal;
      for (size_t s = 0; s < r.stage_idle_measured.size() && s < r.stage_idle_predicted.size(); ++s) {
        r.idle_ok = r.idle_ok && std::abs(r.stage_idle_predicted[s] - r.stage_idle_measured[s]) <= kIdleGoal;
      }
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

Result<std::vector<Row>> replay_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::invalid_argument("--replay " + dir + ": not a directory");
  // Configuration files by name, in matrix order: tp, pp, then np, then skewed before uniform.
  const std::regex name_re(R"(^(?:dp([0-9]+)|pp([0-9]+)x([0-9]+)|tp([0-9]+)x([0-9]+))-(skewed|uniform)\.json$)");
  struct Found {
    int64_t pp, np, tp = 1;
    std::string workload, path;
  };
  std::vector<Found> found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string file = e.path().filename().string();
    std::smatch m;
    if (!std::regex_match(file, m, name_re)) continue;
    Found x;
    if (m[1].matched) {
      x.pp = 1;
      x.np = std::stoll(m[1].str());
    } else if (m[2].matched) {
      x.pp = std::stoll(m[2].str());
      x.np = x.pp * std::stoll(m[3].str());
    } else {
      x.pp = 1;
      x.tp = std::stoll(m[4].str());
      x.np = x.tp * std::stoll(m[5].str());
    }
    x.workload = m[6].str();
    x.path = e.path().string();
    found.push_back(std::move(x));
  }
  if (ec) return Status::invalid_argument("--replay " + dir + ": " + ec.message());
  if (found.empty()) {
    return Status::invalid_argument("--replay " + dir + ": no configuration file (dp<N>-, pp<P>x<D>- or tp<T>x<D>-<workload>.json)");
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return std::tie(a.tp, a.pp, a.np, a.workload) < std::tie(b.tp, b.pp, b.np, b.workload);  // "skewed" < "uniform"
  });
  std::vector<Row> rows;
  for (const Found& x : found) {
    const std::string hw = (fs::path(dir) / ("hw-" + std::to_string(x.np) + ".json")).string();
    if (!fs::is_regular_file(hw, ec)) {
      return Status::invalid_argument("--replay: " + hw + " missing (the profile of " + fs::path(x.path).filename().string() + ")");
    }
    const Config config{x.np, x.pp, x.workload, x.tp};
    std::vector<std::vector<Row>> launches;
    for (int64_t k = 1; k <= kMaxLaunches; ++k) {
      const std::string path = k == 1 ? x.path : (fs::path(dir) / (launch_stem(config, k) + ".json")).string();
      if (k > 1 && !fs::is_regular_file(path, ec)) break;
      DISTCA_ASSIGN_OR_RETURN(nlohmann::json j, read_json(path));
      DISTCA_ASSIGN_OR_RETURN(std::vector<Row> r, replay_one(j, path, hw));
      if (!r.empty() && (r[0].np != x.np || r[0].pp != x.pp || r[0].tp != x.tp || r[0].workload != x.workload)) {
        return Status::invalid_argument(path + ": its contents (" + r[0].config + ") do not match its name");
      }
      launches.push_back(std::move(r));
    }
    DISTCA_ASSIGN_OR_RETURN(std::vector<Row> r, pick_median_launch(launches, x.path));
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}

namespace {

volatile sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int) { g_interrupted = 1; }

// The last non-empty line of a log, for an error message.
std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return last.empty() ? "(no output)" : last;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

// One child run: its output into DIR/<stem>.log (written as .log.tmp and renamed when the child
// has ended, so the log in DIR is always whole); an error names it unless it exited 0.
// `tag` ("[k/n] ") starts the progress lines, not the errors.
Status run_one(const LiveOptions& o, int64_t np, const std::vector<std::string>& args, const std::string& stem,
               const std::string& tag, const std::string& what) {
  std::vector<std::string> argv{o.mpirun, "--oversubscribe"};
  if (o.as_root) argv.emplace_back("--allow-run-as-root");
  argv.insert(argv.end(), {"-np", std::to_string(np), o.self});
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string log = (fs::path(o.dir) / (stem + ".log")).string(), tmp = log + ".tmp";
  if (o.progress) o.progress(tag + what + ": " + join(argv));
  const auto t0 = std::chrono::steady_clock::now();
  auto child = run_in_session(argv, tmp, o.timeout_s, &g_interrupted);
  if (!child.ok()) return child.status();
  std::error_code ec;
  fs::rename(tmp, log, ec);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char took[64];
  std::snprintf(took, sizeof(took), "%.1f s", secs);
  if (child->interrupted) return Status::internal(what + ": interrupted; its mpirun and ranks were ended");
  if (child->timed_out) {
    return Status::internal(what + ": still running after --timeout " + std::to_string(static_cast<long long>(o.timeout_s)) +
                            " s; its mpirun and ranks were ended (log " + log + ")");
  }
  const int st = child->status;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    const std::string how = WIFEXITED(st) ? "exited with " + std::to_string(WEXITSTATUS(st))
                                          : "ended by signal " + std::to_string(WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return Status::internal(what + ": " + how + " after " + took + ": " + last_line(log) + " (log " + log + ")");
  }
  if (o.progress) o.progress(tag + what + ": done in " + took);
  return {};
}

}  // namespace

Result<std::vector<Row>> run_live(const LiveOptions& o) {
  struct sigaction sa {}, old_int {}, old_term {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  struct Restore {
    struct sigaction a, b;
    ~Restore() {
      sigaction(SIGINT, &a, nullptr);
      sigaction(SIGTERM, &b, nullptr);
    }
  } restore{old_int, old_term};
  g_interrupted = 0;

  std::vector<int64_t> nps;
  for (const Config& c : o.configs) {
    if (std::find(nps.begin(), nps.end(), c.np) == nps.end()) nps.push_back(c.np);
  }
  std::sort(nps.begin(), nps.end());
  const size_t total = nps.size() + o.configs.size() * static_cast<size_t>(std::max<int64_t>(o.launches, 1));
  size_t k = 0;
  auto tag = [&] { return "[" + std::to_string(++k) + "/" + std::to_string(total) + "] "; };
  for (int64_t np : nps) {
    std::vector<std::string> args = profile_args(o.quick);
    const std::string hw = (fs::path(o.dir) / ("hw-" + std::to_string(np) + ".json")).string();
    args.insert(args.end(), {"--hardware-out", hw});
    DISTCA_RETURN_IF_ERROR(run_one(o, np, args, "hw-" + std::to_string(np), tag(), "profile, " + std::to_string(np) + " rank(s)"));
  }
  std::vector<Row> rows;
  for (const Config& c : o.configs) {
    const std::string hw = (fs::path(o.dir) / ("hw-" + std::to_string(c.np) + ".json")).string();
    std::vector<std::vector<Row>> launches;
    for (int64_t k = 1; k <= o.launches; ++k) {
      const std::string stem = launch_stem(c, k), json = (fs::path(o.dir) / (stem + ".json")).string();
      std::vector<std::string> args = bench_args(c, o.quick);
      args.insert(args.end(), {"--hardware", hw, "--json", json});
      DISTCA_RETURN_IF_ERROR(run_one(o, c.np, args, stem, tag(), "bench train " + stem));
      DISTCA_ASSIGN_OR_RETURN(nlohmann::json j, read_json(json));
      DISTCA_ASSIGN_OR_RETURN(std::vector<Row> r, replay_one(j, json, hw));
      launches.push_back(std::move(r));
    }
    DISTCA_ASSIGN_OR_RETURN(std::vector<Row> r, pick_median_launch(launches, c.name()));
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}

namespace {

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f%%", 100 * x);
  return b;
}

std::string stages(const std::vector<double>& v) {
  std::string s;
  for (double x : v) {
    char b[16];
    std::snprintf(b, sizeof(b), "%s%.0f", s.empty() ? "" : " ", 100 * x);
    s += b;
  }
  return s;
}

}  // namespace

std::string format_table(const std::vector<Row>& rows) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "%-15s %-18s %8s %8s %6s %7s %7s %7s %7s %5s %5s  %s\n", "config", "mode", "meas s",
                "pred s", "ratio", "idle m", "idle p", "exp m", "exp p", "step", "idle", "idle per stage % (meas / pred)");
  out += line;
  int step_ok = 0, idle_ok = 0;
  for (const Row& r : rows) {
    if (!r.error.empty()) {
      std::snprintf(line, sizeof(line), "%-15s %-18s %8.3f  (simulator: %s)\n", r.config.c_str(), r.mode.c_str(), r.measured_s,
                    r.error.c_str());
      out += line;
      continue;
    }
    step_ok += r.step_ok ? 1 : 0;
    idle_ok += r.idle_ok ? 1 : 0;
    const std::string per_stage = r.pp > 1 ? stages(r.stage_idle_measured) + " / " + stages(r.stage_idle_predicted) : "";
    std::snprintf(line, sizeof(line), "%-15s %-18s %8.3f %8.3f %6.2f %7s %7s %7s %7s %5s %5s  %s\n", r.config.c_str(),
                  r.mode.c_str(), r.measured_s, r.predicted_s, r.ratio, pct(r.idle_measured).c_str(),
                  pct(r.idle_predicted).c_str(), pct(r.exposed_measured).c_str(), pct(r.exposed_predicted).c_str(),
                  r.step_ok ? "ok" : "miss", r.idle_ok ? "ok" : "miss", per_stage.c_str());
    out += line;
  }
  std::snprintf(line, sizeof(line),
                "goal: predicted step within %.0f%% of the measured median (ratio = predicted / measured), idle within "
                "%.0f points (pipelines: every stage); %d of %zu rows meet the step goal, %d the idle goal\n",
                100 * kStepGoal, 100 * kIdleGoal, step_ok, rows.size(), idle_ok);
  out += line;
  int64_t launches = 1;
  for (const Row& r : rows) launches = std::max(launches, r.launches);
  if (launches > 1) {
    out += "meas s: per configuration and mode, the launch with the median step of " + std::to_string(launches) +
           " launches (separate mpiruns; the least and largest in the JSON's measured_min_s, measured_max_s)\n";
  }
  out += "idle: 1 - (linear + attention) / step, each rank's, mean over ranks; exp: time blocked in communication / "
         "step, waits for a slower peer inside an exchange included (measured: StepMetrics::comm_s; predicted: "
         "UnitStats::comm_blocked), mean over ranks\n";
  return out;
}

nlohmann::json rows_json(const std::vector<Row>& rows) {
  nlohmann::json a = nlohmann::json::array();
  int step_ok = 0, idle_ok = 0;
  for (const Row& r : rows) {
    step_ok += r.step_ok ? 1 : 0;
    idle_ok += r.idle_ok ? 1 : 0;
    nlohmann::json j = {{"config", r.config},
                        {"mode", r.mode},
                        {"np", r.np},
                        {"pp", r.pp},
                        {"tp", r.tp},
                        {"workload", r.workload},
                        {"measured_s", r.measured_s},
                        {"launches", r.launches},
                        {"measured_min_s", r.measured_min_s},
                        {"measured_max_s", r.measured_max_s},
                        {"predicted_s", r.predicted_s},
                        {"ratio", r.ratio},
                        {"idle_measured", r.idle_measured},
                        {"idle_predicted", r.idle_predicted},
                        {"exposed_measured", r.exposed_measured},
                        {"exposed_predicted", r.exposed_predicted},
                        {"linear_measured", r.linear_measured},
                        {"linear_predicted", r.linear_predicted},
                        {"attention_measured", r.attention_measured},
                        {"attention_predicted", r.attention_predicted},
                        {"step_ok", r.step_ok},
                        {"idle_ok", r.idle_ok}};
    if (r.pp > 1) {
      j["stage_idle_measured"] = r.stage_idle_measured;
      j["stage_idle_predicted"] = r.stage_idle_predicted;
    }
    if (!r.error.empty()) j["error"] = r.error;
    a.push_back(std::move(j));
  }
  return {{"bench", "simulate --validate"},
          {"goal", {{"step_within", kStepGoal}, {"idle_within", kIdleGoal}}},
          {"rows", a},
          {"step_ok", step_ok},
          {"idle_ok", idle_ok}};
}

}  // namespace distca::cli::validate
