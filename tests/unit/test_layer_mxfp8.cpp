// The layer with the MXFP8 indexer: MXFP8 scales are per row, so packing and padding change
// no selection; runs are bitwise repeatable and independent of the thread count (the compact
// indexer has no cross-row reductions); fp32 storage works too.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <vector>

#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

AttentionConfig mxfp8_config() {
  AttentionConfig cfg = tiny_config(4, 8, 5);
  cfg.indexer_precision = IndexerPrecision::mxfp8;
  return cfg;
}

Tensor rows_of(const Tensor& t, int first, int count) {
  const int cols = static_cast<int>(t.dim(1));
  std::vector<float> all = t.to_f32();
  return Tensor::from_f32({all.begin() + static_cast<long>(first) * cols,
                           all.begin() + static_cast<long>(first + count) * cols},
                          {count, cols});
}

TEST(LayerMxfp8, PackedSelectionEqualsSegmentsAlone) {
  const AttentionConfig cfg = mxfp8_config();
  const std::vector<int> lens = {45, 3, 70, 22};
  const SeqLayout packed = SeqLayout::from_lengths(lens);
  const int T = static_cast<int>(packed.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 8);
  const Tensor x = random_tensor(T, cfg.d_model, 9);
  HybridAttentionLayer layer(cfg, w, RunOptions{Precision::bf16});
  const auto all = topk_vector(layer.forward(x, packed));
  int first = 0;
  for (int len : lens) {
    const auto one = topk_vector(layer.forward(rows_of(x, first, len), SeqLayout::from_lengths({len})));
    const std::vector<std::int32_t> part(all.begin() + static_cast<long>(first) * cfg.index_topk,
                                         all.begin() + static_cast<long>(first + len) * cfg.index_topk);
    EXPECT_EQ(part, one) << "segment at row " << first;
    first += len;
  }
}

TEST(LayerMxfp8, PaddingRowsChangeNothing) {
  const AttentionConfig cfg = mxfp8_config();
  const SeqLayout padded = SeqLayout::from_lengths({37, 50}, {44, 52});
  const int T = static_cast<int>(padded.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 10);
  Tensor x = random_tensor(T, cfg.d_model, 11);
  HybridAttentionLayer layer(cfg, w, RunOptions{Precision::bf16});
  const LayerOutputs a = layer.forward(x, padded);
  // Garbage (huge values and a NaN) in the padding rows.
  float* px = x.ptr<float>();
  for (int r : {37, 40, 43, 44 + 50, 44 + 51})
    for (int j = 0; j < cfg.d_model; ++j) px[r * cfg.d_model + j] = j == 3 ? NAN : 1e30f;
  const LayerOutputs b = layer.forward(x, padded);
  const auto ta = topk_vector(a), tb = topk_vector(b);
  const std::vector<float> ya = a.output.to_f32(), yb = b.output.to_f32();
  const int K = cfg.index_topk;
  for (int r = 0; r < T; ++r) {
    const bool pad = (r >= 37 && r < 44) || r >= 44 + 50;
    for (int s = 0; s < K; ++s) {
      if (pad) {
        EXPECT_EQ(tb[r * K + s], -1) << "padding row " << r << " selects";
      } else {
        EXPECT_EQ(ta[r * K + s], tb[r * K + s]) << "row " << r;
      }
    }
    if (!pad) {
      for (int j = 0; j < cfg.d_model; ++j) ASSERT_EQ(ya[r * cfg.d_model + j], yb[r * cfg.d_model + j]);
    }
  }
  EXPECT_EQ(a.indexer_loss, b.indexer_loss);
}

TEST(LayerMxfp8, RepeatableAndThreadCountIndependent) {
  for (Precision prec : {Precision::bf16, Precision::fp32}) {
    const AttentionConfig cfg = mxfp8_config();
    const SeqLayout layout = SeqLayout::from_lengths({130, 67});
    const int T = static_cast<int>(layout.total_rows());
    const LayerWeights w = LayerWeights::random(cfg, 12);
    const Tensor x = random_tensor(T, cfg.d_model, 13);
    HybridAttentionLayer one(cfg, w, RunOptions{prec, Device::cpu, 1});
    HybridAttentionLayer two(cfg, w, RunOptions{prec, Device::cpu, 2});
    const LayerOutputs a = one.forward(x, layout), b = one.forward(x, layout), c = two.forward(x, layout);
    EXPECT_EQ(topk_vector(a), topk_vector(b));
    EXPECT_EQ(topk_vector(a), topk_vector(c));
    EXPECT_EQ(a.output.to_f32(), b.output.to_f32());
    EXPECT_EQ(a.indexer_loss, b.indexer_loss);
    EXPECT_EQ(a.indexer_loss, c.indexer_loss);
    EXPECT_TRUE(std::isfinite(a.indexer_loss));
    EXPECT_GT(a.indexer_loss, 0.0f);
  }
}

}  // namespace
}  // namespace csattn
