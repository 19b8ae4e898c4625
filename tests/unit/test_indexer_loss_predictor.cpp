// The sparse indexer loss with the compact softmax as its predictor (spec 03 §8): the KL
// uses the given slot-aligned softmax (not a softmax of recomputed scores), the gradient is
// p - T through the bf16 / fp32 operands. Spec example: predict [0.25, 0.75] against a delta
// target gives loss log 4.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/geometry.hpp"
#include "cpu/indexer_loss.hpp"

namespace csattn {
namespace {

struct Fixture {
  // One segment of 12 rows, ratio 4: row 11 sees compressed entries 0..2; its selection is
  // {0, 2}. One teacher head: its query is aligned with entry 0 and opposed to entry 2 and
  // to the window, so the teacher is a delta on entry 0.
  static constexpr int T = 12, K = 3;
  BatchGeometry geo = BatchGeometry::build(SeqLayout::bshd(1, T), 4);
  std::vector<std::int32_t> topk = std::vector<std::int32_t>(T * K, -1);
  std::vector<float> qi = std::vector<float>(T * 2, 0.0f), w = std::vector<float>(T, 0.0f);
  std::vector<float> keys = {1, 0, 0, 0, 0, 2};  // K^I_0 = [1,0], K^I_2 = [0,2]
  std::vector<float> q = std::vector<float>(T * 2, 0.0f), kv = std::vector<float>(T * 2, 0.0f);
  std::vector<float> comp = {10, 0, 0, 0, -10, 0};
  std::vector<float> sink = {-100.0f};
  std::vector<float> predict = std::vector<float>(T * K, 0.0f);

  Fixture() {
    topk[11 * K + 0] = 0;
    topk[11 * K + 1] = 2;
    qi[22] = 1.0f;
    qi[23] = 1.0f;
    w[11] = 0.5f;
    q[22] = 50.0f;
    for (int t = 0; t < T; ++t) kv[2 * t] = -10.0f;
    predict[11 * K + 0] = 0.25f;
    predict[11 * K + 1] = 0.75f;
  }
  cpu::LossArgs args(bool with_predict) {
    cpu::LossArgs a;
    a.indexer = {1, 2, K, qi.data(), w.data(), keys.data()};
    a.teacher = {1, 2, 4, static_cast<float>(1.0 / std::sqrt(2.0)), q.data(), kv.data(),
                 comp.data(), sink.data()};
    a.topk = topk.data();
    a.predict = with_predict ? predict.data() : nullptr;
    a.sparse = true;
    a.per_token = true;
    a.coeff = 1.0;
    return a;
  }
};

TEST(IndexerLossPredictor, CompactSoftmaxIsThePredictor) {
  Fixture f;
  EXPECT_NEAR(cpu::indexer_loss_forward(f.geo, f.args(true)), std::log(4.0), 1e-6);
  // Recomputed scores I = w relu(q.k) = [0.5, 1.0] give another predictor and loss.
  const double p0 = 1.0 / (1.0 + std::exp(0.5));
  EXPECT_NEAR(cpu::indexer_loss_forward(f.geo, f.args(false)), -std::log(p0), 1e-6);
}

TEST(IndexerLossPredictor, GradientIsPMinusTargetThroughOperands) {
  Fixture f;
  std::vector<float> dq(f.T * 2), dw(f.T), dkeys(6, 0.0f);
  cpu::indexer_loss_backward(f.geo, f.args(true), 1.0f, dq.data(), dw.data(), dkeys.data());
  // dL/dI = p - T = [0.25 - 1, 0.75 - 0]; dots = [1, 2].
  const float g0 = -0.75f, g1 = 0.75f;
  EXPECT_NEAR(dw[11], g0 * 1.0f + g1 * 2.0f, 1e-6);
  EXPECT_NEAR(dq[22], 0.5f * (g0 * 1.0f), 1e-6);
  EXPECT_NEAR(dq[23], 0.5f * (g1 * 2.0f), 1e-6);
  EXPECT_NEAR(dkeys[0], g0 * 0.5f, 1e-6);
  EXPECT_NEAR(dkeys[1], g0 * 0.5f, 1e-6);
  EXPECT_NEAR(dkeys[4], g1 * 0.5f, 1e-6);
  EXPECT_NEAR(dkeys[5], g1 * 0.5f, 1e-6);
  EXPECT_EQ(dkeys[2], 0.0f);  // entry 1 was not selected
  for (int t = 0; t < 11; ++t) EXPECT_EQ(dw[t], 0.0f);
}

}  // namespace
}  // namespace csattn
