// Loading a layer the way the DeepSeek-V4 release ships it: the Hugging Face sharded layout
// (model.safetensors.index.json + shards), shards holding tensors of dtypes csattn does not
// read (packed FP4 experts as I8), and FP8 linear weights with E8M0 scales per 128 x 128
// block. The expected values are decoded here from the bytes by the E4M3 / E8M0 definitions,
// independently of the library's decoders.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "csattn/checkpoint.hpp"
#include "csattn/error.hpp"
#include "csattn/safetensors.hpp"
#include "csattn/weights.hpp"
#include "expect_error.hpp"

using namespace csattn;
using csattn::testing_util::expect_error;
namespace fs = std::filesystem;

namespace {

// Dims that give FP8 block grids with whole and partial 128 x 128 blocks:
// wq_a [160, 256] -> 2 x 2, wkv [64, 256] -> 1 x 2, wo_a [192, 128] -> 2 x 1, ...
AttentionConfig release_like_cfg(int compress_ratio) {
  AttentionConfig c;
  c.d_model = 256;
  c.n_heads = 4;
  c.head_dim = 64;
  c.rope_dim = 16;
  c.q_lora_rank = 160;
  c.o_groups = 2;
  c.o_lora_rank = 96;
  c.window = 8;
  c.compress_ratio = compress_ratio;
  c.index_n_heads = 2;
  c.index_head_dim = 64;
  c.index_topk = 4;
  return c;
}

// The linear weights the release stores as FP8 (block-scaled).
bool released_as_fp8(const std::string& name) {
  for (const char* n : {"attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight",
                        "attn.wo_b.weight", "attn.indexer.wq_b.weight"})
    if (name == n) return true;
  return false;
}

// OCP E4M3 (bias 7, no infinities): sign, 4 exponent bits, 3 mantissa bits.
double e4m3_value(std::uint8_t b) {
  const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return sign ? -mag : mag;
}


class ReleaseCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("csattn_ckpt_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // One layer (index `layer`) as the release has it: FP8 + E8M0 block scales for the
  // released FP8 linears, everything else in its file dtype; `expected` gets the values
  // LayerWeights::load must produce.
  TensorMap release_layer(const AttentionConfig& cfg, const CheckpointLayer& layer, std::uint32_t seed,
                          std::map<std::string, std::vector<float>>* expected) {
    std::mt19937 rng(seed);
    const LayerWeights base = LayerWeights::random(cfg, seed);
    TensorMap out;
    const std::string prefix = layer.prefix() + ".";
    for (const ParamInfo& p : base.params()) {
      if (!released_as_fp8(p.name)) {
        Tensor t = p.file_dtype == DType::bf16 ? Tensor(DType::bf16, p.shape) : base.get(p.name);
        if (p.file_dtype == DType::bf16) {
          const float* v = base.f32(p.name);
          auto* b = t.ptr<std::uint16_t>();
          for (std::int64_t i = 0; i < t.numel(); ++i) b[i] = float_to_bf16_bits(v[i]);
        }
        out.emplace(prefix + p.name, std::move(t));
        if (expected) (*expected)[p.name] = base.get(p.name).to_f32();
        continue;
      }
      const std::int64_t rows = p.shape[0], cols = p.shape[1];
      const std::int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
      Tensor q(DType::e4m3, p.shape), s(DType::e8m0, {br, bc});
      auto* qb = static_cast<std::uint8_t*>(q.data());
      auto* sb = static_cast<std::uint8_t*>(s.data());
      for (std::int64_t i = 0; i < br * bc; ++i)
        sb[i] = static_cast<std::uint8_t>(127 - 4 - static_cast<int>(rng() % 6));  // 2^-4 .. 2^-9
      std::vector<float> want(static_cast<std::size_t>(rows * cols));
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j) {
          std::uint8_t b = static_cast<std::uint8_t>(rng());
          if ((b & 0x7F) == 0x7F) b ^= 1;  // no NaN codes
          qb[i * cols + j] = b;
          const int exponent = sb[(i / 128) * bc + j / 128] - 127;
          want[static_cast<std::size_t>(i * cols + j)] =
              static_cast<float>(std::ldexp(e4m3_value(b), exponent));  // exact in f32 and bf16
        }
      out.emplace(prefix + p.name, std::move(q));
      const std::string stem = p.name.substr(0, p.name.size() - 7);
      out.emplace(prefix + stem + ".scale", std::move(s));
      if (expected) (*expected)[p.name] = std::move(want);
    }
    return out;
  }

