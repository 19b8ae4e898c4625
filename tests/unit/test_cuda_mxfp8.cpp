// MXFP8 on the GPU. The round trip kernel (mxfp8.cu) against the CPU's quantize_mxfp8 +
// dequantize_mxfp8 bit for bit, on blocks of every kind (zeros, NaN, Inf, values at E4M3
// rounding ties, subnormal E4M3 results, saturation, magnitudes 2^-30..2^30); the layer
// with indexer_precision = mxfp8 on the GPU against the CPU's MXFP8 layer (selection within
// the n-1 rule, output on one selection tight, loss value, dense-loss gradients), a check
// that the MXFP8 selection differs from the bf16 one somewhere (the path is taken), and the
// sparse-loss backward with the MXFP8 predictor against the CPU's. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "csattn/ops.hpp"
#include "test_util.hpp"

#ifdef CSATTN_HAVE_CUDA
#include "cuda/kernels.hpp"
#include "cuda_test_util.hpp"
#endif

namespace csattn {
namespace {

using namespace testing_util;

#ifdef CSATTN_HAVE_CUDA
TEST(CudaMxfp8, RoundTripMatchesTheCpuQuantizerBitwise) {
  SKIP_WITHOUT_GPU();
  const int rows = 96, cols = 128;
  std::vector<float> x = random_normal(static_cast<std::size_t>(rows) * cols, 71);
  for (int r = 0; r < rows; ++r)  // a magnitude per row: 2^-30 .. 2^30
    for (int c = 0; c < cols; ++c) x[r * cols + c] *= std::ldexp(1.0f, (r % 61) - 30);
  // Special blocks in row 0: zeros, a NaN, an Inf, exact E4M3 ties, tiny values next to a
  // large one (subnormal E4M3), one value far above the others (saturation is impossible:
  // the scale rounds up; the others flush).
  for (int c = 0; c < 32; ++c) x[c] = 0.0f;
  x[32 + 5] = NAN;
  x[64 + 9] = INFINITY;
  for (int c = 0; c < 32; ++c) x[96 + c] = (1.0f + 0.0625f * (c % 16)) * (c % 2 ? 1.0f : -1.0f);
  x[1 * cols + 0] = 448.0f;
  for (int c = 1; c < 32; ++c) x[1 * cols + c] = 1e-3f * c;
  std::vector<std::uint16_t> bits(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) bits[i] = float_to_bf16_bits(x[i]);
  std::vector<float> xb(x.size());  // the bf16 inputs as floats: the CPU quantizes these
  for (std::size_t i = 0; i < x.size(); ++i) xb[i] = bf16_bits_to_float(bits[i]);

  std::vector<std::uint8_t> data(x.size()), scales(x.size() / 32);
  ops::quantize_mxfp8(ConstTensorView{xb.data(), DType::f32, {rows, cols}},
                      TensorView{data.data(), DType::e4m3, {rows, cols}},
                      TensorView{scales.data(), DType::e8m0, {rows, cols / 32}});
  std::vector<float> deq(x.size());
  ops::dequantize_mxfp8(ConstTensorView{data.data(), DType::e4m3, {rows, cols}},
                        ConstTensorView{scales.data(), DType::e8m0, {rows, cols / 32}},
                        TensorView{deq.data(), DType::f32, {rows, cols}});

  DeviceArray<std::uint16_t> in(bits), out(bits.size());
  out.fill_bytes(0x5A);
  cuda::launch_mxfp8_roundtrip(dev_cast<cuda::bf16>(in), dev_cast<cuda::bf16>(out), rows, cols, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<std::uint16_t> got = out.download();
  int bad = 0;
  for (std::size_t i = 0; i < got.size() && bad < 8; ++i) {
    const float g = bf16_bits_to_float(got[i]);
    const bool same = std::isnan(deq[i]) ? std::isnan(g) : got[i] == float_to_bf16_bits(deq[i]);
    if (!same) {
      ++bad;
      ADD_FAILURE() << "element " << i << " (row " << i / cols << "): input " << xb[i] << ", GPU " << g
                    << ", CPU " << deq[i];
    }
  }
  // In place gives the same.
  cuda::launch_mxfp8_roundtrip(dev_cast<cuda::bf16>(in), dev_cast<cuda::bf16>(in), rows, cols, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<std::uint16_t> again = in.download();
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(bf16_bits_to_float(got[i]))) continue;
    ASSERT_EQ(again[i], got[i]) << i;
  }
  EXPECT_THROW(cuda::launch_mxfp8_roundtrip(dev_cast<cuda::bf16>(in), dev_cast<cuda::bf16>(out), 2, 48, nullptr),
               Error);
}
#endif

AttentionConfig mxfp8_config(bool sparse) {
  AttentionConfig cfg = ModelConfig::preset("small").base;
  cfg.compress_ratio = 4;
  cfg.indexer_precision = IndexerPrecision::mxfp8;
  cfg.sparse_loss = sparse;
  cfg.loss_coeff = 0.5;
  cfg.validate();
  return cfg;
}

// One MXFP8 layer on the CPU and on the GPU (poisoned outputs) with the same random weights,
// a ragged padded batch, its hidden states and an output gradient.
struct Mxfp8Layers {
  AttentionConfig cfg;
  SeqLayout layout = SeqLayout::from_lengths({5, 77, 203, 130}, {8, 77, 210, 130});
  LayerWeights w;
  Tensor x, dy;
  HybridAttentionLayer cpu, gpu;
  Mxfp8Layers(bool sparse, std::uint64_t seed)
      : cfg(mxfp8_config(sparse)),
        w(LayerWeights::random(cfg, seed)),
        x(random_tensor(layout.total_rows(), cfg.d_model, seed + 1, true)),
        dy(random_tensor(layout.total_rows(), cfg.d_model, seed + 2, true)),
        cpu(cfg, w, RunOptions{Precision::bf16, Device::cpu}),
        gpu(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true}) {}
};

TEST(CudaMxfp8, LayerForwardMatchesTheCpuMxfp8Layer) {
  SKIP_WITHOUT_GPU();
  Mxfp8Layers l(true, 81);
  const LayerOutputs c = l.cpu.forward(l.x, l.layout);
  const LayerOutputs g = l.gpu.forward(l.x, l.layout);
  expect_topk_close(topk_vector(g), topk_vector(c), l.cfg.index_topk);
  // The loss: the predictor is the MXFP8 selection's softmax on both.
  EXPECT_NEAR(g.indexer_loss, c.indexer_loss, 2e-2 * std::fabs(c.indexer_loss) + 1e-7);
  const LayerOutputs gf = l.gpu.forward(l.x, l.layout, c.topk_indices);
  const Similarity tight = similarity(gf.output.to_f32(), to_double(c.output.to_f32()));
  EXPECT_GT(tight.cosine, 1.0 - 2e-4);
  EXPECT_GT(tight.tensor, 1.0 - 2e-4);

  // The MXFP8 path is taken: its selection differs from the bf16 indexer's on some row.
  AttentionConfig bf = l.cfg;
  bf.indexer_precision = IndexerPrecision::bf16;
  HybridAttentionLayer gpu_bf16(bf, l.w, RunOptions{Precision::bf16, Device::cuda});
  EXPECT_NE(topk_vector(gpu_bf16.forward(l.x, l.layout)), topk_vector(g));
}

TEST(CudaMxfp8, DenseLossBackwardMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Mxfp8Layers l(false, 83);
  const LayerOutputs c = l.cpu.forward(l.x, l.layout);
  const LayerOutputs g = l.gpu.forward(l.x, l.layout, c.topk_indices);
  expect_gradients_close(l.gpu.backward(g, l.dy), l.cpu.backward(c, l.dy), l.w);
}

// The sparse loss with the indexer's own MXFP8 selection: its predictor is that selection's
// softmax (from the MXFP8 operands), its gradient flows through the bf16 scores. Each layer
// selects for itself, so where a near-tie flips one id (the n - 1 rule) the gradients of that
// row differ: the tight gate applies when the selections are equal, numerics.md's MXFP8 gate
// (1 - 3e-2) otherwise.
TEST(CudaMxfp8, SparseLossBackwardMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Mxfp8Layers l(true, 86);
  const LayerOutputs c = l.cpu.forward(l.x, l.layout);
  const LayerOutputs g = l.gpu.forward(l.x, l.layout);
  expect_topk_close(topk_vector(g), topk_vector(c), l.cfg.index_topk);
  EXPECT_NEAR(g.indexer_loss, c.indexer_loss, 2e-2 * std::fabs(c.indexer_loss) + 1e-7);
  const bool same = topk_vector(g) == topk_vector(c);
  SCOPED_TRACE(same ? "same selection: tight gate" : "a selection differs: the MXFP8 gate");
  const LayerGradients gg = l.gpu.backward(g, l.dy), cg = l.cpu.backward(c, l.dy);
  expect_gradients_close(gg, cg, l.w, same ? 3e-3 : 3e-2);

  // The MXFP8 predictor is used: the bf16 predictor (the same selection forced, which
  // recomputes the predictor from the bf16 scores) gives other indexer gradients.
  const LayerOutputs gf = l.gpu.forward(l.x, l.layout, g.topk_indices);
  const LayerGradients gb = l.gpu.backward(gf, l.dy);
  EXPECT_GT(rel_l2(gg.grad.at("attn.indexer.wq_b.weight").to_f32(),
                   gb.grad.at("attn.indexer.wq_b.weight").to_f32()),
            1e-4)
      << "the MXFP8 predictor was not used";
}

}  // namespace
}  // namespace csattn
