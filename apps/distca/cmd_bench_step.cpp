// `distca bench step`: an attention-dominated layer step (core attention through the CA
// runtime plus a linear stand-in of tunable cost) on a skewed batch: rank 0 holds one long
// document, every other rank many short ones. Times `colocated` and `cad` plans in the three
// overlap modes in the same run and prints the ratios (docs/benchmarks.md, "Step").
//
//   mpirun -np 2 distca bench step --backend mpi --json -
//
// Under mpirun every rank runs the same steps and only rank 0 prints. On the local backend the
// ranks are threads whose kernels are serialised (kernels::kernel_mutex), so its times are a
// smoke test, not figures.
#include <omp.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "launcher.h"
#include "distca/core/stats.h"
#include "distca/comm/launch.h"
#include "distca/core/clock.h"
#include "distca/core/io.h"
#include "distca/core/rng.h"
#include "distca/core/trace.h"
#include "distca/cost/analytic.h"
#include "distca/kernels/attention.h"
#include "distca/kernels/blas.h"
#include "distca/runtime/pingpong.h"
#include "distca/runtime/tick_runner.h"
#include "distca/train/bench.h"

namespace distca::cli::cmd_bench_step {
namespace {

struct StepFlags {
  std::string backend = "local";
  int ranks = 2;  // local backend only
  int64_t long_doc = 16384;
  int64_t short_doc = 1024;
  int heads = 2, kv_heads = 1, head_dim = 64;
  int layers = 1;
  int reps = 3;
  int64_t linear_width = 256;  // stand-in: (tokens, W) x (W, W) sgemm per nano-batch call
  std::string json;            // FILE or "-"
  std::string trace;           // Chrome trace of the last cad pingpong step
  std::string mode = "all";    // pingpong | single-stream | signal | all
  double tolerance = 0.05;     // cad's balance band
  bool align = true;           // cad cuts on the kernel's query tiles (no padding)
  std::string mpi_progress = "auto";  // auto | thread | poll (comm::ProgressMode)
  int mpi_poll_us = 20;               // progress thread's pause between polls ...
  int mpi_max_poll_us = 1000;         // ... backing off to this while nothing completes
  double mpi_timeout = 300;           // seconds without progress before a silent rank ends the job
  std::string servers = "both";  // keep | stateless | both (cad pingpong with stateless servers)
};

// Rank 0: one document of long_doc tokens; ranks 1..n-1: long_doc / short_doc documents each
// (bench train's skewed batch at long_doc tokens per rank).
Batch skewed_batch(const StepFlags& f, int n) {
  train::BenchOptions o;
  o.tokens = f.long_doc;
  o.short_doc = f.short_doc;
  return train::dp_batch(o, n);
}

struct Config {
  std::string scheduler;
  runtime::OverlapMode mode;
  bool stateless = false;  // servers receive Q, K/V, O, LSE again in backward
};

struct Measured {
  Config config;
  std::vector<double> steps;  // seconds, max over ranks
  double ideal_flops_max = 0;  // max over ranks of the FLOPs the rank computes per step
  bool outputs_valid = true;
};

// One rank's whole benchmark. Returns the figures (meaningful on rank 0).
Status run_rank(comm::Communicator& comm, const StepFlags& f, std::vector<Measured>* results,
                std::vector<TraceEvent>* trace_out) {
  const int n = comm.size();
  const int r = comm.rank();
  const Batch batch = skewed_batch(f, n);
  DISTCA_RETURN_IF_ERROR(batch.validate());
  const runtime::AttentionDims dims{f.heads, f.kv_heads, f.head_dim, 0};
  ScheduleOptions opt;
  opt.model = {"bench-step", 1, int64_t{f.heads} * f.head_dim, f.heads, f.kv_heads, f.head_dim, int64_t{f.heads} * f.head_dim, 256};
  opt.dtype_bytes = 4;
  opt.tolerance = f.tolerance;
  opt.align_rows = f.align ? runtime::query_tile_rows(dims) : 1;
  const int64_t qf = dims.q_floats(), kvf = dims.kv_floats();
  const int64_t tokens = batch.rank_tokens(r);
  Rng rng(1234, static_cast<uint64_t>(r));
  auto fill = [&](int64_t count) {
    std::vector<float> x(static_cast<size_t>(count));
    for (auto& e : x) e = static_cast<float>(rng.uniform(-1, 1));
    return x;
  };
  const auto q = fill(tokens * qf), k = fill(tokens * kvf), v = fill(tokens * kvf), d_o = fill(tokens * qf);
  std::vector<std::vector<float>> o(static_cast<size_t>(f.layers)), dq(o.size()), dk(o.size()), dv(o.size());
  std::vector<runtime::LayerForward> fw;
  std::vector<runtime::LayerBackward> bw;
  for (size_t l = 0; l < o.size(); ++l) {
    o[l].resize(q.size()), dq[l].resize(q.size()), dk[l].resize(k.size()), dv[l].resize(k.size());
    fw.push_back({q.data(), k.data(), v.data(), o[l].data(), nullptr, tokens});
    bw.push_back({d_o.data(), dq[l].data(), dk[l].data(), dv[l].data(), tokens});
  }
  // Linear stand-in: per nano-batch call, (rows, W) x (W, W) on the nano-batch's own rows
  // (the split batch holds ping's rows first, then pong's); backward does two of them.
  const int64_t W = f.linear_width;
  std::vector<float> wmat = fill(W * W), act = fill(tokens * W), out(static_cast<size_t>(tokens * W));
  std::array<int64_t, 2> nano_rows{0, 0};
  auto linear = [&](int nano, int, bool backward) {
    const int64_t rows = nano_rows[static_cast<size_t>(nano)];
    if (rows == 0 || W == 0) return;
    const int64_t row0 = nano == 0 ? 0 : nano_rows[0];
    std::lock_guard<std::mutex> lock(kernels::kernel_mutex());
    kernels::ScopedBlasThreads threads(omp_get_max_threads());
    for (int rep = 0; rep < (backward ? 2 : 1); ++rep) {
      kernels::gemm<float>(false, false, rows, W, W, 1.0f, act.data() + row0 * W, W, wmat.data(), W, 0.0f,
                           out.data() + row0 * W, W);
    }
  };
  const double linear_flops_per_token = 2.0 * static_cast<double>(W * W) * 3.0;  // fwd + 2x bwd

  std::vector<Config> configs;
  for (const char* s : {"colocated", "cad"}) {
    for (runtime::OverlapMode m : {runtime::OverlapMode::kPingPong, runtime::OverlapMode::kSingleStream,
                                   runtime::OverlapMode::kSignal}) {
      if (f.mode == "all" || f.mode == runtime::overlap_mode_name(m)) configs.push_back({s, m, f.servers == "stateless"});
    }
  }
  if (f.servers == "both") {
    const runtime::OverlapMode m = f.mode == "all" ? runtime::OverlapMode::kPingPong : runtime::parse_overlap_mode(f.mode).value();
    configs.push_back({"cad", m, true});
  }
  // Plan every configuration first, then time them round-robin (rep by rep), so that load
  // from other processes on a shared machine falls on every configuration alike.
  std::vector<NanoPlans> plans;
  for (const Config& c : configs) {
    DISTCA_ASSIGN_OR_RETURN(SchedulerSpec spec, parse_scheduler(c.scheduler));
    DISTCA_ASSIGN_OR_RETURN(NanoPlans np, plan_nano_batches(batch, spec, opt));
    Measured m;
    m.config = c;
    for (int64_t p = 0; p < n; ++p) {
      const double pairs = np.full.metrics.loads[static_cast<size_t>(p)];
      const double flops = f.layers * (attention_forward_flops(opt.model, pairs) + attention_backward_flops(opt.model, pairs)) +
                           (f.layers + 1) * static_cast<double>(batch.rank_tokens(p)) * linear_flops_per_token;
      m.ideal_flops_max = std::max(m.ideal_flops_max, flops);
    }
    plans.push_back(std::move(np));
    results->push_back(std::move(m));
  }
  for (int rep = 0; rep <= f.reps; ++rep) {  // rep 0 warms up
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      const Config& c = configs[ci];
      Measured& m = (*results)[ci];
      nano_rows = plans[ci].split.tokens[static_cast<size_t>(r)];
      const bool record = !f.trace.empty() && rep == f.reps && c.scheduler == "cad" &&
                          c.mode == runtime::OverlapMode::kPingPong && c.stateless == (f.servers == "stateless");
      DISTCA_RETURN_IF_ERROR(comm.barrier());
      TraceRecorder trace;  // epoch right after the barrier: ranks line up on one host
      DISTCA_ASSIGN_OR_RETURN(auto runner, runtime::TickRunner::create(comm, plans[ci], dims, c.mode, record ? &trace : nullptr, c.stateless));
      const double t0 = monotonic_seconds();
      DISTCA_RETURN_IF_ERROR(runner->forward(fw, linear));
      DISTCA_RETURN_IF_ERROR(runner->backward(bw, linear));
      const double mine = monotonic_seconds() - t0;
      m.outputs_valid = runner->outputs_valid();
      DISTCA_ASSIGN_OR_RETURN(std::vector<double> all, comm.all_gather_value(mine));
      if (rep > 0) m.steps.push_back(*std::max_element(all.begin(), all.end()));
      if (record) DISTCA_RETURN_IF_ERROR(runtime::gather_trace(comm, trace.events(), trace_out));
    }
  }
  return Status::ok_status();
}

comm::Settings step_settings(const StepFlags& f) {
  comm::Settings s;
  s.add("command", "bench step").add("--long-doc", f.long_doc).add("--short-doc", f.short_doc).add("--heads", f.heads);
  s.add("--kv-heads", f.kv_heads).add("--head-dim", f.head_dim).add("--layers", f.layers).add("--reps", f.reps);
  s.add("--linear-width", f.linear_width).add("--mode", f.mode).add("--tolerance", f.tolerance).add("--align", f.align);
  s.add("--servers", f.servers).add("--trace given", !f.trace.empty());
  return s;
}

// The figures of every configuration (rank 0's), the speedups, --json and --trace.
int report(const StepFlags& f, int64_t ranks, const std::vector<Measured>& results, const std::vector<TraceEvent>& events) {

  auto find = [&](const std::string& s, runtime::OverlapMode m) -> const Measured* {
    for (const auto& x : results) {
      if (x.config.scheduler == s && x.config.mode == m) return &x;
    }
    return nullptr;
  };
  // speedup: cad over colocated in the first mode run (pingpong unless --mode says otherwise).
  const runtime::OverlapMode main_mode = results.front().config.mode;
  const Measured* col = find("colocated", main_mode);
  const Measured* cad = find("cad", main_mode);
  const Measured* pp = find("cad", runtime::OverlapMode::kPingPong);
  const Measured* sig = find("cad", runtime::OverlapMode::kSignal);
  const double speedup = median(col->steps) / median(cad->steps);
  // The same, paired by round: configurations run round-robin, so the two steps of one round
  // share the machine's state; the median of their ratios resists slow periods of a shared
  // host better than the ratio of medians.
  std::vector<double> paired;
  for (size_t i = 0; i < std::min(col->steps.size(), cad->steps.size()); ++i) paired.push_back(col->steps[i] / cad->steps[i]);
  const double speedup_paired = median(paired);
  const double ideal = col->ideal_flops_max / cad->ideal_flops_max;
  const bool have_exposed = pp && sig;
  const double exposed = have_exposed ? (median(pp->steps) - median(sig->steps)) / median(pp->steps) : 0;

  nlohmann::json j;
  j["backend"] = f.backend;
  j["ranks"] = static_cast<int64_t>(results.empty() ? 0 : ranks);
  j["omp_threads"] = omp_get_max_threads();
  j["long_doc"] = f.long_doc;
  j["short_doc"] = f.short_doc;
  j["heads"] = f.heads;
  j["kv_heads"] = f.kv_heads;
  j["head_dim"] = f.head_dim;
  j["layers"] = f.layers;
  j["reps"] = f.reps;
  j["linear_width"] = f.linear_width;
  j["tolerance"] = f.tolerance;
  j["align_rows"] = f.align ? runtime::query_tile_rows({f.heads, f.kv_heads, f.head_dim, 0}) : 1;
  j["results"] = nlohmann::json::array();
  for (const auto& m : results) {
    j["results"].push_back({{"scheduler", m.config.scheduler},
                            {"mode", runtime::overlap_mode_name(m.config.mode)},
                            {"median_s", median(m.steps)},
                            {"steps_s", m.steps},
                            {"servers", m.config.stateless ? "stateless" : "keep"},
                            {"outputs_valid", m.outputs_valid}});
  }
  j["ideal_speedup"] = ideal;
  j["speedup"] = speedup;
  j["speedup_paired"] = speedup_paired;
  j["speedup_mode"] = runtime::overlap_mode_name(main_mode);
  if (have_exposed) j["exposed"] = exposed;

  std::string report;
  for (const auto& m : results) {
    const std::string who = m.config.scheduler + (m.config.stateless ? " (stateless)" : "");
    appendf(report, "%-22s %-14s median %8.4f s%s\n", who.c_str(), runtime::overlap_mode_name(m.config.mode),
                median(m.steps), m.outputs_valid ? "" : "  (signal: outputs invalid)");
  }
  if (f.servers == "both" && results.back().config.stateless) {
    const Measured& st = results.back();
    const Measured* keep = find("cad", st.config.mode);
    const double extra = median(st.steps) / median(keep->steps) - 1;
    j["stateless_over_keep"] = 1 + extra;
    appendf(report, "stateless servers: %+.1f%% step time against servers that keep their inputs\n", 100 * extra);
  }
  appendf(report, "ideal speedup (FLOPs): %.3f\n", ideal);
  appendf(report, "speedup: %.3f\n", speedup);
  appendf(report, "speedup (paired by round): %.3f\n", speedup_paired);
  if (have_exposed) appendf(report, "exposed: %.1f%%\n", 100.0 * exposed);
  if (f.backend == "local") appendf(report, "note: local backend serialises the ranks' kernels; use --backend mpi for figures\n");
  std::vector<std::pair<std::string, std::string>> files;
  if (f.json == "-") {
    report += j.dump(2) + "\n";
  } else if (!f.json.empty()) {
    files.emplace_back(f.json, j.dump(2) + "\n");
  }
  if (!f.trace.empty()) files.emplace_back(f.trace, chrome_trace_json(events));
  if (Status w = write_files_atomic(files); !w.ok()) return fail(w);
  if (Status w = write_stdout(report); !w.ok()) return fail(w);
  return kExitOk;
}

int run(const StepFlags& f) {
  comm::LaunchOptions lo{f.backend == "mpi" ? comm::Backend::kMpi : comm::Backend::kLocal, f.ranks, {}};
  lo.mpi.progress = f.mpi_progress == "thread" ? comm::ProgressMode::kThread
                    : f.mpi_progress == "poll" ? comm::ProgressMode::kPoll
                                               : comm::ProgressMode::kAuto;
  lo.mpi.poll_interval_us = f.mpi_poll_us;
  lo.mpi.max_poll_interval_us = std::max(f.mpi_poll_us, f.mpi_max_poll_us);
  lo.mpi.timeout_s = f.mpi_timeout;
  std::vector<std::vector<Measured>> per;  // [slot]: this process's ranks
  std::vector<TraceEvent> events;
  auto prepare = [&](const comm::GroupInfo& g) -> Status {
    if (f.backend == "mpi" && g.size < 2) return Status::invalid_argument("--backend mpi needs at least 2 ranks (mpirun -np 2 ...)");
    per.resize(static_cast<size_t>(g.here));
    return Status::ok_status();
  };
  const comm::Launched launched = comm::launch(lo, step_settings(f), prepare, [&](comm::Communicator& c, int slot) {
    return run_rank(c, f, &per[static_cast<size_t>(slot)], slot == 0 ? &events : nullptr);
  });
  if (!launched.status.ok()) return launch_failed(launched);
  if (!launched.speaks) return kExitOk;
  return report(f, launched.group.size, per[0], events);
}

Runner setup(CLI::App& app) {
  auto f = std::make_shared<StepFlags>();
  app.add_option("--backend", f->backend, "local (rank threads) or mpi (under mpirun)")
      ->check(CLI::IsMember({"local", "mpi"}));
  app.add_option("--ranks", f->ranks, "ranks of the local backend")->check(CLI::Range(2, 64));
  app.add_option("--long-doc", f->long_doc, "tokens of rank 0's single document")->check(CLI::Range(int64_t{16}, int64_t{1} << 22));
  app.add_option("--short-doc", f->short_doc, "tokens of each document of the other ranks")->check(CLI::Range(int64_t{16}, int64_t{1} << 22));
  app.add_option("--heads", f->heads, "query heads")->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", f->kv_heads, "key/value heads (divides --heads)")->check(CLI::PositiveNumber);
  app.add_option("--head-dim", f->head_dim, "head dimension")->check(CLI::Range(1, 1024));
  app.add_option("--layers", f->layers, "layers per step")->check(CLI::Range(1, 64));
  app.add_option("--reps", f->reps, "timed steps per configuration (median; one more warms up)")->check(CLI::Range(1, 1000));
  app.add_option("--linear-width", f->linear_width,
                 "cost of the linear stand-in: a (tokens, W) x (W, W) sgemm per nano-batch and layer (0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{16384}));
  app.add_option("--tolerance", f->tolerance, "cad: every server within tolerance * mean of the mean load")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--align,!--no-align", f->align,
               "cad: cut documents on the kernel's query tiles, so no task pays tile padding (default on)");
  app.add_option("--servers", f->servers,
                 "cad servers: keep (forward inputs kept for backward), stateless (sent again), or both "
                 "(adds a stateless cad run)")
      ->check(CLI::IsMember({"keep", "stateless", "both"}));
  app.add_option("--mpi-progress", f->mpi_progress,
                 "mpi: who drives transfers during compute: a progress thread, the rank's own polls, or auto")
      ->check(CLI::IsMember({"auto", "thread", "poll"}));
  app.add_option("--mpi-poll-us", f->mpi_poll_us, "mpi: the progress thread's pause between polls (microseconds)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--mpi-max-poll-us", f->mpi_max_poll_us,
                 "mpi: the longest pause the progress thread backs off to while nothing completes")
      ->check(CLI::Range(0, 1000000));
  add_mpi_timeout(app, f->mpi_timeout, "mpi");
  app.add_option("--mode", f->mode, "overlap mode to run: pingpong, single-stream, signal or all");
  app.add_option("--json", f->json, "write the figures as JSON to FILE (- for stdout)");
  app.add_option("--trace", f->trace, "write a Chrome trace (Perfetto) of the last cad pingpong step");
  return [f] {
    if (f->heads % f->kv_heads != 0) return fail_input("--kv-heads must divide --heads");
    if (f->short_doc > f->long_doc) return fail_input("--short-doc must not exceed --long-doc");
    // Outputs are checked before any work (and, under mpirun, on every rank alike).
    if (Status st = check_outputs({{"--json", f->json, true}, {"--trace", f->trace}}); !st.ok()) {
      return fail_input(st.message());
    }
    if (f->mode != "all") {
      auto m = runtime::parse_overlap_mode(f->mode);
      if (!m.ok()) return fail(m.status());
    }
    return run(*f);
  };
}

}  // namespace

DISTCA_REGISTER_COMMAND(bench_step, {"step", "bench",
                                     "Layer step: colocated vs cad in pingpong, single-stream and signal modes", 62,
                                     &setup});

}  // namespace distca::cli::cmd_bench_step