  // Writes `shards` as model-0000i-of-0000n.safetensors with their index.
  void write_sharded(const std::vector<TensorMap>& shards) {
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
    for (std::size_t k = 0; k < shards.size(); ++k) {
      const std::string file = "model-0000" + std::to_string(k + 1) + "-of-0000" +
                               std::to_string(shards.size()) + ".safetensors";
      save_safetensors((dir_ / file).string(), shards[k]);
      for (const auto& [name, t] : shards[k]) index["weight_map"][name] = file;
    }
    write_index(index);
  }
  void write_index(const nlohmann::json& index) {
    std::ofstream(dir_ / "model.safetensors.index.json") << index.dump(1);
  }

  fs::path dir_;
};

void expect_values(const LayerWeights& w, const std::map<std::string, std::vector<float>>& want) {
  for (const ParamInfo& p : w.params()) {
    ASSERT_TRUE(want.count(p.name)) << p.name;
    const std::vector<float> got = w.get(p.name).to_f32();
    ASSERT_EQ(got.size(), want.at(p.name).size()) << p.name;
    std::size_t differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i) differ += got[i] != want.at(p.name)[i];
    EXPECT_EQ(differ, 0u) << p.name << ": elements differing from the decoded bytes";
  }
}

}  // namespace

TEST_F(ReleaseCheckpoint, ShardedFp8LayerLoadsExactly) {
  for (int m : {0, 4, 128}) {
    SCOPED_TRACE("compress_ratio " + std::to_string(m));
    const AttentionConfig cfg = release_like_cfg(m);
    std::map<std::string, std::vector<float>> want;
    TensorMap layer = release_layer(cfg, 2, 40 + m, &want);
    // The layer split over two shards (a scale apart from its weight included), beside other
    // layers' tensors and packed FP4 experts stored as I8, which csattn never reads.
    std::vector<TensorMap> shards(2);
    int k = 0;
    for (auto& [name, t] : layer) shards[static_cast<std::size_t>(k++ % 2)].emplace(name, std::move(t));
    shards[0].emplace("embed.weight", Tensor(DType::bf16, {10, 256}));
    shards[1].emplace("layers.2.ffn.gate.weight", Tensor(DType::bf16, {8, 256}));
    for (auto& [name, t] : release_layer(cfg, 5, 9, nullptr)) shards[1].emplace(name, std::move(t));
    write_sharded(shards);
    // An I8 tensor: the safetensors writer knows no I8, so patch a U8 entry's dtype text.
    {
      TensorMap extra;
      extra.emplace("layers.2.ffn.experts.0.w1.weight", Tensor(DType::e8m0, {4, 8}));
      const fs::path f = dir_ / "model-00003-of-00003.safetensors";
      save_safetensors(f.string(), extra);
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(io)), {});
      const auto at = bytes.find("\"U8\"");
      ASSERT_NE(at, std::string::npos);
      io.seekp(static_cast<std::streamoff>(at));
      io.write("\"I8\"", 4);
      nlohmann::json index;
      std::ifstream(dir_ / "model.safetensors.index.json") >> index;
      index["weight_map"]["layers.2.ffn.experts.0.w1.weight"] = f.filename().string();
      write_index(index);
    }

    const LayerWeights from_dir = LayerWeights::load(dir_.string(), cfg, 2);
    expect_values(from_dir, want);
    const LayerWeights from_index =
        LayerWeights::load((dir_ / "model.safetensors.index.json").string(), cfg, 2);
    expect_values(from_index, want);
    // The I8 tensor is listed, and only reading it fails.
    const Checkpoint ckpt = Checkpoint::open(dir_.string());
    EXPECT_TRUE(ckpt.contains("layers.2.ffn.experts.0.w1.weight"));
    EXPECT_EQ(ckpt.entry("layers.2.ffn.experts.0.w1.weight").file_dtype, "I8");
    expect_error([&] { ckpt.read("layers.2.ffn.experts.0.w1.weight"); }, ErrorKind::Io,
                 {"'layers.2.ffn.experts.0.w1.weight'", "unknown dtype 'I8'"});
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
}

