// The CPU backend against the naive fp64 oracle: outputs, top-k and the indexer loss, for
// every layer type and loss mode, on a ragged packed batch with padding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

struct OracleCase {
  int ratio;
  bool sparse;
  bool per_token;
  Precision precision;
};

std::string case_name(const ::testing::TestParamInfo<OracleCase>& info) {
  const OracleCase& c = info.param;
  return std::string(layer_kind_name(layer_kind(c.ratio))) + (c.sparse ? "_sparse" : "_dense") +
         (c.per_token ? "_pertoken" : "_mean") + "_" + precision_name(c.precision);
}

// Segments: shorter than the window, a length with an L mod m tail, and (for HCA) long
// enough for several compressed entries; one segment carries padding rows.
SeqLayout batch_for(int ratio) {
  if (ratio == 128) return SeqLayout::from_lengths({5, 300, 131}, {5, 304, 131});
  return SeqLayout::from_lengths({5, 1, 37, 22}, {5, 1, 40, 22});
}

// Every row's selection must be the oracle's, except where the oracle's own scores tie
// within `tol` at the k-th boundary (then either choice is a correct top-k).
void expect_topk_matches(const std::vector<std::int32_t>& got, const oracle::Result& ref,
                         int K, double tol) {
  const int T = static_cast<int>(got.size()) / K;
  for (int t = 0; t < T; ++t) {
    std::vector<int> a, b;
    for (int k = 0; k < K; ++k) {
      if (got[t * K + k] >= 0) a.push_back(got[t * K + k]);
      if (ref.topk[t * K + k] >= 0) b.push_back(ref.topk[t * K + k]);
    }
    ASSERT_EQ(a.size(), b.size()) << "row " << t;
    if (a == b) continue;
    const std::vector<double>& s = ref.index_scores[t];
    std::vector<double> sorted = s;
    std::sort(sorted.rbegin(), sorted.rend());
    const double kth = sorted[b.size() - 1];
    for (int id : a) {
      if (std::find(b.begin(), b.end(), id) != b.end()) continue;
      EXPECT_NEAR(s[id], kth, tol * (1.0 + std::fabs(kth))) << "row " << t << " id " << id;
    }
  }
}

class LayerVsOracle : public ::testing::TestWithParam<OracleCase> {};

TEST_P(LayerVsOracle, OutputTopkAndLoss) {
  const OracleCase& pc = GetParam();
  AttentionConfig cfg = tiny_config(pc.ratio);
  cfg.sparse_loss = pc.sparse;
  cfg.per_token_loss = pc.per_token;
  const SeqLayout layout = batch_for(pc.ratio);
  const int T = static_cast<int>(layout.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 1234 + pc.ratio);
  const Tensor x = random_tensor(T, cfg.d_model, 99, true);
  HybridAttentionLayer layer(cfg, w, RunOptions{pc.precision});
  const LayerOutputs out = layer.forward(x, layout);

  const auto topk = topk_vector(out);
  const oracle::Weights64 w64 = oracle::weights64(w);
  const std::vector<double> x64 = x.to_f64();
  const bool fp32 = pc.precision == Precision::fp32;
  if (cfg.has_indexer()) {
    const oracle::Result own = oracle::forward(cfg, layout, w64, x64);
    expect_topk_matches(topk, own, cfg.index_topk, fp32 ? 1e-4 : 3e-2);
  }
  // Attention, output and loss on the backend's selection.
  oracle::Options opt;
  opt.forced_topk = cfg.has_indexer() ? &topk : nullptr;
  const oracle::Result ref = oracle::forward(cfg, layout, w64, x64, opt);
  const std::vector<float> y = out.output.to_f32();
  const double scale = max_abs(ref.output);
  ASSERT_GT(scale, 0.0);
  if (fp32) {
    EXPECT_LT(max_abs_diff(y, ref.output), 2e-5 * scale);
    EXPECT_NEAR(out.indexer_loss, ref.indexer_loss, 1e-5 * std::fabs(ref.indexer_loss) + 1e-9);
  } else {
    const Similarity sim = similarity(y, ref.output);
    EXPECT_GT(sim.cosine, 1.0 - 1.5e-3);
    EXPECT_GT(sim.tensor, 1.0 - 1.5e-3);
    EXPECT_NEAR(out.indexer_loss, ref.indexer_loss, 3e-2 * std::fabs(ref.indexer_loss) + 1e-6);
  }
  if (cfg.has_indexer()) {
    EXPECT_GT(ref.indexer_loss, 0.0);  // the loss is exercised, not trivially zero
  } else {
    EXPECT_EQ(out.indexer_loss, 0.0f);
    EXPECT_TRUE(out.topk_indices.empty());
  }
}

std::vector<OracleCase> all_cases() {
  std::vector<OracleCase> v;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    v.push_back({0, true, false, p});
    v.push_back({128, true, false, p});
    for (bool sparse : {true, false})
      for (bool per_token : {false, true}) v.push_back({4, sparse, per_token, p});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllLayerTypes, LayerVsOracle, ::testing::ValuesIn(all_cases()),
                         case_name);

// The small preset's real shapes once, in bf16: the tiny config could hide a dimension bug.
TEST(LayerVsOracle, SmallPresetCsaBf16) {
  AttentionConfig cfg = ModelConfig::preset("small").layer(1);
  const SeqLayout layout = SeqLayout::from_lengths({50, 301});
  const int T = static_cast<int>(layout.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 7);
  const Tensor x = random_tensor(T, cfg.d_model, 8, true);
  HybridAttentionLayer layer(cfg, w, RunOptions{Precision::bf16});
  const LayerOutputs out = layer.forward(x, layout);
  const auto topk = topk_vector(out);
  oracle::Options opt;
  opt.forced_topk = &topk;
  const oracle::Result ref = oracle::forward(cfg, layout, oracle::weights64(w), x.to_f64(), opt);
  const Similarity sim = similarity(out.output.to_f32(), ref.output);
  EXPECT_GT(sim.cosine, 1.0 - 1.5e-3);
  EXPECT_GT(sim.tensor, 1.0 - 1.5e-3);
  EXPECT_NEAR(out.indexer_loss, ref.indexer_loss, 3e-2 * ref.indexer_loss);
}

}  // namespace
}  // namespace csattn
