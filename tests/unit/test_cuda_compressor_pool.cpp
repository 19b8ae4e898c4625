// The compressors' gated pooling on the GPU: the layer's vectorised kernel and the
// one-thread-per-channel reference kernel against an fp64 evaluation of the equation on the
// same bf16 inputs, for both ratios (m = 4 with its overlapping A / B halves, m = 128 with
// its split-and-merge), the main (512) and indexer (128) widths, and widths the vector kernel
// does not take (the fallback). Ragged padded batches: segments shorter than the ratio, tails,
// padding rows. Outputs are NaN-poisoned; capacity rows without an entry must stay so.
// Skips where no GPU is present.
#ifdef CSATTN_HAVE_CUDA
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "csattn/layer.hpp"
#include "csattn/tensor.hpp"
#include "cuda_test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

struct PoolCase {
  std::string name;
  int ratio;
  int d;  // pooled width
};
void PrintTo(const PoolCase& c, std::ostream* os) { *os << c.name; }

class CudaCompressorPool : public ::testing::TestWithParam<PoolCase> {};

TEST_P(CudaCompressorPool, MatchesFp64AndTheReferenceKernel) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const PoolCase c = GetParam();
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  cfg.compress_ratio = c.ratio;
  const bool m4 = c.ratio == 4;
  const std::vector<int> real = m4 ? std::vector<int>{5, 1, 3, 77, 203, 130} : std::vector<int>{70, 300, 521, 128};
  const std::vector<int> padded = m4 ? std::vector<int>{8, 1, 3, 77, 210, 130} : std::vector<int>{72, 300, 530, 128};
  const DeviceBatch batch(cfg, real, padded);
  const cuda::LayerDims& d = batch.dims;
  const int T = d.rows, width = (m4 ? 2 : 1) * c.d, cap = d.comp_capacity;
  const int entries = batch.host_comp_start.back();
  ASSERT_GT(entries, 0);

  std::mt19937 rng(static_cast<unsigned>(c.ratio * 1000 + c.d));
  std::normal_distribution<float> dist;
  std::vector<std::uint16_t> a(static_cast<std::size_t>(T) * width), g(a.size());
  std::vector<float> ape(static_cast<std::size_t>(c.ratio) * width);
  for (auto& v : a) v = float_to_bf16_bits(dist(rng));
  for (auto& v : g) v = float_to_bf16_bits(2.0f * dist(rng));
  for (auto& v : ape) v = 0.5f * dist(rng);
  const DeviceArray<std::uint16_t> da(a), dg(g);
  const DeviceArray<float> dape(ape);
  DeviceArray<std::uint16_t> out_vec(static_cast<std::size_t>(cap) * c.d), out_ref(out_vec.size());
  out_vec.fill_bytes(0xFF);
  out_ref.fill_bytes(0xFF);
  auto bf = [](const DeviceArray<std::uint16_t>& x) { return reinterpret_cast<const cuda::bf16*>(x.get()); };
  cuda::launch_compressor_pool(d, batch.meta, c.d, bf(da), bf(dg), dape.get(),
                               reinterpret_cast<cuda::bf16*>(out_vec.get()), nullptr);
  cuda::launch_compressor_pool_reference(d, batch.meta, c.d, bf(da), bf(dg), dape.get(),
                                         reinterpret_cast<cuda::bf16*>(out_ref.get()), nullptr);
  cuda_ok(cudaDeviceSynchronize(), "pool");
  const std::vector<std::uint16_t> ov = out_vec.download(), orf = out_ref.download();

  // fp64 oracle of the pooling equation, entry by entry.
  int differ = 0;
  for (int e = 0; e < cap; ++e) {
    if (e >= entries) {
      for (int ch = 0; ch < c.d; ++ch) {
        ASSERT_EQ(ov[static_cast<std::size_t>(e) * c.d + ch], 0xFFFF) << "entry " << e << " written";
        ASSERT_EQ(orf[static_cast<std::size_t>(e) * c.d + ch], 0xFFFF) << "entry " << e << " written";
      }
      continue;
    }
    int b = 0;
    while (batch.host_comp_start[b + 1] <= e) ++b;
    const int j = e - batch.host_comp_start[b];
    const int block0 = batch.host_cu_padded[b] + j * c.ratio;
    for (int ch = 0; ch < c.d; ++ch) {
      struct Cand { int token, col, slot; };
      std::vector<Cand> cands;
      if (m4 && j > 0)
        for (int k = 0; k < 4; ++k) cands.push_back({block0 - 4 + k, ch, k});
      for (int k = 0; k < c.ratio; ++k) cands.push_back({block0 + k, m4 ? c.d + ch : ch, k});
      double mx = -INFINITY;
      for (const Cand& k : cands)
        mx = std::max(mx, static_cast<double>(bf16_bits_to_float(g[static_cast<std::size_t>(k.token) * width + k.col])) +
                              ape[static_cast<std::size_t>(k.slot) * width + k.col]);
      double z = 0.0, acc = 0.0;
      for (const Cand& k : cands) {
        const std::size_t at = static_cast<std::size_t>(k.token) * width + k.col;
        const double p = std::exp(bf16_bits_to_float(g[at]) + static_cast<double>(ape[static_cast<std::size_t>(k.slot) * width + k.col]) - mx);
        z += p;
        acc += p * bf16_bits_to_float(a[at]);
      }
      const double want = acc / z;
      const std::size_t at = static_cast<std::size_t>(e) * c.d + ch;
      const float fv = bf16_bits_to_float(ov[at]), rv = bf16_bits_to_float(orf[at]);
      ASSERT_TRUE(std::isfinite(fv)) << "entry " << e << " channel " << ch;
      // bf16 output: half a step of rounding plus fp32 accumulation.
      EXPECT_NEAR(fv, want, std::fabs(want) / 200.0 + 1e-4) << "vector kernel, entry " << e << " channel " << ch;
      EXPECT_NEAR(rv, want, std::fabs(want) / 200.0 + 1e-4) << "reference kernel, entry " << e << " channel " << ch;
      if (ov[at] != orf[at]) ++differ;
    }
  }
  // The kernels sum in other orders: a few outputs may round to the neighbouring bf16.
  EXPECT_LE(differ, entries * c.d / 20) << "the vector and reference kernels disagree too often";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaCompressorPool,
    ::testing::Values(PoolCase{"csa_main_512", 4, 512}, PoolCase{"csa_indexer_128", 4, 128},
                      PoolCase{"hca_main_512", 128, 512}, PoolCase{"hca_width_64", 128, 64},
                      PoolCase{"csa_width_60", 4, 60}, PoolCase{"csa_width_62_fallback", 4, 62},
                      PoolCase{"hca_width_1024_fallback", 128, 1024}),
    [](const auto& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
