// ModelConfig <-> Hugging Face config.json (src/core/config_json.cpp).
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "csattn/config.hpp"
#include "csattn/error.hpp"
#include "expect_error.hpp"

namespace csattn {
namespace {

using testing_util::expect_error;

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  const AttentionConfig& x = a.base;
  const AttentionConfig& y = b.base;
  EXPECT_EQ(x.d_model, y.d_model);
  EXPECT_EQ(x.n_heads, y.n_heads);
  EXPECT_EQ(x.head_dim, y.head_dim);
  EXPECT_EQ(x.rope_dim, y.rope_dim);
  EXPECT_EQ(x.q_lora_rank, y.q_lora_rank);
  EXPECT_EQ(x.o_groups, y.o_groups);
  EXPECT_EQ(x.o_lora_rank, y.o_lora_rank);
  EXPECT_EQ(x.window, y.window);
  EXPECT_EQ(x.index_n_heads, y.index_n_heads);
  EXPECT_EQ(x.index_head_dim, y.index_head_dim);
  EXPECT_EQ(x.index_topk, y.index_topk);
  EXPECT_EQ(x.rope_theta, y.rope_theta);
  EXPECT_EQ(x.compress_rope_theta, y.compress_rope_theta);
  EXPECT_EQ(x.yarn_factor, y.yarn_factor);
  EXPECT_EQ(x.yarn_original_max_pos, y.yarn_original_max_pos);
  EXPECT_EQ(x.yarn_beta_fast, y.yarn_beta_fast);
  EXPECT_EQ(x.yarn_beta_slow, y.yarn_beta_slow);
  EXPECT_EQ(x.norm_eps, y.norm_eps);
  EXPECT_EQ(a.compress_ratios, b.compress_ratios);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
}

TEST(ConfigJson, ReadsEveryKeyAndIgnoresUnknownOnes) {
  const std::string text = R"({
    "model_type": "deepseek_v4",
    "architectures": ["DeepseekV4ForCausalLM"],
    "vocab_size": 129280,
    "hidden_size": 512,
    "num_attention_heads": 16,
    "head_dim": 128,
    "qk_rope_head_dim": 32,
    "q_lora_rank": 256,
    "o_groups": 4,
    "o_lora_rank": 64,
    "sliding_window": 32,
    "compress_ratios": [0, 4, 128, 4],
    "index_n_heads": 4,
    "index_head_dim": 128,
    "index_topk": 16,
    "rope_theta": 20000,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 4096,
                     "beta_fast": 24, "beta_slow": 2, "mscale": 1.0},
    "rms_norm_eps": 1e-5,
    "some_future_key": {"nested": [1, 2, 3]}
  })";
  const ModelConfig m = ModelConfig::from_hf_json_text(text, ModelConfig::preset("small"));
  const AttentionConfig& c = m.base;
  EXPECT_EQ(c.d_model, 512);
  EXPECT_EQ(c.n_heads, 16);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_dim, 32);
  EXPECT_EQ(c.q_lora_rank, 256);
  EXPECT_EQ(c.o_groups, 4);
  EXPECT_EQ(c.o_lora_rank, 64);
  EXPECT_EQ(c.window, 32);
  EXPECT_EQ(c.index_n_heads, 4);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 16);
  EXPECT_EQ(c.rope_theta, 20000.0);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_EQ(c.yarn_factor, 16.0);
  EXPECT_EQ(c.yarn_original_max_pos, 4096);
  EXPECT_EQ(c.yarn_beta_fast, 24.0);
  EXPECT_EQ(c.yarn_beta_slow, 2.0);
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(m.compress_ratios, (std::vector<int>{0, 4, 128, 4}));
}

TEST(ConfigJson, MissingAndNullKeysKeepTheDefaults) {
  const ModelConfig defaults = ModelConfig::preset("small");
  const ModelConfig m = ModelConfig::from_hf_json_text(
      R"({"index_topk": 8, "rope_scaling": null, "q_lora_rank": null})", defaults);
  ModelConfig expected = defaults;
  expected.base.index_topk = 8;
  expect_same(m, expected);

  expect_same(ModelConfig::from_hf_json_text("{}", defaults), defaults);
  // A partial rope_scaling keeps the other YaRN values.
  const ModelConfig r =
      ModelConfig::from_hf_json_text(R"({"rope_scaling": {"factor": 40}})", defaults);
  EXPECT_EQ(r.base.yarn_factor, 40.0);
  EXPECT_EQ(r.base.yarn_original_max_pos, defaults.base.yarn_original_max_pos);
  EXPECT_EQ(r.base.yarn_beta_fast, defaults.base.yarn_beta_fast);
}

