// Kernel-level tests of the sparse attention forward kernels (launch_sparse_attention_*): the
// wgmma kernel against an fp64 reference computed here, the mma kernel and the CUDA-core
// baseline, on random inputs with heads 64 / 128 / 72 / 24 / 20 / 8, CSA top-k rows with -1
// slots (trailing and interleaved), HCA rows with hundreds of compressed keys, rows with fewer
// keys than a tile. Outputs and LSE are NaN-poisoned (0xFF bytes) before every run. Skips (with
// the reason) where no GPU is present; the lent H200 runs them.
#include <gtest/gtest.h>

#ifdef CSATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "csattn/layer.hpp"
#include "csattn/tensor.hpp"
#include "cuda/kernels.hpp"
#include "cuda_test_util.hpp"
#include "test_util.hpp"

namespace csattn {
namespace {

using cuda::bf16;
using cuda::DeviceMetadata;
using cuda::LayerDims;
using testing_util::cuda_ok;
using testing_util::DeviceArray;

struct AttnCase {
  std::string name;
  int heads, ratio, window, topk;
  std::vector<int> seg_lens;  // raw (padded) rows per segment
  // Query rows per segment: every position when the segment is at most this long, else its
  // first 6, 6 around the window edge and the last `tail` positions.
  int all_up_to;
  int tail;
  bool interleave_invalid;  // CSA: shuffle -1 slots between the valid ids on every 3rd row
  // Compressed row j of a segment with E entries scaled by 1 + key_growth * j / E: logits
  // that grow along the key order, so a later tile's max exceeds the running one by more
  // than 2^8 again and again (the online softmax's rescale on many tiles; window rows stay
  // unscaled).
  float key_growth = 0.0f;
};
void PrintTo(const AttnCase& c, std::ostream* os) { *os << c.name; }

// The problem on the host (bf16 values as floats) and on the device.
struct Problem {
  LayerDims d;
  std::vector<int> q_seg, q_pos;                // per query row
  std::vector<int> cu, comp_start;              // [B+1]
  std::vector<float> q, kv, comp, sink;         // bf16-exact values
  std::vector<std::int32_t> topk;               // [T, K] (CSA)
  int comp_rows = 0;
};

std::vector<std::uint16_t> to_bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16_bits(v[i]);
  return b;
}

// Fast bf16-exact pseudo-normal values (sum of uniforms; the long HCA case has ~50M values).
void fill_random(std::vector<float>& v, std::size_t n, std::uint64_t seed, float scale) {
  v.resize(n);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < n; ++i) {
    float acc = 0.0f;
    for (int k = 0; k < 4; ++k) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      acc += static_cast<float>(s >> 40) * (1.0f / 16777216.0f) - 0.5f;
    }
    v[i] = round_bf16(acc * 1.7320508f * scale);  // 4 uniforms: variance 1/3
  }
}

