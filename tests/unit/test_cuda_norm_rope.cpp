// The warp-per-row norm / RoPE / Hadamard kernel and the per-run RoPE table against the
// one-block-per-row reference kernel (whose numerics the layer tests pin to the CPU
// backend): RoPE and Hadamard do the same fp32 operations in the same order, so without the
// norm the results must be bitwise equal; the norm's sum of squares is reduced in another
// order, so with it a few elements may differ by one bf16 step. The table must reproduce the
// reference's per-row cos / sin exactly. Outputs are NaN-poisoned first; compressed rows
// without an entry must stay untouched. Skips where no GPU is present.
#ifdef CSATTN_HAVE_CUDA
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <ostream>
#include <string>
#include <vector>

#include "csattn/layer.hpp"
#include "cuda/kernels.hpp"
#include "cuda/workspace.hpp"
#include "cuda_test_util.hpp"

namespace csattn {
namespace {

using testing_util::dev_cast;
using testing_util::DeviceArray;

struct NrCase {
  std::string name;
  int n;
  bool norm, weight, hadamard, compressed;
  int rope_sign;  // 0: no RoPE
  int per_token;
};
void PrintTo(const NrCase& c, std::ostream* os) { *os << c.name; }

class CudaNormRope : public ::testing::TestWithParam<NrCase> {};

TEST_P(CudaNormRope, WarpKernelMatchesTheBlockKernel) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const NrCase c = GetParam();
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  cfg.compress_ratio = 4;
  const std::vector<int> real = {37, 1, 300, 9}, padded = {40, 1, 303, 9};
  // Dims (max_seg_len 303, the longest padded segment), metadata and the RoPE table.
  const testing_util::DeviceBatch batch(cfg, real, padded);
  const cuda::LayerDims& d = batch.dims;
  const cuda::DeviceMetadata& m = batch.meta;
  const int T = d.rows, B = d.segments;
  cuda::DeviceWeights w;
  w.omega = batch.omega();

  const int rows = c.compressed ? d.comp_capacity : T * c.per_token;
  const std::size_t count = static_cast<std::size_t>(rows) * c.n;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<std::uint16_t> x(count), wt(c.n);
  for (auto& v : x) v = float_to_bf16_bits(dist(rng));
  for (auto& v : wt) v = float_to_bf16_bits(1.0f + 0.1f * dist(rng));
  const DeviceArray<std::uint16_t> in(x), weight(wt);
  DeviceArray<std::uint16_t> out_fast(count), out_ref(count), out_notable(count);
  out_fast.fill_bytes(0xFF);
  out_ref.fill_bytes(0xFF);
  out_notable.fill_bytes(0xFF);

  const cuda::bf16* in_p = dev_cast<cuda::bf16>(in);
  cuda::bf16* fast_p = dev_cast<cuda::bf16>(out_fast);
  cuda::NormRopeArgs a = c.compressed ? cuda::compressed_rows_args(d, w, m, in_p, fast_p, c.n)
                                      : cuda::token_rows_args(d, w, m, in_p, fast_p, rows, c.n, c.per_token);
  a.norm = c.norm;
  a.weight = c.weight ? dev_cast<cuda::bf16>(weight) : nullptr;
  a.hadamard = c.hadamard;
  a.rope_dim = c.rope_sign != 0 ? cfg.rope_dim : 0;
  a.rope_sign = c.rope_sign != 0 ? c.rope_sign : 1;
  cuda::launch_norm_rope(a, nullptr);
  a.out = dev_cast<cuda::bf16>(out_ref);
  cuda::launch_norm_rope_reference(a, nullptr);
  a.out = dev_cast<cuda::bf16>(out_notable);
  a.rope_table = nullptr;
  cuda::launch_norm_rope_reference(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "cudaDeviceSynchronize()";
  const std::vector<std::uint16_t> f = out_fast.download(), r = out_ref.download(),
                                   nt = out_notable.download();
  EXPECT_EQ(std::memcmp(r.data(), nt.data(), 2 * count), 0) << "the RoPE table differs from per-row cos / sin";

  const int written_rows = c.compressed ? batch.host_comp_start[B] : rows;
  ASSERT_GT(written_rows, 0);
  std::size_t differ = 0;
  for (int row = 0; row < rows; ++row)
    for (int i = 0; i < c.n; ++i) {
      const std::size_t k = static_cast<std::size_t>(row) * c.n + i;
      if (row >= written_rows) {  // capacity rows without an entry: untouched (still NaN)
        ASSERT_EQ(f[k], 0xFFFF) << "row " << row;
        continue;
      }
      const float fv = bf16_bits_to_float(f[k]), rv = bf16_bits_to_float(r[k]);
      ASSERT_TRUE(std::isfinite(fv)) << "row " << row << " col " << i;
      if (f[k] == r[k]) continue;
      ++differ;
      ASSERT_TRUE(c.norm) << "without the norm the kernels must agree bitwise: row " << row << " col " << i;
      // One bf16 step of a normalised value (|x| ~ 1); after a Hadamard the step of one
      // input spreads over the row at 1/sqrt(n) of its size.
      EXPECT_LE(std::fabs(fv - rv), 1e-2f * std::fabs(rv) + 2e-2f) << "row " << row << " col " << i;
    }
  const std::size_t allowed = static_cast<std::size_t>(written_rows) * c.n / (c.hadamard ? 10 : 100);
  EXPECT_LE(differ, allowed) << "too many elements differ";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaNormRope,
    ::testing::Values(NrCase{"q_norm_rope", 512, true, false, false, false, 1, 4},
                      NrCase{"inverse_rope", 512, false, false, false, false, -1, 4},
                      NrCase{"kv_norm_weight_rope", 512, true, true, false, false, 1, 1},
                      NrCase{"cq_norm_1024", 1024, true, true, false, false, 0, 1},
                      NrCase{"indexer_q_rope_hadamard", 128, false, false, true, false, 1, 8},
                      NrCase{"indexer_keys_compressed", 128, true, true, true, true, 1, 1},
                      NrCase{"main_keys_compressed", 512, true, true, false, true, 1, 1},
                      NrCase{"hadamard_256_transpose", 256, false, false, true, false, -1, 2},
                      // several rows per warp with a partial last group (353 rows)
                      NrCase{"rows_128_partial_group", 128, true, true, true, false, 1, 1},
                      NrCase{"rows_256_partial_group", 256, true, false, false, false, 1, 1}),
    [](const auto& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace csattn
#endif
