#include "workload_flags.h"

#include <algorithm>
#include <numeric>

#include <nlohmann/json.hpp>

#include "distca/core/io.h"
#include "distca/cost/analytic.h"
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

nlohmann::json batch_summary_json(const Batch& batch, const ModelSpec& m) {
  const double linear_per_token = linear_forward_flops_per_token(m);
  nlohmann::json per_rank = nlohmann::json::array();
  int64_t total_pairs = 0, max_pairs = 0, total_tokens = 0;
  for (int64_t r = 0; r < batch.ranks; ++r) {
    const auto& pieces = batch.per_rank[static_cast<size_t>(r)];
    int64_t tokens = 0, pairs = 0;
    std::vector<int64_t> docs;
    for (const Piece& p : pieces) {
      tokens += p.len;
      // Co-located: the piece's queries attend to the document's prefix up to their position.
      pairs += causal_pairs(p.offset, p.offset + p.len);
      docs.push_back(p.doc);
    }
    std::sort(docs.begin(), docs.end());
    const auto n_docs = std::unique(docs.begin(), docs.end()) - docs.begin();
    per_rank.push_back({{"tokens", tokens},
                        {"documents", n_docs},
                        {"attn_pairs", pairs},
                        {"attn_flops", attention_forward_flops(m, static_cast<double>(pairs))},
                        {"linear_flops", linear_per_token * static_cast<double>(tokens)}});
    total_pairs += pairs;
    max_pairs = std::max(max_pairs, pairs);
    total_tokens += tokens;
  }
  const double mean = static_cast<double>(total_pairs) / static_cast<double>(batch.ranks);
  return {{"ranks", batch.ranks},
          {"tokens_per_rank", batch.tokens_per_rank},
          {"documents", batch.num_documents()},
          {"tokens", total_tokens},
          {"attn_pairs", total_pairs},
          {"attn_load_max_over_mean", mean > 0 ? static_cast<double>(max_pairs) / mean : 1.0},
          {"per_rank", std::move(per_rank)}};
}

}  // namespace distca::cli
