// `distca bench simulate`: how long simulate() takes for one iteration at scale, per strategy
// (docs/simulation-model.md, "Speed"). Default configuration: 4096 GPUs (512 nodes of 8),
// llama-8b, 512K tokens per node, ProLong, one micro-batch, h200. The batch is drawn once;
// each strategy is simulated --repeats times and the median wall-clock seconds printed, with
// the simulated iteration time beside it. The draw time is printed as the baseline measured in
// the same run (simulating should cost about as much as drawing the batch).
//
// With --validate, the simulator against the runtime on this machine instead (bench_validate.h,
// docs/benchmarks.md "Simulator validation"): live (profiles and bench train runs under
// mpirun, then the table) or --replay DIR (the table from files recorded earlier).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_validate.h"
#include "command.h"
#include "launcher.h"
#include "distca/core/stats.h"
#include "distca/core/clock.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/specs.h"
#include "distca/sim/simulator.h"

namespace distca::cli::cmd_bench_simulate {
namespace {

struct Flags {
  std::string json_path;  // "-": stdout
  int64_t gpus = 4096;
  int64_t tokens_k = 512;
  int64_t pp = 1;
  int64_t microbatches = 0;  // 0: 1, or 2 x PP
  int64_t repeats = 3;
  std::string model = "llama-8b";
  std::string dist = "prolong";
  std::string strategies = "colocated,wlb,percp:8,cad,cad:single-stream,cad:signal";
  uint64_t seed = 42;
  // --validate
  bool validate = false, quick = false;
  std::string replay, out_dir, ranks, mpirun;
  double timeout_s = 600;
  int64_t launches = 1;
};

// Each strategy simulated --repeats times on the same micro-batches: the table's rows (printed
// unless the JSON goes to stdout) and their JSON; the exit code through `code`.
nlohmann::json time_strategies(const Flags& f, sim::SimOptions o, const std::vector<sim::Strategy>& strategies,
                               const std::vector<Batch>& mbs, double draw_seconds, bool to_stdout, int& code) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& s : strategies) {
    o.strategy = s;
    std::vector<double> times;
    sim::SimResult last;
    for (int64_t rep = 0; rep < f.repeats; ++rep) {
      const double a = monotonic_seconds();
      auto r = sim::simulate(o, mbs);
      times.push_back(monotonic_seconds() - a);
      if (!r.ok()) {
        code = fail(r.status());
        return rows;
      }
      last = std::move(r).value();
    }
    const double med = median(times);
    if (!to_stdout) {
      std::printf("%-20s %12.3f %12.2f %14.3f %10lld%s\n", s.name().c_str(), med, draw_seconds > 0 ? med / draw_seconds : 0.0,
                  last.iteration_seconds, static_cast<long long>(last.cp_degree), last.oom ? " (OOM)" : "");
      std::fflush(stdout);
    }
    rows.push_back({{"strategy", s.name()},
                    {"wall_seconds_median", med},
                    {"wall_seconds", times},
                    {"iteration_seconds", last.iteration_seconds},
                    {"cp_degree", last.cp_degree},
                    {"oom", last.oom}});
  }
  code = kExitOk;
  return rows;
}

// The flags' simulator options, every strategy checked against them.
Result<sim::SimOptions> speed_options(const Flags& f, std::vector<sim::Strategy>& strategies) {
  if (f.repeats < 1 || f.repeats > 100) return Status::invalid_argument("--repeats must be in 1 .. 100");
  if (f.tokens_k < 1) return Status::invalid_argument("--tokens-k must be positive");
  for (const std::string& one : split_list(f.strategies)) {
    auto s = sim::parse_strategy(one);
    if (!s.ok()) return Status(s.status().code(), "--strategies: " + s.status().message());
    strategies.push_back(*s);
  }
  sim::SimOptions o;
  DISTCA_ASSIGN_OR_RETURN(o.model, model_flag(f.model));
  o.cluster.hw = hardware_preset("h200").value();
  o.cluster.gpus = f.gpus;
  o.cluster.gpus_per_node = o.cluster.hw.gpus_per_node;
  o.cluster.pp = f.pp;
  for (const auto& s : strategies) {
    o.strategy = s;
    DISTCA_RETURN_IF_ERROR(o.validate());
  }
  return o;
}

