// The figures of packed batches (batch_summary.h).
#include "distca/plan/batch_summary.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

#include "distca/cost/analytic.h"

namespace distca {

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

nlohmann::json batches_summary_json(std::vector<nlohmann::json> summaries) {
  if (summaries.size() == 1) return std::move(summaries.front());
  nlohmann::json out = nlohmann::json::object();
  int64_t docs = 0;
  double ratio_sum = 0, ratio_max = 0;
  bool same_shape = true;
  for (const auto& s : summaries) {
    docs += s["documents"].get<int64_t>();
    const double r = s["attn_load_max_over_mean"].get<double>();
    ratio_sum += r;
    ratio_max = std::max(ratio_max, r);
    same_shape = same_shape && s["ranks"] == summaries.front()["ranks"] &&
                 s["tokens_per_rank"] == summaries.front()["tokens_per_rank"];
  }
  if (same_shape) {
    out["ranks"] = summaries.front()["ranks"];
    out["tokens_per_rank"] = summaries.front()["tokens_per_rank"];
  }
  out["documents"] = docs;
  out["attn_load_max_over_mean"] = ratio_sum / static_cast<double>(summaries.size());
  out["attn_load_max_over_mean_max"] = ratio_max;
  out["batches"] = std::move(summaries);
  return out;
}

}  // namespace distca
