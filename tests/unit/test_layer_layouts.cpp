// Packed-batch contracts: a multi-segment THD batch equals running each segment alone;
// BSHD is THD with equal lengths; padding rows change neither real rows nor the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

Tensor rows_of(const Tensor& t, int first, int count) {
  const int cols = static_cast<int>(t.dim(1));
  std::vector<float> all = t.to_f32();
  std::vector<float> part(all.begin() + static_cast<long>(first) * cols,
                          all.begin() + static_cast<long>(first + count) * cols);
  return Tensor::from_f32(part, {count, cols});
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0, s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
    s = std::max(s, static_cast<double>(std::fabs(b[i])));
  }
  return m / std::max(s, 1e-30);
}

class PackedBatch : public ::testing::TestWithParam<int> {};

TEST_P(PackedBatch, EqualsSegmentsRunAlone) {
  AttentionConfig cfg = tiny_config(GetParam());
  cfg.per_token_loss = true;  // sums, so the per-segment losses add up
  const std::vector<int> lens = GetParam() == 128 ? std::vector<int>{131, 7, 260}
                                                  : std::vector<int>{9, 1, 30, 17};
  const SeqLayout packed = SeqLayout::from_lengths(lens);
  const int T = static_cast<int>(packed.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 5);
  const Tensor x = random_tensor(T, cfg.d_model, 6);
  const Tensor dy = random_tensor(T, cfg.d_model, 7);
  HybridAttentionLayer layer(cfg, w, RunOptions{Precision::fp32});
  const LayerOutputs all = layer.forward(x, packed);
  const LayerGradients gall = layer.backward(all, dy);
  const std::vector<float> y = all.output.to_f32();
  const std::vector<float> dx = gall.grad_input.to_f32();
  const auto topk = topk_vector(all);

  double loss_sum = 0.0;
  std::map<std::string, std::vector<double>> grad_sum;
  int first = 0;
  for (int len : lens) {
    const SeqLayout one = SeqLayout::from_lengths({len});
    const LayerOutputs o = layer.forward(rows_of(x, first, len), one);
    const LayerGradients g = layer.backward(o, rows_of(dy, first, len));
    const std::vector<float> ys = o.output.to_f32(), dxs = g.grad_input.to_f32();
    const std::vector<float> yp(y.begin() + static_cast<long>(first) * cfg.d_model,
                                y.begin() + static_cast<long>(first + len) * cfg.d_model);
    const std::vector<float> dxp(dx.begin() + static_cast<long>(first) * cfg.d_model,
                                 dx.begin() + static_cast<long>(first + len) * cfg.d_model);
    EXPECT_LT(max_rel_diff(ys, yp), 1e-5) << "segment of length " << len;
    EXPECT_LT(max_rel_diff(dxs, dxp), 1e-5) << "segment of length " << len;
    if (cfg.has_indexer()) {
      const auto ts = topk_vector(o);
      const std::vector<std::int32_t> tp(topk.begin() + static_cast<long>(first) * cfg.index_topk,
                                         topk.begin() + static_cast<long>(first + len) * cfg.index_topk);
      EXPECT_EQ(ts, tp) << "segment of length " << len;
    }
    loss_sum += o.indexer_loss;
    for (const auto& [name, t] : g.grad) {
      std::vector<double>& acc = grad_sum[name];
      const std::vector<float> v = t.to_f32();
      acc.resize(v.size(), 0.0);
      for (std::size_t i = 0; i < v.size(); ++i) acc[i] += v[i];
    }
    first += len;
  }
  EXPECT_NEAR(all.indexer_loss, loss_sum, 1e-5 * std::fabs(loss_sum) + 1e-9);
  for (const auto& [name, acc] : grad_sum) {
    const std::vector<float> v = gall.grad.at(name).to_f32();
    double m = 0.0, s = 0.0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      m = std::max(m, std::fabs(v[i] - acc[i]));
      s = std::max(s, std::fabs(acc[i]));
    }
    EXPECT_LE(m, 1e-4 * s + 1e-9) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayerTypes, PackedBatch, ::testing::Values(0, 4, 128),
                         [](const auto& param_info) {
                           return std::string(layer_kind_name(layer_kind(param_info.param)));
                         });

TEST(Layouts, BshdIsThdWithEqualLengths) {
  const SeqLayout bshd = SeqLayout::bshd(3, 20);
  const SeqLayout thd = SeqLayout::thd({0, 20, 40, 60});
  EXPECT_EQ(bshd.cu_seqlens(), thd.cu_seqlens());
  EXPECT_EQ(bshd.cu_seqlens_padded(), thd.cu_seqlens_padded());
  AttentionConfig cfg = tiny_config(4);
  const LayerWeights w = LayerWeights::random(cfg, 3);
  const Tensor x = random_tensor(60, cfg.d_model, 4);
  HybridAttentionLayer layer(cfg, w, RunOptions{Precision::fp32});
  const LayerOutputs a = layer.forward(x, bshd), b = layer.forward(x, thd);
  EXPECT_EQ(a.output.to_f32(), b.output.to_f32());
  EXPECT_EQ(a.indexer_loss, b.indexer_loss);
}

class Padding : public ::testing::TestWithParam<int> {};