// The release's multi-token-prediction module has an attention layer of its own,
// mtp.0.attn.*, beside its other tensors (mtp.0.emb / .e_proj / .ffn ...) and the main stack.
TEST_F(ReleaseCheckpoint, MtpModuleLayerLoadsByItsName) {
  const AttentionConfig swa = release_like_cfg(0), csa = release_like_cfg(4);
  std::map<std::string, std::vector<float>> want;
  std::vector<TensorMap> shards(2);
  shards[0] = release_layer(csa, 0, 11, nullptr);
  shards[1] = release_layer(swa, CheckpointLayer::mtp_module(0), 12, &want);
  shards[1].emplace("mtp.0.e_proj.weight", Tensor(DType::bf16, {8, 256}));
  shards[1].emplace("mtp.0.ffn.gate.weight", Tensor(DType::bf16, {8, 256}));
  write_sharded(shards);
  expect_values(LayerWeights::load(dir_.string(), swa, CheckpointLayer::mtp_module(0)), want);
  expect_values(LayerWeights::load(dir_.string(), swa, CheckpointLayer::parse("mtp.0", "layer")), want);
  EXPECT_NO_THROW(LayerWeights::load(dir_.string(), csa, 0));
  // A missing module, and a load without a layer, list what there is, MTP modules included.
  expect_error([&] { LayerWeights::load(dir_.string(), swa, CheckpointLayer::mtp_module(1)); },
               ErrorKind::InvalidArgument, {"mtp.1.attn.*", "in it: 0, mtp.0"});
  expect_error([&] { LayerWeights::load(dir_.string(), swa); }, ErrorKind::InvalidArgument,
               {"multi-layer", "0, mtp.0"});
}

TEST(CheckpointLayerName, ParsesAndMapsToTheModelsLayers) {
  EXPECT_EQ(CheckpointLayer::parse("12", "x").prefix(), "layers.12");
  EXPECT_EQ(CheckpointLayer::parse("layers.3", "x").prefix(), "layers.3");
  EXPECT_EQ(CheckpointLayer::parse("mtp.0", "x"), CheckpointLayer::mtp_module(0));
  EXPECT_EQ(CheckpointLayer(12).label(), "12");
  EXPECT_EQ(CheckpointLayer::mtp_module(0).label(), "mtp.0");
  for (const char* bad : {"", "-1", "mtp", "mtp.", "mtp.x", "layers.2.attn", "layer.2", "1234567", " 1",
                          "043", "mtp.01", "layers.00"})
    expect_error([&] { CheckpointLayer::parse(bad, "--layer"); }, ErrorKind::InvalidArgument,
                 {"--layer", "mtp.K"});
  EXPECT_EQ(attention_layer_of("layers.7.attn.wkv.weight"), CheckpointLayer(7));
  EXPECT_EQ(attention_layer_of("mtp.0.attn.compressor.ape"), CheckpointLayer::mtp_module(0));
  for (const char* other : {"mtp.0.e_proj.weight", "layers.7.ffn.w1.weight", "embed.weight",
                            "layers.x.attn.wkv.weight", "attn.wkv.weight", "mtp.0.attn"})
    EXPECT_EQ(attention_layer_of(other), std::nullopt) << other;
  // Flash: 43 main layers, then the MTP module's entry (44 ratios).
  const ModelConfig flash = ModelConfig::preset("flash");
  EXPECT_EQ(checkpoint_layer_of(flash, 42), CheckpointLayer(42));
  EXPECT_EQ(checkpoint_layer_of(flash, 43), CheckpointLayer::mtp_module(0));
  EXPECT_EQ(model_layer_index(flash, CheckpointLayer::mtp_module(0)), 43);
  EXPECT_EQ(model_layer_index(flash, CheckpointLayer::mtp_module(1)), std::nullopt);
  EXPECT_EQ(model_layer_index(flash, CheckpointLayer(43)), std::nullopt);  // no layers.43
  EXPECT_EQ(model_layer_index(flash, CheckpointLayer(5)), 5);
  EXPECT_EQ(model_layer_index(flash, CheckpointLayer::mtp_module(-1)), std::nullopt);  // not layers.42
  EXPECT_EQ(model_layer_index(flash, CheckpointLayer(-1)), std::nullopt);
  ModelConfig no_mtp = flash;
  no_mtp.num_hidden_layers = 44;  // every entry a main layer
  EXPECT_EQ(model_layer_index(no_mtp, CheckpointLayer::mtp_module(0)), std::nullopt);
  EXPECT_EQ(model_layer_index(no_mtp, CheckpointLayer(43)), 43);
  EXPECT_EQ(checkpoint_layer_of(no_mtp, 43), CheckpointLayer(43));
  // Without num_hidden_layers every entry is a main layer and no MTP module can be placed.
  const ModelConfig tiny = ModelConfig::preset("tiny");
  EXPECT_EQ(checkpoint_layer_of(tiny, 2), CheckpointLayer(2));
  EXPECT_EQ(model_layer_index(tiny, CheckpointLayer(2)), 2);
  EXPECT_EQ(model_layer_index(tiny, CheckpointLayer::mtp_module(0)), std::nullopt);
}

