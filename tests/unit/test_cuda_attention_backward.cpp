// The tensor-core sparse attention backwards (attention_backward_wgmma.cu,
// attention_backward_mma.cu) against the CUDA-core baseline (attention_backward.cu) at kernel
// level: random Q, kv, compressed rows, dO and top-k (with -1 slots), the forward run for out /
// LSE, then every backward on the same inputs with every output NaN-poisoned first. All
// accumulate in fp32 (dQ is stored in bf16); the tensor-core kernels round P and dS to bf16 before their MMAs, so
// the gate is a tight relative L2 error, not bitwise. Skips (with the reason) where no GPU is
// present.
#ifdef CSATTN_HAVE_CUDA
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
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
#include "cuda_test_util.hpp"
#include "test_util.hpp"

namespace csattn {
namespace {

using namespace csattn::cuda;
using testing_util::dev_cast;
using testing_util::DeviceArray;

using testing_util::random_bf16;

struct BwdCase {
  int heads;
  int ratio;  // 0 SWA, 4 CSA (top-k), 128 HCA
  int topk;
  int long_segment = 0;  // > 0: one more segment of this length (rows with > 1000 entries)
};
void PrintTo(const BwdCase& c, std::ostream* os) {
  *os << "heads " << c.heads << " ratio " << c.ratio << " topk " << c.topk << " long segment "
      << c.long_segment;
}

// A bf16 device array's values as floats (dQ is bf16).
std::vector<float> download_bf16(const DeviceArray<std::uint16_t>& a) {
  std::vector<float> out;
  for (std::uint16_t b : a.download()) out.push_back(bf16_bits_to_float(b));
  return out;
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

// The worst row of got (rows of `width`) relative to its own norm in ref, below `tol`: a wrong
// row among many good ones would hide in the global L2 error. Rows zero in ref must be zero.
void expect_rows_close(const std::vector<float>& got, const std::vector<float>& ref, int width,
                       double tol, const std::string& name) {
  ASSERT_EQ(got.size(), ref.size()) << name;
  double worst = 0.0;
  long worst_row = -1;
  for (std::size_t r = 0; r + width <= ref.size(); r += width) {
    double e2 = 0.0, r2 = 0.0;
    for (int i = 0; i < width; ++i) {
      const double e = static_cast<double>(got[r + i]) - ref[r + i];
      e2 += e * e;
      r2 += static_cast<double>(ref[r + i]) * ref[r + i];
    }
    if (r2 > 0.0) {
      const double rel = std::sqrt(e2 / r2);
      if (!(rel <= worst)) {
        worst = rel;
        worst_row = static_cast<long>(r / width);
      }
    } else {
      EXPECT_EQ(e2, 0.0) << name << " row " << r / width << " should be zero";
    }
  }
  EXPECT_LT(worst, tol) << name << ": worst row " << worst_row;
}

// The ordered scatter of the attention's key gradients (deterministic mode) into dkv / dcomp.
OrderedScatter attention_scatter(float* dkv, float* dcomp, int slots, int copies) {
  OrderedScatter os;
  os.layout = SlotLayout::attention;
  os.slots = slots;
  os.width = 512;
  os.dst_window = dkv;
  os.dst_comp = dcomp;
  os.copies = copies;
  return os;
}

// launch_attention_backward_wgmma with the others' signature (key gradients written).
void launch_wgmma(const LayerDims& d, const DeviceMetadata& meta, const bf16* q, const bf16* kv,
                  const bf16* comp, const float* sink, const std::int32_t* topk, OutputRows out,
                  const float* lse, const bf16* dout, bf16* dq, float* dkv_acc,
                  float* dcomp_acc, float* dsink_part, cudaStream_t stream,
                  const GradChunk& chunk) {
  launch_attention_backward_wgmma(d, meta, q, kv, comp, sink, topk, out, lse, dout, dq,
                                  dkv_acc, dcomp_acc, dsink_part, stream, chunk);
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
  std::vector<int> real = {5, 1, 40, 300, 650}, padded = {8, 1, 40, 304, 650};
  if (c.long_segment > 0) {
    real.push_back(c.long_segment);
    padded.push_back(c.long_segment);
  }
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
  ASSERT_TRUE(attention_backward_wgmma_supported(d));

  // Metadata on the device (the forward's kernel builds the per-row part).
  testing_util::DeviceMetadataArrays metadata;
  const DeviceMetadata meta = metadata.build(d, cu_real, cu_padded);

  // Inputs. Logits ~ N(0, 1) after the 512^-1/2 scale, so P spreads over many keys.
  const std::size_t rowsHD = static_cast<std::size_t>(T) * H * D;
  // bf16 tensors as raw 16-bit patterns; the kernels take them through dev_cast<bf16>.
  DeviceArray<std::uint16_t> q(random_bf16(rowsHD, 1)),
      kv(random_bf16(static_cast<std::size_t>(T) * D, 2)),
      comp(random_bf16(static_cast<std::size_t>(Nc) * D, 3)), dout(random_bf16(rowsHD, 4)),
      out(rowsHD);
  DeviceArray<float> lse(static_cast<std::size_t>(T) * H), sink(H);
  DeviceArray<std::int32_t> topk(std::max<std::size_t>(1, static_cast<std::size_t>(T) * K));
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> sink_h(H);
  for (float& s : sink_h) s = nd(rng);
  sink.upload(sink_h);
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
    topk.upload(sel);
  }
  launch_sparse_attention(d, meta, dev_cast<bf16>(q), dev_cast<bf16>(kv), dev_cast<bf16>(comp),
                          sink.get(), topk.get(), dev_cast<bf16>(out), lse.get(), nullptr);

  DeviceArray<std::uint16_t> dq(rowsHD);  // bf16
  DeviceArray<float> dkv(static_cast<std::size_t>(T) * D),
      dcomp(static_cast<std::size_t>(Nc) * D), dsink(static_cast<std::size_t>(T) * H);
  enum class Kernel { wgmma, mma, baseline };
  auto launcher = [](Kernel k) {
    return k == Kernel::wgmma ? launch_wgmma
           : k == Kernel::mma ? launch_attention_backward_mma
                              : launch_attention_backward_baseline;
  };
  const auto name = [](Kernel k) {
    return k == Kernel::wgmma ? "wgmma kernel" : k == Kernel::mma ? "mma kernel" : "baseline";
  };
  // o: O as given to the kernels (null: out's whole rows).
  auto run = [&](Kernel k, const OutputRows* o = nullptr) {
    // dq and dsink_part are written: NaN first. The key gradients are accumulated: zero.
    dq.fill_bytes(0xFF);
    dsink.fill_bytes(0xFF);
    dkv.fill_bytes(0);
    dcomp.fill_bytes(0);
    launcher(k)(d, meta, dev_cast<bf16>(q), dev_cast<bf16>(kv), dev_cast<bf16>(comp), sink.get(),
                topk.get(), o ? *o : OutputRows(dev_cast<bf16>(out)), lse.get(), dev_cast<bf16>(dout),
                dev_cast<bf16>(dq), dkv.get(), dcomp.get(), dsink.get(), nullptr, GradChunk{});
    CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
    return Grads{download_bf16(dq), dkv.download(), dcomp.download(), dsink.download()};
  };
  const Grads ref = run(Kernel::baseline), got = run(Kernel::wgmma), got_mma = run(Kernel::mma);

  // The measurement instance (phase stamps) computes the same dQ bit for bit, and every CTA
  // it stamps writes its kernel entry, loop and exit stamps and, per key tile it has, eight
  // stamps in time order (32-bit clock, never 0).
  {
    using Stamps = AttentionBackwardStamps;
    DeviceArray<unsigned> stamps(static_cast<std::size_t>(Stamps::count()));
    stamps.fill_bytes(0);
    dq.fill_bytes(0xFF);
    launch_attention_backward_wgmma(d, meta, dev_cast<bf16>(q), dev_cast<bf16>(kv),
                                    dev_cast<bf16>(comp), sink.get(), topk.get(),
                                    dev_cast<bf16>(out), lse.get(), dev_cast<bf16>(dout), dev_cast<bf16>(dq),
                                    dkv.get(), dcomp.get(), dsink.get(), nullptr, GradChunk{},
                                    KeyGradWrites::all, stamps.get());
    CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
    // (The unstamped fast-mode run took the rotated tile order: its dQ sums ran in another order.)
    expect_close(download_bf16(dq), got.dq, "the stamped kernel's dQ");
    const std::vector<unsigned> h = stamps.download();
    const int ctas = std::min<int>(Stamps::ctas, T * ((H + 63) / 64));
    for (int cta = 0; cta < ctas; ++cta)
      for (int wg = 0; wg < 2; ++wg) {
        const unsigned* base = h.data() + static_cast<std::size_t>(cta * 2 + wg) * (Stamps::tiles + 1) * Stamps::phases;
        const unsigned* head = base + static_cast<std::size_t>(Stamps::tiles) * Stamps::phases;
        for (int p = 0; p < 4; ++p) ASSERT_NE(head[p], 0u) << "CTA " << cta << " WG " << wg << " stamp " << p;
        ASSERT_NE(base[7], 0u) << "CTA " << cta << " WG " << wg << ": its first tile";
        for (int tile = 0; tile < Stamps::tiles && base[tile * Stamps::phases + 7] != 0u; ++tile)
          for (int p = 1; p < Stamps::phases; ++p) {
            const unsigned* r = base + tile * Stamps::phases;
            ASSERT_LT(r[p] - r[p - 1], 1u << 31) << "CTA " << cta << " tile " << tile << " phase " << p;
          }
      }
  }

  // Deterministic mode: row chunks write per-(row, head block, slot) contributions to a
  // NaN-poisoned scratch (a slot the kernel forgot stays NaN and poisons the sum), then the
  // ordered scatter adds them per key row in row order.
  // keyed (HCA, as the layer's deterministic backward runs it): the chunks write only their
  // window slots (GradChunk::window_only) and the compressed rows' gradients come from the
  // key-stationary pass (launch_comp_grad_keyed); dcomp is NaN-poisoned then, since that pass
  // overwrites the rows with an entry and must leave the capacity rows alone.
  auto run_deterministic = [&](Kernel k, int chunk_rows, bool keyed = false, const OutputRows* o = nullptr) {
    const OutputRows o_rows = o ? *o : OutputRows(dev_cast<bf16>(out));
    dq.fill_bytes(0xFF);
    dsink.fill_bytes(0xFF);
    dkv.fill_bytes(0);
    dcomp.fill_bytes(keyed ? 0xFF : 0);
    const int copies = k == Kernel::baseline ? 1 : (H + 63) / 64;
    const int slots = keyed ? d.window : max_keys_per_query(d);
    DeviceArray<float> scratch(static_cast<std::size_t>(chunk_rows) * copies * slots * D);
    scratch.fill_bytes(0xFF);
    const OrderedScatter os = attention_scatter(dkv.get(), keyed ? nullptr : dcomp.get(), slots, copies);
    for (int r0 = 0; r0 < T; r0 += chunk_rows) {
      GradChunk chunk{r0, std::min(chunk_rows, T - r0), scratch.get(), slots, copies};
      chunk.window_only = keyed;
      launcher(k)(d, meta, dev_cast<bf16>(q), dev_cast<bf16>(kv), dev_cast<bf16>(comp),
                  sink.get(), topk.get(), o_rows, lse.get(), dev_cast<bf16>(dout),
                  dev_cast<bf16>(dq), dkv.get(), dcomp.get(), dsink.get(), nullptr, chunk);
      launch_ordered_scatter(d, meta, topk.get(), os, chunk.r0, chunk.rows, scratch.get(), nullptr);
    }
    if (keyed) {
      const std::size_t kbytes = comp_grad_keyed_scratch_bytes(d);
      DeviceArray<float> kscratch(std::max<std::size_t>(1, kbytes / 4)),
          drow(static_cast<std::size_t>(T) * H);
      kscratch.fill_bytes(0xFF);
      drow.fill_bytes(0xFF);
      launch_comp_grad_keyed(d, meta, dev_cast<bf16>(q), dev_cast<bf16>(comp), o_rows,
                             lse.get(), dev_cast<bf16>(dout), drow.get(), dcomp.get(),
                             kscratch.get(), kbytes, nullptr);
      CSATTN_CUDA_CHECK(cudaDeviceSynchronize());  // before kscratch / drow are freed
    }
    CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
    return Grads{download_bf16(dq), dkv.download(), dcomp.download(), dsink.download()};
  };
  // The deterministic whole-row results by (kernel, keyed), which the split-O block below
  // compares bit for bit instead of running them again.
  std::map<std::pair<Kernel, bool>, Grads> det_whole;
  for (Kernel k : {Kernel::wgmma, Kernel::mma, Kernel::baseline}) {
    SCOPED_TRACE(std::string("deterministic ") + name(k));
    const Grads a = run_deterministic(k, 37), b = run_deterministic(k, 37);
    det_whole[{k, false}] = a;
    const Grads& fast = k == Kernel::wgmma ? got : k == Kernel::mma ? got_mma : ref;
    expect_close(a.dq, fast.dq, "dq");
    expect_close(a.dkv, fast.dkv, "dkv");
    expect_close(a.dcomp, fast.dcomp, "dcomp");
    expect_close(a.dsink, fast.dsink, "dsink");
    EXPECT_EQ(a.dkv, b.dkv) << "dkv is not bitwise repeatable";
    EXPECT_EQ(a.dcomp, b.dcomp) << "dcomp is not bitwise repeatable";
    EXPECT_EQ(a.dq, b.dq) << "dq is not bitwise repeatable";
  }
  // HCA, as the layer's deterministic backward runs it (run_deterministic's keyed mode), the
  // key-stationary pass in several row chunks whose partial sums are added in order.
  if (c.ratio == 128) {
    ASSERT_TRUE(comp_grad_keyed_applies(d));
    ASSERT_GT(comp_grad_keyed_chunks(d), 1) << "the partial sums' path";
    std::int32_t entries = 0;
    CSATTN_CUDA_CHECK(cudaMemcpy(&entries, meta.comp_start + B, 4, cudaMemcpyDeviceToHost));
    ASSERT_GT(entries, 0);
    ASSERT_LE(entries, Nc);
    const std::size_t live = static_cast<std::size_t>(entries) * D;
    for (Kernel k : {Kernel::wgmma, Kernel::mma, Kernel::baseline}) {
      SCOPED_TRACE(std::string("keyed compressed rows, ") + name(k));
      const Grads a = run_deterministic(k, 37, true), b = run_deterministic(k, 37, true);
      det_whole[{k, true}] = a;
      const Grads& fast = k == Kernel::wgmma ? got : k == Kernel::mma ? got_mma : ref;
      expect_close(a.dq, fast.dq, "dq");
      expect_close(a.dkv, fast.dkv, "dkv");
      const std::vector<float> a_live(a.dcomp.begin(), a.dcomp.begin() + live),
          fast_live(fast.dcomp.begin(), fast.dcomp.begin() + live);
      expect_close(a_live, fast_live, "dcomp");
      // Per entry: a row that missed (or doubled) one of its queries shows here.
      expect_rows_close(a_live, fast_live, D, 2e-2, "dcomp per entry");
      for (std::size_t i = live; i < a.dcomp.size(); ++i)
        ASSERT_TRUE(std::isnan(a.dcomp[i])) << "dcomp capacity row " << i / D << " written";
      expect_close(a.dsink, fast.dsink, "dsink");
      EXPECT_EQ(a.dkv, b.dkv) << "dkv is not bitwise repeatable";
      EXPECT_EQ(std::vector<float>(a.dcomp.begin(), a.dcomp.begin() + live),
                std::vector<float>(b.dcomp.begin(), b.dcomp.begin() + live))
          << "dcomp is not bitwise repeatable";
    }
  }
  // O as the layer keeps it (OutputRows): each head row's first D - tail dims with its tail
  // overwritten (forward_output's in-place inverse RoPE leaves the rotated tail there; here
  // random bits) and the original tail apart. Every kernel must read the same O: the same
  // D_row, so the same sink gradient bit for bit in the fast mode and the same everything in
  // the deterministic mode (the keyed pass too).
  {
    const int tail = attention_tail_dim(d);
    ASSERT_EQ(tail, 64);
    const std::vector<std::uint16_t> whole = out.download(), noise = random_bf16(rowsHD, 9);
    std::vector<std::uint16_t> heads_h = whole, tails_h(static_cast<std::size_t>(T) * H * tail);
    for (std::size_t r = 0; r < static_cast<std::size_t>(T) * H; ++r)
      for (int i = 0; i < tail; ++i) {
        const std::size_t at = r * D + (D - tail) + i;
        tails_h[r * tail + i] = whole[at];
        heads_h[at] = noise[at];
      }
    const DeviceArray<std::uint16_t> heads(heads_h), tails(tails_h);
    const OutputRows split(dev_cast<bf16>(heads), dev_cast<bf16>(tails), tail);
    for (Kernel k : {Kernel::wgmma, Kernel::mma, Kernel::baseline}) {
      SCOPED_TRACE(std::string("O with its tails apart, ") + name(k));
      const Grads& whole_rows = k == Kernel::wgmma ? got : k == Kernel::mma ? got_mma : ref;
      const Grads fast = run(k, &split);
      EXPECT_EQ(fast.dsink, whole_rows.dsink) << "D_row differs";
      expect_close(fast.dq, whole_rows.dq, "dq");
      expect_close(fast.dkv, whole_rows.dkv, "dkv");
      for (bool keyed : {false, true}) {
        if (keyed && c.ratio != 128) continue;
        const Grads a = run_deterministic(k, 37, keyed, &split);
        const Grads& b = det_whole.at({k, keyed});
        EXPECT_EQ(a.dq, b.dq) << "deterministic dq" << (keyed ? " (keyed)" : "");
        EXPECT_EQ(a.dkv, b.dkv) << "deterministic dkv" << (keyed ? " (keyed)" : "");
        EXPECT_EQ(a.dsink, b.dsink) << "deterministic dsink" << (keyed ? " (keyed)" : "");
        // (NaN capacity rows of the keyed pass compare unequal: the entries' rows only.)
        std::int32_t entries = Nc;
        if (keyed) CSATTN_CUDA_CHECK(cudaMemcpy(&entries, meta.comp_start + B, 4, cudaMemcpyDeviceToHost));
        const std::size_t live = static_cast<std::size_t>(entries) * D;
        EXPECT_EQ(std::vector<float>(a.dcomp.begin(), a.dcomp.begin() + live),
                  std::vector<float>(b.dcomp.begin(), b.dcomp.begin() + live))
            << "deterministic dcomp" << (keyed ? " (keyed)" : "");
      }
    }
    // A tail split other than the layer's is refused.
    const OutputRows wrong(dev_cast<bf16>(heads), dev_cast<bf16>(tails), 32);
    EXPECT_THROW(launch_attention_backward(d, meta, dev_cast<bf16>(q), dev_cast<bf16>(kv), dev_cast<bf16>(comp),
                                           sink.get(), topk.get(), wrong, lse.get(), dev_cast<bf16>(dout),
                                           dev_cast<bf16>(dq), dkv.get(), dcomp.get(), dsink.get(), nullptr),
                 Error);
  }

  for (const Grads* g : {&got, &got_mma}) {
    SCOPED_TRACE(g == &got ? "wgmma kernel" : "mma kernel");
    expect_close(g->dq, ref.dq, "dq");
    expect_close(g->dkv, ref.dkv, "dkv");
    expect_close(g->dcomp, ref.dcomp, "dcomp");
    expect_close(g->dsink, ref.dsink, "dsink");
  }

  // Per-row spot check: the worst row of dq relative to its own norm (a wrong row among many
  // good ones would hide in the global L2 error).
  for (const Grads* g : {&got, &got_mma}) {
    double worst = 0.0;
    for (long r = 0; r < static_cast<long>(T) * H; ++r) {
      double e2 = 0.0, r2 = 0.0;
      for (int i = 0; i < D; ++i) {
        const double e = static_cast<double>(g->dq[r * D + i]) - ref.dq[r * D + i];
        e2 += e * e;
        r2 += static_cast<double>(ref.dq[r * D + i]) * ref.dq[r * D + i];
      }
      if (r2 > 0.0) worst = std::max(worst, std::sqrt(e2 / r2));
      else EXPECT_EQ(e2, 0.0) << "dq row " << r;
    }
    EXPECT_LT(worst, 5e-2) << "worst dq row, " << (g == &got ? "wgmma kernel" : "mma kernel");
  }
}

// HCA queries late in a segment of 600K tokens see 128 + ~4.7K keys: more ids than fit beside
// the wgmma kernel's tiles if the key list were stored (it derives them per slot). Only the
// last 48 rows are queries (the benchmark's layout), so only the window rows they see and the
// compressed rows hold data; the wgmma kernel must match the baseline there and write no
// other key-gradient row.
TEST(CudaAttentionBackwardLong, HcaSegmentOf600KTokens) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  cfg.compress_ratio = 128;
  const int L = 600000, Q = 48, W = cfg.window, D = cfg.head_dim, H = cfg.n_heads;
  const int Nc = L / 128;
  LayerDims d = make_dims(cfg, Q, 1, L);
  d.comp_capacity = Nc;
  ASSERT_GT(max_keys_per_query(d), 4600);  // ~18.5 KB of ids: past the old stored-list limit
  ASSERT_TRUE(attention_backward_wgmma_supported(d));

