// LayerWeights: the parameter table, deterministic random init, and safetensors load/save
// including multi-layer checkpoints and every kind of mismatched file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "csattn/error.hpp"
#include "expect_error.hpp"
#include "csattn/safetensors.hpp"
#include "csattn/weights.hpp"

using namespace csattn;
using csattn::testing_util::expect_error;

namespace {

AttentionConfig small_cfg(int compress_ratio) {
  AttentionConfig c;
  c.d_model = 32;
  c.n_heads = 4;
  c.head_dim = 16;
  c.rope_dim = 8;
  c.q_lora_rank = 16;
  c.o_groups = 2;
  c.o_lora_rank = 16;
  c.window = 8;
  c.compress_ratio = compress_ratio;
  c.index_n_heads = 2;
  c.index_head_dim = 16;
  c.index_topk = 4;
  return c;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

void expect_same_weights(const LayerWeights& a, const LayerWeights& b) {
  ASSERT_EQ(a.params().size(), b.params().size());
  for (const ParamInfo& p : a.params()) {
    EXPECT_TRUE(same_bytes(a.get(p.name), b.get(p.name))) << p.name;
  }
}


class LayerWeightsFile : public ::testing::Test {
 protected:
  void TearDown() override {
    std::error_code ec;
    for (const auto& p : paths_) std::filesystem::remove(p, ec);
  }
  // Unique per process and test: test cases run in parallel as separate processes.
  std::string path(const std::string& tag = "w") {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    paths_.push_back(::testing::TempDir() + "csattn_w_" + info->name() + "_" +
                     std::to_string(::getpid()) + "_" + tag + ".safetensors");
    return paths_.back();
  }
  // Saves random weights for `cfg`, lets `edit` change the raw tensors, writes them back.
  template <class Edit>
  std::string edited_file(const AttentionConfig& cfg, Edit edit) {
    const std::string p = path();
    LayerWeights::random(cfg, 7).save(p);
    TensorMap m = load_safetensors(p);
    edit(m);
    save_safetensors(p, m);
    return p;
  }
  std::vector<std::string> paths_;
};

}  // namespace

TEST(LayerParamsTable, NamesShapesDtypesGroups) {
  const auto swa = layer_params(small_cfg(0));
  const auto csa = layer_params(small_cfg(4));
  const auto hca = layer_params(small_cfg(128));
  EXPECT_EQ(swa.size(), 8u);
  EXPECT_EQ(hca.size(), 12u);
  EXPECT_EQ(csa.size(), 18u);

  auto find = [](const std::vector<ParamInfo>& t, const std::string& n) -> const ParamInfo& {
    for (const auto& p : t) {
      if (p.name == n) return p;
    }
    throw std::runtime_error("no " + n);
  };
  EXPECT_EQ(find(swa, "attn.wq_a.weight").shape, (Shape{16, 32}));
  EXPECT_EQ(find(swa, "attn.wq_b.weight").shape, (Shape{64, 16}));
  EXPECT_EQ(find(swa, "attn.wkv.weight").shape, (Shape{16, 32}));
  EXPECT_EQ(find(swa, "attn.wo_a.weight").shape, (Shape{32, 32}));
  EXPECT_EQ(find(swa, "attn.wo_b.weight").shape, (Shape{32, 32}));
  EXPECT_EQ(find(swa, "attn.attn_sink").shape, (Shape{4}));
  EXPECT_EQ(find(swa, "attn.attn_sink").file_dtype, DType::f32);
  EXPECT_EQ(find(swa, "attn.q_norm.weight").file_dtype, DType::bf16);

  EXPECT_EQ(find(csa, "attn.compressor.wkv.weight").shape, (Shape{32, 32}));  // coff 2
  EXPECT_EQ(find(csa, "attn.compressor.ape").shape, (Shape{4, 32}));
  EXPECT_EQ(find(csa, "attn.compressor.ape").file_dtype, DType::f32);
  EXPECT_EQ(find(csa, "attn.compressor.ape").group, ParamGroup::main);
  EXPECT_EQ(find(hca, "attn.compressor.wgate.weight").shape, (Shape{16, 32}));  // coff 1
  EXPECT_EQ(find(hca, "attn.compressor.ape").shape, (Shape{128, 16}));

  EXPECT_EQ(find(csa, "attn.indexer.wq_b.weight").shape, (Shape{32, 16}));
  EXPECT_EQ(find(csa, "attn.indexer.weights_proj.weight").shape, (Shape{2, 32}));
  EXPECT_EQ(find(csa, "attn.indexer.compressor.wkv.weight").shape, (Shape{32, 32}));
  EXPECT_EQ(find(csa, "attn.indexer.compressor.norm.weight").shape, (Shape{16}));
  EXPECT_EQ(find(csa, "attn.indexer.compressor.ape").shape, (Shape{4, 32}));
  int indexer = 0;
  for (const auto& p : csa) {
    const bool is_indexer = p.name.rfind("attn.indexer.", 0) == 0;
    EXPECT_EQ(p.group, is_indexer ? ParamGroup::indexer : ParamGroup::main) << p.name;
    indexer += is_indexer;
  }
  EXPECT_EQ(indexer, 6);
}

TEST(LayerWeightsInit, RandomIsDeterministicAndSeedDependent) {
  const auto cfg = small_cfg(4);
  const auto a = LayerWeights::random(cfg, 1);
  const auto b = LayerWeights::random(cfg, 1);
  const auto c = LayerWeights::random(cfg, 2);
  expect_same_weights(a, b);
  for (const ParamInfo& p : a.params()) {
    EXPECT_FALSE(same_bytes(a.get(p.name), c.get(p.name))) << p.name;
  }
  EXPECT_NO_THROW(a.check(cfg));
  EXPECT_EQ(a.config().compress_ratio, 4);

  // Per-parameter streams: a tensor does not depend on which other parameters exist.
  const auto swa = LayerWeights::random(small_cfg(0), 1);
  EXPECT_TRUE(same_bytes(swa.get("attn.wq_a.weight"), a.get("attn.wq_a.weight")));
  EXPECT_TRUE(same_bytes(swa.get("attn.attn_sink"), a.get("attn.attn_sink")));
  // ... but different parameters of the same shape differ.
  EXPECT_FALSE(same_bytes(a.get("attn.compressor.wkv.weight"),
                          a.get("attn.compressor.wgate.weight")));
}

TEST(LayerWeightsInit, ValuesRoundedToFileDtypeWithSensibleScales) {
  const auto cfg = small_cfg(4);
  const auto w = LayerWeights::random(cfg, 11);
  for (const ParamInfo& p : w.params()) {
    const auto v = w.get(p.name).to_f32();
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << p.name;
      if (p.file_dtype == DType::bf16) {
        ASSERT_EQ(x, round_bf16(x)) << p.name;
      }
    }
  }
  // attn_sink is non-zero so that tests exercise it.
  for (float x : w.get("attn.attn_sink").to_f32()) EXPECT_NE(x, 0.0f);
  for (float x : w.get("attn.q_norm.weight").to_f32()) EXPECT_NEAR(x, 1.0f, 0.6f);
  // A projection's standard deviation is about 1/sqrt(fan_in).
  const auto q = w.get("attn.wq_a.weight").to_f32();  // 16 x 32, fan_in 32
  double ss = 0;
  for (float x : q) ss += double(x) * x;
  const double sd = std::sqrt(ss / q.size());
  EXPECT_NEAR(sd, 1.0 / std::sqrt(32.0), 0.03);
  // ape values are not bf16-rounded (f32 in the file); most draws are not bf16-exact.
  int not_bf16 = 0;
  for (float x : w.get("attn.compressor.ape").to_f32()) not_bf16 += (x != round_bf16(x));
  EXPECT_GT(not_bf16, 0);
}

