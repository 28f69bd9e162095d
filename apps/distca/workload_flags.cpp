#include "workload_flags.h"

#include <nlohmann/json.hpp>

#include "distca/core/io.h"
#include "distca/data/json_field.h"

namespace distca::cli {
void add_workload_flags(CLI::App& app, WorkloadFlags& f) {
  WorkloadOptions& o = f.options;
  std::vector<CLI::Option*> gen;
  gen.push_back(app.add_option("--dist", o.dist,
                               "Document lengths: pretrain | prolong | fixed:N | uniform:A:B | file:PATH")
                    ->capture_default_str());
  gen.push_back(app.add_option("--ranks", o.ranks, "Ranks the batch is packed into")->capture_default_str());
  gen.push_back(app.add_option("--tokens-per-rank", o.tokens_per_rank,
                               "Token slots per rank (a positive multiple of 16)")
                    ->capture_default_str());
  gen.push_back(app.add_option("--layout", f.layout, "contiguous | head-tail")->capture_default_str());
  gen.push_back(app.add_option("--max-doc-len", o.max_doc_len,
                               "Cap on document length (>= 16, rounded down to a multiple of 16; 0: none)")
                    ->capture_default_str());
  gen.push_back(app.add_option("--batches", o.batches, "Independent batches to draw")->capture_default_str());
  gen.push_back(app.add_option("--seed", o.seed, "Random seed (batch b uses stream b)")->capture_default_str());
  gen.push_back(app.add_option("--long-prob", o.prolong_long_prob,
                               "prolong: probability a long document becomes one of tokens-per-rank tokens")
                    ->capture_default_str());
  CLI::Option* batch = app.add_option("--batch", f.batch_file,
                                      "Read the batch(es) from FILE (`workload --json --full` output) "
                                      "instead of generating them");
  for (CLI::Option* g : gen) batch->excludes(g);
}

Result<std::vector<Batch>> resolve_batches(const WorkloadFlags& f) {
  if (f.batch_file.empty()) {
    WorkloadOptions o = f.options;
    DISTCA_ASSIGN_OR_RETURN(o.layout, parse_layout(f.layout));
    return make_batches(o);
  }
  const std::string ctx = "--batch " + f.batch_file;
  auto j = read_json_fields(f.batch_file);
  if (!j.ok()) return Status(j.status().code(), ctx + ": " + j.status().message());
  return batches_from_json(*j, ctx);
}

int fail_before_work(const Status& status) {
  return status.code() == StatusCode::kOutOfMemory ? fail_input(status.message()) : fail(status);
}

Result<BatchShape> estimate_shape(const WorkloadFlags& f) {
  WorkloadOptions o = f.options;
  DISTCA_ASSIGN_OR_RETURN(o.layout, parse_layout(f.layout));
  return distca::estimate_shape(o);
}

std::string shape_flags(const WorkloadFlags& f) {
  if (!f.batch_file.empty()) return "--batch " + f.batch_file;
  return "--ranks " + std::to_string(f.options.ranks) + " --tokens-per-rank " +
         std::to_string(f.options.tokens_per_rank) + " --batches " + std::to_string(f.options.batches);
}

Status check_batch_file_memory(const WorkloadFlags& f) {
  if (f.batch_file.empty()) return Status::ok_status();
  DISTCA_RETURN_IF_ERROR(check_input_file(f.batch_file).with_context("--batch"));
  return check_json_file_memory(f.batch_file, "--batch " + f.batch_file);
}

}  // namespace distca::cli
