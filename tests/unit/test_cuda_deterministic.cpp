// The GPU backward's deterministic mode (RunOptions::deterministic): two backward passes give
// bitwise-equal gradients (the fast mode sums key gradients with atomics, whose order varies),
// and they agree with the fast mode to fp32 summation-order accuracy. Flash shape (the
// tensor-core kernels) for every layer type and both loss modes, the small preset (the
// CUDA-core attention kernel) for SWA / HCA; a shape whose indexer loss has no deterministic
// kernel is refused with a clear error. Skips where no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>

#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

std::uint32_t float_bits(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

struct DetCase {
  std::string preset;
  int ratio;
  bool sparse;
  int heads = 0;  // > 0: the preset with this many heads (128: two head blocks, the Pro count)
};
void PrintTo(const DetCase& c, std::ostream* os) {
  *os << c.preset << " ratio " << c.ratio << (c.sparse ? " sparse" : " dense")
      << (c.heads > 0 ? " heads " + std::to_string(c.heads) : std::string());
}


class CudaDeterministic : public ::testing::TestWithParam<DetCase> {};

TEST_P(CudaDeterministic, BackwardIsBitwiseRepeatableAndMatchesTheFastMode) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const DetCase c = GetParam();
  AttentionConfig cfg = ModelConfig::preset(c.preset).base;
  cfg.compress_ratio = c.ratio;
  cfg.sparse_loss = c.sparse;
  if (c.heads > 0) cfg.n_heads = c.heads;
  cfg.validate();
  cfg.loss_coeff = 0.5;
  const SeqLayout layout = c.preset == "flash" ? SeqLayout::from_lengths({200, 3, 497}, {200, 8, 500})
                                               : SeqLayout::from_lengths({70, 300, 521}, {72, 300, 530});
  const int T = static_cast<int>(layout.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 51);
  const Tensor x = random_tensor(T, cfg.d_model, 52, true);
  const Tensor dy = random_tensor(T, cfg.d_model, 53, true);
  RunOptions det_opt{Precision::bf16, Device::cuda, 0, true};
  det_opt.deterministic = true;
  HybridAttentionLayer det(cfg, w, det_opt);
  HybridAttentionLayer fast(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
  const LayerOutputs od = det.forward(x, layout);
  const LayerOutputs of = cfg.has_indexer() ? fast.forward(x, layout, od.topk_indices) : fast.forward(x, layout);
  const LayerGradients g1 = det.backward(od, dy), g2 = det.backward(od, dy);
  const LayerGradients gf = fast.backward(of, dy);
  auto same_bits = [](const Tensor& a, const Tensor& b, const std::string& name) {
    const std::vector<float> va = a.to_f32(), vb = b.to_f32();
    ASSERT_EQ(va.size(), vb.size()) << name;
    for (std::size_t i = 0; i < va.size(); ++i)
      ASSERT_EQ(float_bits(va[i]), float_bits(vb[i])) << name << " differs at " << i;
  };
  auto close = [](const Tensor& a, const Tensor& b, const std::string& name) {
    const std::vector<float> va = a.to_f32(), vb = b.to_f32();
    for (float v : va) ASSERT_TRUE(std::isfinite(v)) << name;
    double nb = 0.0;
    for (float v : vb) nb += static_cast<double>(v) * v;
    if (nb == 0.0) {
      for (float v : va) ASSERT_EQ(v, 0.0f) << name;
      return;
    }
    const Similarity s = similarity(va, to_double(vb));
    EXPECT_GT(s.cosine, 1.0 - 1e-4) << name;
  };
  same_bits(g1.grad_input, g2.grad_input, "grad_input");
  close(g1.grad_input, gf.grad_input, "grad_input");
  for (const ParamInfo& p : w.params()) {
    same_bits(g1.grad.at(p.name), g2.grad.at(p.name), p.name);
    close(g1.grad.at(p.name), gf.grad.at(p.name), p.name);
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, CudaDeterministic,
                         ::testing::Values(DetCase{"flash", 0, true}, DetCase{"flash", 4, true},
                                           DetCase{"flash", 4, false}, DetCase{"flash", 128, true},
                                           // 128 heads: the loss's two head groups in the
                                           // tensor-core kernel, chunked (deterministic)
                                           DetCase{"flash", 4, true, 128}, DetCase{"flash", 4, false, 128},
                                           DetCase{"small", 0, true}, DetCase{"small", 128, true}),
                         [](const auto& param_info) {
                           const DetCase& c = param_info.param;
                           return c.preset + "_" + layer_kind_name(layer_kind(c.ratio)) +
                                  (c.sparse ? "_sparse" : "_dense") +
                                  (c.heads > 0 ? "_H" + std::to_string(c.heads) : std::string());
                         });

TEST(CudaDeterministic, IndexerLossWithoutItsDeterministicKernelIsRefused) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  AttentionConfig cfg = ModelConfig::preset("small").base;  // head_dim 64: CUDA-core loss
  cfg.compress_ratio = 4;
  cfg.loss_coeff = 0.5;
  RunOptions opt{Precision::bf16, Device::cuda};
  opt.deterministic = true;
  HybridAttentionLayer layer(cfg, LayerWeights::random(cfg, 3), opt);
  const SeqLayout layout = SeqLayout::from_lengths({40});
  const LayerOutputs o = layer.forward(random_tensor(40, cfg.d_model, 4), layout);
  try {
    layer.backward(o, random_tensor(40, cfg.d_model, 5));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deterministic"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace csattn
