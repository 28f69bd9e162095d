#include "distca/core/specs.h"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace distca {
namespace {

struct ModelPresetRow {
  const char* name;
  int64_t layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
};

// Llama-3-8B and the paper's 34B (64 heads, 16 KV heads: the paper's text; CodeLlama-34B has 8).
constexpr ModelPresetRow kModelPresets[] = {
    {"tiny", 4, 256, 8, 2, 32, 688, 512},
    {"llama-8b", 32, 4096, 32, 8, 128, 14336, 128256},
    {"llama-34b", 48, 8192, 64, 16, 128, 22016, 32000},
};

Status positive(const char* field, double v) {
  if (!(v > 0)) return Status::invalid_argument(std::string(field) + " must be positive (got " + std::to_string(v) + ")");
  return {};
}

}  // namespace

Status ModelSpec::validate() const {
  for (auto [field, v] : {std::pair{"n_layers", n_layers}, {"hidden", hidden}, {"n_heads", n_heads},
                          {"n_kv_heads", n_kv_heads}, {"head_dim", head_dim}, {"ffn", ffn}, {"vocab", vocab}}) {
    if (v < 1 || v > kMaxModelDim) {
      return Status::invalid_argument(std::string(field) + " must be in 1..2^24 = 16777216 (got " + std::to_string(v) + ")");
    }
  }
  if (n_heads % n_kv_heads != 0) {
    return Status::invalid_argument("n_kv_heads (" + std::to_string(n_kv_heads) +
                                    ") must divide n_heads (" + std::to_string(n_heads) + ")");
  }
  if (q_dim() > kMaxModelDim) {
    return Status::invalid_argument("n_heads x head_dim must be at most 2^24 = 16777216 (got " +
                                    std::to_string(q_dim()) + ")");
  }
  if (const double p = parameter_count(); p > kMaxModelParams) {
    char got[32];
    std::snprintf(got, sizeof got, "%.3g", p);
    return Status::invalid_argument(std::string("the model's parameter count (") + got + ") exceeds 2^52");
  }
  return {};
}

double ModelSpec::parameter_count() const {
  const auto h = static_cast<double>(hidden), q = static_cast<double>(q_dim()), kv = static_cast<double>(kv_dim());
  // Per layer: Q, K, V and O projections, the SwiGLU's three matrices, two norms; then the
  // embedding, the LM head and the final norm.
  const double layer = h * (q + 2 * kv) + q * h + 3 * h * static_cast<double>(ffn) + 2 * h;
  return static_cast<double>(n_layers) * layer + 2 * static_cast<double>(vocab) * h + h;
}

Status HardwareSpec::validate() const {
  DISTCA_RETURN_IF_ERROR(positive("peak_flops", peak_flops));
  DISTCA_RETURN_IF_ERROR(positive("memory_bytes", memory_bytes));
  DISTCA_RETURN_IF_ERROR(positive("intra_node_bw", intra_node_bw));
  DISTCA_RETURN_IF_ERROR(positive("inter_node_bw", inter_node_bw));
  DISTCA_RETURN_IF_ERROR(positive("gpus_per_node", static_cast<double>(gpus_per_node)));
  if (intra_node_latency < 0 || inter_node_latency < 0) return Status::invalid_argument("latencies must be >= 0");
  return {};
}

Result<ModelSpec> model_preset(std::string_view name) {
  for (const auto& r : kModelPresets) {
    if (name == r.name) {
      return ModelSpec{r.name, r.layers, r.hidden, r.heads, r.kv_heads, r.head_dim, r.ffn, r.vocab};
    }
  }
  std::string names;
  for (const auto& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  return Status::not_found("unknown model '" + std::string(name) + "' (presets: " + names + ")");
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const auto& r : kModelPresets) out.emplace_back(r.name);
  return out;
}

Result<HardwareSpec> hardware_preset(std::string_view name) {
  if (name == "h200") {
    return HardwareSpec{.name = "h200", .peak_flops = 990e12, .memory_bytes = 141e9, .intra_node_bw = 900e9,
                        .inter_node_bw = 50e9, .intra_node_latency = 3e-6, .inter_node_latency = 10e-6,
                        .gpus_per_node = 8};
  }
  // Nominal figures for this project's CPU machines (2 cores, 24 GiB); `distca profile`
  // measures the real attention speed, these only seed the analytic model.
  if (name == "local-cpu") {
    return HardwareSpec{.name = "local-cpu", .peak_flops = 100e9, .memory_bytes = 24.0 * (1ull << 30),
                        .intra_node_bw = 10e9, .inter_node_bw = 1.25e9, .intra_node_latency = 1e-6,
                        .inter_node_latency = 50e-6, .gpus_per_node = 1};
  }
  return Status::not_found("unknown hardware '" + std::string(name) + "' (presets: h200, local-cpu)");
}

std::vector<std::string> hardware_preset_names() { return {"h200", "local-cpu"}; }

nlohmann::json to_json(const ModelSpec& m) {
  return {{"name", m.name},         {"n_layers", m.n_layers}, {"hidden", m.hidden},
          {"n_heads", m.n_heads},   {"n_kv_heads", m.n_kv_heads}, {"head_dim", m.head_dim},
          {"ffn", m.ffn},           {"vocab", m.vocab}};
}

}  // namespace distca
