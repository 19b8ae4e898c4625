// The CUDA forward against the CPU backend's bf16 emulation (tight) and the fp64 oracle
// (loose), on ragged padded THD batches; the workspace is poisoned with NaN before every
// run. Skips (with the reason) where no GPU is present; the lent H200 runs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

struct CudaCase {
  std::string preset;
  int ratio;
  int heads;  // 0: the preset's
};
void PrintTo(const CudaCase& c, std::ostream* os) {
  *os << c.preset << " ratio " << c.ratio << " heads " << c.heads;
}

std::string cuda_case_name(const ::testing::TestParamInfo<CudaCase>& info) {
  return info.param.preset + "_" + layer_kind_name(layer_kind(info.param.ratio)) + "_H" +
         std::to_string(info.param.heads);
}

AttentionConfig config_for(const CudaCase& c) {
  AttentionConfig cfg = ModelConfig::preset(c.preset).base;
  cfg.compress_ratio = c.ratio;
  if (c.heads > 0) {
    cfg.n_heads = c.heads;
    cfg.o_groups = c.heads % 8 == 0 ? 8 : 1;
  }
  cfg.validate();
  return cfg;
}

SeqLayout batch_for(const AttentionConfig& cfg) {
  // Shorter than the window, an L mod m tail, several compressed entries, padding rows.
  if (cfg.compress_ratio == 128) return SeqLayout::from_lengths({70, 300, 521}, {72, 300, 530});
  return SeqLayout::from_lengths({5, 1, 77, 203, 130}, {8, 1, 77, 210, 130});
}

class CudaForward : public ::testing::TestWithParam<CudaCase> {};