TEST(ConfigJson, IntegralFloatsAreIntegers) {
  const ModelConfig m = ModelConfig::from_hf_json_text(R"({"hidden_size": 512.0})",
                                                       ModelConfig::preset("small"));
  EXPECT_EQ(m.base.d_model, 512);
}

TEST(ConfigJson, RatioOneMeansNoCompression) {
  // Some published DeepSeek-V4 configs write 1 for the sliding-window-only layers.
  const ModelConfig m = ModelConfig::from_hf_json_text(R"({"compress_ratios": [1, 1, 4, 128]})",
                                                       ModelConfig::preset("small"));
  EXPECT_EQ(m.compress_ratios, (std::vector<int>{0, 0, 4, 128}));
}

TEST(ConfigJson, WrongTypesNameTheKey) {
  const ModelConfig d = ModelConfig::preset("small");
  expect_error([&] { ModelConfig::from_hf_json_text(R"({"hidden_size": "big"})", d); },
               ErrorKind::InvalidArgument, "hidden_size");
  expect_error([&] { ModelConfig::from_hf_json_text(R"({"num_attention_heads": 8.5})", d); },
               ErrorKind::InvalidArgument, "num_attention_heads");
  expect_error([&] { ModelConfig::from_hf_json_text(R"({"rope_theta": true})", d); },
               ErrorKind::InvalidArgument, "rope_theta");
  expect_error([&] { ModelConfig::from_hf_json_text(R"({"compress_ratios": 4})", d); },
               ErrorKind::InvalidArgument, "compress_ratios");
  expect_error([&] { ModelConfig::from_hf_json_text(R"({"compress_ratios": [0, "4"]})", d); },
               ErrorKind::InvalidArgument, "compress_ratios[1]");
  expect_error([&] { ModelConfig::from_hf_json_text(R"({"rope_scaling": [16]})", d); },
               ErrorKind::InvalidArgument, "rope_scaling");
  expect_error(
      [&] { ModelConfig::from_hf_json_text(R"({"rope_scaling": {"factor": "16"}})", d); },
      ErrorKind::InvalidArgument, "rope_scaling.factor");
  expect_error([&] { ModelConfig::from_hf_json_text(R"({"sliding_window": 1e12})", d); },
               ErrorKind::InvalidArgument, "sliding_window");
}

TEST(ConfigJson, UnparsableTextAndNonObjects) {
  const ModelConfig d = ModelConfig::preset("small");
  expect_error([&] { ModelConfig::from_hf_json_text("{\"hidden_size\": 4096,", d); },
               ErrorKind::InvalidArgument, "JSON");
  expect_error([&] { ModelConfig::from_hf_json_text("", d); }, ErrorKind::InvalidArgument,
               "JSON");
  expect_error([&] { ModelConfig::from_hf_json_text("[1, 2]", d); },
               ErrorKind::InvalidArgument, "object");
}

TEST(ConfigJson, InconsistentValuesAreRejected) {
  const ModelConfig d = ModelConfig::preset("small");
  EXPECT_THROW(ModelConfig::from_hf_json_text(R"({"compress_ratios": [0, 7]})", d), Error);
  EXPECT_THROW(ModelConfig::from_hf_json_text(R"({"compress_ratios": []})", d), Error);
  EXPECT_THROW(ModelConfig::from_hf_json_text(R"({"o_groups": 3})", d), Error);
  EXPECT_THROW(ModelConfig::from_hf_json_text(R"({"hidden_size": -4})", d), Error);
}