TEST(LayerWeightsInit, ZerosGetAndCheck) {
  const auto cfg = small_cfg(128);
  auto z = LayerWeights::zeros(cfg);
  EXPECT_NO_THROW(z.check(cfg));
  for (const ParamInfo& p : z.params()) {
    EXPECT_EQ(z.get(p.name).dtype(), DType::f32);
    EXPECT_EQ(z.get(p.name).shape(), p.shape);
    for (float x : z.get(p.name).to_f32()) EXPECT_EQ(x, 0.0f);
  }
  z.f32("attn.attn_sink")[1] = 3.0f;
  EXPECT_EQ(z.get("attn.attn_sink").to_f32()[1], 3.0f);
  EXPECT_TRUE(z.has("attn.compressor.ape"));
  EXPECT_FALSE(z.has("attn.indexer.wq_b.weight"));
  expect_error([&] { z.get("attn.indexer.wq_b.weight"); }, ErrorKind::InvalidArgument,
               {"attn.indexer.wq_b.weight"});
  // Checked against a config it was not made for.
  expect_error([&] { z.check(small_cfg(4)); }, ErrorKind::ShapeMismatch,
               {"attn.compressor.wkv.weight"});
  expect_error([&] { z.check(small_cfg(0)); }, ErrorKind::InvalidArgument,
               {"unexpected", "attn.compressor"});
}