TEST_F(ReleaseCheckpoint, OneFileAndDirectoryWithOneFile) {
  const AttentionConfig cfg = release_like_cfg(4);
  std::map<std::string, std::vector<float>> want;
  const TensorMap layer = release_layer(cfg, 0, 3, &want);
  const std::string file = (dir_ / "layer.safetensors").string();
  save_safetensors(file, layer);
  expect_values(LayerWeights::load(file, cfg, 0), want);
  expect_values(LayerWeights::load(dir_.string(), cfg, 0), want);
  // The bf16 path is unchanged: a layer saved by csattn loads bitwise.
  const LayerWeights w = LayerWeights::random(cfg, 8);
  w.save(file);
  const LayerWeights u = LayerWeights::load(file, cfg);
  for (const ParamInfo& p : w.params()) EXPECT_EQ(u.get(p.name).to_f32(), w.get(p.name).to_f32()) << p.name;
}

TEST_F(ReleaseCheckpoint, BlockScaleErrorsNameTheTensor) {
  const AttentionConfig cfg = release_like_cfg(0);
  const std::string file = (dir_ / "l.safetensors").string();
  auto with = [&](auto edit) {
    TensorMap m = release_layer(cfg, 1, 11, nullptr);
    edit(m);
    save_safetensors(file, m);
  };
  with([](TensorMap& m) { m.erase("layers.1.attn.wkv.scale"); });
  expect_error([&] { LayerWeights::load(file, cfg, 1); }, ErrorKind::Io,
               {file, "'layers.1.attn.wkv.weight' is F8_E4M3", "'layers.1.attn.wkv.scale'", "missing"});
  with([](TensorMap& m) { m["layers.1.attn.wkv.scale"] = Tensor(DType::e8m0, {1, 1}); });
  expect_error([&] { LayerWeights::load(file, cfg, 1); }, ErrorKind::ShapeMismatch,
               {"'layers.1.attn.wkv.weight'", "[1, 1]", "expected [1, 2]"});
  with([](TensorMap& m) { m["layers.1.attn.wkv.scale"] = Tensor(DType::bf16, {1, 2}); });
  expect_error([&] { LayerWeights::load(file, cfg, 1); }, ErrorKind::DTypeMismatch,
               {"'layers.1.attn.wkv.weight'", "F8_E8M0", "bf16"});
  with([](TensorMap& m) {
    static_cast<std::uint8_t*>(m["layers.1.attn.wo_b.scale"].data())[1] = 0xFF;  // E8M0 NaN
  });
  expect_error([&] { LayerWeights::load(file, cfg, 1); }, ErrorKind::InvalidArgument,
               {"'layers.1.attn.wo_b.weight'", "block scale [0, 1] is not finite"});
  with([](TensorMap& m) { static_cast<std::uint8_t*>(m["layers.1.attn.wq_a.weight"].data())[300] = 0x7F; });
  expect_error([&] { LayerWeights::load(file, cfg, 1); }, ErrorKind::InvalidArgument,
               {"'layers.1.attn.wq_a.weight'", "element [1, 44]", "NaN"});
  with([](TensorMap& m) { m["layers.1.attn.wkv.scale"] = Tensor(DType::f16, {1, 2}); });
  expect_error([&] { LayerWeights::load(file, cfg, 1); }, ErrorKind::DTypeMismatch,
               {"'layers.1.attn.wkv.weight'", "got f16"});
  with([](TensorMap& m) {  // 2^127 times E4M3 448 leaves bf16's range
    static_cast<std::uint8_t*>(m["layers.1.attn.wkv.scale"].data())[0] = 254;
    static_cast<std::uint8_t*>(m["layers.1.attn.wkv.weight"].data())[0] = 0x7E;
  });
  expect_error([&] { LayerWeights::load(file, cfg, 1); }, ErrorKind::InvalidArgument,
               {"'layers.1.attn.wkv.weight'", "element [0, 0]", "out of range"});
  // FP8 only stands in for bf16 linear weights: an f32 parameter stays f32.
  with([](TensorMap& m) { m["layers.1.attn.attn_sink"] = Tensor(DType::e4m3, {4}); });
  expect_error([&] { LayerWeights::load(file, cfg, 1); }, ErrorKind::DTypeMismatch,
               {"'layers.1.attn.attn_sink'", "expected dtype f32, got e4m3"});
  // A scale without its FP8 weight (the weight in bf16) is unexpected, and says so.
  with([](TensorMap& m) {
    m.erase("layers.1.attn.wkv.weight");
    m.emplace("layers.1.attn.wkv.weight", Tensor(DType::bf16, {64, 256}));
  });
  expect_error([&] { LayerWeights::load(file, cfg, 1); }, ErrorKind::Io,
               {"unexpected tensor 'layers.1.attn.wkv.scale'", "block scales of an F8_E4M3"});
}

