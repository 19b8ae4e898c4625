// The indexer top-k shared by the single-rank layer and the context-parallel ranks
// (cpu::layer_indexer_topk over the compact indexer op, src/cpu/layer_topk.hpp):
//  - any row set (a rank's contiguous or two_chunk rows, scattered rows, rows in another
//    order) selects exactly what those rows select in the whole batch: same indices, logits
//    and softmax bit for bit, in both indexer precisions, with several OpenMP threads;
//  - the context-parallel layer honours indexer_precision = mxfp8: its output, top-k, loss and
//    gradients equal the single-rank MXFP8 layer's (fp32: forward bitwise).
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <tuple>

#include "core/geometry.hpp"
#include "cp_test_util.hpp"
#include "cpu/blas.hpp"
#include "cpu/layer_topk.hpp"

namespace csattn {
namespace {

using namespace testing_util;

struct OmpThreads {  // several threads even under ctest's OMP_NUM_THREADS=1
  int saved = omp_get_max_threads();
  explicit OmpThreads(int n) { omp_set_num_threads(n); }
  ~OmpThreads() { omp_set_num_threads(saved); }
};

struct TopkResult {
  std::vector<std::int32_t> topk;
  std::vector<float> logits, softmax;
};

struct IndexerInputs {
  int HI = 4, DI = 32, K = 5;
  std::vector<float> q, w, keys;  // [T, HI, DI], [T, HI], [Nc, DI]
};

// Rows `rows` of the per-query inputs, in that order, through the shared top-k.
TopkResult select(const BatchGeometry& geo, const IndexerInputs& in, const std::vector<int>& rows,
                  IndexerPrecision precision) {
  const int n = static_cast<int>(rows.size()), HI = in.HI, DI = in.DI, K = in.K;
  std::vector<float> q(static_cast<std::size_t>(n) * HI * DI), w(static_cast<std::size_t>(n) * HI);
  for (int i = 0; i < n; ++i) {
    std::copy_n(in.q.begin() + static_cast<long>(rows[i]) * HI * DI, HI * DI,
                q.begin() + static_cast<long>(i) * HI * DI);
    std::copy_n(in.w.begin() + static_cast<long>(rows[i]) * HI, HI,
                w.begin() + static_cast<long>(i) * HI);
  }
  TopkResult r;
  r.topk.assign(static_cast<std::size_t>(n) * K, -2);
  r.logits.assign(r.topk.size(), 7.0f);
  r.softmax.assign(r.topk.size(), 7.0f);
  const cpu::IndexerArgs a{HI, DI, K, q.data(), w.data(), in.keys.data()};
  const QueryRows queries{&geo, n, rows.data(), nullptr};
  cpu::layer_indexer_topk(queries, a, precision, r.topk.data(), r.logits.data(),
                          r.softmax.data());
  return r;
}

class LayerTopkRows : public ::testing::TestWithParam<IndexerPrecision> {};

TEST_P(LayerTopkRows, AnyRowSetSelectsAsTheWholeBatch) {
  const IndexerPrecision precision = GetParam();
  // Ragged, with padding rows, a segment of padding only and one shorter than the ratio;
  // padded so that both partitions over 3 ranks accept it as it is.
  const SeqLayout layout = SeqLayout::from_lengths({37, 0, 3, 90, 21}, {42, 6, 6, 96, 24});
  const BatchGeometry geo = BatchGeometry::build(layout, 4);
  IndexerInputs in;
  const int T = geo.rows;
  in.q = random_normal(static_cast<std::size_t>(T) * in.HI * in.DI, 1);
  in.w = random_normal(static_cast<std::size_t>(T) * in.HI, 2);
  in.keys = random_normal(static_cast<std::size_t>(geo.compressed_rows()) * in.DI, 3);

  const cpu::BatchInvariantScope invariant(true);  // the fp32 forward's GEMM mode
  const OmpThreads threads(2);
  const cpu::IndexerArgs all_args{in.HI, in.DI, in.K, in.q.data(), in.w.data(), in.keys.data()};
  TopkResult whole;
  whole.topk.assign(static_cast<std::size_t>(T) * in.K, -2);
  whole.logits.assign(whole.topk.size(), 7.0f);
  whole.softmax.assign(whole.topk.size(), 7.0f);
  cpu::layer_indexer_topk(geo, all_args, precision, whole.topk.data(), whole.logits.data(),
                          whole.softmax.data());
  // The whole batch: padding rows select nothing, real rows min(K, visible).
  for (int t = 0; t < T; ++t) {
    const int vis = geo.row_is_padding[t] ? 0 : geo.visible_compressed(t);
    const int count = static_cast<int>(std::count_if(
        whole.topk.begin() + static_cast<long>(t) * in.K,
        whole.topk.begin() + static_cast<long>(t + 1) * in.K, [](std::int32_t v) { return v >= 0; }));
    ASSERT_EQ(count, std::min(vis, in.K)) << "row " << t;
  }

  std::vector<std::pair<std::string, std::vector<int>>> sets;
  for (CpMode mode : {CpMode::contiguous, CpMode::two_chunk}) {
    const CpPartition part = CpPartition::build(layout, mode, 3);
    for (int r = 0; r < 3; ++r)
      sets.emplace_back(std::string(cp_mode_name(mode)) + " rank " + std::to_string(r),
                        part.rows(r));
  }
  // Chunks of 16 rows as two_chunk would cut them, regardless of sequence boundaries.
  for (int start : {0, 16, 48, 96, 144}) {
    std::vector<int> rows;
    for (int t = start; t < std::min(T, start + 16); ++t) rows.push_back(t);
    for (int t = T - 1 - start; t >= 0 && t > T - 1 - start - 16; --t) rows.push_back(t);
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    sets.emplace_back("chunk pair at " + std::to_string(start), rows);
  }
  std::vector<int> scattered, reversed;
  for (int t = 0; t < T; t += 3) scattered.push_back(t);
  for (int t = T - 1; t >= 0; --t) reversed.push_back(t);
  sets.emplace_back("every third row", scattered);
  sets.emplace_back("every row in reverse", reversed);
  ASSERT_EQ(sets.size(), 13u);

  for (const auto& [name, rows] : sets) {
    const TopkResult part = select(geo, in, rows, precision);
    for (std::size_t i = 0; i < rows.size(); ++i)
      for (int k = 0; k < in.K; ++k) {
        const std::size_t a = i * in.K + k, b = static_cast<std::size_t>(rows[i]) * in.K + k;
        ASSERT_EQ(part.topk[a], whole.topk[b]) << name << ", row " << rows[i] << ", slot " << k;
        ASSERT_EQ(std::memcmp(&part.logits[a], &whole.logits[b], sizeof(float)), 0)
            << name << ", row " << rows[i] << ", slot " << k;
        ASSERT_EQ(std::memcmp(&part.softmax[a], &whole.softmax[b], sizeof(float)), 0)
            << name << ", row " << rows[i] << ", slot " << k;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, LayerTopkRows,
                         ::testing::Values(IndexerPrecision::bf16, IndexerPrecision::mxfp8),
                         [](const auto& i) { return std::string(indexer_precision_name(i.param)); });

// The context-parallel layer with the MXFP8 indexer equals the single-rank MXFP8 layer; the
// mxfp8 selection is really in use (its predictor gives another loss than bf16's).
class CpMxfp8 : public ::testing::TestWithParam<std::tuple<int, CpMode>> {};

TEST_P(CpMxfp8, EqualsTheSingleRankMxfp8Layer) {
  const auto [P, mode] = GetParam();
  AttentionConfig cfg = tiny_config(4);
  cfg.indexer_precision = IndexerPrecision::mxfp8;
  const SeqLayout layout = pad_for_context_parallel(
      SeqLayout::from_lengths({5, 37, 3, 64, 21, 1, 30, 50}, {6, 40, 3, 64, 24, 4, 33, 50}), mode,
      P, 8);
  const CpPartition part = CpPartition::build(layout, mode, P);
  const int T = static_cast<int>(layout.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 71);
  const Tensor x = random_tensor(T, cfg.d_model, 72);
  const Tensor dy = random_tensor(T, cfg.d_model, 73);
  const RunOptions opt{Precision::fp32, Device::cpu, 2};

  HybridAttentionLayer single(cfg, w, opt);
  const LayerOutputs ref = single.forward(x, layout);
  const LayerGradients gref = single.backward(ref, dy);
  const CpRun cp = run_cp(cfg, w, part, x, dy, opt);
  EXPECT_TRUE(bitwise_equal(cp.output, ref.output.to_f32()))
      << "output rel diff " << rel_diff(cp.output, ref.output.to_f32());
  EXPECT_EQ(cp.topk, topk_vector(ref));
  EXPECT_NEAR(cp.loss, ref.indexer_loss, 1e-6 * std::fabs(ref.indexer_loss));
  EXPECT_LE(rel_diff(cp.grad_input, gref.grad_input.to_f32()), 1e-6);
  for (const auto& [name, g] : gref.grad) {
    EXPECT_LE(rel_diff(cp.grad.at(name), g.to_f32()), 1e-6) << name;
  }

  AttentionConfig bf16_cfg = cfg;
  bf16_cfg.indexer_precision = IndexerPrecision::bf16;
  const CpRun bf16_run = run_cp(bf16_cfg, w, part, x, dy, opt, false);
  EXPECT_NE(bf16_run.loss, cp.loss);
}

INSTANTIATE_TEST_SUITE_P(Modes, CpMxfp8,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(CpMode::contiguous, CpMode::two_chunk)),
                         [](const auto& i) {
                           std::string name = "P";  // appended: GCC 12 -Wrestrict on "P" + s
                           name += std::to_string(std::get<0>(i.param));
                           name += "_";
                           name += cp_mode_name(std::get<1>(i.param));
                           return name;
                         });

}  // namespace
}  // namespace csattn
