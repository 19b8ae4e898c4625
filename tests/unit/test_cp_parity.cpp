// Context-parallel parity: for P in {1, 2, 3, 4} ranks x {contiguous, two_chunk} x {SWA, CSA,
// HCA} x {sparse, dense indexer loss}, on ragged packed batches (segments shorter than the
// window, segments crossing several ranks, tails that are not a multiple of m, padding rows),
// every rank's output rows and input gradients equal the single-rank layer's rows, the
// parameter gradients and the indexer loss summed over ranks equal the single-rank ones. The
// fp32 forward is bitwise equal (batch-invariant products, docs/numerics.md); gradients agree
// within 1e-6 relative (sums in another order). Ranks run as threads (in-process backend).
#include <gtest/gtest.h>

#include <tuple>

#include "cp_test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

// Real and padded lengths of the ragged batch of a ratio.
void ragged(int ratio, std::vector<int>& real, std::vector<int>& padded) {
  if (ratio == 128) {
    real = {5, 300, 131, 3, 260, 40};
    padded = {8, 300, 140, 3, 264, 40};
  } else {
    real = {5, 37, 3, 64, 21, 1, 30, 50};
    padded = {6, 40, 3, 64, 24, 4, 33, 50};
  }
}

struct Case {
  int ranks;
  CpMode mode;
  int ratio;
  bool sparse;
};

std::string case_name(const Case& c) {
  return "P" + std::to_string(c.ranks) + "_" + cp_mode_name(c.mode) + "_" +
         layer_kind_name(layer_kind(c.ratio)) + (c.sparse ? "_sparse" : "_dense");
}

class CpParity : public ::testing::TestWithParam<Case> {};

TEST_P(CpParity, Fp32ForwardBitwiseGradientsWithin1e6) {
  const Case k = GetParam();
  AttentionConfig cfg = tiny_config(k.ratio);
  cfg.sparse_loss = k.sparse;
  std::vector<int> real, padded;
  ragged(k.ratio, real, padded);
  const int d_w = std::max(cfg.window, k.ratio == 4 ? 8 : k.ratio);
  const SeqLayout layout = pad_for_context_parallel(SeqLayout::from_lengths(real, padded), k.mode,
                                                    k.ranks, d_w);
  const CpPartition part = CpPartition::build(layout, k.mode, k.ranks);
  const int T = static_cast<int>(layout.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 21);
  const Tensor x = random_tensor(T, cfg.d_model, 22);
  const Tensor dy = random_tensor(T, cfg.d_model, 23);

  HybridAttentionLayer single(cfg, w, RunOptions{Precision::fp32});
  const LayerOutputs ref = single.forward(x, layout);
  const LayerGradients gref = single.backward(ref, dy);
  const CpRun cp = run_cp(cfg, w, part, x, dy);

  EXPECT_TRUE(bitwise_equal(cp.output, ref.output.to_f32()))
      << "output rel diff " << rel_diff(cp.output, ref.output.to_f32());
  if (cfg.has_indexer()) EXPECT_EQ(cp.topk, topk_vector(ref));
  EXPECT_LE(rel_diff(cp.grad_input, gref.grad_input.to_f32()), 1e-6);
  EXPECT_NEAR(cp.loss, ref.indexer_loss, 1e-6 * std::fabs(ref.indexer_loss));
  if (cfg.has_indexer()) EXPECT_GT(ref.indexer_loss, 0.0f);
  for (const auto& [name, g] : gref.grad) {
    const std::vector<float> v = g.to_f32();
    EXPECT_LE(rel_diff(cp.grad.at(name), v), 1e-6) << name;
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int P : {1, 2, 3, 4})
    for (CpMode mode : {CpMode::contiguous, CpMode::two_chunk})
      for (int ratio : {0, 4, 128})
        for (bool sparse : {true, false}) cases.push_back({P, mode, ratio, sparse});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllModes, CpParity, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return case_name(i.param); });

}  // namespace
}  // namespace csattn
