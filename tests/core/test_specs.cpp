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

TEST(ModelSpec, UnknownPresetNamesChoices) {
  auto r = model_preset("gpt-5");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'gpt-5'"), std::string::npos);
  EXPECT_NE(r.status().message().find("llama-8b"), std::string::npos);
}

TEST(ModelSpec, JsonRoundTripAndOverrides) {
  auto m = model_preset("llama-8b").value();
  auto back = model_from_json(to_json(m));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->hidden, m.hidden);
  EXPECT_EQ(back->name, m.name);

  auto custom = model_from_json(nlohmann::json{{"preset", "tiny"}, {"n_layers", 2}});
  ASSERT_TRUE(custom.ok());
  EXPECT_EQ(custom->n_layers, 2);
  EXPECT_EQ(custom->hidden, 256);

  auto bad_gqa = model_from_json(nlohmann::json{{"preset", "tiny"}, {"n_kv_heads", 3}});
  ASSERT_FALSE(bad_gqa.ok());
  EXPECT_NE(bad_gqa.status().message().find("n_kv_heads"), std::string::npos);

  auto bad_type = model_from_json(nlohmann::json{{"preset", "tiny"}, {"hidden", "big"}});
  ASSERT_FALSE(bad_type.ok());
  EXPECT_NE(bad_type.status().message().find("hidden"), std::string::npos);

  auto zero = model_from_json(nlohmann::json{{"preset", "tiny"}, {"vocab", 0}});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("vocab"), std::string::npos);
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

  auto over = hardware_from_json(nlohmann::json{{"preset", "h200"}, {"inter_node_bw", 25e9}});
  ASSERT_TRUE(over.ok());
  EXPECT_DOUBLE_EQ(over->inter_node_bw, 25e9);
  EXPECT_FALSE(hardware_from_json(nlohmann::json{{"preset", "h200"}, {"gpus_per_node", 0}}).ok());
}

}  // namespace
}  // namespace distca
