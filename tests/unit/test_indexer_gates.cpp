// The numerical gates of the compact indexer (spec 03 §4, §5.6), as tests:
//  - MXFP8 top-k against the fp64 oracle run on the DEQUANTIZED q and k: per row at least
//    max(1, n - 1) common ids, logits within atol = rtol = 2e-2 (and, loosely, against the
//    original operands);
//  - BF16 compact top-k against the fp64 oracle on the original operands, same gate;
//  - the whole layer with the MXFP8 indexer against BF16: output cosine and tensor similarity
//    above 1 - 5e-3, every gradient above 1 - 3e-2.
// (Compact == dense reference as exact sets in BF16 / fp32 accumulation: test_compact_indexer.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "compact_indexer_util.hpp"
#include "csattn/ops.hpp"
#include "oracle.hpp"
#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

std::vector<float> dequantized(const std::vector<float>& v, int D) {
  const auto rows = static_cast<std::int64_t>(v.size()) / D;
  Tensor x = Tensor::from_f32(v, {rows, D});
  Tensor data(DType::e4m3, {rows, D}), scales(DType::e8m0, {rows, D / 32}), out(DType::f32, {rows, D});
  ops::quantize_mxfp8(x.view(), data.view(), scales.view());
  ops::dequantize_mxfp8(data.view(), scales.view(), out.view());
  return out.to_f32();
}

std::vector<double> f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }

struct GateStats {
  int rows = 0, rows_below_full_overlap = 0;
  double mean_overlap = 0.0, max_logit_err = 0.0;
};

// Checks the gate for every row: |selected ∩ oracle| >= max(1, n - 1), and each selected
// logit within 2e-2 (atol and rtol) of the oracle's score of the same id.
GateStats check_gate(const IndexerProblem& p, const IndexerResult& r, const oracle::IndexerTopk& ref,
                     bool enforce) {
  GateStats st;
  double overlap_sum = 0.0;
  for (std::int64_t t = 0; t < p.rows(); ++t) {
    const auto& want = ref.topk[static_cast<std::size_t>(t)];
    const int n = static_cast<int>(want.size());
    const std::size_t o = static_cast<std::size_t>(t * p.K);
    std::set<int> got;
    for (int s = 0; s < p.K; ++s)
      if (r.idx[o + s] >= 0) got.insert(r.idx[o + s]);
    if (enforce) {
      EXPECT_EQ(static_cast<int>(got.size()), n) << "row " << t;
    }
    if (n == 0) continue;
    int common = 0;
    for (int j : want) common += static_cast<int>(got.count(j));
    ++st.rows;
    st.rows_below_full_overlap += common < n;
    overlap_sum += static_cast<double>(common) / n;
    if (enforce) {
      EXPECT_GE(common, std::max(1, n - 1)) << "row " << t;
    }
    for (int s = 0; s < p.K; ++s) {
      const std::int32_t id = r.idx[o + s];
      if (id < 0) continue;
      const double want_s = ref.scores[static_cast<std::size_t>(t)][static_cast<std::size_t>(id)];
      const double err = std::fabs(r.logits[o + s] - want_s);
      st.max_logit_err = std::max(st.max_logit_err, err / (1.0 + std::fabs(want_s)));
      if (enforce) {
        EXPECT_LE(err, 2e-2 + 2e-2 * std::fabs(want_s)) << "row " << t << " id " << id;
      }
    }
  }
  st.mean_overlap = st.rows ? overlap_sum / st.rows : 1.0;
  return st;
}

// Operands with blocks of very different magnitudes, so the E8M0 scales vary within a row.
IndexerProblem mxfp8_problem(int H, int D, int K, std::uint32_t seed) {
  IndexerProblem p = make_problem({130, 257, 64, 3}, {40, 70, 16, 1}, H, D, K, seed, bf16_normal);
  p.offsets = {0, 31, 100, 0};  // context-parallel pieces
  std::mt19937 rng(seed + 1);
  std::uniform_int_distribution<int> mag(-6, 6);
  for (std::size_t blk = 0; blk < p.q.size() / 32; ++blk) {
    const float s = std::ldexp(1.0f, mag(rng));
    for (std::size_t i = 0; i < 32; ++i) p.q[blk * 32 + i] *= s;
  }
  for (float& v : p.w) v = round_bf16(v / std::sqrt(static_cast<float>(H * D)));
  return p;
}