  DeviceArray<std::int32_t> cu(std::vector<std::int32_t>{0, L}),
      comp_start(std::vector<std::int32_t>{0, Nc}), row_segment(std::vector<std::int32_t>(Q, 0)),
      row_position(Q);
  std::vector<std::int32_t> pos(Q);
  for (int t = 0; t < Q; ++t) pos[t] = L - Q + t;
  row_position.upload(pos);
  DeviceArray<std::uint8_t> padding(std::vector<std::uint8_t>(Q, 0));
  DeviceMetadata meta;
  meta.cu_real = cu.get();
  meta.cu_padded = cu.get();
  meta.comp_start = comp_start.get();
  meta.row_segment = row_segment.get();
  meta.row_position = row_position.get();
  meta.row_is_padding = padding.get();

  const std::size_t rowsHD = static_cast<std::size_t>(Q) * H * D;
  const int first = L - Q - W;  // the first raw row any query sees
  DeviceArray<std::uint16_t> q(random_bf16(rowsHD, 21)), dout(random_bf16(rowsHD, 22)),
      comp(random_bf16(static_cast<std::size_t>(Nc) * D, 23)), out(rowsHD),
      kv(static_cast<std::size_t>(L) * D);
  kv.fill_bytes(0);
  const std::vector<std::uint16_t> tail = random_bf16(static_cast<std::size_t>(L - first) * D, 24);
  CSATTN_CUDA_CHECK(cudaMemcpy(kv.get() + static_cast<std::size_t>(first) * D, tail.data(),
                               tail.size() * 2, cudaMemcpyHostToDevice));
  DeviceArray<float> lse(static_cast<std::size_t>(Q) * H), sink(std::vector<float>(H, 0.25f));
  DeviceArray<std::int32_t> topk(1);
  launch_sparse_attention(d, meta, dev_cast<bf16>(q), dev_cast<bf16>(kv), dev_cast<bf16>(comp),
                          sink.get(), topk.get(), dev_cast<bf16>(out), lse.get(), nullptr);

