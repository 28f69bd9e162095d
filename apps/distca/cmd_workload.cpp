// `distca workload`: draw and pack batches, print their attention balance (docs/workloads.md).
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "command.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/specs.h"
#include "distca/plan/batch_summary.h"
#include "workload_flags.h"

namespace distca::cli::cmd_workload {
namespace {

struct Options {
  WorkloadFlags workload;
  std::string model = "llama-8b";
  bool json = false;
  bool full = false;
};

constexpr size_t kMaxTableBatches = 40;

void print_batch_table(const nlohmann::json& s) {
  const auto& rows = s["per_rank"];
  const double total = s["attn_pairs"].get<double>();
  std::printf("%-6s %14s %10s %20s %8s\n", "rank", "tokens", "documents", "attention pairs", "share");
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    const double pairs = row["attn_pairs"].get<double>();
    std::printf("%-6zu %14lld %10lld %20lld %7.1f%%\n", r, static_cast<long long>(row["tokens"].get<int64_t>()),
                static_cast<long long>(row["documents"].get<int64_t>()),
                static_cast<long long>(row["attn_pairs"].get<int64_t>()), total > 0 ? 100.0 * pairs / total : 0.0);
  }
}

void print_batches_table(const nlohmann::json& list) {
  std::printf("%-6s %10s %20s %20s %9s\n", "batch", "documents", "max rank pairs", "mean rank pairs", "max/mean");
  for (size_t b = 0; b < list.size() && b < kMaxTableBatches; ++b) {
    const auto& s = list[b];
    int64_t max_pairs = 0;
    for (const auto& row : s["per_rank"]) max_pairs = std::max(max_pairs, row["attn_pairs"].get<int64_t>());
    std::printf("%-6zu %10lld %20lld %20.0f %9.3f\n", b, static_cast<long long>(s["documents"].get<int64_t>()),
                static_cast<long long>(max_pairs),
                s["attn_pairs"].get<double>() / s["ranks"].get<double>(), s["attn_load_max_over_mean"].get<double>());
  }
  if (list.size() > kMaxTableBatches) {
    std::printf("... %zu more batches (use --json for all)\n", list.size() - kMaxTableBatches);
  }
}

// What `workload` holds at its peak (docs/workloads.md, "Memory"): the batches, every batch's
// summary (a JSON object per rank, measured 1.6 KB with its text) and, with --full, every
// piece as JSON (measured 1.06 KB with its text). The constants round the measurements up.
double workload_bytes(const BatchShape& s, bool full) {
  constexpr double kSummaryPerRank = 2560;
  const double per_batch = kSummaryPerRank * s.ranks + (full ? batch_json_bytes(s) : 0);
  return batches_bytes(s) + s.batches * per_batch;
}

int run(const Options& o) {
  // Everything the user typed is checked before any batch is drawn.
  auto model = model_flag(o.model);
  if (!model.ok()) return fail(model.status());
  const std::string what = shape_flags(o.workload) + (o.full ? " --full" : "");
  auto batches = load_batches(o.workload, [&](const BatchShape& s) { return workload_bytes(s, o.full); }, what);
  if (!batches.ok()) return fail(batches.status());

  nlohmann::json out;
  if (o.workload.batch_file.empty()) {
    out["dist"] = o.workload.options.dist;
    out["layout"] = o.workload.layout;
    out["seed"] = o.workload.options.seed;
    if (o.workload.options.max_doc_len > 0) out["max_doc_len"] = o.workload.options.max_doc_len;
    if (o.workload.options.dist == "prolong") out["long_prob"] = o.workload.options.prolong_long_prob;
  } else {
    out["batch_file"] = o.workload.batch_file;
  }
  out["model"] = model->name;

  std::vector<nlohmann::json> summaries;
  for (const Batch& b : *batches) {
    nlohmann::json s = batch_summary_json(b, *model);
    if (o.full) s["batch"] = batch_to_json(b);
    summaries.push_back(std::move(s));
  }
  out.update(batches_summary_json(std::move(summaries)));

  if (o.json) {
    const Status written = write_stdout(out.dump(2) + "\n");
    return written.ok() ? kExitOk : fail(written);
  }
  std::printf("workload: %s, layout %s, model %s\n",
              out.contains("dist") ? out["dist"].get<std::string>().c_str()
                                   : ("batch file " + o.workload.batch_file).c_str(),
              out.contains("layout") ? out["layout"].get<std::string>().c_str() : "as read",
              model->name.c_str());
  if (out.contains("ranks")) {
    std::printf("ranks %lld, tokens/rank %lld\n", static_cast<long long>(out["ranks"].get<int64_t>()),
                static_cast<long long>(out["tokens_per_rank"].get<int64_t>()));
  }
  if (!out.contains("batches")) {
    std::printf("documents %lld, attention imbalance (max/mean pairs) %.3f\n\n",
                static_cast<long long>(out["documents"].get<int64_t>()), out["attn_load_max_over_mean"].get<double>());
    print_batch_table(out);
  } else {
    std::printf("batches %zu, documents %lld, attention imbalance (max/mean pairs) mean %.3f, max %.3f\n\n",
                out["batches"].size(), static_cast<long long>(out["documents"].get<int64_t>()),
                out["attn_load_max_over_mean"].get<double>(), out["attn_load_max_over_mean_max"].get<double>());
    print_batches_table(out["batches"]);
  }
  return kExitOk;
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  add_workload_flags(sub, o->workload);
  sub.add_option("--model", o->model, "Model preset for the FLOPs figures (tiny, llama-8b, llama-34b)")
      ->capture_default_str();
  CLI::Option* json = sub.add_flag("--json", o->json, "Print one JSON object instead of a table");
  sub.add_flag("--full", o->full, "With --json: include the packed batch (readable back with --batch)")->needs(json);
  return [o] { return run(*o); };
}

}  // namespace

DISTCA_REGISTER_COMMAND(workload, {"workload", "", "Draw document lengths, pack them into ranks, print the balance",
                                   10, &setup});

}  // namespace distca::cli::cmd_workload