// F32 block scales (checkpoints converted from the V3-style weight_scale_inv): any value, the
// product rounded to bf16.
TEST_F(ReleaseCheckpoint, F32BlockScalesRoundTheProductToBf16) {
  const AttentionConfig cfg = release_like_cfg(0);
  std::map<std::string, std::vector<float>> want;
  TensorMap m = release_layer(cfg, 0, 21, &want);
  const Tensor& q = m.at("layers.0.attn.wq_a.weight");  // [160, 256]: 2 x 2 blocks
  const float scales[4] = {0.3f, -1.7f, 1e-3f, 3.0f};
  m["layers.0.attn.wq_a.scale"] = Tensor::from_f32({scales[0], scales[1], scales[2], scales[3]}, {2, 2});
  const auto* qb = static_cast<const std::uint8_t*>(q.data());
  std::vector<float>& w = want.at("attn.wq_a.weight");
  for (std::int64_t i = 0; i < 160; ++i)
    for (std::int64_t j = 0; j < 256; ++j)
      w[static_cast<std::size_t>(i * 256 + j)] =
          round_bf16(static_cast<float>(e4m3_value(qb[i * 256 + j])) * scales[(i / 128) * 2 + j / 128]);
  const std::string file = (dir_ / "l.safetensors").string();
  save_safetensors(file, m);
  expect_values(LayerWeights::load(file, cfg, 0), want);
}

