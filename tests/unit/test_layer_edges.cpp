// Edge cases of the layer: L < m, L < window, length-1 segments, L mod m tails, top-k larger
// than the candidates, all-equal indexer scores, lambda = 0, NaN-poisoned buffers.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

bool all_finite(const Tensor& t) {
  for (float v : t.to_f32())
    if (!std::isfinite(v)) return false;
  return true;
}

// Short segments (shorter than m, than the window, length 1, with tails) stay exact against
// the oracle for every layer type.
TEST(LayerEdges, ShortSegmentsMatchOracle) {
  for (int ratio : {0, 4, 128}) {
    AttentionConfig cfg = tiny_config(ratio, /*window=*/16, /*topk=*/64);  // k > candidates
    const SeqLayout layout = SeqLayout::from_lengths({1, 3, 4, 5, 127, 129});
    const int T = static_cast<int>(layout.total_rows());
    const LayerWeights w = LayerWeights::random(cfg, 21);
    const Tensor x = random_tensor(T, cfg.d_model, 22);
    HybridAttentionLayer layer(cfg, w, RunOptions{Precision::fp32});
    const LayerOutputs out = layer.forward(x, layout);
    ASSERT_TRUE(all_finite(out.output));
    const oracle::Result ref = oracle::forward(cfg, layout, oracle::weights64(w), x.to_f64());
    EXPECT_LT(max_abs_diff(out.output.to_f32(), ref.output), 2e-5 * max_abs(ref.output))
        << "ratio " << ratio;
    if (cfg.has_indexer()) {
      // k > candidates: every visible entry is selected, in index order, then -1.
      EXPECT_EQ(topk_vector(out), ref.topk);
      const auto topk = topk_vector(out);
      const int K = cfg.index_topk;
      for (int t = 0; t < T; ++t) {
        int n = 0;
        while (n < K && topk[t * K + n] >= 0) {
          EXPECT_EQ(topk[t * K + n], n);
          ++n;
        }
        for (int k = n; k < K; ++k) EXPECT_EQ(topk[t * K + k], -1);
      }
    }
    const LayerGradients g = layer.backward(out, random_tensor(T, cfg.d_model, 23));
    EXPECT_TRUE(all_finite(g.grad_input));
    for (const auto& [name, t] : g.grad) EXPECT_TRUE(all_finite(t)) << name;
  }
}

// A segment shorter than m has no compressed entries: its rows see only the window, and no
// row selects anything.
TEST(LayerEdges, SegmentShorterThanRatioSelectsNothing) {
  AttentionConfig cfg = tiny_config(4);
  const SeqLayout layout = SeqLayout::from_lengths({3, 2, 1});
  const LayerWeights w = LayerWeights::random(cfg, 1);
  HybridAttentionLayer layer(cfg, w, RunOptions{Precision::fp32});
  const LayerOutputs out = layer.forward(random_tensor(6, cfg.d_model, 2), layout);
  for (std::int32_t id : topk_vector(out)) EXPECT_EQ(id, -1);
  EXPECT_EQ(out.indexer_loss, 0.0f);
}

// All-equal indexer scores (zero head weights): ties everywhere, so the selection is the
// smallest indices.
TEST(LayerEdges, AllEqualScoresSelectSmallestIndices) {
  AttentionConfig cfg = tiny_config(4, 8, 3);
  LayerWeights w = LayerWeights::random(cfg, 31);
  Tensor& wp = w.get("attn.indexer.weights_proj.weight");
  std::fill(wp.ptr<float>(), wp.ptr<float>() + wp.numel(), 0.0f);
  const SeqLayout layout = SeqLayout::from_lengths({40});
  HybridAttentionLayer layer(cfg, w, RunOptions{Precision::bf16});
  const LayerOutputs out = layer.forward(random_tensor(40, cfg.d_model, 32), layout);
  const auto topk = topk_vector(out);
  for (int t = 0; t < 40; ++t) {
    const int n = std::min((t + 1) / 4, cfg.index_topk);
    for (int k = 0; k < cfg.index_topk; ++k) EXPECT_EQ(topk[t * 3 + k], k < n ? k : -1) << t;
  }
}