int run(const Flags& f) {
  if (Status out = check_output_flag("--json", f.json_path); !out.ok()) return fail(out);
  std::vector<sim::Strategy> strategies;
  auto options = speed_options(f, strategies);
  if (!options.ok()) return fail(options.status());
  const sim::SimOptions& o = *options;
  WorkloadOptions w;
  w.dist = f.dist;
  w.tokens_per_rank = f.tokens_k * 1024;
  w.seed = f.seed;
  const int64_t m = f.microbatches > 0 ? f.microbatches : (f.pp > 1 ? 2 * f.pp : 1);
  Status st = sim::validate_draw(w, o.cluster, m);
  if (!st.ok()) return fail(st);
  const std::string memory_flags = "--gpus " + std::to_string(f.gpus) + " --tokens-k " + std::to_string(f.tokens_k) +
                                   " --pp " + std::to_string(f.pp) + " --microbatches " + std::to_string(m);
  st = check_memory(sim::estimate_draw_bytes(o.cluster, w.tokens_per_rank, m), memory_flags);
  if (!st.ok()) return fail_input(st.message());
  const bool to_stdout = f.json_path == "-";
  const double t0 = monotonic_seconds();
  auto mbs = sim::draw_microbatches(w, o.cluster, m);
  const double draw_seconds = monotonic_seconds() - t0;
  if (!mbs.ok()) return fail(mbs.status());
  // One strategy's result is alive at a time; they all share the estimate (no events).
  st = check_memory(sim::estimate_simulate_bytes(o, *mbs), memory_flags);
  if (!st.ok()) return fail_input(st.message());
  if (!to_stdout) {
    std::printf("simulate(): %s, %lld GPUs (%lld nodes, PP %lld), %lldK tokens per node, %s, %lld micro-batch(es); "
                "median of %lld runs\n",
                o.model.name.c_str(), static_cast<long long>(f.gpus), static_cast<long long>(o.cluster.units()),
                static_cast<long long>(f.pp), static_cast<long long>(f.tokens_k), f.dist.c_str(),
                static_cast<long long>(m), static_cast<long long>(f.repeats));
    std::printf("drawing the batch (baseline, same run): %.3f s\n\n", draw_seconds);
    std::printf("%-20s %12s %12s %14s %10s\n", "strategy", "wall s", "x draw", "iteration s", "CP");
  }
  int code = kExitOk;
  nlohmann::json rows = time_strategies(f, o, strategies, *mbs, draw_seconds, to_stdout, code);
  if (code != kExitOk) return code;
  nlohmann::json out = {{"bench", "simulate"},  {"model", o.model.name}, {"gpus", f.gpus},
                        {"pp", f.pp},            {"microbatches", m},    {"tokens_per_unit", w.tokens_per_rank},
                        {"dist", f.dist},        {"seed", f.seed},       {"repeats", f.repeats},
                        {"draw_seconds", draw_seconds}, {"strategies", rows}};
  st = write_output_flag(f.json_path, out.dump(2) + "\n");
  return st.ok() ? kExitOk : fail(st);
}

namespace fs = std::filesystem;

// --ranks LIST: comma-separated process counts, each 1 .. 64.
Result<std::vector<int64_t>> parse_ranks(const std::string& list) {
  std::vector<int64_t> out;
  for (const std::string& one : split_list(list)) {
    char* end = nullptr;
    const long long v = one.empty() ? 0 : std::strtoll(one.c_str(), &end, 10);
    if (one.empty() || *end != '\0' || v < 1 || v > 64) {
      return Status::invalid_argument("--ranks: \"" + one + "\" is not a process count in 1 .. 64 (a list such as 1,2,4)");
    }
    out.push_back(v);
  }
  return out;
}

int emit(const std::string& json_path, const std::vector<validate::Row>& rows, const std::string& header) {
  if (Status st = write_output_flag(json_path, validate::rows_json(rows).dump(2) + "\n"); !st.ok()) return fail(st);
  if (json_path == "-") return kExitOk;
  if (Status st = write_stdout(header + validate::format_table(rows)); !st.ok()) return fail(st);
  return kExitOk;
}

