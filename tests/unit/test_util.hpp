// Shared helpers of the layer tests: configs, random inputs, the bridge to the fp64 oracle,
// comparison metrics, and SKIP_WITHOUT_GPU for the GPU tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "csattn/config.hpp"
#include "csattn/error.hpp"
#include "csattn/layer.hpp"
#include "csattn/layout.hpp"
#include "csattn/tensor.hpp"
#include "csattn/weights.hpp"
#include "oracle.hpp"

// Skips the running test, with the reason, where no GPU is usable (csattn::cuda_available).
#define SKIP_WITHOUT_GPU()                                                  \
  do {                                                                      \
    std::string why;                                                        \
    if (!::csattn::cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why; \
  } while (0)

namespace csattn::testing_util {

// A tiny config with the given ratio; window and top-k small enough that compressed entries
// and the selection matter at short lengths.
inline AttentionConfig tiny_config(int ratio, int window = 8, int topk = 3) {
  AttentionConfig c = ModelConfig::preset("tiny").base;
  c.compress_ratio = ratio;
  c.window = window;
  c.index_topk = topk;
  c.loss_coeff = 0.5;  // large enough that the loss gradients are well above fp32 noise
  c.validate();
  return c;
}

inline std::vector<float> random_normal(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline Tensor random_tensor(std::int64_t rows, std::int64_t cols, std::uint64_t seed,
                            bool bf16_values = false) {
  std::vector<float> v = random_normal(static_cast<std::size_t>(rows * cols), seed);
  if (bf16_values)
    for (float& x : v) x = round_bf16(x);
  return Tensor::from_f32(v, {rows, cols});
}


inline std::vector<std::int32_t> topk_vector(const LayerOutputs& o) {
  if (o.topk_indices.empty()) return {};
  const std::int32_t* p = o.topk_indices.ptr<std::int32_t>();
  return std::vector<std::int32_t>(p, p + o.topk_indices.numel());
}

inline double max_abs(const std::vector<double>& a) {
  double m = 0.0;
  for (double v : a) m = std::max(m, std::fabs(v));
  return m;
}

// max |a - b| over all elements; NaN anywhere gives +inf.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(d == d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

// ||a - b|| / ||b|| (L2, in double); NaN anywhere gives NaN, b all zero gives ||a||.
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Cosine similarity and the "tensor similarity" 2<a,b>/(|a|^2+|b|^2) of Megatron's parity
// tests, both 1 for equal tensors; and |a| / |b|, which both miss to first order.
struct Similarity {
  double cosine = 0.0, tensor = 0.0, norm_ratio = 1.0;
};
inline Similarity similarity(const std::vector<float>& a, const std::vector<double>& b) {
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += b[i] * b[i];
  }
  if (aa == 0.0 && bb == 0.0) return {1.0, 1.0, 1.0};
  return {ab / std::sqrt(aa * bb), 2.0 * ab / (aa + bb), bb > 0.0 ? std::sqrt(aa / bb) : INFINITY};
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Per row: the GPU's selection shares at least max(1, n-1) ids with the CPU's (rounding may
// flip one boundary element), and rows with n valid entries have n on both sides.
inline void expect_topk_close(const std::vector<std::int32_t>& gpu, const std::vector<std::int32_t>& cpu,
                       int K) {
  const int T = static_cast<int>(cpu.size()) / K;
  int rows_differing = 0;
  for (int t = 0; t < T; ++t) {
    std::set<int> a, b;
    for (int k = 0; k < K; ++k) {
      if (gpu[t * K + k] >= 0) a.insert(gpu[t * K + k]);
      if (cpu[t * K + k] >= 0) b.insert(cpu[t * K + k]);
    }
    ASSERT_EQ(a.size(), b.size()) << "row " << t;
    int common = 0;
    for (int id : a) common += b.count(id) ? 1 : 0;
    const int n = static_cast<int>(b.size());
    EXPECT_GE(common, std::max(n == 0 ? 0 : 1, n - 1)) << "row " << t;
    rows_differing += common != n;
    // Ascending ids, then -1.
    for (int k = 1; k < K; ++k) {
      if (gpu[t * K + k] < 0) continue;
      EXPECT_GT(gpu[t * K + k], gpu[t * K + k - 1]) << "row " << t;
    }
  }
  EXPECT_LE(rows_differing, std::max(1, T / 20)) << "too many rows with a different selection";
}

// A GPU gradient against the CPU's: finite, cosine and tensor similarity above 1 - tol, and
// norms within 5 tol of each other; where the reference is all zeros (lambda = 0, unused
// parameters) exact zeros. The norm term is there because both similarities are blind to a
// common scale to first order: a gradient off by a factor 1 + e keeps its cosine at 1 and
// its tensor similarity at ~1 - e^2 / 2, so a loss mean over the wrong row count (e = 2-3%)
// passed them; rounding noise of relative size r moves the norm by ~r^2 / 2 only.
inline void expect_gradient_close(const Tensor& got, const Tensor& ref, const std::string& name,
                                  double tol = 3e-3) {
  const std::vector<float> a = got.to_f32(), b = ref.to_f32();
  for (float v : a) ASSERT_TRUE(std::isfinite(v)) << name << " has NaN / inf";
  double bmax = 0.0;
  for (float v : b) bmax = std::max(bmax, static_cast<double>(std::fabs(v)));
  if (bmax == 0.0) {
    for (float v : a) ASSERT_EQ(v, 0.0f) << name;
    return;
  }
  const Similarity sim = similarity(a, to_double(b));
  EXPECT_GT(sim.cosine, 1.0 - tol) << name;
  EXPECT_GT(sim.tensor, 1.0 - tol) << name;
  EXPECT_NEAR(sim.norm_ratio, 1.0, 5.0 * tol) << name << ": |gpu| / |cpu|";
}

// Every gradient of a layer: the input's and each parameter's.
inline void expect_gradients_close(const LayerGradients& got, const LayerGradients& ref,
                                   const LayerWeights& w, double tol = 3e-3) {
  expect_gradient_close(got.grad_input, ref.grad_input, "grad_input", tol);
  for (const ParamInfo& p : w.params()) expect_gradient_close(got.grad.at(p.name), ref.grad.at(p.name), p.name, tol);
}

}  // namespace csattn::testing_util
