// Finite-difference gradient checks in fp64: directional derivatives of the oracle against
// the CPU backend's backward (fp32 mode), for the input and every parameter. The main
// objective <dy, y> checks x and the main parameters; the indexer loss checks the indexer
// parameters (which the main loss never reaches). The selection is fixed to the backend's
// top-k so a perturbation cannot flip it.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

struct GradCase {
  int ratio;
  bool sparse;
  bool per_token;
};

std::string grad_case_name(const ::testing::TestParamInfo<GradCase>& info) {
  return std::string(layer_kind_name(layer_kind(info.param.ratio))) +
         (info.param.sparse ? "_sparse" : "_dense") + (info.param.per_token ? "_pertoken" : "_mean");
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

class LayerGradCheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(LayerGradCheck, DirectionalDerivatives) {
  const GradCase& gc = GetParam();
  AttentionConfig cfg = tiny_config(gc.ratio);
  cfg.sparse_loss = gc.sparse;
  cfg.per_token_loss = gc.per_token;
  const SeqLayout layout = gc.ratio == 128 ? SeqLayout::from_lengths({131, 260}, {131, 262})
                                           : SeqLayout::from_lengths({6, 23, 15}, {6, 24, 15});
  const int T = static_cast<int>(layout.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 4242 + gc.ratio);
  const Tensor x = random_tensor(T, cfg.d_model, 17);
  const Tensor dy = random_tensor(T, cfg.d_model, 18);

  HybridAttentionLayer layer(cfg, w, RunOptions{Precision::fp32});
  const LayerOutputs out = layer.forward(x, layout);
  const LayerGradients grads = layer.backward(out, dy, 1.0f);
  const auto topk = topk_vector(out);
  oracle::Options opt;
  opt.forced_topk = cfg.has_indexer() ? &topk : nullptr;

  const std::vector<double> dy64 = dy.to_f64();
  oracle::Weights64 w64 = oracle::weights64(w);
  std::vector<double> x64 = x.to_f64();
  auto objective = [&](bool indexer_loss) {
    const oracle::Result r = oracle::forward(cfg, layout, w64, x64, opt);
    return indexer_loss ? r.indexer_loss : dot(dy64, r.output);
  };

  // Checks <grad, v> against the central difference along v for the tensor `target`.
  auto check = [&](std::vector<double>& target, const std::vector<float>& analytic,
                   bool indexer_loss, const std::string& what) {
    for (int dir = 0; dir < 2; ++dir) {
      const std::vector<float> vf =
          random_normal(target.size(), 1000 + dir + 31 * what.size());
      const std::vector<double> v(vf.begin(), vf.end());
      double scale = 0.0;
      for (double t : target) scale = std::max(scale, std::fabs(t));
      const double eps = 1e-5 * std::max(scale, 1.0);
      const std::vector<double> saved = target;
      for (std::size_t i = 0; i < v.size(); ++i) target[i] = saved[i] + eps * v[i];
      const double plus = objective(indexer_loss);
      for (std::size_t i = 0; i < v.size(); ++i) target[i] = saved[i] - eps * v[i];
      const double minus = objective(indexer_loss);
      target = saved;
      const double fd = (plus - minus) / (2.0 * eps);
      const double an = dot(to_double(analytic), v);
      double gnorm = 0.0;
      for (float g : analytic) gnorm += static_cast<double>(g) * g;
      gnorm = std::sqrt(gnorm * static_cast<double>(v.size()));
      EXPECT_NEAR(an, fd, 2e-3 * std::fabs(fd) + 1e-5 * gnorm + 1e-9)
          << what << " direction " << dir;
    }
  };

  check(x64, grads.grad_input.to_f32(), false, "hidden_states");
  for (const ParamInfo& p : w.params()) {
    const bool idx = p.group == ParamGroup::indexer;
    const std::vector<float> g = grads.grad.at(p.name).to_f32();
    double gmax = 0.0;
    for (float v : g) gmax = std::max(gmax, static_cast<double>(std::fabs(v)));
    EXPECT_GT(gmax, 0.0) << p.name << " has an all-zero gradient";
    check(w64.at(p.name), g, idx, p.name);
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayerTypes, LayerGradCheck,
                         ::testing::Values(GradCase{0, true, false}, GradCase{128, true, false},
                                           GradCase{4, true, false}, GradCase{4, false, false},
                                           GradCase{4, true, true}),
                         grad_case_name);

}  // namespace
}  // namespace csattn