Problem make_problem(const AttnCase& c, std::uint64_t seed) {
  Problem p;
  const int D = 512, H = c.heads, B = static_cast<int>(c.seg_lens.size());
  p.cu.assign(B + 1, 0);
  p.comp_start.assign(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    p.cu[b + 1] = p.cu[b] + c.seg_lens[b];
    p.comp_start[b + 1] = p.comp_start[b] + (c.ratio > 1 ? c.seg_lens[b] / c.ratio : 0);
  }
  p.comp_rows = p.comp_start[B];
  for (int b = 0; b < B; ++b) {
    const int L = c.seg_lens[b];
    std::vector<int> pos;
    if (L <= c.all_up_to) {
      for (int i = 0; i < L; ++i) pos.push_back(i);
    } else {
      for (int i = 0; i < 6; ++i) pos.push_back(i);
      for (int i = c.window - 3; i < c.window + 3; ++i) pos.push_back(i);
      for (int i = L - c.tail; i < L; ++i) pos.push_back(i);
      std::sort(pos.begin(), pos.end());
      pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
    }
    for (int x : pos) {
      p.q_seg.push_back(b);
      p.q_pos.push_back(x);
    }
  }
  const int T = static_cast<int>(p.q_pos.size());
  fill_random(p.q, static_cast<std::size_t>(T) * H * D, seed + 1, 2.0f);
  fill_random(p.kv, static_cast<std::size_t>(p.cu[B]) * D, seed + 2, 1.0f);
  fill_random(p.comp, static_cast<std::size_t>(std::max(p.comp_rows, 1)) * D, seed + 3, 1.0f);
  if (c.key_growth > 0.0f)
    for (int b = 0; b < B; ++b) {
      const int E = p.comp_start[b + 1] - p.comp_start[b];
      for (int j = 0; j < E; ++j) {
        const float f = 1.0f + c.key_growth * static_cast<float>(j) / static_cast<float>(E);
        float* row = &p.comp[static_cast<std::size_t>(p.comp_start[b] + j) * D];
        for (int i = 0; i < D; ++i) row[i] = round_bf16(row[i] * f);
      }
    }
  fill_random(p.sink, H, seed + 4, 1.0f);
  std::mt19937_64 rng(seed + 5);
  if (c.ratio == 4) {
    const int K = c.topk;
    p.topk.assign(static_cast<std::size_t>(T) * K, -1);
    for (int t = 0; t < T; ++t) {
      const int b = p.q_seg[t];
      const int visible = std::min((p.q_pos[t] + 1) / 4, p.comp_start[b + 1] - p.comp_start[b]);
      std::vector<int> pool(visible);
      std::iota(pool.begin(), pool.end(), 0);
      std::shuffle(pool.begin(), pool.end(), rng);
      const int cnt = std::min(K, visible);
      std::vector<int> row(pool.begin(), pool.begin() + cnt);
      std::sort(row.begin(), row.end());
      row.resize(K, -1);
      if (c.interleave_invalid && t % 3 == 1) std::shuffle(row.begin(), row.end(), rng);
      std::copy(row.begin(), row.end(), p.topk.begin() + static_cast<long>(t) * K);
    }
  }
  LayerDims& d = p.d;
  d.rows = T;
  d.segments = B;
  d.max_seg_len = *std::max_element(c.seg_lens.begin(), c.seg_lens.end());
  d.heads = H;
  d.head_dim = D;
  d.window = c.window;
  d.ratio = c.ratio;
  d.coff = c.ratio == 4 ? 2 : 1;
  d.comp_capacity = std::max(p.comp_rows, 1);
  d.topk = c.ratio == 4 ? c.topk : 0;
  d.scale = 1.0f / std::sqrt(static_cast<float>(D));
  return p;
}

// fp64 reference: out [T, H, D] and lse [T, H], keys in build_key_list's order.
void reference(const Problem& p, std::vector<double>& out, std::vector<double>& lse) {
  const LayerDims& d = p.d;
  const int D = 512, H = d.heads, T = d.rows;
  out.assign(static_cast<std::size_t>(T) * H * D, 0.0);
  lse.assign(static_cast<std::size_t>(T) * H, 0.0);
  std::vector<const float*> keys;
  std::vector<double> logit, acc(D);
  for (int t = 0; t < T; ++t) {
    const int b = p.q_seg[t], pos = p.q_pos[t];
    const int w0 = std::max(0, pos - d.window + 1);
    keys.clear();
    for (int r = w0; r <= pos; ++r) keys.push_back(&p.kv[static_cast<std::size_t>(p.cu[b] + r) * D]);
    const int comp0 = p.comp_start[b];
    if (d.ratio == 4) {
      for (int k = 0; k < d.topk; ++k) {
        const int id = p.topk[static_cast<std::size_t>(t) * d.topk + k];
        if (id >= 0) keys.push_back(&p.comp[static_cast<std::size_t>(comp0 + id) * D]);
      }
    } else if (d.ratio > 1) {
      const int n = std::min((pos + 1) / d.ratio, p.comp_start[b + 1] - comp0);
      for (int j = 0; j < n; ++j) keys.push_back(&p.comp[static_cast<std::size_t>(comp0 + j) * D]);
    }
    for (int h = 0; h < H; ++h) {
      const float* qr = &p.q[(static_cast<std::size_t>(t) * H + h) * D];
      logit.assign(keys.size(), 0.0);
      double m = p.sink[h];
      for (std::size_t k = 0; k < keys.size(); ++k) {
        double s = 0.0;
        for (int i = 0; i < D; ++i) s += static_cast<double>(qr[i]) * keys[k][i];
        logit[k] = s * d.scale;
        m = std::max(m, logit[k]);
      }
      double z = std::exp(p.sink[h] - m);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::size_t k = 0; k < keys.size(); ++k) {
        const double w = std::exp(logit[k] - m);
        z += w;
        for (int i = 0; i < D; ++i) acc[i] += w * keys[k][i];
      }
      double* o = &out[(static_cast<std::size_t>(t) * H + h) * D];
      for (int i = 0; i < D; ++i) o[i] = acc[i] / z;
      lse[static_cast<std::size_t>(t) * H + h] = m + std::log(z);
    }
  }
}