  DeviceArray<std::uint16_t> dq(rowsHD);  // bf16
  DeviceArray<float> dkv(static_cast<std::size_t>(L) * D),
      dcomp(static_cast<std::size_t>(Nc) * D), dsink(static_cast<std::size_t>(Q) * H);
  struct Result {
    Grads g;
    std::vector<float> dkv_before;  // the 1024 rows before `first`: must stay zero
  };
  auto run = [&](bool wgmma) {
    dq.fill_bytes(0xFF);
    dsink.fill_bytes(0xFF);
    dkv.fill_bytes(0);
    dcomp.fill_bytes(0);
    auto launch = wgmma ? launch_wgmma : launch_attention_backward_baseline;
    launch(d, meta, dev_cast<bf16>(q), dev_cast<bf16>(kv), dev_cast<bf16>(comp), sink.get(),
           topk.get(), dev_cast<bf16>(out), lse.get(), dev_cast<bf16>(dout), dev_cast<bf16>(dq), dkv.get(),
           dcomp.get(), dsink.get(), nullptr, GradChunk{});
    CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
    Result r;
    r.g.dq = download_bf16(dq);
    r.g.dcomp = dcomp.download();
    r.g.dsink = dsink.download();
    r.g.dkv.resize(static_cast<std::size_t>(L - first) * D);
    CSATTN_CUDA_CHECK(cudaMemcpy(r.g.dkv.data(), dkv.get() + static_cast<std::size_t>(first) * D,
                                 r.g.dkv.size() * 4, cudaMemcpyDeviceToHost));
    r.dkv_before.resize(static_cast<std::size_t>(1024) * D);
    CSATTN_CUDA_CHECK(cudaMemcpy(r.dkv_before.data(),
                                 dkv.get() + static_cast<std::size_t>(first - 1024) * D,
                                 r.dkv_before.size() * 4, cudaMemcpyDeviceToHost));
    return r;
  };
  const Result ref = run(false), got = run(true);
  expect_close(got.g.dq, ref.g.dq, "dq");
  expect_close(got.g.dkv, ref.g.dkv, "dkv (the window rows)");
  expect_close(got.g.dcomp, ref.g.dcomp, "dcomp");
  expect_close(got.g.dsink, ref.g.dsink, "dsink");
  for (float v : got.dkv_before) ASSERT_EQ(v, 0.0f) << "a key-gradient row no query sees";

