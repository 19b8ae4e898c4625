// The tensor-core sparse attention backward (attention_backward_mma.cu) against the CUDA-core
// baseline (attention_backward.cu) at kernel level: random Q, kv, compressed rows, dO and
// top-k (with -1 slots), the forward run for out / LSE, then both backwards on the same
// inputs with every output NaN-poisoned first. Both accumulate in fp32; the tensor-core
// kernel rounds P and dS to bf16 before its MMAs, so the gate is a tight relative L2 error,
// not bitwise. Skips (with the reason) where no GPU is present.
#ifdef CSATTN_HAVE_CUDA
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "csattn/config.hpp"
#include "csattn/layer.hpp"
#include "csattn/tensor.hpp"
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/ordered_scatter.hpp"
#include "cuda/workspace.hpp"

namespace csattn {
namespace {

using namespace csattn::cuda;

#define SKIP_WITHOUT_GPU()                                            \
  do {                                                                \
    std::string why;                                                  \
    if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;     \
  } while (0)

// One device allocation, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    CSATTN_CUDA_CHECK(cudaMalloc(&p_, std::max<std::size_t>(bytes, 256)));
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

template <class T>
void upload(const DeviceBuffer& dst, const std::vector<T>& v) {
  CSATTN_CUDA_CHECK(cudaMemcpy(dst.as<void>(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
}
std::vector<float> download_f32(const DeviceBuffer& src, std::size_t n) {
  std::vector<float> v(n);
  CSATTN_CUDA_CHECK(cudaMemcpy(v.data(), src.as<void>(), n * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}
std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint64_t seed, float sd = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16_bits(dist(rng));
  return v;
}

struct BwdCase {
  int heads;
  int ratio;  // 0 SWA, 4 CSA (top-k), 128 HCA
  int topk;
};
void PrintTo(const BwdCase& c, std::ostream* os) {
  *os << "heads " << c.heads << " ratio " << c.ratio << " topk " << c.topk;
}

struct Grads {
  std::vector<float> dq, dkv, dcomp, dsink;
};

// Relative L2 error and cosine of got against ref; every value of got finite; ref must be
// non-trivial (a test on all-zero gradients could not fail).
void expect_close(const std::vector<float>& got, const std::vector<float>& ref,
                  const std::string& name) {
  ASSERT_EQ(got.size(), ref.size()) << name;
  double err2 = 0.0, ref2 = 0.0, got2 = 0.0, dot = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << name << "[" << i << "] unwritten or NaN";
    ASSERT_TRUE(std::isfinite(ref[i])) << name << "[" << i << "] of the baseline";
    const double e = static_cast<double>(got[i]) - ref[i];
    err2 += e * e;
    ref2 += static_cast<double>(ref[i]) * ref[i];
    got2 += static_cast<double>(got[i]) * got[i];
    dot += static_cast<double>(got[i]) * ref[i];
  }
  if (ref.empty()) return;
  ASSERT_GT(ref2, 0.0) << name << ": the reference is all zeros";
  const double rel = std::sqrt(err2 / ref2), cosine = dot / std::sqrt(got2 * ref2);
  EXPECT_LT(rel, 1e-2) << name;
  EXPECT_GT(cosine, 1.0 - 1e-4) << name;
}

class CudaAttentionBackward : public ::testing::TestWithParam<BwdCase> {};

TEST_P(CudaAttentionBackward, TensorCoreMatchesBaseline) {
  SKIP_WITHOUT_GPU();
  const BwdCase c = GetParam();
  AttentionConfig cfg = ModelConfig::preset("flash").base;  // head_dim 512, window 128
  cfg.n_heads = c.heads;
  cfg.compress_ratio = c.ratio;
  if (c.ratio == 4) cfg.index_topk = c.topk;
  // Segments: shorter than a key tile, one row, a padded tail, and two long enough for full
  // windows and many compressed entries (rows with fewer keys than a tile start each one).
  const std::vector<int> real = {5, 1, 40, 300, 650}, padded = {8, 1, 40, 304, 650};
  const int B = static_cast<int>(real.size());
  std::vector<std::int32_t> cu_real(B + 1, 0), cu_padded(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    cu_real[b + 1] = cu_real[b] + real[b];
    cu_padded[b + 1] = cu_padded[b] + padded[b];
  }
  const int T = cu_padded[B];
  const int max_seg = *std::max_element(padded.begin(), padded.end());
  LayerDims d = make_dims(cfg, T, B, max_seg);
  const int H = d.heads, D = d.head_dim, Nc = d.comp_capacity, K = d.topk;
  ASSERT_EQ(D, 512);
  ASSERT_TRUE(attention_backward_mma_supported(d));

  // Metadata on the device (the forward's kernel builds the per-row part).
  DeviceBuffer cu_real_d(sizeof(std::int32_t) * (B + 1)), cu_padded_d(sizeof(std::int32_t) * (B + 1)),
      comp_start_d(sizeof(std::int32_t) * (B + 1)), row_segment_d(sizeof(std::int32_t) * T),
      row_position_d(sizeof(std::int32_t) * T), row_padding_d(T);
  upload(cu_real_d, cu_real);
  upload(cu_padded_d, cu_padded);
  DeviceMetadata meta;
  meta.cu_real = cu_real_d.as<std::int32_t>();
  meta.cu_padded = cu_padded_d.as<std::int32_t>();
  meta.comp_start = comp_start_d.as<std::int32_t>();
  meta.row_segment = row_segment_d.as<std::int32_t>();
  meta.row_position = row_position_d.as<std::int32_t>();
  meta.row_is_padding = row_padding_d.as<std::uint8_t>();
  launch_metadata(d, meta, nullptr);

  // Inputs. Logits ~ N(0, 1) after the 512^-1/2 scale, so P spreads over many keys.
  const std::size_t rowsHD = static_cast<std::size_t>(T) * H * D;
  DeviceBuffer q(rowsHD * 2), kv(static_cast<std::size_t>(T) * D * 2),
      comp(static_cast<std::size_t>(Nc) * D * 2), dout(rowsHD * 2), out(rowsHD * 2),
      lse(sizeof(float) * T * H), sink(sizeof(float) * H),
      topk(sizeof(std::int32_t) * std::max<std::size_t>(1, static_cast<std::size_t>(T) * K));
  upload(q, random_bf16(rowsHD, 1));
  upload(kv, random_bf16(static_cast<std::size_t>(T) * D, 2));
  upload(comp, random_bf16(static_cast<std::size_t>(Nc) * D, 3));
  upload(dout, random_bf16(rowsHD, 4));
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> sink_h(H);
  for (float& s : sink_h) s = nd(rng);
  upload(sink, sink_h);
  if (K > 0) {
    // Per row: distinct causally visible ids, ascending, then -1; about one in eight of the
    // selectable ids left out so rows below top-k have -1 slots too.
    std::vector<std::int32_t> sel(static_cast<std::size_t>(T) * K, -1);
    for (int b = 0; b < B; ++b)
      for (int pos = 0; pos < padded[b]; ++pos) {
        const int visible = std::min((pos + 1) / 4, padded[b] / 4);
        std::vector<std::int32_t> pool(visible);
        for (int i = 0; i < visible; ++i) pool[i] = i;
        std::shuffle(pool.begin(), pool.end(), rng);
        int keep = std::min(visible, K);
        if (keep > 1) keep -= static_cast<int>(rng() % (keep / 8 + 1));
        std::sort(pool.begin(), pool.begin() + keep);
        std::copy(pool.begin(), pool.begin() + keep,
                  sel.begin() + static_cast<long>(cu_padded[b] + pos) * K);
      }
    upload(topk, sel);
  }
  launch_sparse_attention(d, meta, q.as<bf16>(), kv.as<bf16>(), comp.as<bf16>(), sink.as<float>(),
                          topk.as<std::int32_t>(), out.as<bf16>(), lse.as<float>(), nullptr);

  DeviceBuffer dq(sizeof(float) * rowsHD), dkv(sizeof(float) * T * D),
      dcomp(sizeof(float) * static_cast<std::size_t>(Nc) * D), dsink(sizeof(float) * T * H);
  auto run = [&](bool mma) {
    // dq and dsink_part are written: NaN first. The key gradients are accumulated: zero.
    CSATTN_CUDA_CHECK(cudaMemset(dq.as<void>(), 0xFF, dq.bytes()));
    CSATTN_CUDA_CHECK(cudaMemset(dsink.as<void>(), 0xFF, dsink.bytes()));
    CSATTN_CUDA_CHECK(cudaMemset(dkv.as<void>(), 0, dkv.bytes()));
    CSATTN_CUDA_CHECK(cudaMemset(dcomp.as<void>(), 0, dcomp.bytes()));
    auto launch = mma ? launch_attention_backward_mma : launch_attention_backward_baseline;
    launch(d, meta, q.as<bf16>(), kv.as<bf16>(), comp.as<bf16>(), sink.as<float>(),
           topk.as<std::int32_t>(), out.as<bf16>(), lse.as<float>(), dout.as<bf16>(),
           dq.as<float>(), dkv.as<float>(), dcomp.as<float>(), dsink.as<float>(), nullptr,
           GradChunk{});
    CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
    return Grads{download_f32(dq, rowsHD), download_f32(dkv, static_cast<std::size_t>(T) * D),
                 download_f32(dcomp, static_cast<std::size_t>(Nc) * D),
                 download_f32(dsink, static_cast<std::size_t>(T) * H)};
  };
  const Grads ref = run(false), got = run(true);

  // Deterministic mode: row chunks write per-(row, head block, slot) contributions to a
  // NaN-poisoned scratch (a slot the kernel forgot stays NaN and poisons the sum), then the
  // ordered scatter adds them per key row in row order.
  auto run_deterministic = [&](bool mma, int chunk_rows) {
    CSATTN_CUDA_CHECK(cudaMemset(dq.as<void>(), 0xFF, dq.bytes()));
    CSATTN_CUDA_CHECK(cudaMemset(dsink.as<void>(), 0xFF, dsink.bytes()));
    CSATTN_CUDA_CHECK(cudaMemset(dkv.as<void>(), 0, dkv.bytes()));
    CSATTN_CUDA_CHECK(cudaMemset(dcomp.as<void>(), 0, dcomp.bytes()));
    const int copies = mma ? (H + 63) / 64 : 1, slots = max_keys_per_query(d);
    DeviceBuffer scratch(sizeof(float) * static_cast<std::size_t>(chunk_rows) * copies * slots * D);
    CSATTN_CUDA_CHECK(cudaMemset(scratch.as<void>(), 0xFF, scratch.bytes()));
    OrderedScatter os;
    os.layout = SlotLayout::attention;
    os.slots = slots;
    os.width = D;
    os.dst_window = dkv.as<float>();
    os.dst_comp = dcomp.as<float>();
    os.copies = copies;
    auto launch = mma ? launch_attention_backward_mma : launch_attention_backward_baseline;
    for (int r0 = 0; r0 < T; r0 += chunk_rows) {
      const GradChunk chunk{r0, std::min(chunk_rows, T - r0), scratch.as<float>(), slots, copies};
      launch(d, meta, q.as<bf16>(), kv.as<bf16>(), comp.as<bf16>(), sink.as<float>(),
             topk.as<std::int32_t>(), out.as<bf16>(), lse.as<float>(), dout.as<bf16>(),
             dq.as<float>(), dkv.as<float>(), dcomp.as<float>(), dsink.as<float>(), nullptr, chunk);
      launch_ordered_scatter(d, meta, topk.as<std::int32_t>(), os, chunk.r0, chunk.rows, scratch.as<float>(),
                             nullptr);
    }
    CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
    return Grads{download_f32(dq, rowsHD), download_f32(dkv, static_cast<std::size_t>(T) * D),
                 download_f32(dcomp, static_cast<std::size_t>(Nc) * D),
                 download_f32(dsink, static_cast<std::size_t>(T) * H)};
  };
  for (bool mma : {true, false}) {
    SCOPED_TRACE(mma ? "deterministic tensor-core kernel" : "deterministic baseline kernel");
    const Grads a = run_deterministic(mma, 37), b = run_deterministic(mma, 37);
    const Grads& fast = mma ? got : ref;
    expect_close(a.dq, fast.dq, "dq");
    expect_close(a.dkv, fast.dkv, "dkv");
    expect_close(a.dcomp, fast.dcomp, "dcomp");
    expect_close(a.dsink, fast.dsink, "dsink");
    EXPECT_EQ(a.dkv, b.dkv) << "dkv is not bitwise repeatable";
    EXPECT_EQ(a.dcomp, b.dcomp) << "dcomp is not bitwise repeatable";
    EXPECT_EQ(a.dq, b.dq) << "dq is not bitwise repeatable";
  }
  expect_close(got.dq, ref.dq, "dq");
  expect_close(got.dkv, ref.dkv, "dkv");
  expect_close(got.dcomp, ref.dcomp, "dcomp");
  expect_close(got.dsink, ref.dsink, "dsink");

  // Per-row spot check: the worst row of dq relative to its own norm (a wrong row among many
  // good ones would hide in the global L2 error).
  double worst = 0.0;
  for (long r = 0; r < static_cast<long>(T) * H; ++r) {
    double e2 = 0.0, r2 = 0.0;
    for (int i = 0; i < D; ++i) {
      const double e = static_cast<double>(got.dq[r * D + i]) - ref.dq[r * D + i];
      e2 += e * e;
      r2 += static_cast<double>(ref.dq[r * D + i]) * ref.dq[r * D + i];
    }
    if (r2 > 0.0) worst = std::max(worst, std::sqrt(e2 / r2));
    else EXPECT_EQ(e2, 0.0) << "dq row " << r;
  }
  EXPECT_LT(worst, 5e-2) << "worst dq row";
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaAttentionBackward,
                         ::testing::Values(BwdCase{64, 4, 100}, BwdCase{128, 4, 128},
                                           BwdCase{24, 4, 100}, BwdCase{64, 128, 0},
                                           BwdCase{64, 0, 0}),
                         [](const auto& param_info) {
                           const BwdCase& c = param_info.param;
                           std::string name = "H";
                           name += std::to_string(c.heads);
                           name += "_ratio";
                           name += std::to_string(c.ratio);
                           name += "_topk";
                           name += std::to_string(c.topk);
                           return name;
                         });

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