enum class Kernel { wgmma, wgmma_stamped, mma, baseline, dispatch };

struct Result {
  std::vector<float> out, lse;
  std::vector<std::uint16_t> out_bits;
};

// Uploads the problem once and runs any kernel on it (outputs poisoned before each run). The
// output sits between guard elements, which every run must leave poisoned: a write past the
// head rows or the tokens shows.
class DeviceProblem {
 public:
  explicit DeviceProblem(const Problem& p)
      : p_(p),
        q_(p.q.size()),
        kv_(p.kv.size()),
        comp_(p.comp.size()),
        sink_(p.sink.size()),
        topk_(std::max<std::size_t>(p.topk.size(), 1)),
        meta_(2 * (p.cu.size() + p.comp_start.size()) + 2 * p.q_pos.size() + p.q_pos.size()),
        out_(static_cast<std::size_t>(p.d.rows) * p.d.heads * 512 + 2 * kGuard),
        lse_(static_cast<std::size_t>(p.d.rows) * p.d.heads) {
    q_.upload(to_bits(p.q));
    kv_.upload(to_bits(p.kv));
    comp_.upload(to_bits(p.comp));
    sink_.upload(p.sink);
    if (!p.topk.empty()) topk_.upload(p.topk);
    // Metadata: cu_padded (= cu_real) | comp_start | row_segment | row_position | padding flags.
    std::vector<std::int32_t> h;
    h.insert(h.end(), p.cu.begin(), p.cu.end());
    h.insert(h.end(), p.comp_start.begin(), p.comp_start.end());
    h.insert(h.end(), p.q_seg.begin(), p.q_seg.end());
    h.insert(h.end(), p.q_pos.begin(), p.q_pos.end());
    const std::size_t flags_at = h.size();
    h.resize(meta_.size(), 0);  // row_is_padding: zero bytes
    meta_.upload(h);
    std::int32_t* m = meta_.get();
    const std::size_t B1 = p.cu.size(), T = p.q_pos.size();
    meta_dev_.cu_real = m;
    meta_dev_.cu_padded = m;
    meta_dev_.comp_start = m + B1;
    meta_dev_.row_segment = m + 2 * B1;
    meta_dev_.row_position = m + 2 * B1 + T;
    meta_dev_.row_is_padding = reinterpret_cast<std::uint8_t*>(m + flags_at);
  }