TEST_F(ReleaseCheckpoint, IndexErrorsNameTheIndexShardAndTensor) {
  const AttentionConfig cfg = release_like_cfg(0);
  const std::string index = (dir_ / "model.safetensors.index.json").string();
  std::ofstream(index) << "{ not json";
  expect_error([&] { Checkpoint::open(dir_.string()); }, ErrorKind::Io, {index, "not valid JSON"});
  write_index({{"metadata", nlohmann::json::object()}});
  expect_error([&] { Checkpoint::open(dir_.string()); }, ErrorKind::Io, {index, "weight_map"});
  write_index({{"weight_map", {{"layers.0.attn.attn_sink", 7}}}});
  expect_error([&] { Checkpoint::open(index); }, ErrorKind::Io, {"layers.0.attn.attn_sink", "shard file name"});
  write_index({{"weight_map", nlohmann::json::array({"a", "b"})}});
  expect_error([&] { Checkpoint::open(index); }, ErrorKind::Io, {index, "weight_map"});
  write_index({{"weight_map", {{"layers.0.attn.attn_sink", ""}}}});
  expect_error([&] { Checkpoint::open(index); }, ErrorKind::Io, {"layers.0.attn.attn_sink", "shard file name"});
  for (const char* outside : {"/abs.safetensors", "../x.safetensors", "shards/../../x.safetensors"}) {
    write_index({{"weight_map", {{"layers.0.attn.attn_sink", outside}}}});
    expect_error([&] { Checkpoint::open(index); }, ErrorKind::Io, {outside, "leaves the index's directory"});
  }
  // A shard the index names but the directory lacks, and a shard without the tensor.
  write_sharded({release_layer(cfg, 0, 1, nullptr)});
  nlohmann::json j;
  std::ifstream(index) >> j;
  j["weight_map"]["layers.0.attn.attn_sink"] = "model-00009-of-00009.safetensors";
  j["weight_map"]["layers.0.attn.kv_norm.weight"] = "model-00001-of-00001.safetensors";
  j["weight_map"]["layers.0.attn.q_norm.weight"] = "model-00002-of-00002.safetensors";
  write_index(j);
  TensorMap other;
  other.emplace("x", Tensor(DType::f32, {1}));
  save_safetensors((dir_ / "model-00002-of-00002.safetensors").string(), other);
  const Checkpoint c = Checkpoint::open(dir_.string());
  expect_error([&] { c.read("layers.0.attn.attn_sink"); }, ErrorKind::Io,
               {"'layers.0.attn.attn_sink'", "model-00009-of-00009.safetensors", "does not exist"});
  expect_error([&] { c.read("layers.0.attn.q_norm.weight"); }, ErrorKind::Io,
               {"model-00002-of-00002.safetensors", "does not hold it"});
  expect_error([&] { c.read("nope"); }, ErrorKind::Io, {"no tensor named 'nope'"});
  // The layer's first parameter in table order with a bad entry: q_norm (after wq_a).
  expect_error([&] { LayerWeights::load(dir_.string(), cfg, 0); }, ErrorKind::Io,
               {"'layers.0.attn.q_norm.weight'", "does not hold it"});
  // A directory with neither an index nor exactly one .safetensors file.
  fs::remove(index);
  save_safetensors((dir_ / "another.safetensors").string(), other);
  expect_error([&] { Checkpoint::open(dir_.string()); }, ErrorKind::Io,
               {"model.safetensors.index.json", "3 .safetensors files"});
  expect_error([&] { Checkpoint::open((dir_ / "missing").string()); }, ErrorKind::Io,
               {"no such file or directory"});
}

TEST(SafetensorsReaderTest, ReadsOneTensorAtATime) {
  const std::string p = ::testing::TempDir() + "csattn_reader_" + std::to_string(::getpid()) + ".safetensors";
  TensorMap m;
  m.emplace("a", Tensor::from_f32({1.0f, 2.0f, 3.0f}, {3}));
  m.emplace("b", Tensor::from_f32({4.0f, 5.0f}, {2}));
  save_safetensors(p, m);
  const SafetensorsReader r(p);
  std::vector<std::string> names;
  for (const auto& [name, e] : r.entries()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.entry("b").shape, (Shape{2}));
  EXPECT_EQ(r.entry("b").file_dtype, "F32");
  EXPECT_EQ(r.read("b").to_f32(), (std::vector<float>{4.0f, 5.0f}));
  EXPECT_EQ(r.read("a").to_f32(), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(r.read("b").to_f32(), (std::vector<float>{4.0f, 5.0f}));  // seeks back
  expect_error([&] { r.read("c"); }, ErrorKind::Io, {p, "'c'", "no such tensor"});
  // A read that fails (the file cut short after the header was read) leaves the reader
  // usable for the tensors before the cut.
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 4);
  expect_error([&] { r.read("b"); }, ErrorKind::Io, {p, "'b'", "cannot read its data"});
  EXPECT_EQ(r.read("a").to_f32(), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  std::filesystem::remove(p);
}
