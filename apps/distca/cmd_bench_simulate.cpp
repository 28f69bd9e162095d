// `distca bench simulate`: how long simulate() takes for one iteration at scale, per strategy
// (docs/simulation-model.md, "Speed"). Default configuration: 4096 GPUs (512 nodes of 8),
// llama-8b, 512K tokens per node, ProLong, one micro-batch, h200. The batch is drawn once;
// each strategy is simulated --repeats times and the median wall-clock seconds printed, with
// the simulated iteration time beside it. The draw time is printed as the baseline measured in
// the same run (simulating should cost about as much as drawing the batch).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/specs.h"
#include "distca/sim/simulator.h"

namespace distca::cli {
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
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int run(const Flags& f) {
  if (!f.json_path.empty() && f.json_path != "-") {
    Status out = check_output_path(f.json_path).with_context("--json");
    if (!out.ok()) return fail(out);
  }
  if (f.repeats < 1 || f.repeats > 100) return fail_input("--repeats must be in 1 .. 100");
  if (f.tokens_k < 1) return fail_input("--tokens-k must be positive");
  std::vector<sim::Strategy> strategies;
  size_t pos = 0;
  while (pos <= f.strategies.size()) {
    const size_t comma = f.strategies.find(',', pos);
    const std::string one = f.strategies.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    auto s = sim::parse_strategy(one);
    if (!s.ok()) return fail(Status(s.status().code(), "--strategies: " + s.status().message()));
    strategies.push_back(*s);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  auto model = model_preset(f.model);
  if (!model.ok()) return fail(Status(model.status().code(), "--model: " + model.status().message()));
  sim::SimOptions o;
  o.model = *model;
  o.cluster.hw = hardware_preset("h200").value();
  o.cluster.gpus = f.gpus;
  o.cluster.gpus_per_node = o.cluster.hw.gpus_per_node;
  o.cluster.pp = f.pp;
  for (const auto& s : strategies) {
    o.strategy = s;
    Status st = o.validate();
    if (!st.ok()) return fail(st);
  }
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
  const double t0 = now();
  auto mbs = sim::draw_microbatches(w, o.cluster, m);
  const double draw_seconds = now() - t0;
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
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& s : strategies) {
    o.strategy = s;
    std::vector<double> times;
    sim::SimResult last;
    for (int64_t rep = 0; rep < f.repeats; ++rep) {
      const double a = now();
      auto r = sim::simulate(o, *mbs);
      times.push_back(now() - a);
      if (!r.ok()) return fail(r.status());
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
  nlohmann::json out = {{"bench", "simulate"},  {"model", o.model.name}, {"gpus", f.gpus},
                        {"pp", f.pp},            {"microbatches", m},    {"tokens_per_unit", w.tokens_per_rank},
                        {"dist", f.dist},        {"seed", f.seed},       {"repeats", f.repeats},
                        {"draw_seconds", draw_seconds}, {"strategies", rows}};
  if (to_stdout) {
    st = write_stdout(out.dump(2) + "\n");
    if (!st.ok()) return fail(st);
  } else if (!f.json_path.empty()) {
    st = write_file_atomic(f.json_path, out.dump(2) + "\n");
    if (!st.ok()) return fail(st);
  }
  return kExitOk;
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
  return [f] { return run(*f); };
}

}  // namespace

DISTCA_REGISTER_COMMAND(bench_simulate, {"simulate", "bench", "Simulator: wall-clock seconds of simulate() at 4096 GPUs",
                                         70, &setup});

}  // namespace distca::cli