  Result run(Kernel k) {
    const bf16* q = reinterpret_cast<const bf16*>(q_.get());
    const bf16* kv = reinterpret_cast<const bf16*>(kv_.get());
    const bf16* comp = reinterpret_cast<const bf16*>(comp_.get());
    bf16* out = reinterpret_cast<bf16*>(out_.get()) + kGuard;
    out_.fill_bytes(0xFF);  // NaN for bf16 and fp32
    lse_.fill_bytes(0xFF);
    const LayerDims& d = p_.d;
    const std::int32_t* topk = p_.topk.empty() ? nullptr : topk_.get();
    switch (k) {
      case Kernel::wgmma:
        cuda::launch_sparse_attention_wgmma(d, meta_dev_, q, kv, comp, sink_.get(), topk, out,
                                            lse_.get(), nullptr);
        break;
      case Kernel::wgmma_stamped:
        stamps_.fill_bytes(0);
        cuda::launch_sparse_attention_wgmma(d, meta_dev_, q, kv, comp, sink_.get(), topk, out,
                                            lse_.get(), nullptr, stamps_.get());
        break;
      case Kernel::mma:
        cuda::launch_sparse_attention_mma(d, meta_dev_, q, kv, comp, sink_.get(), topk, out,
                                          lse_.get(), nullptr);
        break;
      case Kernel::baseline:
        cuda::launch_sparse_attention_baseline(d, meta_dev_, q, kv, comp, sink_.get(), topk, out,
                                               lse_.get(), nullptr);
        break;
      case Kernel::dispatch:
        cuda::launch_sparse_attention(d, meta_dev_, q, kv, comp, sink_.get(), topk, out,
                                      lse_.get(), nullptr);
        break;
    }
    cuda_ok(cudaGetLastError(), "cudaGetLastError()");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize()");
    Result r;
    const std::vector<std::uint16_t> all = out_.download();
    const std::size_t count = all.size() - 2 * kGuard;
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (i < kGuard || i >= kGuard + count) {
        EXPECT_EQ(all[i], 0xFFFFu) << "a write outside the output, guard element " << i;
      }
    }
    r.out_bits.assign(all.begin() + static_cast<long>(kGuard), all.begin() + static_cast<long>(kGuard + count));
    r.out.resize(r.out_bits.size());
    for (std::size_t i = 0; i < r.out.size(); ++i) r.out[i] = bf16_bits_to_float(r.out_bits[i]);
    r.lse = lse_.download();
    return r;
  }
  // The phase stamps of the last Kernel::wgmma_stamped run.
  std::vector<unsigned> stamps() { return stamps_.download(); }

 private:
  static constexpr std::size_t kGuard = 8;  // bf16 elements (16 bytes) before and after the output
  const Problem& p_;
  DeviceArray<std::uint16_t> q_, kv_, comp_;
  DeviceArray<float> sink_;
  DeviceArray<std::int32_t> topk_, meta_;
  DeviceArray<std::uint16_t> out_;
  DeviceArray<float> lse_;
  DeviceArray<unsigned> stamps_{static_cast<std::size_t>(cuda::AttentionForwardStamps::count())};
  DeviceMetadata meta_dev_;
};

// Every element finite; per (row, head): max |a - ref| <= rel * max|ref| of that head row +
// abs_floor; over everything: ||a - ref|| / ||ref|| <= rel_l2; LSE within lse_tol.
template <class Ref>
void expect_close(const char* what, const Result& a, const std::vector<Ref>& ref_out,
                  const std::vector<Ref>& ref_lse, int T, int H, double rel, double rel_l2,
                  double lse_tol) {
  const int D = 512;
  double num = 0.0, den = 0.0, worst = 0.0;
  int bad_rows = 0, first_bad = -1;
  for (int row = 0; row < T * H; ++row) {
    double rmax = 0.0, emax = 0.0;
    for (int i = 0; i < D; ++i) {
      const std::size_t k = static_cast<std::size_t>(row) * D + i;
      const double x = a.out[k], r = static_cast<double>(ref_out[k]);
      ASSERT_TRUE(std::isfinite(x)) << what << ": unwritten or NaN output at row " << row / H
                                    << " head " << row % H << " dim " << i;
      rmax = std::max(rmax, std::abs(r));
      emax = std::max(emax, std::abs(x - r));
      num += (x - r) * (x - r);
      den += r * r;
    }
    const double err = emax / (rmax + 1e-3);
    worst = std::max(worst, err);
    if (err > rel) {
      if (first_bad < 0) first_bad = row;
      ++bad_rows;
    }
    const double l = a.lse[row], lr = static_cast<double>(ref_lse[row]);
    ASSERT_TRUE(std::isfinite(l)) << what << ": unwritten or NaN LSE at row " << row / H << " head "
                                  << row % H;
    EXPECT_LE(std::abs(l - lr), lse_tol * std::max(1.0, std::abs(lr)))
        << what << ": LSE at row " << row / H << " head " << row % H;
  }
  EXPECT_EQ(bad_rows, 0) << what << ": " << bad_rows << " head rows off, first row "
                         << first_bad / H << " head " << first_bad % H << ", worst rel " << worst;
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), rel_l2) << what;
}

std::string attn_case_name(const ::testing::TestParamInfo<AttnCase>& param) {
  return param.param.name;
}

