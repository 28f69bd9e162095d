#include "distca/core/specs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace distca {
namespace {

TEST(ModelSpec, PresetsMatchDesign) {
  auto tiny = model_preset("tiny");
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->n_layers, 4);
  EXPECT_EQ(tiny->hidden, 256);
  EXPECT_EQ(tiny->n_heads, 8);
  EXPECT_EQ(tiny->n_kv_heads, 2);
  EXPECT_EQ(tiny->head_dim, 32);
  EXPECT_EQ(tiny->ffn, 688);
  EXPECT_EQ(tiny->vocab, 512);

  auto l8 = model_preset("llama-8b");
  ASSERT_TRUE(l8.ok());
  EXPECT_EQ(l8->n_layers, 32);
  EXPECT_EQ(l8->hidden, 4096);
  EXPECT_EQ(l8->n_heads, 32);
  EXPECT_EQ(l8->n_kv_heads, 8);
  EXPECT_EQ(l8->head_dim, 128);
  EXPECT_EQ(l8->ffn, 14336);
  EXPECT_EQ(l8->q_dim(), l8->hidden);

  auto l34 = model_preset("llama-34b");
  ASSERT_TRUE(l34.ok());
  EXPECT_EQ(l34->n_layers, 48);
  EXPECT_EQ(l34->hidden, 8192);
  EXPECT_EQ(l34->n_heads, 64);
  EXPECT_EQ(l34->n_kv_heads, 16);
  EXPECT_EQ(l34->ffn, 22016);
  for (const auto& name : model_preset_names()) EXPECT_TRUE(model_preset(name)->validate().ok()) << name;
}

// Sizes whose derived quantities (q_dim, row bytes, parameter bytes) would overflow int64 are
// refused with the field named; the bounds themselves are accepted.
TEST(ModelSpec, ValidateRefusesSizesWhoseDerivedQuantitiesOverflow) {
  const ModelSpec base = model_preset("llama-8b").value();
  auto refused = [&](void (*edit)(ModelSpec&), const std::string& message) {
    ModelSpec m = base;
    edit(m);
    const Status st = m.validate();
    EXPECT_FALSE(st.ok()) << message;
    EXPECT_EQ(st.message(), message);
  };
  refused([](ModelSpec& m) { m.head_dim = int64_t{1} << 62; }, "head_dim must be in 1..2^24 = 16777216 (got 4611686018427387904)");
  refused([](ModelSpec& m) { m.vocab = kMaxModelDim + 1; }, "vocab must be in 1..2^24 = 16777216 (got 16777217)");
  refused([](ModelSpec& m) { m.n_kv_heads = 0; }, "n_kv_heads must be in 1..2^24 = 16777216 (got 0)");
  refused([](ModelSpec& m) { m.n_layers = INT64_MAX; }, "n_layers must be in 1..2^24 = 16777216 (got 9223372036854775807)");
  // Each field within range, but n_heads x head_dim (the row width) beyond it: 2^25.
  refused([](ModelSpec& m) { m.n_heads = m.n_kv_heads = 4096, m.head_dim = 8192; },
          "n_heads x head_dim must be at most 2^24 = 16777216 (got 33554432)");
  // Every field at most 2^24, but 2^24 layers of 3 x 2^48 SwiGLU weights: 1.4e22 parameters.
  refused([](ModelSpec& m) { m.n_layers = m.hidden = m.ffn = kMaxModelDim, m.n_heads = m.n_kv_heads = m.head_dim = 1; },
          "the model's parameter count (1.42e+22) exceeds 2^52");

  ModelSpec edge = base;
  edge.vocab = kMaxModelDim;
  edge.n_heads = 4096;
  edge.n_kv_heads = 4096;
  edge.head_dim = 4096;  // n_heads x head_dim = 2^24 exactly
  EXPECT_TRUE(edge.validate().ok()) << edge.validate().message();
  EXPECT_LE(edge.parameter_count(), kMaxModelParams);
}

TEST(ModelSpec, ParameterCountOfLlama8b) {
  // Llama-3-8B: 8.03e9 parameters (embedding and LM head untied).
  const double p = model_preset("llama-8b").value().parameter_count();
  EXPECT_NEAR(p, 8.03e9, 0.01e9);
}

TEST(ModelSpec, UnknownPresetNamesChoices) {
  auto r = model_preset("gpt-5");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'gpt-5'"), std::string::npos);
  EXPECT_NE(r.status().message().find("llama-8b"), std::string::npos);
}

TEST(HardwareSpec, Presets) {
  auto h = hardware_preset("h200");
  ASSERT_TRUE(h.ok());
  EXPECT_DOUBLE_EQ(h->peak_flops, 990e12);
  EXPECT_DOUBLE_EQ(h->memory_bytes, 141e9);
  EXPECT_DOUBLE_EQ(h->intra_node_bw, 900e9);
  EXPECT_DOUBLE_EQ(h->inter_node_bw, 50e9);
  EXPECT_EQ(h->gpus_per_node, 8);
  auto cpu = hardware_preset("local-cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE(cpu->validate().ok());
  EXPECT_FALSE(hardware_preset("tpu").ok());
}

}  // namespace
}  // namespace distca