// Padding rows after a segment's real rows change no real row, no gradient of a real row,
// and not the (mean) loss, whatever they hold.
TEST_P(Padding, DoesNotChangeRealRowsOrLoss) {
  AttentionConfig cfg = tiny_config(GetParam());
  const std::vector<int> real = GetParam() == 128 ? std::vector<int>{200, 130}
                                                  : std::vector<int>{13, 26};
  const std::vector<int> pad = GetParam() == 128 ? std::vector<int>{256, 131}
                                                 : std::vector<int>{16, 29};
  const SeqLayout unpadded = SeqLayout::from_lengths(real);
  const SeqLayout padded = SeqLayout::from_lengths(real, pad);
  const LayerWeights w = LayerWeights::random(cfg, 11);
  const int Tu = static_cast<int>(unpadded.total_rows()), Tp = static_cast<int>(padded.total_rows());
  const Tensor xu = random_tensor(Tu, cfg.d_model, 12);
  const Tensor dyu = random_tensor(Tu, cfg.d_model, 13);
  // Scatter the real rows into the padded batch; padding rows get large garbage.
  std::vector<float> xp = random_normal(static_cast<std::size_t>(Tp) * cfg.d_model, 14, 30.0f);
  std::vector<float> dyp(static_cast<std::size_t>(Tp) * cfg.d_model, 0.0f);
  const std::vector<float> xv = xu.to_f32(), dyv = dyu.to_f32();
  std::vector<std::pair<int, int>> map;  // (unpadded row, padded row)
  for (int b = 0, ru = 0, rp = 0; b < static_cast<int>(real.size()); ru += real[b], rp += pad[b], ++b)
    for (int i = 0; i < real[b]; ++i) map.push_back({ru + i, rp + i});
  for (auto [u, p] : map)
    for (int d = 0; d < cfg.d_model; ++d) {
      xp[static_cast<long>(p) * cfg.d_model + d] = xv[static_cast<long>(u) * cfg.d_model + d];
      dyp[static_cast<long>(p) * cfg.d_model + d] = dyv[static_cast<long>(u) * cfg.d_model + d];
    }
  HybridAttentionLayer layer(cfg, w, RunOptions{Precision::fp32});
  const LayerOutputs ou = layer.forward(xu, unpadded);
  const LayerOutputs op = layer.forward(Tensor::from_f32(xp, {Tp, cfg.d_model}), padded);
  const LayerGradients gu = layer.backward(ou, dyu);
  const LayerGradients gp = layer.backward(op, Tensor::from_f32(dyp, {Tp, cfg.d_model}));
  const std::vector<float> yu = ou.output.to_f32(), yp = op.output.to_f32();
  const std::vector<float> dxu = gu.grad_input.to_f32(), dxp = gp.grad_input.to_f32();
  double ydiff = 0.0, dxdiff = 0.0, yscale = 0.0, dxscale = 0.0;
  for (auto [u, p] : map)
    for (int d = 0; d < cfg.d_model; ++d) {
      const long iu = static_cast<long>(u) * cfg.d_model + d, ip = static_cast<long>(p) * cfg.d_model + d;
      ydiff = std::max(ydiff, static_cast<double>(std::fabs(yu[iu] - yp[ip])));
      yscale = std::max(yscale, static_cast<double>(std::fabs(yu[iu])));
      dxdiff = std::max(dxdiff, static_cast<double>(std::fabs(dxu[iu] - dxp[ip])));
      dxscale = std::max(dxscale, static_cast<double>(std::fabs(dxu[iu])));
    }
  EXPECT_LE(ydiff, 1e-5 * yscale);
  EXPECT_LE(dxdiff, 1e-5 * dxscale);
  EXPECT_NEAR(ou.indexer_loss, op.indexer_loss, 1e-6 * std::fabs(ou.indexer_loss) + 1e-12);
  if (cfg.has_indexer()) {
    // Padding rows select nothing.
    const auto tp = topk_vector(op);
    for (int b = 0, rp = 0; b < static_cast<int>(real.size()); rp += pad[b], ++b)
      for (int i = real[b]; i < pad[b]; ++i)
        for (int k = 0; k < cfg.index_topk; ++k)
          EXPECT_EQ(tp[static_cast<long>(rp + i) * cfg.index_topk + k], -1);
    // Indexer gradients come only from real rows.
    for (const ParamInfo& p : w.params())
      if (p.group == ParamGroup::indexer) {
        const std::vector<float> a = gu.grad.at(p.name).to_f32(), b = gp.grad.at(p.name).to_f32();
        double m = 0.0, s = 0.0;
        for (std::size_t i = 0; i < a.size(); ++i) {
          m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
          s = std::max(s, static_cast<double>(std::fabs(a[i])));
        }
        // Keys computed from padding rows are never visible to real rows' selections,
        // so the indexer weight gradients agree up to fp32 summation order.
        EXPECT_LE(m, 1e-4 * s + 1e-12) << p.name;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayerTypes, Padding, ::testing::Values(0, 4, 128),
                         [](const auto& param_info) {
                           return std::string(layer_kind_name(layer_kind(param_info.param)));
                         });

}  // namespace
}  // namespace csattn