// --out DIR: an existing writable directory, or a new one whose parent is. Nothing is made.
Status check_out_dir(const std::string& dir, bool* exists) {
  std::error_code ec;
  const fs::path d(dir);
  *exists = fs::exists(d, ec);
  if (*exists && !fs::is_directory(d, ec)) return Status::invalid_argument("--out " + dir + ": exists and is not a directory");
  const fs::path parent = d.has_parent_path() ? d.parent_path() : fs::path(".");
  if (!*exists && !fs::is_directory(parent, ec)) return Status::invalid_argument("--out " + dir + ": its parent directory does not exist");
  if (access((*exists ? d : parent).c_str(), W_OK | X_OK) != 0) return Status::invalid_argument("--out " + dir + ": not writable");
  return {};
}

// Every check before any directory is made or any child started: exit 2 and one line. `given`
// says whether a flag was on the command line (an empty value never gets here: flags.cpp
// refuses it for every option).
int run_validate(const Flags& f, bool speed_flags_given, const std::function<bool(const char*)>& given) {
  if (speed_flags_given) return fail_input("--validate: --gpus, --tokens-k, --pp, --microbatches, --repeats, --model, "
                                           "--dist, --strategies and --seed belong to the speed benchmark");
  if (Status out = check_output_flag("--json", f.json_path); !out.ok()) return fail(out);
  if (Status st = check_distinct_outputs({{"--json", f.json_path, true}, {"--out", f.out_dir}}); !st.ok()) {
    return fail(st);
  }
  if (given("--replay")) {
    for (const char* live : {"--out", "--quick", "--ranks", "--mpirun", "--timeout", "--launches"}) {
      if (given(live)) return fail_input(std::string("--replay: ") + live + " applies to a live run (a replay runs nothing)");
    }
    auto rows = validate::replay_dir(f.replay);
    if (!rows.ok()) return fail_input(rows.status().message());
    return emit(f.json_path, *rows, "distca bench simulate --validate --replay " + f.replay +
                                        ": the recorded runs, re-predicted by this build's simulator\n");
  }
  if (detect_launcher().present) return fail_input("--validate starts its own mpirun; run it without mpirun");
  std::vector<int64_t> ranks;
  if (given("--ranks")) {
    auto r = parse_ranks(f.ranks);
    if (!r.ok()) return fail_input(r.status().message());
    ranks = *r;
  }
  validate::LiveOptions o;
  o.quick = f.quick;
  o.timeout_s = f.timeout_s;
  o.launches = f.launches;
  o.configs = validate::matrix(f.quick, ranks);
  if (o.configs.empty()) return fail_input("--ranks " + f.ranks + ": no configuration of the matrix runs on these process counts (1, 2, 3, 4)");
  bool out_exists = false;
  if (given("--out")) {
    if (Status st = check_out_dir(f.out_dir, &out_exists); !st.ok()) return fail_input(st.message());
  }
  o.mpirun = find_executable(given("--mpirun") ? f.mpirun : "mpirun");
  if (o.mpirun.empty()) {
    return fail_input(given("--mpirun") ? "--mpirun " + f.mpirun + ": not an executable file"
                                        : "--mpirun: no mpirun on PATH (give its path with --mpirun PATH)");
  }
  std::error_code ec;
  o.self = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec || o.self.empty()) return fail(Status::internal("cannot find this distca binary (/proc/self/exe)"));
  o.as_root = geteuid() == 0;
  // Every check passed: the directory is the first thing made (a --out that cannot be made is
  // the user's path, refused like the checks above: nothing exists yet).
  if (!given("--out")) {
    std::string tmpl = (fs::temp_directory_path(ec) / "distca-validate-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return fail(Status::internal("cannot create a directory under the temporary directory"));
    o.dir = tmpl;
  } else {
    if (!out_exists && !fs::create_directory(f.out_dir, ec)) {
      return fail_input("--out " + f.out_dir + ": cannot be created: " + (ec ? ec.message() : std::string("it exists")));
    }
    o.dir = f.out_dir;
  }
  o.progress = [](const std::string& line) {
    std::fprintf(stderr, "distca bench simulate: %s\n", line.c_str());
    std::fflush(stderr);
  };
  std::fprintf(stderr, "distca bench simulate: --validate, %zu configuration(s) into %s\n", o.configs.size(), o.dir.c_str());
  auto rows = validate::run_live(o);
  if (!rows.ok()) return fail(rows.status());
  return emit(f.json_path, *rows, "distca bench simulate --validate: measured on this machine (files in " + o.dir +
                                      "; re-predict with --replay " + o.dir + ")\n");
}

