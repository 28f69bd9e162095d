// `distca plan`: shard a batch's core attention into CA-tasks, place them on servers, print
// the balance and the traffic (docs/plan-format.md for the JSON, docs/scheduler.md for the
// algorithms).
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "command.h"
#include "distca/core/clock.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/specs.h"
#include "distca/cost/cost_model.h"
#include "distca/cost/options.h"
#include "distca/cost/profiled.h"
#include "distca/cost/hardware_profile.h"
#include "distca/plan/auto_tolerance.h"
#include "distca/plan/plan.h"
#include "distca/plan/plan_json.h"
#include "distca/plan/plan_memory.h"
#include "distca/plan/validate.h"
#include "workload_flags.h"

namespace distca::cli::cmd_plan {
namespace {

struct Options {
  WorkloadFlags workload;
  std::string model = "llama-8b";
  std::string scheduler = "cad";
  std::string tolerance = "0.05";  // or "auto"
  std::string hardware;            // --tolerance auto: the hardware profile
  double wlb_mem_cap = 1.2;
  int64_t align_rows = 1;
  std::string dtype = "bf16";
  std::string json_path;  // empty: table; "-": stdout
  std::string cost_table;  // empty: causal pairs
  int64_t ranks_per_host = 0;  // 0 and host_map empty: no topology
  std::string host_map;
  int64_t inter_host_price = 0;  // 0: the default price
  bool full = false;
};

void print_header(const nlohmann::json& s) {
  char tol[32] = "auto (per batch)";
  if (!s["tolerance"].is_string()) std::snprintf(tol, sizeof tol, "%g", s["tolerance"].get<double>());
  std::printf("scheduler %s, tolerance %s%s, %s activations, cost in %s\n", s["scheduler"].get<std::string>().c_str(),
              tol, s.contains("tolerance_auto") ? " (auto)" : "", s["dtype"].get<std::string>().c_str(),
              s["cost_unit"].get<std::string>().c_str());
  std::printf("servers %g, tasks %g, load max/mean %.4f (colocated %.4f), tokens max/mean %.4f\n",
              s["servers"].get<double>(), s["tasks"].get<double>(), s["load_max_over_mean"].get<double>(),
              s["load_before_max_over_mean"].get<double>(), s["tokens_max_over_mean"].get<double>());
  std::printf("bytes per layer: forward %s, backward %s, busiest rank %s",
              human_bytes(s["comm_bytes_total"].get<double>(), 1024).c_str(),
              human_bytes(s["comm_bytes_backward"].get<double>(), 1024).c_str(),
              human_bytes(s["comm_bytes_max_rank"].get<double>(), 1024).c_str());
  if (s["allgather_bytes"].get<double>() > 0) {
    std::printf(" (of which K/V all-gather %s)", human_bytes(s["allgather_bytes"].get<double>(), 1024).c_str());
  }
  if (s.contains("hosts")) {
    std::printf("\nforward bytes by link (inter-host price %lld): inter-host %s, intra-host %s",
                static_cast<long long>(s["inter_host_price"].get<int64_t>()),
                human_bytes(s["inter_host_bytes"].get<double>(), 1024).c_str(),
                human_bytes(s["intra_host_bytes"].get<double>(), 1024).c_str());
  }
  std::printf("\nplan time %.3f ms\n\n", 1e3 * s["plan_seconds"].get<double>());
}

void print_ranks(const nlohmann::json& s) {
  std::printf("%-6s %12s %18s %18s %14s %14s\n", "rank", "tokens", "work before", "work after",
              "bytes out", "bytes in");
  for (const auto& row : s["per_rank"]) {
    std::printf("%-6lld %12lld %18.0f %18.0f %14s %14s\n", static_cast<long long>(row["rank"].get<int64_t>()),
                static_cast<long long>(row["tokens"].get<int64_t>()), row["load_before"].get<double>(),
                row["load"].get<double>(), human_bytes(row["bytes_out"].get<double>(), 1024).c_str(),
                human_bytes(row["bytes_in"].get<double>(), 1024).c_str());
  }
}

void print_batches(const nlohmann::json& list) {
  std::printf("%-6s %8s %12s %16s %16s %12s\n", "batch", "tasks", "load max/mean", "fwd bytes",
              "busiest rank", "plan ms");
  for (size_t b = 0; b < list.size(); ++b) {
    const auto& s = list[b];
    std::printf("%-6zu %8lld %12.4f %16s %16s %12.3f\n", b, static_cast<long long>(s["tasks"].get<int64_t>()),
                s["load_max_over_mean"].get<double>(), human_bytes(s["comm_bytes_total"].get<double>(), 1024).c_str(),
                human_bytes(s["comm_bytes_max_rank"].get<double>(), 1024).c_str(), 1e3 * s["plan_seconds"].get<double>());
  }
}

// Memory (docs/scheduler.md, "Memory"; plan/plan_memory.h for the plan itself); the
// constants are measured costs rounded up (by 1.1-1.7x on the shapes measured). What stays
// held: the batches and every batch's summary, with --full every batch's JSON plan, whose
// exchange arrays are dense [ranks] per rank (quadratic in ranks). On top, the plan of one
// batch and its validation: before any work estimated with a task per piece and no row
// blocks; for percp, before scheduling, from its exact task count; and, once the schedule is
// known and before build_plan allocates, from its tasks and row blocks (plan_size).
constexpr double kSummaryPerRank = 2048;  // measured 1.6 KB: per_rank object and its text

double plan_held_bytes(const BatchShape& s, bool full) {
  const double per_batch = kSummaryPerRank * s.ranks + (full ? plan_json_bytes(s.ranks) : 0);
  return batches_bytes(s) + s.batches * per_batch;
}

double plan_upfront_bytes(const BatchShape& s, bool full) {
  return plan_held_bytes(s, full) + plan_bytes(s.ranks, s.pieces, s.pieces, 0, 0);
}

// --tolerance: a number, or auto with its model from --hardware (read here, before any work).
struct AutoTolerance {
  bool on = false;
  std::unique_ptr<AttentionCostModel> table;  // what model.seconds points to
  AutoToleranceModel model;
};

Status read_tolerance(const Options& o, const std::optional<double>& tolerance, const SchedulerSpec& spec,
                      AutoTolerance& a) {
  a.on = !tolerance.has_value();
  if (!a.on) {
    if (!o.hardware.empty()) return Status::invalid_argument("--hardware is used only with --tolerance auto");
    return Status::ok_status();
  }
  if (o.hardware.empty()) return Status::invalid_argument("--tolerance auto needs --hardware FILE (the link and attention figures)");
  if (spec.kind != SchedulerKind::kCad && spec.kind != SchedulerKind::kCadSymmetric) {
    return Status::invalid_argument("--tolerance auto needs --scheduler cad or cad-symmetric (got " + spec.name() + ")");
  }
  auto profile = load_hardware_profile(o.hardware);
  if (!profile.ok()) return Status(profile.status().code(), "--hardware: " + profile.status().message());
  HostTopology priced;
  if (o.inter_host_price != 0) priced.inter_host_price = o.inter_host_price;
  DISTCA_ASSIGN_OR_RETURN(a.model, auto_tolerance_model(*profile, priced, true, &a.table));
  return Status::ok_status();
}

// The plans' summary (one batch: its own; several: medians), as JSON (--json) or a table.
int report(const Options& o, const std::string& model_name, const std::vector<nlohmann::json>& summaries, bool auto_tol) {
  nlohmann::json out = summaries.size() == 1 ? summaries.front() : summarize_batches(summaries);
  if (auto_tol && summaries.size() > 1) out["tolerance"] = "auto";  // per_batch holds each choice
  out["model"] = model_name;
  if (o.workload.batch_file.empty()) {
    out["dist"] = o.workload.options.dist;
    out["layout"] = o.workload.layout;
    out["seed"] = o.workload.options.seed;
  } else {
    out["batch_file"] = o.workload.batch_file;
  }

  if (!o.json_path.empty()) {
    const Status written = write_output_flag(o.json_path, out.dump(2) + "\n");
    return written.ok() ? kExitOk : fail(written);
  }
  std::printf("model %s, %s\n", model_name.c_str(),
              o.workload.batch_file.empty() ? ("workload " + o.workload.options.dist + ", layout " + o.workload.layout).c_str()
                                            : ("batch file " + o.workload.batch_file).c_str());
  if (summaries.size() == 1) {
    print_header(out);
    print_ranks(out);
  } else {
    std::printf("%zu batches: medians (load max/mean: the worst batch)\n", summaries.size());
    print_header(out);
    print_batches(out["per_batch"]);
  }
  return kExitOk;
}

// What the flags say about planning, every flag checked before any batch is drawn; filled in
// place (options.cost points into it).
struct Setup {
  ModelSpec model;
  PlanSetup plan;
  AutoTolerance autotol;
};

Status make_setup(const Options& o, Setup& s) {
  DISTCA_ASSIGN_OR_RETURN(s.model, model_flag(o.model));
  DISTCA_ASSIGN_OR_RETURN(const std::optional<double> tolerance, parse_tolerance(o.tolerance));
  const PlanFlags flags{o.scheduler, o.dtype, tolerance.value_or(0.05), o.wlb_mem_cap, o.align_rows, o.cost_table};
  DISTCA_RETURN_IF_ERROR(make_plan_setup(s.model, flags, s.plan));
  DISTCA_RETURN_IF_ERROR(read_tolerance(o, tolerance, s.plan.spec, s.autotol));
  if (Status st = check_output_flag("--json", o.json_path); !st.ok()) return Status::invalid_argument(st.message());
  return Status::ok_status();
}

// One batch planned, validated and summarized into `summaries` (`held`: what the earlier
// batches hold); kExitOk, or the exit code after the one line.
int plan_batch(const Options& o, Setup& s, const Batch& b, double held, const std::string& what,
               std::vector<nlohmann::json>& summaries) {
  const SchedulerSpec& spec = s.plan.spec;
  ScheduleOptions& options = s.plan.options;
  if (spec.kind == SchedulerKind::kPerCp) {
    Status st = check_memory(held + plan_schedule_bytes(b, spec), what + " --scheduler " + spec.name());
    if (!st.ok()) return fail(st);
  }
  const double t0 = monotonic_seconds();
  nlohmann::json auto_json;
  if (s.autotol.on) {
    auto choice = choose_tolerance(b, spec, options, s.autotol.model);
    if (!choice.ok()) return fail(choice.status());
    options.tolerance = choice->tolerance;
    auto_json = {{"candidates", kAutoTolerances}, {"predicted_seconds", choice->predicted}};
  }
  const double choosing = monotonic_seconds() - t0;  // --tolerance auto's share of plan_seconds
  double seconds = 0;
  auto plan = make_plan_within_memory(b, spec, options, held, what, &seconds);
  if (!plan.ok()) return fail(plan.status());
  seconds += choosing;
  // Every plan is checked before it is reported; a failure here is a planner bug.
  Status valid = validate_plan(*plan, b, options.cost);
  if (!valid.ok()) return fail(Status::internal("the plan failed validation: " + valid.message()));
  nlohmann::json summary = plan_summary_json(*plan, seconds);
  if (o.full) summary["plan"] = plan_to_json(*plan);
  if (s.autotol.on) summary["tolerance_auto"] = std::move(auto_json);
  summaries.push_back(std::move(summary));
  return kExitOk;
}

int run(const Options& o) {
  // Every flag is checked before any batch is drawn or planned.
  Setup s;
  if (Status st = make_setup(o, s); !st.ok()) return fail(st);
  const std::string what = shape_flags(o.workload) + (o.full ? " --full" : "");
  const SchedulerSpec& spec = s.plan.spec;
  // Drawn batches: the topology and percp's degree checked from the flags, before any is drawn.
  auto check = [&]() -> Status {
    DISTCA_RETURN_IF_ERROR(
        topology_from_flags(o.ranks_per_host, o.host_map, o.inter_host_price, o.workload.options.ranks).status());
    if (spec.kind == SchedulerKind::kPerCp && o.workload.options.ranks % spec.cp_degree != 0) {
      return Status::invalid_argument("--scheduler " + spec.name() + ": CP degree " + std::to_string(spec.cp_degree) +
                                      " does not divide --ranks " + std::to_string(o.workload.options.ranks));
    }
    return Status::ok_status();
  };
  auto batches = load_batches(o.workload, [&](const BatchShape& b) { return plan_upfront_bytes(b, o.full); }, what, check);
  if (!batches.ok()) return fail(batches.status());
  for (const Batch& b : *batches) {
    auto topology = topology_from_flags(o.ranks_per_host, o.host_map, o.inter_host_price, b.ranks);
    if (!topology.ok()) return fail(topology.status());
    s.plan.options.topology = std::move(topology).value();
    if (Status st = s.plan.options.validate(b, spec); !st.ok()) return fail(st);
  }
  const BatchShape shape = shape_of(*batches);
  const double held = plan_held_bytes(shape, o.full);
  std::vector<nlohmann::json> summaries;
  for (const Batch& b : *batches) {
    if (const int rc = plan_batch(o, s, b, held, what, summaries); rc != kExitOk) return rc;
  }
  return report(o, s.model.name, summaries, s.autotol.on);
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  add_workload_flags(sub, o->workload);
  sub.add_option("--model", o->model, "Model preset for the byte counts (tiny, llama-8b, llama-34b)")
      ->capture_default_str();
  sub.add_option("--scheduler", o->scheduler, "colocated | wlb | percp:C | cad | cad-symmetric")
      ->capture_default_str();
  sub.add_option("--tolerance", o->tolerance,
                 "cad: every server within tolerance * mean load, in [0, 1]; auto: chosen per batch (needs --hardware)")
      ->capture_default_str();
  sub.add_option("--hardware", o->hardware,
                 "--tolerance auto: a `distca profile --hardware-out` file (attention seconds and link rate)");
  sub.add_option("--align-rows", o->align_rows,
                 "cad: cut documents only at multiples of N positions (the kernel's query tile; 1: anywhere)")
      ->capture_default_str();
  sub.add_option("--wlb-mem-cap", o->wlb_mem_cap, "wlb: per-rank token cap as a factor over the mean (>= 1)")
      ->capture_default_str();
  sub.add_option("--cost-table", o->cost_table,
                 "Balance predicted seconds from a `distca profile` table instead of causal pairs");
  CLI::Option* rph = sub.add_option("--ranks-per-host", o->ranks_per_host,
                                    "cad: ranks [h*N, (h+1)*N) share host h; bytes between hosts are priced higher");
  sub.add_option("--host-map", o->host_map, "cad: the host of every rank, comma-separated (0,0,1,1)")->excludes(rph);
  sub.add_option("--inter-host-price", o->inter_host_price,
                 "cad: what a byte between hosts costs in bytes within a host (default " +
                     std::to_string(kDefaultInterHostPrice) + ")");
  sub.add_option("--dtype", o->dtype, "Activation type of the byte counts: bf16 | fp32")->capture_default_str();
  CLI::Option* json = sub.add_option("--json", o->json_path, "Write the JSON summary to FILE (atomically), or - for stdout");
  sub.add_flag("--full", o->full, "With --json: add every task and every exchange layout")->needs(json);
  return [o] { return run(*o); };
}

}  // namespace

DISTCA_REGISTER_COMMAND(plan, {"plan", "", "Cut core attention into CA-tasks, place them on servers, report balance and bytes",
                               20, &setup});

}  // namespace distca::cli::cmd_plan
