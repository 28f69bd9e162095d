// `distca bench plan`: plan time, balance and bytes of the schedulers side by side, measured in
// one run on the same batches (docs/benchmarks.md, "Planner"), plus a tolerance sweep of `cad`
// and `cad-symmetric`. The runs and their statistics are the plan layer's (plan/plan_bench.h);
// this command picks the rows (every (distribution, tokens per rank, servers) unless --dist /
// --tokens-k / --servers select some; --no-sweep skips the sweep), checks the memory of the
// largest before the first runs, and prints.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "distca/core/stats.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/specs.h"
#include "distca/data/workload.h"
#include "distca/plan/plan.h"
#include "distca/plan/plan_bench.h"

namespace distca::cli::cmd_bench_plan {
namespace {

struct Flags {
  std::string json_path;
  int64_t batches = 30;
  bool quick = false;
  std::string model = "llama-8b";
  std::string layout = "contiguous";
  double tolerance = 0.05;
  double wide_tolerance = 0.10;
  uint64_t seed = 42;
  // Row selection (empty / 0: the default rows); --no-sweep skips the tolerance sweep.
  std::string dist;
  int64_t tokens_k = 0;
  int64_t servers = 0;
  bool no_sweep = false;
};

std::string fmt_tol(double t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", t);
  return buf;
}

struct Config {
  std::string dist;
  int64_t tokens = 0, servers = 0;
};

void progress(bool on, const std::string& line) {
  if (on) std::fprintf(stderr, "\r%-70s", line.c_str());
}

// Step 1: every flag checked, output path included, before any work.
Status check_flags(const Flags& f) {
  if (f.batches < 1) return Status::invalid_argument("--batches must be >= 1 (got " + std::to_string(f.batches) + ")");
  if (!std::isfinite(f.tolerance) || f.tolerance < 0 || f.tolerance > 1) {
    return Status::invalid_argument("--tolerance must be in [0, 1]");
  }
  if (!std::isfinite(f.wide_tolerance) || f.wide_tolerance < f.tolerance || f.wide_tolerance > 1) {
    return Status::invalid_argument("--wide-tolerance must be in [--tolerance, 1] (got " +
                                    std::to_string(f.wide_tolerance) + ")");
  }
  DISTCA_RETURN_IF_ERROR(model_flag(f.model).status());
  DISTCA_RETURN_IF_ERROR(parse_layout(f.layout).status());
  DISTCA_RETURN_IF_ERROR(check_output_flag("--json", f.json_path));
  if (!f.dist.empty() && f.dist != "pretrain" && f.dist != "prolong") {
    return Status::invalid_argument("--dist must be pretrain or prolong (got '" + f.dist + "')");
  }
  // Checked here in the flags' own terms (WorkloadOptions::validate would name --ranks and
  // --tokens-per-rank, which this command does not have).
  if (f.tokens_k < 0) return Status::invalid_argument("--tokens-k must be positive (got " + std::to_string(f.tokens_k) + ")");
  if (f.servers < 0) return Status::invalid_argument("--servers must be positive (got " + std::to_string(f.servers) + ")");
  constexpr int64_t kMaxServers = int64_t{1} << 24, kMaxTokensK = int64_t{1} << 30;  // 2^40 tokens
  if (f.servers > kMaxServers) {
    return Status::invalid_argument("--servers must be at most 16777216 (got " + std::to_string(f.servers) + ")");
  }
  if (f.tokens_k > kMaxTokensK) {
    return Status::invalid_argument("--tokens-k must be at most 1073741824 (got " + std::to_string(f.tokens_k) + ")");
  }
  // The largest row's batch: the given values, or the defaults' largest (1024 servers, 512K).
  const int64_t servers = f.servers > 0 ? f.servers : 1024, tokens_k = f.tokens_k > 0 ? f.tokens_k : 512;
  if (tokens_k > (kMaxTokensK / servers)) {
    return Status::invalid_argument("--servers (" + std::to_string(servers) + ") times --tokens-k (" +
                                    std::to_string(tokens_k) + ") exceeds 2^40 tokens per batch");
  }
  return Status::ok_status();
}

// The rows selected by the flags (every default row unless --dist / --tokens-k / --servers).
std::vector<Config> select_configs(const Flags& f, std::vector<const char*>& dists) {
  std::vector<Config> configs;
  std::vector<int64_t> tokens = f.quick ? std::vector<int64_t>{128 << 10, 512 << 10}
                                        : std::vector<int64_t>{128 << 10, 256 << 10, 512 << 10};
  std::vector<int64_t> servers = f.quick ? std::vector<int64_t>{8, 64, 512}
                                         : std::vector<int64_t>{8, 16, 32, 64, 128, 256, 512, 1024};
  if (f.tokens_k > 0) tokens = {f.tokens_k << 10};
  if (f.servers > 0) servers = {f.servers};
  dists = {"pretrain", "prolong"};
  if (f.dist == "pretrain") dists = {"pretrain"};
  if (f.dist == "prolong") dists = {"prolong"};
  for (const char* dist : dists) {
    for (int64_t t : tokens) {
      for (int64_t s : servers) configs.push_back({dist, t, s});
    }
  }
  return configs;
}

// Everything one run shares: the flags as resolved, the scheduling options, the output.
struct Bench {
  explicit Bench(const Flags& flags) : f(flags) {}
  const Flags& f;
  Layout layout = Layout::kContiguous;
  int64_t batches = 0;
  bool to_stdout = false;
  bool show = false;
  ScheduleOptions o;
  nlohmann::json out;
  std::string what;  // the flags that size a run, for check_memory's message

