// Model and hardware descriptions shared by every layer (cost model, planner, simulator,
// trainer). Presets hold the figures of docs/architecture.md; a config file may set any field.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/status.h"

namespace distca {

// A Llama-style decoder. head_dim * n_heads need not equal hidden (it does for the presets).
struct ModelSpec {
  std::string name;
  int64_t n_layers = 0;
  int64_t hidden = 0;      // h
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // key/value heads (GQA); divides n_heads
  int64_t head_dim = 0;
  int64_t ffn = 0;         // SwiGLU intermediate size i
  int64_t vocab = 0;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  // Every field in 1..2^24 (kMaxModelDim), n_kv_heads divides n_heads, n_heads x head_dim
  // at most 2^24, parameter_count() at most 2^52 (kMaxModelParams): the ranges within which
  // every quantity derived from a spec (row bytes, parameter bytes, FLOPs per token) fits
  // int64 with room for byte and token factors. The message names the field ("hidden must
  // be in 1..2^24 = 16777216 (got 0)"). Every user of a spec that came from outside (a
  // preset override, a file, Python) calls it first.
  Status validate() const;
  // Parameters of the whole model (every layer, the embedding, the LM head, the norms), as a
  // double so that it cannot overflow for any field values.
  double parameter_count() const;
};

inline constexpr int64_t kMaxModelDim = int64_t{1} << 24;
inline constexpr double kMaxModelParams = 4503599627370496.0;  // 2^52

// One accelerator (or CPU socket) and its links.
struct HardwareSpec {
  std::string name;
  double peak_flops = 0;           // dense FLOP/s at the training precision
  double memory_bytes = 0;         // device memory (HBM) per GPU
  double intra_node_bw = 0;        // bytes/s per GPU inside a node (NVLink)
  double inter_node_bw = 0;        // bytes/s per GPU between nodes
  double intra_node_latency = 0;   // seconds per message
  double inter_node_latency = 0;   // seconds per message
  int64_t gpus_per_node = 1;
  Status validate() const;
};

// Presets: "tiny", "llama-8b", "llama-34b".
Result<ModelSpec> model_preset(std::string_view name);
std::vector<std::string> model_preset_names();
// Presets: "h200", "local-cpu".
Result<HardwareSpec> hardware_preset(std::string_view name);
std::vector<std::string> hardware_preset_names();

// The model's fields as JSON (name, n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab).
nlohmann::json to_json(const ModelSpec& m);

}  // namespace distca