// lambda = 0: the indexer parameters get exact zero gradients (present, not absent), and
// the main gradients are unchanged.
TEST(LayerEdges, ZeroLossCoefficientGivesExactZeroIndexerGradients) {
  AttentionConfig cfg = tiny_config(4);
  const SeqLayout layout = SeqLayout::from_lengths({30, 11});
  const LayerWeights w = LayerWeights::random(cfg, 41);
  const Tensor x = random_tensor(41, cfg.d_model, 42), dy = random_tensor(41, cfg.d_model, 43);
  AttentionConfig cfg0 = cfg;
  cfg0.loss_coeff = 0.0;
  HybridAttentionLayer with_loss(cfg, w, RunOptions{Precision::fp32});
  HybridAttentionLayer no_loss(cfg0, w, RunOptions{Precision::fp32});
  const LayerOutputs o1 = with_loss.forward(x, layout), o0 = no_loss.forward(x, layout);
  EXPECT_GT(o1.indexer_loss, 0.0f);
  EXPECT_EQ(o0.indexer_loss, 0.0f);
  const LayerGradients g1 = with_loss.backward(o1, dy), g0 = no_loss.backward(o0, dy);
  for (const ParamInfo& p : w.params()) {
    ASSERT_TRUE(g0.grad.count(p.name)) << p.name;
    const std::vector<float> a = g0.grad.at(p.name).to_f32(), b = g1.grad.at(p.name).to_f32();
    if (p.group == ParamGroup::indexer) {
      for (float v : a) ASSERT_EQ(v, 0.0f) << p.name;
      bool any = false;
      for (float v : b) any |= v != 0.0f;
      EXPECT_TRUE(any) << p.name << " gets no gradient from a non-zero loss";
    } else {
      EXPECT_EQ(a, b) << p.name << ": the indexer loss must not reach main parameters";
    }
  }
  EXPECT_EQ(g0.grad_input.to_f32(), g1.grad_input.to_f32());
  // grad_indexer_loss = 0 has the same effect.
  const LayerGradients gz = with_loss.backward(o1, dy, 0.0f);
  for (const ParamInfo& p : w.params()) {
    if (p.group != ParamGroup::indexer) continue;
    for (float v : gz.grad.at(p.name).to_f32()) ASSERT_EQ(v, 0.0f) << p.name;
  }
}

// NaN in the input rows of one segment stays in that segment (nothing reads across
// segments), and repeated runs are bitwise equal.
TEST(LayerEdges, NanStaysInItsSegmentAndRunsRepeat) {
  AttentionConfig cfg = tiny_config(4);
  const SeqLayout layout = SeqLayout::from_lengths({20, 20});
  const LayerWeights w = LayerWeights::random(cfg, 51);
  std::vector<float> xv = random_normal(40 * static_cast<std::size_t>(cfg.d_model), 52);
  const Tensor clean = Tensor::from_f32(xv, {40, cfg.d_model});
  for (int d = 0; d < cfg.d_model; ++d) xv[static_cast<std::size_t>(25) * cfg.d_model + d] = NAN;
  HybridAttentionLayer layer(cfg, w, RunOptions{Precision::bf16});
  const LayerOutputs o = layer.forward(Tensor::from_f32(xv, {40, cfg.d_model}), layout);
  const std::vector<float> y = o.output.to_f32();
  for (int t = 0; t < 20; ++t)
    for (int d = 0; d < cfg.d_model; ++d) ASSERT_TRUE(std::isfinite(y[t * cfg.d_model + d])) << t;
  const LayerOutputs a = layer.forward(clean, layout), b = layer.forward(clean, layout);
  EXPECT_EQ(a.output.to_f32(), b.output.to_f32());
  EXPECT_EQ(topk_vector(a), topk_vector(b));
  EXPECT_EQ(a.indexer_loss, b.indexer_loss);
}

}  // namespace
}  // namespace csattn

namespace csattn {
namespace {

using namespace testing_util;

// Degenerate layouts: an empty batch, an empty segment between real ones, and a segment that
// is all padding. Nothing may crash, rows must stay exact against the oracle, the loss must
// be finite (0 for the empty batch).
TEST(LayerEdges, EmptyBatchEmptySegmentAndPaddingOnlySegment) {
  for (int ratio : {0, 4, 128}) {
    AttentionConfig cfg = tiny_config(ratio);
    const LayerWeights w = LayerWeights::random(cfg, 61);
    HybridAttentionLayer layer(cfg, w, RunOptions{Precision::fp32});

    const LayerOutputs empty = layer.forward(Tensor(DType::f32, {0, cfg.d_model}),
                                             SeqLayout::bshd(1, 0));
    EXPECT_EQ(empty.output.numel(), 0);
    EXPECT_EQ(empty.indexer_loss, 0.0f);
    const LayerGradients ge = layer.backward(empty, Tensor(DType::f32, {0, cfg.d_model}));
    for (const auto& [name, t] : ge.grad)
      for (float v : t.to_f32()) ASSERT_EQ(v, 0.0f) << name;

    // Real lengths 9, 0, 0 (padded 8), 140; the padding-only segment has 8 physical rows.
    const SeqLayout layout = SeqLayout::from_lengths({9, 0, 0, 140}, {9, 0, 8, 140});
    const int T = static_cast<int>(layout.total_rows());
    const Tensor x = random_tensor(T, cfg.d_model, 62);
    const LayerOutputs out = layer.forward(x, layout);
    ASSERT_TRUE(std::isfinite(out.indexer_loss));
    const oracle::Result ref = oracle::forward(cfg, layout, oracle::weights64(w), x.to_f64());
    EXPECT_LT(max_abs_diff(out.output.to_f32(), ref.output), 2e-5 * max_abs(ref.output))
        << "ratio " << ratio;
    const LayerGradients g = layer.backward(out, random_tensor(T, cfg.d_model, 63));
    for (float v : g.grad_input.to_f32()) ASSERT_TRUE(std::isfinite(v));
  }
}

}  // namespace
}  // namespace csattn
