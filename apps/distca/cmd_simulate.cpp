// `distca simulate`: one training iteration on a simulated cluster under one strategy
// (docs/simulation-model.md), or a paper-reproduction sweep (--sweep NAME --out DIR,
// docs/simulation.md).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"
#include "launcher.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/trace.h"
#include "distca/core/specs.h"
#include "distca/cost/hardware_profile.h"
#include "distca/cost/profiled.h"
#include "distca/sim/request.h"
#include "distca/sim/simulator.h"
#include "distca/sim/sweeps.h"
#include "workload_flags.h"

extern char** environ;

namespace distca::cli::cmd_simulate {
namespace {

struct Options {
  WorkloadFlags workload;
  std::string model = "llama-8b";
  std::string hardware = "h200";
  int64_t gpus = 0;
  int64_t gpus_per_node = 0;  // 0: the hardware preset's
  int64_t pp = 1;
  int64_t microbatches = 0;   // 0: 1 without PP, else 2 x PP (--batch: the file's batches)
  std::string strategy = "cad";
  double mfu = 0.5;
  double attention_efficiency = 0.5;
  int64_t attention_tile = 128;
  std::string cost_table;
  double tolerance = 0.1;
  double wlb_mem_cap = 1.2;
  std::string dtype = "bf16";
  bool no_shard_optimizer = false;
  bool no_checkpointing = false;
  bool no_lm_head = false;
  bool no_grad_sync = false;
  std::string cad_servers = "keep";
  double inter_node_gbps = 0;     // GB/s per GPU; 0: the preset's
  double inter_node_latency_us = -1;  // < 0: the preset's
  double memory_gb = 0;           // 0: the preset's
  std::string trace_path;
  std::string json_path;  // "-": stdout
  bool json = false;
  bool full = false;
  // Sweep mode.
  std::string sweep;
  std::string out_dir;
  int64_t sweep_batches = 30;
  bool quick = false;
  bool no_plot = false;
  std::string batch_rule;  // fig9, fig10: fixed | memory-limit (empty: the sweep's default)
  // Which flags were given (CLI11 counts), for the mode checks.
  CLI::App* app = nullptr;
};

bool given(const Options& o, const char* flag) { return o.app->count(flag) > 0; }

// ---- plotting (the sim library writes the CSV and the script; drawing is the CLI's) ----------

// Runs `exe` on `script` with working directory `dir`, drawing into `outfile` (a name inside
// dir); gnuplot's own chatter goes to /dev/null. A failure to start, a signal or a non-zero
// exit is an error naming the script.
Status spawn_gnuplot(const std::string& exe, const std::string& dir, const std::string& script,
                     const std::string& outfile) {
  // gnuplot's single-quoted strings cannot hold a single quote.
  if (dir.find('\'') != std::string::npos) {
    return Status::invalid_argument("--out '" + dir + "': gnuplot cannot be given a directory name with a single quote");
  }
  std::vector<std::string> args = {exe, "-e", "cd '" + dir + "'; outfile='" + outfile + "'", script};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  if (posix_spawn_file_actions_init(&actions) != 0) return Status::io_error("cannot start gnuplot");
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return Status::io_error("cannot start " + exe + ": " + std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Status::io_error("lost track of gnuplot (" + std::string(std::strerror(errno)) + ")");
  }
  if (WIFSIGNALED(status)) {
    return Status::io_error("gnuplot was killed by signal " + std::to_string(WTERMSIG(status)) + " drawing " + script);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::io_error("gnuplot failed on " + script + " (exit " + std::to_string(WEXITSTATUS(status)) + ")");
  }
  return {};
}

// Draws `svg` from `script` (both in one directory): into a temporary name first, renamed into
// place, so the plot appears whole or not at all.
Status draw_plot(const std::string& exe, const std::string& script, const std::string& svg) {
  namespace fs = std::filesystem;
  const fs::path target = svg;
  const std::string dir = target.parent_path().string();
  const std::string tmp_name = temp_file_path(target.filename().string());
  const fs::path tmp = target.parent_path() / tmp_name;
  TempFileGuard guard(tmp.string());
  std::error_code ec;
  Status st = spawn_gnuplot(exe, dir, script, tmp_name);
  if (st.ok() && (!fs::is_regular_file(tmp, ec) || fs::file_size(tmp, ec) == 0)) {
    st = Status::io_error("gnuplot wrote nothing drawing " + script);
  }
  if (st.ok()) {
    fs::rename(tmp, target, ec);
    if (ec) st = Status::io_error("cannot write '" + svg + "': " + ec.message());
  }
  if (!st.ok()) fs::remove(tmp, ec);
  return st;
}

int run_sweep_mode(const Options& o) {
  if (o.out_dir.empty()) return fail_input("--sweep needs --out DIR");
  for (const char* f : {"--gpus", "--strategy", "--trace", "--json", "--batch", "--pp", "--microbatches"}) {
    if (given(o, f)) return fail_input(std::string(f) + " cannot be combined with --sweep");
  }
  sim::SweepOptions so;
  so.name = o.sweep;
  so.out_dir = o.out_dir;
  so.batches = given(o, "--batches") ? o.workload.options.batches : o.sweep_batches;
  so.batches_flag = given(o, "--batches") ? "--batches" : "--sweep-batches";
  so.seed = o.workload.options.seed;
  so.quick = o.quick;
  if (given(o, "--dist")) so.dist = o.workload.options.dist;
  so.cost_table = o.cost_table;
  so.batch_rule = o.batch_rule;
  if (given(o, "--batch-rule") && o.batch_rule.empty()) return fail_input("--batch-rule: expected fixed or memory-limit, got ''");
  Status st = sim::validate_sweep(so);
  if (!st.ok()) return fail(st);
  const bool tty = stderr_is_terminal();
  auto summary = sim::run_sweep(so, [tty](const sim::SweepProgress& p) {
    if (tty) std::fprintf(stderr, "\r[%lld/%lld] %s\033[K", static_cast<long long>(p.done),
                          static_cast<long long>(p.total), p.what.c_str());
  });
  if (tty) std::fprintf(stderr, "\n");
  if (!summary.ok()) return fail(summary.status());
  // The CSV and the script are written; a missing gnuplot only skips the drawing (the script
  // redraws later), a gnuplot that fails is an error.
  std::vector<std::string> drawn;
  std::string skipped;
  if (o.no_plot) {
    skipped = "--no-plot";
  } else if (const std::string exe = find_executable("gnuplot"); exe.empty()) {
    skipped = "gnuplot not found on PATH (run the .gp script later)";
  } else {
    for (size_t i = 0; i < summary->script_paths.size(); ++i) {
      st = draw_plot(exe, summary->script_paths[i], summary->svg_paths.at(i));
      if (!st.ok()) return fail(st);
      drawn.push_back(summary->svg_paths[i]);
    }
  }
  for (const auto& path : summary->csv_paths) std::printf("wrote %s\n", path.c_str());
  for (const auto& path : summary->script_paths) std::printf("wrote %s\n", path.c_str());
  for (const auto& path : drawn) std::printf("wrote %s\n", path.c_str());
  if (!skipped.empty()) std::printf("plot skipped: %s\n", skipped.c_str());
  for (const auto& [what, value] : summary->headline) std::printf("%-40s %.4f\n", what.c_str(), value);
  return kExitOk;
}

void print_result(const sim::SimResult& r, const Options& o) {
  std::printf("%s on %lld GPUs (%lld nodes of %lld, PP %lld, %lld micro-batches), %s, strategy %s\n",
              r.model.c_str(), static_cast<long long>(r.gpus), static_cast<long long>(r.units),
              static_cast<long long>(r.gpus_per_node), static_cast<long long>(r.pp),
              static_cast<long long>(r.microbatches), r.hardware.c_str(), r.strategy.name().c_str());
  std::printf("iteration %.4f s (pipeline %.4f s, gradient all-reduce %.4f s), %.3g tokens/s\n", r.iteration_seconds,
              r.pipeline_seconds, r.grad_sync_seconds, r.tokens_per_second);
  std::printf("DP %lld x CP %lld per stage; idle %.1f%%, exposed communication %.1f%%, bytes moved %s\n",
              static_cast<long long>(r.dp), static_cast<long long>(r.cp_degree), 100 * r.idle_fraction,
              100 * r.exposed_comm_fraction, human_bytes(r.bytes_total, 1000).c_str());
  std::printf("peak memory %s per GPU%s\n", human_bytes(r.peak_memory, 1000).c_str(),
              r.oom ? (", OUT OF MEMORY: " + r.oom_reason).c_str() : "");
  std::printf("plans %lld, tasks %lld, load max/mean %.4f (colocated %.4f), %.1f ms planning\n",
              static_cast<long long>(r.plan.plans), static_cast<long long>(r.plan.tasks), r.plan.load_max_over_mean,
              r.plan.load_before_max_over_mean, 1e3 * r.plan.plan_seconds);
  if (r.cp_candidates.size() > 1) {
    std::printf("CP degrees tried:");
    for (const auto& c : r.cp_candidates) {
      std::printf(" %lld: %.4f s%s;", static_cast<long long>(c.cp_degree), c.iteration_seconds, c.oom ? " (OOM)" : "");
    }
    std::printf("\n");
  }
  const size_t kMaxRows = 64;
  std::printf("\n%-5s %-5s %10s %10s %10s %10s %10s %10s %11s\n", "unit", "stage", "busy s", "linear s", "attn s",
              "exp.comm s", "idle s", "sent", "memory/GPU");
  for (size_t i = 0; i < r.per_unit.size() && (i < kMaxRows || o.full); ++i) {
    const auto& u = r.per_unit[i];
    std::printf("%-5zu %-5lld %10.4f %10.4f %10.4f %10.4f %10.4f %10s %11s\n", i, static_cast<long long>(u.stage),
                u.busy, u.linear, u.attention, u.exposed_comm, u.idle, human_bytes(u.bytes_sent, 1000).c_str(),
                human_bytes(u.memory.total(), 1000).c_str());
  }
  if (r.per_unit.size() > kMaxRows && !o.full) {
    std::printf("... %zu more units (--full lists them all; --json has every figure)\n", r.per_unit.size() - kMaxRows);
  }
}

// The simulator request of the flags (sim/request.h maps and checks it).
sim::SimRequest make_request(const Options& o) {
  sim::SimRequest req;
  req.model = o.model;
  req.hardware = o.hardware;
  req.gpus = o.gpus;
  if (given(o, "--gpus-per-node")) req.gpus_per_node = o.gpus_per_node;
  req.pp = o.pp;
  req.strategy = o.strategy;
  if (given(o, "--mfu")) req.mfu = o.mfu;
  if (given(o, "--attention-efficiency")) req.attention_efficiency = o.attention_efficiency;
  req.attention_tile = o.attention_tile;
  req.cost_table = o.cost_table;
  req.tolerance = o.tolerance;
  req.wlb_mem_cap = o.wlb_mem_cap;
  req.dtype = o.dtype;
  req.shard_optimizer = !o.no_shard_optimizer;
  req.activation_checkpointing = !o.no_checkpointing;
  req.lm_head = !o.no_lm_head;
  req.grad_sync = !o.no_grad_sync;
  req.cad_servers = o.cad_servers;
  if (given(o, "--inter-node-bw")) req.inter_node_gbps = o.inter_node_gbps;
  if (given(o, "--inter-node-latency")) req.inter_node_latency_us = o.inter_node_latency_us;
  if (given(o, "--memory-gb")) req.memory_gb = o.memory_gb;
  req.record_events = !o.trace_path.empty();
  return req;
}

// The micro-batches: drawn (--dist ...; checked against the cluster and the memory limit
// first) or read (--batch FILE, one per batch). kExitOk, or the exit code of the refusal.
int micro_batches(const Options& o, const sim::SimOptions& so, const std::string& memory_flags,
                  std::vector<Batch>& out) {
  const int64_t ups = so.cluster.units_per_stage();
  if (o.workload.batch_file.empty()) {
    if (given(o, "--ranks") && o.workload.options.ranks != ups) {
      return fail_input("--ranks " + std::to_string(o.workload.options.ranks) + " does not match the " +
                        std::to_string(ups) + " nodes per pipeline stage (simulate packs one rank per node; omit --ranks)");
    }
    if (given(o, "--batches")) return fail_input("--batches: simulate draws --microbatches micro-batches instead");
    const int64_t m = o.microbatches > 0 ? o.microbatches : (so.cluster.pp > 1 ? 2 * so.cluster.pp : 1);
    if (given(o, "--microbatches") && o.microbatches <= 0) return fail_input("--microbatches must be positive");
    if (m > 10000) return fail_input("--microbatches must be at most 10000");
    WorkloadOptions w = o.workload.options;
    auto layout = parse_layout(o.workload.layout);
    if (!layout.ok()) return fail(layout.status());
    w.layout = *layout;
    Status st = sim::validate_draw(w, so.cluster, m);
    if (!st.ok()) return fail(st);
    st = check_memory(sim::estimate_draw_bytes(so.cluster, w.tokens_per_rank, m),
                      memory_flags + " --tokens-per-rank " + std::to_string(w.tokens_per_rank) + " --microbatches " +
                          std::to_string(m));
    if (!st.ok()) return fail_input(st.message());
    auto drawn = sim::draw_microbatches(w, so.cluster, m);
    if (!drawn.ok()) return fail(drawn.status());
    out = std::move(drawn).value();
  } else {
    if (given(o, "--microbatches")) return fail_input("--microbatches: with --batch every batch of the file is one micro-batch");
    auto read = resolve_batches(o.workload);
    if (!read.ok()) return fail(read.status());
    out = std::move(read).value();
    for (size_t j = 0; j < out.size(); ++j) {
      if (out[j].ranks != ups) {
        return fail_input("--batch " + o.workload.batch_file + ": batch " + std::to_string(j) + " has " +
                          std::to_string(out[j].ranks) + " ranks; the cluster has " + std::to_string(ups) +
                          " nodes per pipeline stage");
      }
    }
  }
  return kExitOk;
}

// --trace and --json, written all or none (--json -: the JSON on stdout instead of the table).
int write_outputs(const Options& o, const sim::SimResult& r) {
  std::vector<std::pair<std::string, std::string>> files;  // written all or none
  std::string to_stdout;
  if (!o.trace_path.empty()) {
    files.emplace_back(o.trace_path, chrome_trace_json(r.events, sim::trace_metadata(r)));
  }
  if (!o.json_path.empty()) {
    nlohmann::json j = sim::to_json(r);
    if (o.workload.batch_file.empty()) {
      j["dist"] = o.workload.options.dist;
      j["seed"] = o.workload.options.seed;
      j["tokens_per_unit"] = o.workload.options.tokens_per_rank;
    } else {
      j["batch_file"] = o.workload.batch_file;
    }
    if (!o.trace_path.empty()) j["trace"] = o.trace_path;
    std::string text = j.dump(2) + "\n";
    if (o.json_path == "-") to_stdout = std::move(text);  // written after the files
    else files.emplace_back(o.json_path, std::move(text));
  }
  Status st = write_files_atomic(files);
  if (st.ok() && !to_stdout.empty()) st = write_stdout(to_stdout);
  return st.ok() ? kExitOk : fail(st);
}

int run(const Options& o) {
  if (!o.sweep.empty()) return run_sweep_mode(o);
  for (const char* f : {"--out", "--quick", "--no-plot", "--sweep-batches", "--batch-rule"}) {
    if (given(o, f)) return fail_input(std::string(f) + " needs --sweep");
  }
  // Every flag is checked before any batch is drawn, the outputs first.
  if (o.gpus <= 0) return fail_input(given(o, "--gpus") ? "--gpus must be positive (got " + std::to_string(o.gpus) + ")"
                                                       : "--gpus N is required (or --sweep NAME)");
  if (Status st = check_outputs({{"--json", o.json_path, true}, {"--trace", o.trace_path}}); !st.ok()) return fail(st);
  auto setup = sim::make_sim_options(make_request(o));
  if (!setup.ok()) return fail(setup.status());
  const sim::SimOptions& so = setup->options;
  const std::string memory_flags = "--gpus " + std::to_string(o.gpus) + " --pp " + std::to_string(o.pp) +
                                   (o.trace_path.empty() ? "" : " --trace");
  std::vector<Batch> mbs;
  if (const int code = micro_batches(o, so, memory_flags, mbs); code != kExitOk) return code;
  // The micro-batches are known now: what simulate() allocates follows from their pieces.
  Status st = check_memory(sim::estimate_simulate_bytes(so, mbs),
                           memory_flags + (o.workload.batch_file.empty()
                                               ? " --tokens-per-rank " + std::to_string(o.workload.options.tokens_per_rank)
                                               : " --batch " + o.workload.batch_file) +
                               " (" + std::to_string(mbs.size()) + " micro-batches)");
  if (!st.ok()) return fail_input(st.message());
  auto result = sim::simulate(so, mbs);
  if (!result.ok()) return fail(result.status());
  if (const int code = write_outputs(o, *result); code != kExitOk || !o.json_path.empty()) return code;
  print_result(*result, o);
  if (!o.trace_path.empty()) std::printf("\ntrace written to %s (open in https://ui.perfetto.dev)\n", o.trace_path.c_str());
  return kExitOk;
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  o->app = &sub;
  add_workload_flags(sub, o->workload);
  sub.add_option("--model", o->model, "Model preset (tiny, llama-8b, llama-34b)")->capture_default_str();
  sub.add_option("--hardware", o->hardware, "Hardware preset (h200, local-cpu) or a `distca profile --hardware-out` FILE")->capture_default_str();
  sub.add_option("--gpus", o->gpus, "GPUs in the cluster (a multiple of the node size)");
  sub.add_option("--gpus-per-node", o->gpus_per_node, "GPUs per node = TP degree (default: the preset's)");
  sub.add_option("--pp", o->pp, "Pipeline stages (divides the nodes; at most the model's layers)")->capture_default_str();
  sub.add_option("--microbatches", o->microbatches, "Micro-batches per iteration (default 1, or 2 x PP)");
  sub.add_option("--strategy", o->strategy,
                 "colocated | wlb | wlb:C | percp:C | cad | cad:pingpong | cad:single-stream | cad:signal")
      ->capture_default_str();
  sub.add_option("--mfu", o->mfu, "Linear layers' fraction of peak FLOP/s, (0, 1]")->capture_default_str();
  sub.add_option("--attention-efficiency", o->attention_efficiency, "Attention's fraction of peak FLOP/s, (0, 1]")
      ->capture_default_str();
  sub.add_option("--attention-tile", o->attention_tile, "Query rows a short attention shard is padded to")
      ->capture_default_str();
  sub.add_option("--cost-table", o->cost_table, "Attention seconds from a `distca profile` table instead");
  sub.add_option("--tolerance", o->tolerance, "cad: scheduler tolerance, [0, 1]")->capture_default_str();
  sub.add_option("--wlb-mem-cap", o->wlb_mem_cap, "wlb: token cap per DP group over the mean (>= 1)")
      ->capture_default_str();
  sub.add_option("--dtype", o->dtype, "Activation and parameter type: bf16 | fp32")->capture_default_str();
  sub.add_flag("--no-shard-optimizer", o->no_shard_optimizer, "Replicate optimizer state on every DP rank");
  sub.add_flag("--no-checkpointing", o->no_checkpointing, "Store every activation (no recompute in backward)");
  sub.add_flag("--no-lm-head", o->no_lm_head, "Leave the LM head out (time and memory)");
  sub.add_flag("--no-grad-sync", o->no_grad_sync, "Leave the DP gradient all-reduce out");
  sub.add_option("--cad-servers", o->cad_servers,
                 "cad: keep (servers keep forward inputs for backward) | stateless (sent again with dO)")
      ->check(CLI::IsMember({"keep", "stateless"}))
      ->capture_default_str();
  sub.add_option("--inter-node-bw", o->inter_node_gbps, "Override: inter-node GB/s per GPU");
  sub.add_option("--inter-node-latency", o->inter_node_latency_us, "Override: inter-node latency, microseconds");
  sub.add_option("--memory-gb", o->memory_gb, "Override: GPU memory, GB");
  sub.add_option("--trace", o->trace_path, "Write a Chrome trace (Perfetto) to FILE");
  sub.add_option("--json", o->json_path, "Print the JSON result (or write it to FILE, atomically)")
      ->expected(0, 1)
      ->default_str("-");
  sub.add_flag("--full", o->full, "List every unit in the table");
  sub.add_option("--sweep", o->sweep, "Run a paper-reproduction sweep: fig4b | fig9 | fig10 | fig11 | fig12");
  sub.add_option("--out", o->out_dir, "--sweep: output directory");
  sub.add_option("--sweep-batches", o->sweep_batches, "--sweep: batches per configuration")->capture_default_str();
  sub.add_flag("--quick", o->quick, "--sweep: fewer configurations");
  sub.add_flag("--no-plot", o->no_plot, "--sweep: do not run gnuplot (the .gp script still draws later)");
  sub.add_option("--batch-rule", o->batch_rule,
                 "--sweep fig9|fig10: memory-limit (default: the largest batch WLB-ideal fits) | fixed");
  return [o] { return run(*o); };
}

}  // namespace

DISTCA_REGISTER_COMMAND(simulate, {"simulate", "",
                                   "Simulate one training iteration on a cluster (or --sweep a paper figure)", 30,
                                   &setup});

}  // namespace distca::cli::cmd_simulate