Runner setup(CLI::App& sub) {
  auto f = std::make_shared<Flags>();
  sub.add_option("--json", f->json_path, "Write the figures as JSON to FILE (atomically), or - for stdout")
      ->expected(0, 1)
      ->default_str("-");
  sub.add_option("--gpus", f->gpus, "GPUs (nodes of 8)")->capture_default_str();
  sub.add_option("--tokens-k", f->tokens_k, "Tokens per node, in units of 1024")->capture_default_str();
  sub.add_option("--pp", f->pp, "Pipeline stages")->capture_default_str();
  sub.add_option("--microbatches", f->microbatches, "Micro-batches (default 1, or 2 x PP)");
  sub.add_option("--repeats", f->repeats, "Runs per strategy (median reported)")->capture_default_str();
  sub.add_option("--model", f->model, "Model preset")->capture_default_str();
  sub.add_option("--dist", f->dist, "Document lengths (workload --dist)")->capture_default_str();
  sub.add_option("--strategies", f->strategies, "Comma-separated strategies")->capture_default_str();
  sub.add_option("--seed", f->seed, "Random seed")->capture_default_str();
  sub.add_flag("--validate", f->validate,
               "the simulator against the runtime on this machine: profile and bench train runs under mpirun, then "
               "measured beside predicted step, idle and exposed communication");
  sub.add_option("--replay", f->replay, "--validate: re-predict the runs recorded in DIR (hw-N.json, <config>.json); runs nothing");
  sub.add_option("--out", f->out_dir, "--validate: directory for the profiles, runs and logs (default: a new one under /tmp)");
  sub.add_flag("--quick", f->quick, "--validate: DP 1, DP 2 and PP 2, skewed, half the tokens (under a minute on 2 cores)");
  sub.add_option("--ranks", f->ranks, "--validate: only the configurations on these process counts (e.g. 1,2; 3 adds DP 3)");
  sub.add_option("--timeout", f->timeout_s, "--validate: seconds one child run may take before its mpirun and ranks are ended")
      ->check(CLI::Range(1.0, 86400.0));
  sub.add_option("--launches", f->launches,
                 "--validate: bench train runs per configuration, each its own mpirun (default 1); a row is the launch "
                 "with the median step")
      ->check(CLI::Range(int64_t{1}, validate::kMaxLaunches));
  sub.add_option("--mpirun", f->mpirun, "--validate: the mpirun to start the runs with (default: the one on PATH)");
  std::vector<CLI::Option*> speed;
  for (const char* name : {"--gpus", "--tokens-k", "--pp", "--microbatches", "--repeats", "--model", "--dist", "--strategies", "--seed"}) {
    speed.push_back(sub.get_option(name));
  }
  std::vector<CLI::Option*> validate_only;
  for (const char* name : {"--replay", "--out", "--quick", "--ranks", "--timeout", "--launches", "--mpirun"}) {
    validate_only.push_back(sub.get_option(name));
  }
  return [f, speed, validate_only, &sub] {
    bool speed_given = false;
    for (CLI::Option* o : speed) speed_given = speed_given || o->count() > 0;
    if (f->validate) return run_validate(*f, speed_given, [&sub](const char* name) { return sub.count(name) > 0; });
    for (CLI::Option* o : validate_only) {
      if (o->count() > 0) return fail_input(o->get_name() + " applies to --validate");
    }
    return run(*f);
  };
}

}  // namespace

DISTCA_REGISTER_COMMAND(bench_simulate, {"simulate", "bench",
                                         "Simulator: wall-clock seconds of simulate() at 4096 GPUs; --validate: against the runtime here",
                                         70, &setup});

}  // namespace distca::cli::cmd_bench_simulate