  WorkloadOptions workload(const Config& c) const {
    WorkloadOptions w;
    w.dist = c.dist;
    w.ranks = c.servers;
    w.tokens_per_rank = c.tokens;
    w.layout = layout;
    w.batches = batches;
    w.seed = f.seed;
    return w;
  }
};

// Step 2: the largest row (the sweep's included) must fit before the first one runs.
Status check_bench_memory(const Bench& b, const std::vector<Config>& configs, int64_t sweep_servers,
                          const std::vector<const char*>& dists) {
  std::vector<Config> all = configs;
  for (const char* dist : dists) all.push_back({dist, 512 << 10, sweep_servers});
  double need = 0;
  for (const Config& c : all) {
    DISTCA_ASSIGN_OR_RETURN(double pieces, estimate_batch_pieces(b.workload(c)));
    need = std::max(need, bench_row_bytes(b.batches, c.servers, pieces));
  }
  return check_memory(need, b.what);
}

// One scheduler's line of the table, from its JSON (plan_samples_json).
void print_scheduler(const Config& c, int k, const nlohmann::json& j) {
  const auto num = [&](const char* key) { return j[key].get<double>(); };
  const bool full = j.contains("complete_plan_ms_median"), wide = j.contains("wide_over_tight_bytes_worst");
  char full_ms[16] = "       -", wide_s[40] = "";
  if (full) std::snprintf(full_ms, sizeof full_ms, "%8.2f", num("complete_plan_ms_median"));
  if (wide) {
    std::snprintf(wide_s, sizeof wide_s, " | %6.3f (%lld)", num("wide_over_tight_bytes_worst"),
                  static_cast<long long>(j["wide_costs_more_batches"].get<int64_t>()));
  }
  std::printf("%-8s %4lldK %5lld | %-13s %8.2f %s %8.4f %8.4f %9.2f %9.3f | %lld/%lld%s%s\n", c.dist.c_str(),
              static_cast<long long>(c.tokens >> 10), static_cast<long long>(c.servers), kBenchSchedulers[k],
              num("plan_ms_median"), full_ms, num("load_max_over_mean_median"), num("load_max_over_mean_worst"),
              num("comm_bytes_total_median") / 1e9, num("comm_bytes_max_rank_median") / 1e9,
              static_cast<long long>(j["balanced_batches"].get<int64_t>()), static_cast<long long>(j["batches"].get<int64_t>()),
              k == 3 ? (" (C=" + std::to_string(static_cast<long long>(num("cp_degree_median"))) + ")").c_str() : "", wide_s);
  if (k == 0 && full) {
    std::printf("%-8s %4lldK %5lld | cad complete plan, median ms per phase:", c.dist.c_str(),
                static_cast<long long>(c.tokens >> 10), static_cast<long long>(c.servers));
    for (const char* phase : kPlanPhaseNames) {
      std::printf(" %s %.2f", phase, j["complete_plan_phases_ms_median"][phase].get<double>());
    }
    std::printf("\n");
  }
}

// Step 3, one row: every scheduler on the row's batches (plan_bench.h), summarized (and printed).
Status run_config(Bench& b, const Config& c) {
  progress(b.show, c.dist + " " + std::to_string(c.tokens >> 10) + "K x " + std::to_string(c.servers));
  DISTCA_ASSIGN_OR_RETURN(std::vector<Batch> bs, make_batches(b.workload(c)));
  DISTCA_ASSIGN_OR_RETURN(PlanBenchRow r, bench_plan_row(bs, b.o, b.f.wide_tolerance, b.what));
  progress(b.show, "");
  if (b.show) std::fprintf(stderr, "\r");
  const double ratio = median(r.cad_over_symmetric);
  nlohmann::json row = {{"dist", c.dist}, {"tokens_per_rank", c.tokens}, {"servers", c.servers},
                        {"cad_over_symmetric_bytes_median", ratio}, {"schedulers", nlohmann::json::object()}};
  for (int k = 0; k < kNumBenchSchedulers; ++k) {
    const nlohmann::json j = plan_samples_json(r.samples[k], k, b.f.tolerance);
    if (!b.to_stdout) print_scheduler(c, k, j);
    row["schedulers"][kBenchSchedulers[k]] = j;
  }
  if (!b.to_stdout) std::printf("%-8s %4lldK %5lld | cad / cad-symmetric bytes: %.3f (median of per-batch ratios)\n",
                                c.dist.c_str(), static_cast<long long>(c.tokens >> 10),
                                static_cast<long long>(c.servers), ratio);
  b.out["configs"].push_back(row);
  std::fflush(stdout);
  return Status::ok_status();
}

// Step 4, one distribution: bytes of cad and cad-symmetric as the tolerance grows.
Status run_sweep(Bench& b, const char* dist, int64_t sweep_servers) {
  DISTCA_ASSIGN_OR_RETURN(std::vector<Batch> bs, make_batches(b.workload({dist, 512 << 10, sweep_servers})));
  for (double tol : {0.0, 0.05, 0.1, 0.15, 0.2, 0.3}) {
    progress(b.show, std::string("sweep ") + dist + " tol " + std::to_string(tol));
    DISTCA_ASSIGN_OR_RETURN(nlohmann::json p, tolerance_sweep_point(bs, b.o, tol));
    progress(b.show, "");
    if (b.show) std::fprintf(stderr, "\r");
    p["dist"] = dist;
    p["servers"] = sweep_servers;
    p["tokens_per_rank"] = 512 << 10;
    if (!b.to_stdout) {
      const double cad = p["cad_bytes_median"].get<double>(), sym = p["cad_symmetric_bytes_median"].get<double>();
      std::printf("%-8s tol %.2f  cad %9.2f (%lld/%lld)  cad-symmetric %9.2f (%lld/%lld)  ratio %.3f\n", dist, tol,
                  cad / 1e9, static_cast<long long>(p["cad_balanced_batches"].get<int64_t>()),
                  static_cast<long long>(b.batches), sym / 1e9,
                  static_cast<long long>(p["cad_symmetric_balanced_batches"].get<int64_t>()),
                  static_cast<long long>(b.batches), cad / std::max(1.0, sym));
    }
    b.out["sweep"].push_back(std::move(p));
  }
  return Status::ok_status();
}

int run(const Flags& f) {
  Status st = check_flags(f);
  if (!st.ok()) return fail_input(st.message());
  Bench b(f);
  b.layout = *parse_layout(f.layout);
  b.to_stdout = f.json_path == "-";
  b.show = stderr_is_terminal() && !b.to_stdout;
  b.batches = f.quick ? std::min<int64_t>(f.batches, 5) : f.batches;
  b.o.model = *model_preset(f.model);
  b.o.tolerance = f.tolerance;
  b.what = "--batches " + std::to_string(b.batches) + (f.servers > 0 ? " --servers " + std::to_string(f.servers) : "") +
           (f.tokens_k > 0 ? " --tokens-k " + std::to_string(f.tokens_k) : "");
  std::vector<const char*> dists;
  const std::vector<Config> configs = select_configs(f, dists);
  const int64_t sweep_servers = f.quick ? 64 : 256;
  if (f.no_sweep) dists.clear();
  st = check_bench_memory(b, configs, sweep_servers, dists);
  if (!st.ok()) return fail(st);

  b.out = {{"bench", "plan"}, {"model", f.model}, {"layout", f.layout},
           {"tolerance", f.tolerance}, {"wide_tolerance", f.wide_tolerance}, {"batches", b.batches}, {"seed", f.seed},
           {"dtype_bytes", b.o.dtype_bytes}, {"configs", nlohmann::json::array()},
           {"sweep", nlohmann::json::array()}};
  if (!b.to_stdout) {
    std::printf("distca bench plan: %s, %s layout, tolerance %g, %lld batches per row, medians\n",
                f.model.c_str(), f.layout.c_str(), f.tolerance, static_cast<long long>(b.batches));
    std::printf("%-8s %5s %5s | %-13s %8s %8s %8s %8s %9s %9s | %s | %s\n", "dist", "tok", "srv", "scheduler",
                "plan ms", "full ms", "max/mean", "worst", "bytes GB", "rank GB", "balanced",
                ("bytes tol " + fmt_tol(f.wide_tolerance) + " / " + fmt_tol(f.tolerance) + " worst (batches > 1)").c_str());
  }
  for (const Config& c : configs) {
    st = run_config(b, c);
    if (!st.ok()) return fail(st);
  }
  if (!b.to_stdout && !dists.empty()) {
    std::printf("\ntolerance sweep, %lld servers x 512K tokens, median forward GB (balanced batches)\n",
                static_cast<long long>(sweep_servers));
  }
  for (const char* dist : dists) {
    st = run_sweep(b, dist, sweep_servers);
    if (!st.ok()) return fail(st);
  }
  if (b.show) std::fprintf(stderr, "\r%70s\r", "");
  st = write_output_flag(f.json_path, b.out.dump(2) + "\n");
  return st.ok() ? kExitOk : fail(st);
}

Runner setup(CLI::App& sub) {
  auto f = std::make_shared<Flags>();
  sub.add_option("--json", f->json_path, "Write the figures as JSON to FILE (atomically), or - for stdout");
  sub.add_option("--batches", f->batches, "Batches per configuration")->capture_default_str();
  sub.add_flag("--quick", f->quick, "A small subset: 128K and 512K tokens, 8/64/512 servers, <= 5 batches");
  sub.add_option("--model", f->model, "Model preset for the byte counts")->capture_default_str();
  sub.add_option("--layout", f->layout, "Batch layout: contiguous | head-tail")->capture_default_str();
  sub.add_option("--tolerance", f->tolerance, "cad / cad-symmetric tolerance, in [0, 1]")->capture_default_str();
  sub.add_option("--wide-tolerance", f->wide_tolerance,
                 "Tolerance monotonicity: cad and cad-symmetric planned again at this tolerance (>= --tolerance)")
      ->capture_default_str();
  sub.add_option("--seed", f->seed, "Workload seed")->capture_default_str();
  sub.add_option("--dist", f->dist, "Only this distribution's rows (and sweep): pretrain | prolong");
  sub.add_option("--tokens-k", f->tokens_k, "Only rows with this many K tokens per rank (e.g. 512)");
  sub.add_option("--servers", f->servers, "Only rows with this many servers");
  sub.add_flag("--no-sweep", f->no_sweep, "Skip the tolerance sweep");
  return [f] { return run(*f); };
}

}  // namespace

DISTCA_REGISTER_COMMAND(bench_plan, {"plan", "bench", "Planner: plan time, balance and bytes of cad, cad-symmetric, wlb, percp",
                                     60, &setup});

}  // namespace distca::cli::cmd_bench_plan