TEST_P(CudaForward, MatchesCpuBackendAndOracle) {
  SKIP_WITHOUT_GPU();
  const AttentionConfig cfg = config_for(GetParam());
  const SeqLayout layout = batch_for(cfg);
  const int T = static_cast<int>(layout.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 77);
  const Tensor x = random_tensor(T, cfg.d_model, 78, true);
  HybridAttentionLayer cpu(cfg, w, RunOptions{Precision::bf16, Device::cpu});
  HybridAttentionLayer gpu(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
  const LayerOutputs c = cpu.forward(x, layout);
  const LayerOutputs g = gpu.forward(x, layout);
  const std::vector<float> yg = g.output.to_f32();
  for (float v : yg) ASSERT_TRUE(std::isfinite(v)) << "unwritten or NaN output";
  if (cfg.has_indexer())
    expect_topk_close(topk_vector(g), topk_vector(c), cfg.index_topk);

  // Tight: the same selection on both backends (the CPU's), compared with the CPU's bf16
  // emulation.
  const LayerOutputs gf = cfg.has_indexer() ? gpu.forward(x, layout, c.topk_indices) : g;
  const Similarity tight = similarity(gf.output.to_f32(), to_double(c.output.to_f32()));
  EXPECT_GT(tight.cosine, 1.0 - 2e-4);
  EXPECT_GT(tight.tensor, 1.0 - 2e-4);
  // Loose: the fp64 oracle on the same selection.
  oracle::Options opt;
  const auto sel = topk_vector(c);
  opt.forced_topk = cfg.has_indexer() ? &sel : nullptr;
  const oracle::Result ref = oracle::forward(cfg, layout, oracle::weights64(w), x.to_f64(), opt);
  const Similarity loose = similarity(gf.output.to_f32(), ref.output);
  EXPECT_GT(loose.cosine, 1.0 - 1.5e-3);
  EXPECT_GT(loose.tensor, 1.0 - 1.5e-3);
}

TEST_P(CudaForward, RepeatedRunsAreBitwiseEqual) {
  SKIP_WITHOUT_GPU();
  const AttentionConfig cfg = config_for(GetParam());
  const SeqLayout layout = batch_for(cfg);
  const int T = static_cast<int>(layout.total_rows());
  HybridAttentionLayer gpu(cfg, LayerWeights::random(cfg, 5), RunOptions{Precision::bf16, Device::cuda, 0, true});
  const Tensor x = random_tensor(T, cfg.d_model, 6, true);
  const LayerOutputs a = gpu.forward(x, layout);
  for (int i = 0; i < 3; ++i) {
    const LayerOutputs b = gpu.forward(x, layout);
    EXPECT_EQ(a.output.to_f32(), b.output.to_f32());
    EXPECT_EQ(topk_vector(a), topk_vector(b));
  }
}

std::vector<CudaCase> cuda_cases() {
  std::vector<CudaCase> v;
  for (int r : {0, 4, 128}) v.push_back({"small", r, 0});
  for (int h : {8, 24, 64, 128}) v.push_back({"small", 4, h});  // head counts 8..128
  return v;
}

INSTANTIATE_TEST_SUITE_P(Layers, CudaForward, ::testing::ValuesIn(cuda_cases()), cuda_case_name);

// The real Flash dimensions once per layer type, a few hundred tokens.
class CudaForwardFlash : public ::testing::TestWithParam<int> {};

TEST_P(CudaForwardFlash, MatchesCpuBackend) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  cfg.compress_ratio = GetParam();
  const SeqLayout layout = SeqLayout::from_lengths({300, 700});
  const int T = 1000;
  const LayerWeights w = LayerWeights::random(cfg, 9);
  const Tensor x = random_tensor(T, cfg.d_model, 10, true);
  HybridAttentionLayer cpu(cfg, w, RunOptions{Precision::bf16, Device::cpu});
  HybridAttentionLayer gpu(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
  const LayerOutputs c = cpu.forward(x, layout);
  const LayerOutputs g = cfg.has_indexer() ? gpu.forward(x, layout, c.topk_indices)
                                           : gpu.forward(x, layout);
  const Similarity sim = similarity(g.output.to_f32(), to_double(c.output.to_f32()));
  EXPECT_GT(sim.cosine, 1.0 - 2e-4);
  EXPECT_GT(sim.tensor, 1.0 - 2e-4);
  if (cfg.has_indexer())
    expect_topk_close(topk_vector(gpu.forward(x, layout)), topk_vector(c), cfg.index_topk);
}

INSTANTIATE_TEST_SUITE_P(Layers, CudaForwardFlash, ::testing::Values(0, 4, 128),
                         [](const auto& param_info) {
                           return std::string(layer_kind_name(layer_kind(param_info.param)));
                         });

// The GPU backward against the CPU backend (bf16 emulation) on the same selection: every
// gradient and the loss. GPU activation gradients are bf16 between operators, so the gate
// is the oracle-level similarity, not bitwise.
struct CudaGradCase {
  int ratio;
  bool sparse;
  double coeff;
  bool per_token = false;  // the loss summed over rows (its scale lambda, not lambda / rows)
  // 0: the preset's. 12 is not a multiple of 8: the output's kept RoPE tail is widened to
  // 16 columns (attention_tail_dim), so the forward's in-place inverse RoPE, the kept tails
  // and the backward's RoPE^T run their odd-span paths through the whole layer.
  int rope_dim = 0;
};
void PrintTo(const CudaGradCase& c, std::ostream* os) {
  *os << "ratio " << c.ratio << (c.sparse ? " sparse" : " dense") << " coeff " << c.coeff
      << (c.per_token ? " per token" : "") << (c.rope_dim ? " rope_dim " : "")
      << (c.rope_dim ? std::to_string(c.rope_dim) : "");
}

class CudaBackward : public ::testing::TestWithParam<CudaGradCase> {};

TEST_P(CudaBackward, MatchesCpuBackend) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("small").base;
  cfg.compress_ratio = GetParam().ratio;
  cfg.sparse_loss = GetParam().sparse;
  cfg.loss_coeff = GetParam().coeff;
  cfg.per_token_loss = GetParam().per_token;
  if (GetParam().rope_dim > 0) cfg.rope_dim = GetParam().rope_dim;
  cfg.validate();
  const SeqLayout layout = batch_for(cfg);
  const int T = static_cast<int>(layout.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 31);
  const Tensor x = random_tensor(T, cfg.d_model, 32, true);
  const Tensor dy = random_tensor(T, cfg.d_model, 33, true);
  HybridAttentionLayer cpu(cfg, w, RunOptions{Precision::bf16, Device::cpu});
  HybridAttentionLayer gpu(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
  const LayerOutputs c = cpu.forward(x, layout);
  const LayerOutputs g = cfg.has_indexer() ? gpu.forward(x, layout, c.topk_indices)
                                           : gpu.forward(x, layout);
  EXPECT_NEAR(g.indexer_loss, c.indexer_loss, 2e-2 * std::fabs(c.indexer_loss) + 1e-7);
  expect_gradients_close(gpu.backward(g, dy), cpu.backward(c, dy), w);
}

INSTANTIATE_TEST_SUITE_P(Layers, CudaBackward,
                         ::testing::Values(CudaGradCase{0, true, 0.01}, CudaGradCase{128, true, 0.01},
                                           CudaGradCase{4, true, 0.5}, CudaGradCase{4, false, 0.5},
                                           CudaGradCase{4, true, 0.0},
                                           // the device loss scale's per-token branch
                                           CudaGradCase{4, true, 0.5, true},
                                           // a widened output tail (rope_dim 12 -> 16 kept)
                                           CudaGradCase{0, true, 0.01, false, 12},
                                           CudaGradCase{4, true, 0.5, false, 12}),
                         [](const auto& param_info) {
                           const CudaGradCase& c = param_info.param;
                           return std::string(layer_kind_name(layer_kind(c.ratio))) +
                                  (c.sparse ? "_sparse" : "_dense") + (c.coeff == 0.0 ? "_nolos" : "") +
                                  (c.per_token ? "_pertoken" : "") +
                                  (c.rope_dim ? "_rope" + std::to_string(c.rope_dim) : "");
                         });

TEST(CudaBackward, FlashShapeMatchesCpuBackend) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  cfg.compress_ratio = 4;
  const SeqLayout layout = SeqLayout::from_lengths({200, 500});
  const int T = 700;
  const LayerWeights w = LayerWeights::random(cfg, 41);
  const Tensor x = random_tensor(T, cfg.d_model, 42, true);
  const Tensor dy = random_tensor(T, cfg.d_model, 43, true);
  HybridAttentionLayer cpu(cfg, w, RunOptions{Precision::bf16, Device::cpu});
  HybridAttentionLayer gpu(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
  const LayerOutputs c = cpu.forward(x, layout);
  const LayerOutputs g = gpu.forward(x, layout, c.topk_indices);
  const LayerGradients gc = cpu.backward(c, dy), gg = gpu.backward(g, dy);
  const Similarity sim = similarity(gg.grad_input.to_f32(), to_double(gc.grad_input.to_f32()));
  EXPECT_GT(sim.cosine, 1.0 - 3e-3);
  for (const ParamInfo& p : w.params()) {
    const Similarity s = similarity(gg.grad.at(p.name).to_f32(), to_double(gc.grad.at(p.name).to_f32()));
    EXPECT_GT(s.cosine, 1.0 - 3e-3) << p.name;
  }
}

TEST(CudaBackward, MustFollowItsForward) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("tiny").layer(0);
  HybridAttentionLayer gpu(cfg, LayerWeights::random(cfg, 1), RunOptions{Precision::bf16, Device::cuda});
  const SeqLayout layout = SeqLayout::from_lengths({10});
  const LayerOutputs first = gpu.forward(random_tensor(10, cfg.d_model, 2), layout);
  const LayerOutputs second = gpu.forward(random_tensor(10, cfg.d_model, 3), layout);
  EXPECT_THROW(gpu.backward(first, random_tensor(10, cfg.d_model, 4)), Error);
  EXPECT_NO_THROW(gpu.backward(second, random_tensor(10, cfg.d_model, 4)));
}