class CudaAttentionForward : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttentionForward, WgmmaMatchesReferenceMmaAndBaseline) {
  SKIP_WITHOUT_GPU();
  const AttnCase& c = GetParam();
  const Problem p = make_problem(c, 1000 + c.heads + c.ratio);
  ASSERT_TRUE(cuda::sparse_attention_wgmma_supported(p.d));
  std::vector<double> ref_out, ref_lse;
  reference(p, ref_out, ref_lse);
  DeviceProblem dev(p);
  const int T = p.d.rows, H = p.d.heads;
  const Result w = dev.run(Kernel::wgmma);
  // bf16 P and bf16 outputs against fp64: about 2^-8 relative per head row.
  expect_close("wgmma vs fp64", w, ref_out, ref_lse, T, H, 2e-2, 6e-3, 1e-4);
  const Result m = dev.run(Kernel::mma);
  expect_close("mma vs fp64", m, ref_out, ref_lse, T, H, 2e-2, 6e-3, 1e-4);
  expect_close("wgmma vs mma", w, m.out, m.lse, T, H, 2e-2, 5e-3, 1e-4);
  const Result b = dev.run(Kernel::baseline);
  expect_close("baseline vs fp64", b, ref_out, ref_lse, T, H, 2e-2, 6e-3, 1e-4);
}

TEST_P(CudaAttentionForward, WgmmaRunsAreBitwiseEqual) {
  SKIP_WITHOUT_GPU();
  const AttnCase& c = GetParam();
  const Problem p = make_problem(c, 2000 + c.heads);
  DeviceProblem dev(p);
  const Result a = dev.run(Kernel::wgmma);
  const Result b = dev.run(Kernel::wgmma);
  for (float v : a.out) ASSERT_TRUE(std::isfinite(v)) << "unwritten or NaN output";
  EXPECT_EQ(0, std::memcmp(a.out_bits.data(), b.out_bits.data(), a.out_bits.size() * 2));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4));
  // Unless CSATTN_ATTENTION overrides it, launch_sparse_attention dispatches to this kernel.
  if (std::getenv("CSATTN_ATTENTION") == nullptr) {
    const Result dsp = dev.run(Kernel::dispatch);
    EXPECT_EQ(0, std::memcmp(a.out_bits.data(), dsp.out_bits.data(), a.out_bits.size() * 2))
        << "launch_sparse_attention does not dispatch to the wgmma kernel";
  }
}

// The measurement instance (phase stamps, kernels.hpp) computes the same outputs bit for bit,
// and on every CTA that reaches the stamped item each warpgroup writes that item's four stamps
// and, per key-tile pair, its pair stamps in time order (32-bit clock, never 0). 1200 rows of
// one head block: every CTA has 9+ items, the stamped one 2 pairs (window + 66-99 entries).
TEST(CudaAttentionForwardStamps, SameOutputsAndStampsInOrder) {
  SKIP_WITHOUT_GPU();
  using Stamps = cuda::AttentionForwardStamps;
  const AttnCase c{"CSA_H8_stamps", 8, 4, 128, 256, {1200}, 1200, 0, false};
  const Problem p = make_problem(c, 4242);
  DeviceProblem dev(p);
  const Result plain = dev.run(Kernel::wgmma);
  const Result stamped = dev.run(Kernel::wgmma_stamped);
  EXPECT_EQ(0, std::memcmp(plain.out_bits.data(), stamped.out_bits.data(), plain.out_bits.size() * 2));
  EXPECT_EQ(0, std::memcmp(plain.lse.data(), stamped.lse.data(), plain.lse.size() * 4));
  const std::vector<unsigned> h = dev.stamps();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int ctas = std::min({Stamps::ctas, sms, p.d.rows});
  ASSERT_GT(p.d.rows, (Stamps::item + 1) * ctas) << "every CTA must reach the stamped item";
  const int last[3] = {5, 7, 7};  // the final stamp of a pair: producer, consumer 0, consumer 1
  for (int cta = 0; cta < ctas; ++cta)
    for (int wg = 0; wg < 3; ++wg) {
      SCOPED_TRACE("CTA " + std::to_string(cta) + " warpgroup " + std::to_string(wg));
      const unsigned* base = h.data() + static_cast<std::size_t>(cta * 3 + wg) * (Stamps::pairs + 1) * Stamps::phases;
      const unsigned* item = base + static_cast<std::size_t>(Stamps::pairs) * Stamps::phases;
      for (int k = 0; k < 4; ++k) ASSERT_NE(item[k], 0u) << "item stamp " << k;
      for (int k = 1; k < 4; ++k) ASSERT_LT(item[k] - item[k - 1], 1u << 31) << "item stamp " << k;
      ASSERT_NE(base[last[wg]], 0u) << "the item's first pair";
      int pairs = 0;
      for (int pair = 0; pair < Stamps::pairs && base[pair * Stamps::phases + last[wg]] != 0u; ++pair, ++pairs) {
        const unsigned* r = base + pair * Stamps::phases;
        for (int k = 1; k <= last[wg]; ++k) ASSERT_LT(r[k] - r[k - 1], 1u << 31) << "pair " << pair << " stamp " << k;
        if (wg > 0) {
          ASSERT_LT(r[0] - item[1], 1u << 31) << "pair " << pair << " before Q was ready";
        }
      }
      EXPECT_EQ(pairs, 2);
    }
}

