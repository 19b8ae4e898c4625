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

#include "core/rope_table.hpp"
#include "csattn/layer.hpp"
#include "cuda/kernels.hpp"
#include "cuda/workspace.hpp"

namespace csattn {
namespace {

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x

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
  std::vector<std::int32_t> cu_real(1, 0), cu_padded(1, 0);
  for (std::size_t b = 0; b < real.size(); ++b) {
    cu_real.push_back(cu_real.back() + real[b]);
    cu_padded.push_back(cu_padded.back() + padded[b]);
  }
  const int T = cu_padded.back(), B = static_cast<int>(real.size());
  cuda::LayerDims d = cuda::make_dims(cfg, T, B, 303);
  const std::vector<float> omega = rope_frequencies(cfg);
  std::int32_t *dcr, *dcp, *seg, *pos, *cs;
  std::uint8_t* pad;
  float* om;
  __nv_bfloat162* table;
  CK(cudaMalloc(&dcr, 4 * (B + 1)));
  CK(cudaMalloc(&dcp, 4 * (B + 1)));
  CK(cudaMalloc(&seg, 4 * T));
  CK(cudaMalloc(&pos, 4 * T));
  CK(cudaMalloc(&pad, T));
  CK(cudaMalloc(&cs, 4 * (B + 1)));
  CK(cudaMalloc(&om, 4 * omega.size()));
  CK(cudaMalloc(&table, 4 * 303 * (cfg.rope_dim / 2)));
  CK(cudaMemcpy(dcr, cu_real.data(), 4 * (B + 1), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dcp, cu_padded.data(), 4 * (B + 1), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(om, omega.data(), 4 * omega.size(), cudaMemcpyHostToDevice));
  cuda::DeviceMetadata m;
  m.cu_real = dcr;
  m.cu_padded = dcp;
  m.row_segment = seg;
  m.row_position = pos;
  m.row_is_padding = pad;
  m.comp_start = cs;
  m.rope_table = table;
  cuda::launch_metadata(d, m, nullptr);
  cuda::launch_rope_table(d, om, table, nullptr);
  cuda::DeviceWeights w;
  w.omega = om;

  const int rows = c.compressed ? d.comp_capacity : T * c.per_token;
  const std::size_t count = static_cast<std::size_t>(rows) * c.n;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<std::uint16_t> x(count), wt(c.n);
  for (auto& v : x) v = float_to_bf16_bits(dist(rng));
  for (auto& v : wt) v = float_to_bf16_bits(1.0f + 0.1f * dist(rng));
  cuda::bf16 *in, *out_fast, *out_ref, *out_notable, *weight;
  CK(cudaMalloc(&in, 2 * count));
  CK(cudaMalloc(&out_fast, 2 * count));
  CK(cudaMalloc(&out_ref, 2 * count));
  CK(cudaMalloc(&out_notable, 2 * count));
  CK(cudaMalloc(&weight, 2 * c.n));
  CK(cudaMemcpy(in, x.data(), 2 * count, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(weight, wt.data(), 2 * c.n, cudaMemcpyHostToDevice));
  for (cuda::bf16* o : {out_fast, out_ref, out_notable}) CK(cudaMemset(o, 0xFF, 2 * count));

  cuda::NormRopeArgs a = c.compressed ? cuda::compressed_rows_args(d, w, m, in, out_fast, c.n)
                                      : cuda::token_rows_args(d, w, m, in, out_fast, rows, c.n, c.per_token);
  a.norm = c.norm;
  a.weight = c.weight ? weight : nullptr;
  a.hadamard = c.hadamard;
  a.rope_dim = c.rope_sign != 0 ? cfg.rope_dim : 0;
  a.rope_sign = c.rope_sign != 0 ? c.rope_sign : 1;
  cuda::launch_norm_rope(a, nullptr);
  a.out = out_ref;
  cuda::launch_norm_rope_reference(a, nullptr);
  a.out = out_notable;
  a.rope_table = nullptr;
  cuda::launch_norm_rope_reference(a, nullptr);
  CK(cudaDeviceSynchronize());
  std::vector<std::uint16_t> f(count), r(count), nt(count);
  CK(cudaMemcpy(f.data(), out_fast, 2 * count, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r.data(), out_ref, 2 * count, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(nt.data(), out_notable, 2 * count, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(r.data(), nt.data(), 2 * count), 0) << "the RoPE table differs from per-row cos / sin";

  std::vector<std::int32_t> comp_start(B + 1);
  CK(cudaMemcpy(comp_start.data(), cs, 4 * (B + 1), cudaMemcpyDeviceToHost));
  const int written_rows = c.compressed ? comp_start[B] : rows;
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
  for (void* p : {static_cast<void*>(dcr), static_cast<void*>(dcp), static_cast<void*>(seg),
                  static_cast<void*>(pos), static_cast<void*>(pad), static_cast<void*>(cs),
                  static_cast<void*>(om), static_cast<void*>(table), static_cast<void*>(in),
                  static_cast<void*>(out_fast), static_cast<void*>(out_ref),
                  static_cast<void*>(out_notable), static_cast<void*>(weight)})
    cudaFree(p);
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