TEST(IndexerGates, Mxfp8TopkAgainstOracleOnDequantizedOperands) {
  // DeepSeek-V4's 64 heads x 128, and a geometry Megatron's MXFP8 path rejects (5 x 96).
  for (auto [H, D, K] : {std::tuple{64, 128, 16}, std::tuple{5, 96, 8}}) {
    const IndexerProblem p = mxfp8_problem(H, D, K, 40 + H);
    const IndexerResult r = run_compact(p, IndexerPrecision::mxfp8);
    const oracle::IndexerTopk deq = oracle::indexer_topk(
        f64(dequantized(p.q, D)), f64(dequantized(p.k, D)), f64(p.w), H, D,
        {p.cu_q.begin(), p.cu_q.end()}, {p.cu_k.begin(), p.cu_k.end()},
        {p.offsets.begin(), p.offsets.end()}, p.r, K);
    const GateStats tight = check_gate(p, r, deq, true);
    EXPECT_GT(tight.rows, 300);
    // The same operands up to fp32 accumulation: the gate holds with a wide margin.
    EXPECT_LT(tight.max_logit_err, 1e-4) << "H " << H;
    // Against the original operands the difference is the quantization error itself: loose.
    const oracle::IndexerTopk orig = oracle::indexer_topk(
        f64(p.q), f64(p.k), f64(p.w), H, D, {p.cu_q.begin(), p.cu_q.end()},
        {p.cu_k.begin(), p.cu_k.end()}, {p.offsets.begin(), p.offsets.end()}, p.r, K);
    const GateStats loose = check_gate(p, r, orig, false);
    EXPECT_GT(loose.mean_overlap, 0.9) << "H " << H;
    EXPECT_GT(loose.rows_below_full_overlap, 0) << "MXFP8 must actually quantize (H " << H << ")";
  }
}

TEST(IndexerGates, Bf16TopkAgainstOracle) {
  const IndexerProblem p = mxfp8_problem(64, 128, 16, 7);
  const IndexerResult r = run_compact(p, IndexerPrecision::bf16);
  const oracle::IndexerTopk ref = oracle::indexer_topk(
      f64(p.q), f64(p.k), f64(p.w), p.H, p.D, {p.cu_q.begin(), p.cu_q.end()},
      {p.cu_k.begin(), p.cu_k.end()}, {p.offsets.begin(), p.offsets.end()}, p.r, p.K);
  const GateStats st = check_gate(p, r, ref, true);
  EXPECT_LT(st.max_logit_err, 1e-4);
}

std::vector<float> as_vec(const Tensor& t) { return t.to_f32(); }

// The whole layer: MXFP8 indexer vs BF16 indexer, same weights and inputs, bf16 storage.
TEST(IndexerGates, LayerMxfp8AgainstBf16) {
  AttentionConfig cfg = ModelConfig::preset("small").base;
  cfg.compress_ratio = 4;
  cfg.index_topk = 16;
  cfg.loss_coeff = 0.1;
  const SeqLayout layout = SeqLayout::from_lengths({300, 171}, {304, 171});
  const auto T = static_cast<int>(layout.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 3);
  const Tensor x = random_tensor(T, cfg.d_model, 4, true);
  const Tensor dy = random_tensor(T, cfg.d_model, 5, true);
  AttentionConfig cfg_mx = cfg;
  cfg_mx.indexer_precision = IndexerPrecision::mxfp8;
  HybridAttentionLayer bf(cfg, w, RunOptions{Precision::bf16});
  HybridAttentionLayer mx(cfg_mx, w, RunOptions{Precision::bf16});
  const LayerOutputs ob = bf.forward(x, layout), om = mx.forward(x, layout);
  // The flag is wired: some selections and the loss (its predictor) differ.
  EXPECT_NE(topk_vector(ob), topk_vector(om));
  EXPECT_NE(ob.indexer_loss, om.indexer_loss);
  EXPECT_NEAR(om.indexer_loss, ob.indexer_loss, 0.05 * std::fabs(ob.indexer_loss));
  const Similarity so = similarity(as_vec(om.output), to_double(as_vec(ob.output)));
  EXPECT_GT(so.cosine, 1 - 5e-3);
  EXPECT_GT(so.tensor, 1 - 5e-3);
  const LayerGradients gb = bf.backward(ob, dy), gm = mx.backward(om, dy);
  const Similarity sx = similarity(as_vec(gm.grad_input), to_double(as_vec(gb.grad_input)));
  EXPECT_GT(sx.cosine, 1 - 3e-2);
  EXPECT_GT(sx.tensor, 1 - 3e-2);
  for (const auto& [name, g] : gb.grad) {
    const Similarity s = similarity(as_vec(gm.grad.at(name)), to_double(as_vec(g)));
    EXPECT_GT(s.cosine, 1 - 3e-2) << name;
    EXPECT_GT(s.tensor, 1 - 3e-2) << name;
  }
}

}  // namespace
}  // namespace csattn