  // Deterministic mode: chunks of 16 rows into a NaN-poisoned scratch of ~4.8K slots a row,
  // the ordered scatter after each. Only the compressed rows are compared: the scatter finds
  // a window row's contributors by row index, which this layout (48 query rows at the end of
  // a 600K-row key sequence, not a batch of its own) does not keep.
  dkv.fill_bytes(0);
  dcomp.fill_bytes(0);
  const int slots = max_keys_per_query(d), chunk_rows = 16;
  DeviceArray<float> scratch(static_cast<std::size_t>(chunk_rows) * slots * D);
  scratch.fill_bytes(0xFF);
  const OrderedScatter os = attention_scatter(dkv.get(), dcomp.get(), slots, 1);
  for (int r0 = 0; r0 < Q; r0 += chunk_rows) {
    const GradChunk chunk{r0, std::min(chunk_rows, Q - r0), scratch.get(), slots, 1};
    launch_wgmma(d, meta, dev_cast<bf16>(q), dev_cast<bf16>(kv), dev_cast<bf16>(comp), sink.get(),
                 topk.get(), dev_cast<bf16>(out), lse.get(), dev_cast<bf16>(dout), dev_cast<bf16>(dq),
                 dkv.get(), dcomp.get(), dsink.get(), nullptr, chunk);
    launch_ordered_scatter(d, meta, topk.get(), os, chunk.r0, chunk.rows, scratch.get(), nullptr);
  }
  CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
  expect_close(dcomp.download(), got.g.dcomp, "deterministic dcomp");