// name, heads, ratio, window, top-k, segment lengths, all_up_to, tail, interleave
INSTANTIATE_TEST_SUITE_P(
    Kernels, CudaAttentionForward,
    ::testing::Values(
        // CSA: early rows have -1 slots (trailing, or shuffled in), the long segment's last
        // rows a full top-k of 512 (640 keys, 10 tiles).
        AttnCase{"CSA_H64", 64, 4, 128, 512, {5, 1, 300, 2600}, 300, 10, true},
        AttnCase{"CSA_H128", 128, 4, 128, 1024, {70, 4300}, 80, 6, true},
        AttnCase{"CSA_H24", 24, 4, 128, 64, {5, 1, 77, 203, 700}, 210, 8, true},
        AttnCase{"CSA_H8", 8, 4, 16, 40, {3, 150, 401}, 160, 8, true},
        // A last head block that ends inside an 8-row group (20: rows 16-19) or holds one
        // (72 = 64 + 8): its rows past H are the next token's and stay unwritten.
        AttnCase{"CSA_H20", 20, 4, 128, 64, {5, 77, 330}, 210, 8, true},
        AttnCase{"HCA_H72", 72, 128, 128, 0, {1, 400}, 80, 6, false},
        // HCA: the last rows of a 89600-row segment see 700 compressed keys (13 tiles).
        AttnCase{"HCA_H64_long", 64, 128, 128, 0, {70, 300, 89600}, 300, 4, false},
        AttnCase{"HCA_H128", 128, 128, 128, 0, {70, 300, 521}, 80, 6, false},
        AttnCase{"HCA_H24", 24, 128, 128, 0, {1, 1000}, 80, 6, false},
        // SWA: rows with 1..128 keys (fewer than a 64-key tile, one tile, two tiles).
        AttnCase{"SWA_H64", 64, 1, 128, 0, {5, 1, 77, 203, 130}, 210, 0, false},
        AttnCase{"SWA_H8", 8, 1, 128, 0, {200}, 210, 0, false},
        // Logits growing along the compressed keys (x1 -> x5): row maxima jump by more than
        // 2^8 from pair to pair, and the two consumers' tiles differ; the HCA case's 82 rows
        // x 2 head blocks are more items than SMs, so CTAs run several items that settle maxima
        // (the P tiles and barriers reused across them).
        AttnCase{"CSA_H64_growing", 64, 4, 128, 512, {2600}, 300, 10, false, 4.0f},
        AttnCase{"HCA_H128_growing", 128, 128, 128, 0, {30000}, 80, 70, false, 4.0f}),
    attn_case_name);

// The wgmma kernel takes its row maxima before scaling (exact only for a positive scale): a
// zero or negative scale is refused before anything touches the device, so this runs
// without a GPU too.
TEST(CudaAttentionForwardArgs, NonPositiveScaleIsRefused) {
  for (float scale : {0.0f, -0.04f}) {
    LayerDims d;
    d.rows = 1;
    d.heads = 64;
    d.head_dim = 512;
    d.scale = scale;
    try {
      cuda::launch_sparse_attention_wgmma(d, DeviceMetadata{}, nullptr, nullptr, nullptr, nullptr,
                                          nullptr, nullptr, nullptr, nullptr);
      ADD_FAILURE() << "scale " << scale << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("softmax scale"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace csattn

#endif  // CSATTN_HAVE_CUDA