TEST(LayerWeightsInit, BadConfigRejected) {
  auto c = small_cfg(0);
  c.o_groups = 3;
  expect_error([&] { layer_params(c); }, ErrorKind::InvalidArgument, {"o_groups"});
  c = small_cfg(0);
  c.d_model = 0;
  expect_error([&] { LayerWeights::random(c, 1); }, ErrorKind::InvalidArgument, {"d_model"});
}

TEST_F(LayerWeightsFile, SaveLoadRoundTripIsExact) {
  for (int m : {0, 4, 128}) {
    SCOPED_TRACE("compress_ratio " + std::to_string(m));
    const auto cfg = small_cfg(m);
    const auto w = LayerWeights::random(cfg, 100 + m);
    const std::string p = path("m" + std::to_string(m));
    w.save(p);
    expect_same_weights(w, LayerWeights::load(p, cfg));

    // On disk: release names and file dtypes.
    const TensorMap raw = load_safetensors(p);
    ASSERT_EQ(raw.size(), w.params().size());
    for (const ParamInfo& info : w.params()) {
      ASSERT_EQ(raw.count(info.name), 1u) << info.name;
      EXPECT_EQ(raw.at(info.name).dtype(), info.file_dtype) << info.name;
      EXPECT_EQ(raw.at(info.name).to_f32(), w.get(info.name).to_f32()) << info.name;
    }
  }
}

TEST_F(LayerWeightsFile, SaveRoundsTrainedValuesToBf16) {
  const auto cfg = small_cfg(0);
  auto w = LayerWeights::zeros(cfg);
  w.f32("attn.wq_a.weight")[0] = 1.0f + 3 * 0x1.0p-8f;  // a bf16 tie: rounds to even
  w.f32("attn.attn_sink")[0] = 0.1f;                    // f32 in the file: kept
  const std::string p = path();
  w.save(p);
  const auto u = LayerWeights::load(p, cfg);
  EXPECT_EQ(u.f32("attn.wq_a.weight")[0], 1.0f + 0x1.0p-6f);
  EXPECT_EQ(u.f32("attn.attn_sink")[0], 0.1f);
}

TEST_F(LayerWeightsFile, CheckpointLayerSelection) {
  const auto cfg = small_cfg(4);
  const auto w = LayerWeights::random(cfg, 5);
  const std::string single = path("single");
  w.save(single);
  TensorMap ckpt;
  for (auto& [name, t] : load_safetensors(single)) ckpt["layers.3." + name] = t;
  ckpt["layers.3.ffn.w1.weight"] = Tensor(DType::bf16, {8, 32});
  ckpt["embed.weight"] = Tensor(DType::bf16, {10, 32});
  // Another layer with a different (HCA) table must not disturb layer 3.
  LayerWeights::random(small_cfg(128), 6).save(single);
  for (auto& [name, t] : load_safetensors(single)) ckpt["layers.12." + name] = t;
  const std::string p = path("ckpt");
  save_safetensors(p, ckpt);

  expect_same_weights(w, LayerWeights::load(p, cfg, 3));
  expect_error([&] { LayerWeights::load(p, cfg, 2); }, ErrorKind::InvalidArgument,
               {p, "layers.2.attn", "3, 12"});
  expect_error([&] { LayerWeights::load(p, cfg); }, ErrorKind::InvalidArgument,
               {p, "multi-layer", "layer"});
  // Layer 12 is HCA: loading it as CSA names the first mismatch.
  expect_error([&] { LayerWeights::load(p, cfg, 12); }, ErrorKind::ShapeMismatch,
               {"layers.12.attn.compressor.wkv.weight", "expected shape [32, 32], got [16, 32]"});
  EXPECT_NO_THROW(LayerWeights::load(p, small_cfg(128), 12));
}