  // The key-stationary compressed rows (the layer's deterministic HCA path) on the same
  // layout: its walk finds each entry's first query row by position, so 48 rows at the end of
  // a 600K-token run work as a whole run would (one chunk: written straight into dcomp).
  ASSERT_TRUE(comp_grad_keyed_applies(d));
  {
    ASSERT_EQ(comp_grad_keyed_chunks(d), 1);
    ASSERT_EQ(comp_grad_keyed_scratch_bytes(d), 0u);
    DeviceArray<float> drow(static_cast<std::size_t>(Q) * H);
    drow.fill_bytes(0xFF);
    dcomp.fill_bytes(0xFF);
    launch_comp_grad_keyed(d, meta, dev_cast<bf16>(q), dev_cast<bf16>(comp), dev_cast<bf16>(out), lse.get(),
                           dev_cast<bf16>(dout), drow.get(), dcomp.get(), nullptr, 0, nullptr);
    CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> keyed = dcomp.download();
    expect_close(keyed, got.g.dcomp, "key-stationary dcomp");
    expect_rows_close(keyed, got.g.dcomp, D, 2e-2, "key-stationary dcomp per entry");
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaAttentionBackward,
                         ::testing::Values(BwdCase{64, 4, 100}, BwdCase{128, 4, 128},
                                           // two head blocks (HCA, SWA, a half-empty second
                                           // block, a long top-k row)
                                           BwdCase{128, 128, 0}, BwdCase{128, 0, 0},
                                           BwdCase{96, 4, 256}, BwdCase{128, 4, 1024, 4200},
                                           BwdCase{24, 4, 100}, BwdCase{64, 128, 0},
                                           BwdCase{64, 0, 0},
                                           // top-k rows of ~900 valid ids: the wgmma
                                           // kernel's compaction takes 4 entries a thread
                                           BwdCase{64, 4, 1024, 4200},
                                           // HCA with 32+ entries in one segment: the keyed
                                           // pass's blocks span segments and row chunks
                                           BwdCase{64, 128, 0, 4200}),
                         [](const auto& param_info) {
                           const BwdCase& c = param_info.param;
                           std::string name = "H";
                           name += std::to_string(c.heads);
                           name += "_ratio";
                           name += std::to_string(c.ratio);
                           name += "_topk";
                           name += std::to_string(c.topk);
                           if (c.long_segment > 0) name += "_long" + std::to_string(c.long_segment);
                           return name;
                         });

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