// Added after the last device run of 2026-12-02 (from a code review): paths the first
// tests did not reach.

// A long segment: the indexer scores many key tiles per row and the radix select runs
// (visible entries >> top-k), against the CPU's selection and output.
TEST(CudaForward, LongSegmentSelectsLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("small").base;
  cfg.compress_ratio = 4;
  const SeqLayout layout = SeqLayout::from_lengths({3000, 900});
  const int T = 3900;
  const LayerWeights w = LayerWeights::random(cfg, 71);
  const Tensor x = random_tensor(T, cfg.d_model, 72, true);
  HybridAttentionLayer cpu(cfg, w, RunOptions{Precision::bf16, Device::cpu});
  HybridAttentionLayer gpu(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
  const LayerOutputs c = cpu.forward(x, layout);
  expect_topk_close(topk_vector(gpu.forward(x, layout)), topk_vector(c), cfg.index_topk);
  const LayerOutputs g = gpu.forward(x, layout, c.topk_indices);
  const Similarity sim = similarity(g.output.to_f32(), to_double(c.output.to_f32()));
  EXPECT_GT(sim.cosine, 1.0 - 2e-4);
}

// Exact ties everywhere (zero head weights): the selection is the smallest ids, exactly.
TEST(CudaForward, TiesSelectSmallestIndices) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("small").base;
  cfg.compress_ratio = 4;
  LayerWeights w = LayerWeights::random(cfg, 73);
  Tensor& wp = w.get("attn.indexer.weights_proj.weight");
  std::fill(wp.ptr<float>(), wp.ptr<float>() + wp.numel(), 0.0f);
  const SeqLayout layout = SeqLayout::from_lengths({600});
  HybridAttentionLayer gpu(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
  const auto topk = topk_vector(gpu.forward(random_tensor(600, cfg.d_model, 74, true), layout));
  const int K = cfg.index_topk;
  for (int t = 0; t < 600; ++t) {
    const int n = std::min((t + 1) / 4, K);
    for (int k = 0; k < K; ++k) ASSERT_EQ(topk[t * K + k], k < n ? k : -1) << "row " << t;
  }
}

// Head dim 512 with 96 and 128 heads: the tensor-core attention with a partial and with two
// head blocks per token.
class CudaForwardHeads : public ::testing::TestWithParam<int> {};
TEST_P(CudaForwardHeads, MatchesCpuBackend) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  cfg.compress_ratio = 128;
  cfg.n_heads = GetParam();
  cfg.validate();
  const SeqLayout layout = SeqLayout::from_lengths({130, 400});
  const LayerWeights w = LayerWeights::random(cfg, 75);
  const Tensor x = random_tensor(530, cfg.d_model, 76, true);
  HybridAttentionLayer cpu(cfg, w, RunOptions{Precision::bf16, Device::cpu});
  HybridAttentionLayer gpu(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
  const Similarity sim = similarity(gpu.forward(x, layout).output.to_f32(),
                                    to_double(cpu.forward(x, layout).output.to_f32()));
  EXPECT_GT(sim.cosine, 1.0 - 2e-4);
  EXPECT_GT(sim.tensor, 1.0 - 2e-4);
}
INSTANTIATE_TEST_SUITE_P(Heads, CudaForwardHeads, ::testing::Values(96, 128));

// An empty batch, an empty segment and a padding-only segment, forward and backward; then a
// smaller batch after a larger one on the same layer.
TEST(CudaForward, DegenerateLayoutsAndShrinkingBatches) {
  SKIP_WITHOUT_GPU();
  for (int ratio : {0, 4, 128}) {
    AttentionConfig cfg = ModelConfig::preset("small").base;
    cfg.compress_ratio = ratio;
    const LayerWeights w = LayerWeights::random(cfg, 77);
    HybridAttentionLayer cpu(cfg, w, RunOptions{Precision::bf16, Device::cpu});
    HybridAttentionLayer gpu(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
    const LayerOutputs e = gpu.forward(Tensor(DType::f32, {0, cfg.d_model}), SeqLayout::bshd(1, 0));
    EXPECT_EQ(e.output.numel(), 0);
    EXPECT_EQ(e.indexer_loss, 0.0f);
    EXPECT_NO_THROW(gpu.backward(e, Tensor(DType::f32, {0, cfg.d_model})));
    for (const std::vector<int>& lens : {std::vector<int>{700, 300}, std::vector<int>{40}}) {
      std::vector<int> padded = lens;
      std::vector<int> real = lens;
      real.push_back(0);    // an empty segment
      padded.push_back(0);
      real.push_back(0);    // a padding-only segment
      padded.push_back(8);
      const SeqLayout layout = SeqLayout::from_lengths(real, padded);
      const int T = static_cast<int>(layout.total_rows());
      const Tensor x = random_tensor(T, cfg.d_model, 78, true);
      const LayerOutputs c = cpu.forward(x, layout);
      const LayerOutputs g = cfg.has_indexer() ? gpu.forward(x, layout, c.topk_indices)
                                               : gpu.forward(x, layout);
      const Similarity sim = similarity(g.output.to_f32(), to_double(c.output.to_f32()));
      EXPECT_GT(sim.cosine, 1.0 - 2e-4) << "ratio " << ratio << " T " << T;
      const LayerGradients gg = gpu.backward(g, random_tensor(T, cfg.d_model, 79, true));
      for (float v : gg.grad_input.to_f32()) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

// A forward that fails half-way (here: the dense loss of an 80K-token segment needs more
// shared memory than a block has) must not leave the previous forward's outputs usable.
TEST(CudaBackward, FailedForwardInvalidatesThePreviousOne) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("small").base;
  cfg.compress_ratio = 4;
  cfg.sparse_loss = false;
  HybridAttentionLayer gpu(cfg, LayerWeights::random(cfg, 81), RunOptions{Precision::bf16, Device::cuda});
  const SeqLayout small = SeqLayout::from_lengths({500});
  const LayerOutputs ok = gpu.forward(random_tensor(500, cfg.d_model, 82, true), small);
  EXPECT_THROW(gpu.forward(random_tensor(80000, cfg.d_model, 83, true), SeqLayout::from_lengths({80000})),
               Error);
  EXPECT_THROW(gpu.backward(ok, random_tensor(500, cfg.d_model, 84, true)), Error);
  const LayerOutputs again = gpu.forward(random_tensor(500, cfg.d_model, 85, true), small);
  EXPECT_NO_THROW(gpu.backward(again, random_tensor(500, cfg.d_model, 86, true)));
}

TEST(CudaForward, WithoutGpuTheErrorSaysWhy) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a GPU is present";
  AttentionConfig cfg = ModelConfig::preset("tiny").layer(0);
  try {
    HybridAttentionLayer gpu(cfg, LayerWeights::random(cfg, 1), RunOptions{Precision::bf16, Device::cuda, 0, true});
    ADD_FAILURE() << "constructing a cuda layer without a GPU must throw";
  } catch (const Error& e) {
    // The reason itself, not only the prefix (the message was once built before `why` was
    // filled: argument evaluation order).
    ASSERT_FALSE(why.empty());
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace csattn