// num_hidden_layers splits compress_ratios into main layers and MTP modules (the release's
// Flash: 43 + 1). A ratio list read without it must not keep the defaults' count, which
// belongs to another list; more main layers than ratios is refused.
TEST(ConfigJson, NumHiddenLayersSplitsMainAndMtpLayers) {
  const ModelConfig flash = ModelConfig::preset("flash");
  EXPECT_EQ(flash.num_hidden_layers, 43);
  EXPECT_EQ(ModelConfig::preset("pro").num_hidden_layers, 61);
  EXPECT_EQ(ModelConfig::preset("tiny").num_hidden_layers, 0);
  EXPECT_EQ(ModelConfig::from_hf_json_text(R"({"num_hidden_layers": 2, "compress_ratios": [0, 4, 0]})", flash)
                .num_hidden_layers, 2);
  EXPECT_EQ(ModelConfig::from_hf_json_text(R"({"compress_ratios": [0, 4, 0]})", flash).num_hidden_layers, 0);
  EXPECT_EQ(ModelConfig::from_hf_json_text(R"({"hidden_size": 4096})", flash).num_hidden_layers, 43);
  // Alone it is not read: it would split the defaults' list by another model's count.
  EXPECT_EQ(ModelConfig::from_hf_json_text(R"({"num_hidden_layers": 5})", flash).num_hidden_layers, 43);
  EXPECT_EQ(ModelConfig::from_hf_json_text(R"({"num_hidden_layers": 99})", flash).num_hidden_layers, 43);
  // As many main layers as ratios: no MTP entries.
  EXPECT_EQ(ModelConfig::from_hf_json_text(R"({"num_hidden_layers": 3, "compress_ratios": [0, 4, 0]})", flash)
                .num_hidden_layers, 3);
  expect_error([&] { ModelConfig::from_hf_json_text(R"({"num_hidden_layers": 4, "compress_ratios": [0, 4, 0]})", flash); },
               ErrorKind::InvalidArgument, {"num_hidden_layers = 4", "3 entries"});
  expect_error([&] { ModelConfig::from_hf_json_text(R"({"num_hidden_layers": -1, "compress_ratios": [0]})", flash); },
               ErrorKind::InvalidArgument, "num_hidden_layers = -1");
}

TEST(ConfigJson, PresetsRoundTrip) {
  for (const std::string& name : ModelConfig::preset_names()) {
    SCOPED_TRACE(name);
    const ModelConfig p = ModelConfig::preset(name);
    // Read back over a different preset, so every value must come from the text.
    const std::string other = name == "tiny" ? "pro" : "tiny";
    expect_same(ModelConfig::from_hf_json_text(p.to_hf_json(), ModelConfig::preset(other)), p);
  }
}

TEST(ConfigJson, WritesExactlyTheMappedKeys) {
  const nlohmann::json j = nlohmann::json::parse(ModelConfig::preset("flash").to_hf_json());
  std::set<std::string> keys;
  for (const auto& item : j.items()) keys.insert(item.key());
  const std::set<std::string> expected = {
      "hidden_size",   "num_attention_heads", "head_dim",      "qk_rope_head_dim",
      "q_lora_rank",   "o_groups",            "o_lora_rank",   "sliding_window",
      "compress_ratios", "index_n_heads",     "index_head_dim", "index_topk",
      "rope_theta",    "compress_rope_theta", "rope_scaling",  "rms_norm_eps",
      "num_hidden_layers"};
  EXPECT_EQ(keys, expected);
  EXPECT_EQ(j["num_hidden_layers"], 43);  // + the MTP module's entry: 44 ratios
  EXPECT_EQ(j["hidden_size"], 4096);
  EXPECT_EQ(j["compress_ratios"].size(), 44u);
  EXPECT_TRUE(j["rope_scaling"].contains("factor"));
  EXPECT_TRUE(j["rope_scaling"].contains("original_max_position_embeddings"));
}

TEST(ConfigJson, Files) {
  const ModelConfig d = ModelConfig::preset("tiny");
  const auto dir = std::filesystem::path(::testing::TempDir());
  const std::string missing = (dir / "csattn_no_such_config.json").string();
  expect_error([&] { ModelConfig::from_hf_json_file(missing, d); }, ErrorKind::Io,
               "csattn_no_such_config.json");

  const std::string path =
      (dir / ("csattn_config_json_" + std::to_string(::getpid()) + ".json")).string();
  {
    std::ofstream out(path);
    out << ModelConfig::preset("small").to_hf_json();
  }
  expect_same(ModelConfig::from_hf_json_file(path, d), ModelConfig::preset("small"));
  {
    std::ofstream out(path);
    out << R"({"hidden_size": [1]})";
  }
  // The message names the file and the key.
  expect_error([&] { ModelConfig::from_hf_json_file(path, d); }, ErrorKind::InvalidArgument,
               "hidden_size");
  expect_error([&] { ModelConfig::from_hf_json_file(path, d); }, ErrorKind::InvalidArgument,
               path);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace csattn