TEST_F(LayerWeightsFile, MissingTensorIsNamed) {
  const auto cfg = small_cfg(4);
  const auto p = edited_file(cfg, [](TensorMap& m) { m.erase("attn.indexer.compressor.ape"); });
  expect_error([&] { LayerWeights::load(p, cfg); }, ErrorKind::Io,
               {p, "missing tensor 'attn.indexer.compressor.ape'"});
}

TEST_F(LayerWeightsFile, ExtraTensorIsNamed) {
  const auto cfg = small_cfg(128);
  const auto p = edited_file(cfg, [](TensorMap& m) {
    m["attn.indexer.wq_b.weight"] = Tensor(DType::bf16, {32, 16});
  });
  expect_error([&] { LayerWeights::load(p, cfg); }, ErrorKind::Io,
               {p, "unexpected tensor 'attn.indexer.wq_b.weight'", "compress_ratio=128"});
  const auto q = edited_file(cfg, [](TensorMap& m) { m["embed.weight"] = Tensor(DType::bf16, {2}); });
  expect_error([&] { LayerWeights::load(q, cfg); }, ErrorKind::Io, {"'embed.weight'"});
}

TEST_F(LayerWeightsFile, MisShapedTensorIsNamed) {
  const auto cfg = small_cfg(0);
  const auto p = edited_file(cfg, [](TensorMap& m) {
    m["attn.wo_a.weight"] = Tensor(DType::bf16, {32, 31});
  });
  expect_error([&] { LayerWeights::load(p, cfg); }, ErrorKind::ShapeMismatch,
               {p, "'attn.wo_a.weight'", "expected shape [32, 32], got [32, 31]"});
}

TEST_F(LayerWeightsFile, WrongDtypeIsNamed) {
  const auto cfg = small_cfg(4);
  const auto p = edited_file(cfg, [](TensorMap& m) {
    m["attn.wq_b.weight"] = Tensor::from_f32(m["attn.wq_b.weight"].to_f32(), {64, 16});
  });
  expect_error([&] { LayerWeights::load(p, cfg); }, ErrorKind::DTypeMismatch,
               {p, "'attn.wq_b.weight'", "expected dtype bf16 (or F8_E4M3", "got f32"});
  const auto q = edited_file(cfg, [](TensorMap& m) { m["attn.attn_sink"] = Tensor(DType::bf16, {4}); });
  expect_error([&] { LayerWeights::load(q, cfg); }, ErrorKind::DTypeMismatch,
               {"'attn.attn_sink'", "expected dtype f32, got bf16"});
}

TEST_F(LayerWeightsFile, TruncatedOrMissingFile) {
  const auto cfg = small_cfg(0);
  const std::string p = path();
  LayerWeights::random(cfg, 1).save(p);
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 10);
  expect_error([&] { LayerWeights::load(p, cfg); }, ErrorKind::Io, {p, "truncated"});
  const std::string none = path("none");
  expect_error([&] { LayerWeights::load(none, cfg); }, ErrorKind::Io, {none});
}

TEST_F(LayerWeightsFile, DefaultWeightsRefuseToSave) {
  const std::string p = path();
  expect_error([&] { LayerWeights().save(p); }, ErrorKind::InvalidArgument, {"missing"});
}
