#include "workload_flags.h"

#include <nlohmann/json.hpp>

#include "distca/core/io.h"
#include "distca/core/memory.h"
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

Result<std::vector<Batch>> load_batches(const WorkloadFlags& f, const std::function<double(const BatchShape&)>& bytes,
                                        const std::string& what, const std::function<Status()>& check) {
  if (!f.batch_file.empty()) {
    DISTCA_ASSIGN_OR_RETURN(std::vector<Batch> batches, read_batch_file(f.batch_file));
    DISTCA_RETURN_IF_ERROR(check_memory(bytes(shape_of(batches)), what));
    return batches;
  }
  DISTCA_RETURN_IF_ERROR(f.options.validate());
  if (check) DISTCA_RETURN_IF_ERROR(check());
  WorkloadOptions o = f.options;
  DISTCA_ASSIGN_OR_RETURN(o.layout, parse_layout(f.layout));
  DISTCA_ASSIGN_OR_RETURN(const BatchShape shape, estimate_shape(o));
  DISTCA_RETURN_IF_ERROR(check_memory(bytes(shape), what));
  return make_batches(o);
}

std::string shape_flags(const WorkloadFlags& f) {
  if (!f.batch_file.empty()) return "--batch " + f.batch_file;
  return "--ranks " + std::to_string(f.options.ranks) + " --tokens-per-rank " +
         std::to_string(f.options.tokens_per_rank) + " --batches " + std::to_string(f.options.batches);
}

}  // namespace distca::cli
