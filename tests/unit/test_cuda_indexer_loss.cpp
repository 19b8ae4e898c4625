// The tensor-core indexer loss (indexer_loss_mma.cu) against the CUDA-core reference kernel
// (indexer_loss.cu) on the same device inputs: per-row KL, the reduced loss, dqI, dw' and
// dK^I, sparse and dense, on ragged padded batches (segments shorter than the ratio, rows
// without candidates, padding rows, partial head blocks) and at the Flash shape. The sparse
// loss takes its teacher denominator from the forward attention's LSE (launch_sparse_attention
// on the same inputs), so these tests also check that LSE is the loss's full CSA denominator.
// Outputs are poisoned with NaN before every run. Skips without a GPU.
#ifdef CSATTN_HAVE_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "csattn/error.hpp"
#include "csattn/layer.hpp"
#include "csattn/tensor.hpp"
#include "cuda/backward_kernels.hpp"
#include "cuda/kernels.hpp"
#include "cuda_test_util.hpp"
#include "test_util.hpp"

namespace csattn {
namespace {

using namespace csattn::cuda;
using testing_util::dev_cast;
using testing_util::DeviceArray;

void check(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// Cheap deterministic noise (xorshift), uniform with unit variance.
struct Noise {
  std::uint64_t s;
  explicit Noise(std::uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::uint64_t next() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; }
  float uniform() { return static_cast<float>((next() >> 40) * (1.0 / 16777216.0)); }
  float unit() { return (uniform() * 2.0f - 1.0f) * 1.7320508f; }
};

std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint64_t seed, float scale) {
  Noise r(seed);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16_bits(scale * r.unit());
  return v;
}

struct LossCase {
  std::string name;
  std::vector<int> real, padded;  // segment lengths
  int heads = 64, index_heads = 64, topk = 16, window = 32;
  bool sparse = true;
  bool with_lse = true;      // pass the forward's LSE (sparse)
  bool future_ids = false;   // some top-k rows hold an id >= the visible count
  bool holes = false;        // some top-k rows have -1 between valid ids
};

// Device inputs of one case: metadata, the teacher's and the indexer's operands, the top-k,
// and the forward attention's LSE over them.
struct Inputs {
  LayerDims d;
  testing_util::DeviceMetadataArrays metadata;
  DeviceArray<std::int32_t> topk;
  DeviceArray<std::uint16_t> q, kv, comp, qi, keys, attn;
  DeviceArray<float> w_eff, sink, lse;
  DeviceArray<float> loss_scale{std::vector<float>{0.25f}};  // lambda / N (device, as the layer's)
  DeviceMetadata meta;
  IndexerLossArgs args;
  std::vector<int> host_vis;  // candidates per row (0: none)
  std::vector<int> host_visible;  // visible compressed entries per row (0: padding)
  std::vector<char> host_drop;  // the row's top-k holds an id the loss drops (not yet visible)

  explicit Inputs(const LossCase& c) {
    const int B = static_cast<int>(c.real.size());
    std::vector<std::int32_t> cr(B + 1, 0), cp(B + 1, 0), cs(B + 1, 0);
    for (int b = 0; b < B; ++b) {
      cr[b + 1] = cr[b] + c.real[b];
      cp[b + 1] = cp[b] + c.padded[b];
      cs[b + 1] = cs[b] + c.padded[b] / 4;
    }
    const int T = cp[B], Nc = std::max(1, cs[B]);
    d.rows = T;
    d.segments = B;
    d.max_seg_len = *std::max_element(c.padded.begin(), c.padded.end());
    d.heads = c.heads;
    d.head_dim = 512;
    d.window = c.window;
    d.ratio = 4;
    d.coff = 2;
    d.comp_capacity = Nc;
    d.index_heads = c.index_heads;
    d.index_dim = 128;
    d.topk = c.topk;
    d.scale = 1.0f / std::sqrt(512.0f);
    meta = metadata.build(d, cr, cp);

    const int H = c.heads, HI = c.index_heads;
    q.upload(random_bf16(static_cast<std::size_t>(T) * H * 512, 1, 1.0f));
    kv.upload(random_bf16(static_cast<std::size_t>(T) * 512, 2, 1.0f));
    comp.upload(random_bf16(static_cast<std::size_t>(Nc) * 512, 3, 1.0f));
    qi.upload(random_bf16(static_cast<std::size_t>(T) * HI * 128, 4, 1.0f));
    keys.upload(random_bf16(static_cast<std::size_t>(Nc) * 128, 5, 1.0f));
    Noise r(6);
    std::vector<float> w(static_cast<std::size_t>(T) * HI), s(H);
    for (auto& x : w) x = round_bf16(r.unit() / std::sqrt(static_cast<float>(HI) * 128.0f) * 4.0f);
    for (auto& x : s) x = r.unit();
    w_eff.upload(w);
    sink.upload(s);

    // Top-k like the indexer's: every visible id when they fit, else K random distinct ones,
    // ascending, then -1; padding rows all -1.
    std::vector<std::int32_t> sel(static_cast<std::size_t>(T) * c.topk, -1);
    host_vis.assign(T, 0);
    host_visible.assign(T, 0);
    host_drop.assign(T, 0);
    for (int b = 0; b < B; ++b)
      for (int pos = 0; pos < c.padded[b]; ++pos) {
        const int t = cp[b] + pos;
        if (pos >= c.real[b]) continue;
        const int count = c.padded[b] / 4, vis = std::min((pos + 1) / 4, count);
        host_visible[t] = vis;
        std::int32_t* row = sel.data() + static_cast<std::size_t>(t) * c.topk;
        std::vector<int> ids(vis);
        std::iota(ids.begin(), ids.end(), 0);
        for (int k = 0; k < std::min(vis, c.topk); ++k)
          std::swap(ids[k], ids[k + static_cast<int>(r.next() % static_cast<std::uint64_t>(vis - k))]);
        ids.resize(std::min(vis, c.topk));
        std::sort(ids.begin(), ids.end());
        for (std::size_t k = 0; k < ids.size(); ++k) row[k] = ids[k];
        int n = static_cast<int>(ids.size());
        if (c.holes && n >= 3 && t % 5 == 0) {  // a -1 between valid ids
          row[1] = -1;
          --n;
        }
        if (c.future_ids && t % 3 == 0 && vis < count && static_cast<int>(ids.size()) < c.topk)
          host_drop[t] = 1, row[ids.size()] = vis;  // a real entry of the segment, not yet visible
        host_vis[t] = n;
      }
    topk.upload(sel);

    // The forward attention's LSE over sink + window + top-k (its output is not needed).
    attn.resize(static_cast<std::size_t>(T) * H * 512);
    lse.resize(static_cast<std::size_t>(T) * H);
    launch_sparse_attention(d, meta, bf(q), bf(kv), bf(comp), sink.get(), topk.get(), bf(attn), lse.get(),
                            nullptr);
    check(cudaDeviceSynchronize());

    args.qi = bf(qi);
    args.w_eff = w_eff.get();
    args.keys = bf(keys);
    args.q = bf(q);
    args.kv = bf(kv);
    args.comp = bf(comp);
    args.sink = sink.get();
    args.topk = topk.get();
    args.lse = c.sparse && c.with_lse ? lse.get() : nullptr;
    args.sparse = c.sparse;
    args.scale = loss_scale.get();
  }
  static bf16* bf(const DeviceArray<std::uint16_t>& v) { return dev_cast<bf16>(v); }
};

struct Outputs {
  std::vector<float> loss_rows, dweff, dkeys, dqi;
  float loss = 0.0f;
};

// One run of `kernel` on outputs poisoned with `poison` bytes (0xFF: NaN; dkeys_acc zeroed: it
// accumulates); `kept`,
// `own_selection`: launch_indexer_loss's (a value run stores into `kept`, a gradient run reads
// it). `chunks` (row start, rows): one launch per chunk of rows (the deterministic mode's
// launches, here with atomics) instead of one for all rows.
Outputs run(const Inputs& in, IndexerLossKernel kernel, bool grads, float grad_loss,
            float* kept = nullptr, bool own_selection = false,
            const std::vector<std::pair<int, int>>& chunks = {}, unsigned char poison = 0xFF) {
  const LayerDims& d = in.d;
  const int T = d.rows, HI = d.index_heads;
  DeviceArray<float> loss_rows(T), loss(1), dweff(static_cast<std::size_t>(T) * HI),
      dkeys(static_cast<std::size_t>(d.comp_capacity) * 128);
  DeviceArray<std::uint16_t> dqi(static_cast<std::size_t>(T) * HI * 128);
  loss_rows.fill_bytes(poison);
  loss.fill_bytes(poison);
  dweff.fill_bytes(poison);
  dqi.fill_bytes(poison);
  dkeys.fill_bytes(0);
  IndexerLossArgs a = in.args;
  for (std::size_t i = 0; i < std::max<std::size_t>(chunks.size(), 1); ++i) {
    if (!chunks.empty()) a.chunk = GradChunk{chunks[i].first, chunks[i].second, nullptr, 0, 1};
    launch_indexer_loss(d, in.meta, a, loss_rows.get(), loss.get(), grads, grad_loss, dev_cast<bf16>(dqi),
                        dweff.get(), dkeys.get(), kept, nullptr, kernel, false, own_selection);
  }
  check(cudaDeviceSynchronize());
  Outputs o;
  o.loss_rows = loss_rows.download();
  if (!grads) o.loss = loss.download()[0];
  if (grads) {
    o.dweff = dweff.download();
    o.dkeys = dkeys.download();
    const std::vector<std::uint16_t> raw = dqi.download();
    o.dqi.resize(raw.size());
    for (std::size_t i = 0; i < raw.size(); ++i) o.dqi[i] = bf16_bits_to_float(raw[i]);
  }
  return o;
}

// Random predictor operands of a case's shapes (stand-ins for the MXFP8 indexer's qI and keys).
struct PredictorOperands {
  DeviceArray<std::uint16_t> qi, keys;
  PredictorOperands(const Inputs& in, std::uint64_t seed)
      : qi(random_bf16(static_cast<std::size_t>(in.d.rows) * in.d.index_heads * 128, seed, 1.0f)),
        keys(random_bf16(static_cast<std::size_t>(in.d.comp_capacity) * 128, seed + 1, 1.0f)) {}
  void set(IndexerLossArgs& a) const {
    a.pred_qi = Inputs::bf(qi);
    a.pred_keys = Inputs::bf(keys);
  }
};

// ||got - ref|| <= rel ||ref||, everything finite, ref not all zero (a comparison of zeros
// proves nothing).
void expect_rel_l2(const std::vector<float>& got, const std::vector<float>& ref, double rel,
                   const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " [" << i << "] = " << got[i];
    ASSERT_TRUE(std::isfinite(ref[i])) << what << " (reference) [" << i << "]";
    diff += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  ASSERT_GT(norm, 0.0) << what << ": the reference is all zero";
  EXPECT_LE(std::sqrt(diff), rel * std::sqrt(norm)) << what;
}

void compare_kernels(const LossCase& c) {
  const Inputs in(c);
  const int T = in.d.rows, HI = in.d.index_heads;
  // Value only, then value + gradients.
  const Outputs base_v = run(in, IndexerLossKernel::baseline, false, 0.0f);
  const Outputs mma_v = run(in, IndexerLossKernel::tensor_core, false, 0.0f);
  const float gs = 0.37f;
  const Outputs base = run(in, IndexerLossKernel::baseline, true, gs);
  const Outputs mma = run(in, IndexerLossKernel::tensor_core, true, gs);
  int rows_with_candidates = 0;
  for (int t = 0; t < T; ++t) {
    const float ref = base_v.loss_rows[t];
    ASSERT_TRUE(std::isfinite(ref)) << "reference row " << t;
    EXPECT_NEAR(mma_v.loss_rows[t], ref, 2e-4 * std::fabs(ref) + 2e-5) << c.name << " row " << t;
    EXPECT_EQ(mma.loss_rows[t], mma_v.loss_rows[t]) << c.name << " row " << t << ": grads changed the value";
    if (in.host_vis[t] == 0) {  // no candidates: exact zeros
      EXPECT_EQ(mma_v.loss_rows[t], 0.0f) << c.name << " row " << t;
      for (int h = 0; h < HI; ++h) ASSERT_EQ(mma.dweff[static_cast<std::size_t>(t) * HI + h], 0.0f) << "row " << t;
      for (int i = 0; i < HI * 128; ++i) ASSERT_EQ(mma.dqi[static_cast<std::size_t>(t) * HI * 128 + i], 0.0f) << "row " << t;
    }
    rows_with_candidates += in.host_vis[t] > 0;
  }
  ASSERT_GT(rows_with_candidates, 0);
  EXPECT_NEAR(mma_v.loss, base_v.loss, 2e-4 * std::fabs(base_v.loss) + 1e-6) << c.name;
  expect_rel_l2(mma.dweff, base.dweff, 2e-3, c.name + " dweff");
  expect_rel_l2(mma.dqi, base.dqi, 1.5e-2, c.name + " dqi");
  expect_rel_l2(mma.dkeys, base.dkeys, 1.5e-2, c.name + " dkeys");
}

LossCase ragged(const std::string& name, bool sparse) {
  LossCase c;
  c.name = name;
  // L < ratio (3), a single row, a tail, several compressed entries, padding rows.
  c.real = {3, 1, 77, 203, 130, 45};
  c.padded = {4, 1, 80, 210, 130, 48};
  c.sparse = sparse;
  return c;
}

// One 4096-token sequence with the model's window 128 (DeepSeek-V4 shapes: Flash 64 heads,
// top-512; Pro 128 heads, top-1024; 64 index heads x 128 both).
LossCase one_sequence(const std::string& name, bool sparse, int heads, int topk) {
  LossCase c;
  c.name = name;
  c.real = {4096};
  c.padded = {4096};
  c.heads = heads;
  c.topk = topk;
  c.window = 128;
  c.sparse = sparse;
  return c;
}

TEST(CudaIndexerLoss, SparseRaggedMatchesBaseline) {
  SKIP_WITHOUT_GPU();
  LossCase c = ragged("sparse", true);
  c.holes = true;
  compare_kernels(c);
}

// The sparse loss with predictor operands (the MXFP8 indexer's rounded qI / K^I): the
// predictor from those, the gradients through the bf16 scores. Per kernel: predictor operands
// equal to qI / K^I give bitwise the plain results; other ones give bitwise the value of a run
// whose qI / K^I are those operands (the value depends only on the predictor), but gradients
// that differ from both plain runs; and the two kernels agree. With and without the forward's
// LSE (the kernel's one-pass and multi-pass teachers).
TEST(CudaIndexerLoss, SparsePredictorOperands) {
  SKIP_WITHOUT_GPU();
  for (int heads : {64, 128})  // 128: the predictor in the first head group's pass only
  for (bool with_lse : {true, false}) {
    LossCase c = ragged(std::string(with_lse ? "sparse, predictor operands" : "sparse, predictor operands, no lse") +
                            ", H " + std::to_string(heads),
                        true);
    c.holes = true;
    c.with_lse = with_lse;
    c.heads = heads;
    Inputs in(c);
    const int T = in.d.rows;
    const PredictorOperands po(in, 24);
    const float gs = 0.37f;
    for (IndexerLossKernel k : {IndexerLossKernel::baseline, IndexerLossKernel::tensor_core}) {
      SCOPED_TRACE(c.name + (k == IndexerLossKernel::baseline ? ", CUDA-core kernel" : ", tensor-core kernel"));
      const IndexerLossArgs plain = in.args;
      const Outputs ref = run(in, k, true, gs);
      in.args.pred_qi = plain.qi;  // the same operands: bitwise the plain run
      in.args.pred_keys = plain.keys;
      const Outputs same = run(in, k, true, gs);
      EXPECT_EQ(same.loss_rows, ref.loss_rows);
      EXPECT_EQ(same.dweff, ref.dweff);
      // The CUDA-core kernel sums dqI with shared-memory atomics: bitwise only on tensor cores.
      if (k == IndexerLossKernel::tensor_core) EXPECT_EQ(same.dqi, ref.dqi);
      else expect_rel_l2(same.dqi, ref.dqi, 1e-4, c.name + " dqi, the same operands");
      po.set(in.args);
      const Outputs pred_v = run(in, k, false, 0.0f), pred = run(in, k, true, gs);
      in.args = plain;
      in.args.qi = Inputs::bf(po.qi);  // everything from the predictor operands
      in.args.keys = Inputs::bf(po.keys);
      const Outputs other_v = run(in, k, false, 0.0f), other = run(in, k, true, gs);
      in.args = plain;
      EXPECT_EQ(pred_v.loss_rows, other_v.loss_rows) << "the value is the predictor's";
      EXPECT_EQ(pred.loss_rows, pred_v.loss_rows) << "gradients changed the value";
      EXPECT_GT(testing_util::rel_l2(pred.dweff, ref.dweff), 1e-2) << "the predictor operands were not used";
      EXPECT_GT(testing_util::rel_l2(pred.dkeys, other.dkeys), 1e-2) << "the gradient used the predictor operands";
      if (k == IndexerLossKernel::tensor_core) {
        po.set(in.args);
        const Outputs base = run(in, IndexerLossKernel::baseline, true, gs);
        in.args = plain;
        for (int t = 0; t < T; ++t)
          EXPECT_NEAR(pred.loss_rows[t], base.loss_rows[t], 2e-4 * std::fabs(base.loss_rows[t]) + 2e-5)
              << "row " << t;
        expect_rel_l2(pred.dweff, base.dweff, 2e-3, c.name + " dweff");
        expect_rel_l2(pred.dqi, base.dqi, 1.5e-2, c.name + " dqi");
        expect_rel_l2(pred.dkeys, base.dkeys, 1.5e-2, c.name + " dkeys");
      }
    }
  }
}

TEST(CudaIndexerLoss, SparseWithoutForwardLseMatchesBaseline) {
  SKIP_WITHOUT_GPU();
  LossCase c = ragged("sparse, no lse", true);
  c.with_lse = false;
  compare_kernels(c);
}

TEST(CudaIndexerLoss, SparseWithNotYetVisibleIdsMatchesBaseline) {
  SKIP_WITHOUT_GPU();
  // The attention's LSE counts the extra ids, the loss does not: the kernel must notice and
  // recompute the denominator for those rows.
  LossCase c = ragged("sparse, future ids", true);
  c.future_ids = true;
  compare_kernels(c);
}

TEST(CudaIndexerLoss, DenseRaggedMatchesBaseline) {
  SKIP_WITHOUT_GPU();
  compare_kernels(ragged("dense", false));
}

TEST(CudaIndexerLoss, PartialHeadBlocksMatchBaseline) {
  SKIP_WITHOUT_GPU();
  for (bool sparse : {true, false}) {
    LossCase c = ragged(sparse ? "H 40 HI 24 sparse" : "H 40 HI 24 dense", sparse);
    c.heads = 40;
    c.index_heads = 24;
    compare_kernels(c);
  }
}

// More than 64 heads (the Pro shape's 128, and 96 with a partial second group): the tensor-
// core kernel with the teacher's heads in two groups whose candidate masses add up, in every
// flow - sparse with the forward's LSE, without it (statistics per group), with
// not-yet-visible ids (the kernel recomputes the denominator), with -1 holes; the dense loss
// (statistics per group, both groups' teacher per tile in the final pass).
TEST(CudaIndexerLoss, MoreThan64HeadsMatchBaseline) {
  SKIP_WITHOUT_GPU();
  for (int heads : {128, 96}) {
    for (int flow = 0; flow < 3; ++flow) {
      LossCase c = ragged("sparse H " + std::to_string(heads) +
                              (flow == 0 ? ", lse, holes" : flow == 1 ? ", no lse" : ", future ids"),
                          true);
      c.heads = heads;
      c.holes = flow == 0;
      c.with_lse = flow != 1;
      c.future_ids = flow == 2;
      compare_kernels(c);
    }
  }
  // The Pro shape (dense: up to 1024 candidates, 32 tiles through both buffer stages).
  for (bool sparse : {true, false}) compare_kernels(one_sequence(sparse ? "pro sparse" : "pro dense", sparse, 128, 1024));
  for (int heads : {128, 96}) {
    LossCase dense = ragged("dense H " + std::to_string(heads), false);
    dense.heads = heads;
    compare_kernels(dense);
  }
}

TEST(CudaIndexerLoss, FlashShapeMatchesBaseline) {
  SKIP_WITHOUT_GPU();
  for (bool sparse : {true, false}) compare_kernels(one_sequence(sparse ? "flash sparse" : "flash dense", sparse, 64, 512));
}

TEST(CudaIndexerLoss, RowReductionsAreBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  for (int heads : {64, 128})
  for (bool sparse : {true, false}) {
    LossCase c;
    c.name = "repeat";
    c.heads = heads;
    c.real = {1500, 700};
    c.padded = {1504, 704};
    c.topk = 512;
    c.window = 128;
    c.sparse = sparse;
    const Inputs in(c);
    const Outputs a = run(in, IndexerLossKernel::tensor_core, true, 0.5f);
    const Outputs b = run(in, IndexerLossKernel::tensor_core, true, 0.5f);
    EXPECT_EQ(a.loss_rows, b.loss_rows);
    EXPECT_EQ(a.dqi, b.dqi);
    EXPECT_EQ(a.dweff, b.dweff);
  }
}

TEST(CudaIndexerLoss, ZeroGradScaleGivesExactZeros) {
  SKIP_WITHOUT_GPU();
  for (int heads : {64, 128})
  for (bool sparse : {true, false}) {
    LossCase c = ragged("lambda 0", sparse);
    c.heads = heads;
    const Inputs in(c);
    const Outputs ref = run(in, IndexerLossKernel::tensor_core, false, 0.0f);
    const Outputs o = run(in, IndexerLossKernel::tensor_core, true, 0.0f);
    EXPECT_EQ(o.loss_rows, ref.loss_rows);
    for (float v : o.dqi) ASSERT_EQ(v, 0.0f);
    for (float v : o.dweff) ASSERT_EQ(v, 0.0f);
    for (float v : o.dkeys) ASSERT_EQ(v, 0.0f);
  }
}

// A batch scale of 0 on the device (a batch without real rows, as launch_metadata writes it)
// with a nonzero upstream gradient: the full gradient math runs and must give zeros, finite.
TEST(CudaIndexerLoss, ZeroDeviceScaleGivesZeroGradients) {
  SKIP_WITHOUT_GPU();
  for (IndexerLossKernel k : {IndexerLossKernel::tensor_core, IndexerLossKernel::baseline}) {
    LossCase c = ragged("scale 0", true);
    Inputs in(c);
    in.loss_scale.upload(std::vector<float>{0.0f});
    const Outputs o = run(in, k, true, 0.37f);
    for (float v : o.dqi) ASSERT_EQ(v, 0.0f);
    for (float v : o.dweff) ASSERT_EQ(v, 0.0f);
    for (float v : o.dkeys) ASSERT_EQ(v, 0.0f);
  }
}

TEST(CudaIndexerLoss, DenseHasNoPerRowCandidateCap) {
  SKIP_WITHOUT_GPU();
  // 61440 tokens: 15360 visible entries for the last rows, past the reference kernel's
  // shared-memory cap (with 64 index heads: 236 KB > 220 KB, it refuses). Value only; every
  // real row has a finite KL >= 0.
  LossCase c;
  c.name = "long dense";
  c.heads = 16;  // few teacher heads keep q small: the candidate count is what matters here
  c.index_heads = 64;
  c.real = {61440};
  c.padded = {61440};
  c.topk = 512;
  c.window = 128;
  c.sparse = false;
  const Inputs in(c);
  EXPECT_THROW(run(in, IndexerLossKernel::baseline, false, 0.0f), Error);
  const Outputs o = run(in, IndexerLossKernel::tensor_core, false, 0.0f);
  for (int t = 0; t < in.d.rows; ++t) {
    ASSERT_TRUE(std::isfinite(o.loss_rows[t])) << "row " << t;
    ASSERT_GE(o.loss_rows[t], -1e-5f) << "row " << t;
    if (t < 3) {
      ASSERT_EQ(o.loss_rows[t], 0.0f) << "row " << t;
    }
  }
  EXPECT_TRUE(std::isfinite(o.loss));
  EXPECT_GT(o.loss, 0.0f);
}

// The backward's loss launch reuses what the forward's stored (launch_indexer_loss's `kept`):
// the value launch that stores it gives bitwise its plain value; the gradient launch that
// reads it gives bitwise the plain launch's value, dqI and dw' (dK^I: atomics, summed in
// any order), and it reads the kept values of exactly the rows that store their masses - the
// forward's LSE without a dropped id, or more than 64 heads - which a NaN-poisoned kept buffer
// shows: those rows' values turn NaN, every other row stays equal. With predictor operands
// too (the MXFP8 indexer's), whose logits the kept values carry.
TEST(CudaIndexerLoss, BackwardReusesTheForwardsKeptValues) {
  SKIP_WITHOUT_GPU();
  for (int heads : {64, 128})
  for (bool with_lse : {true, false})
  for (bool pred_ops : {false, true}) {
    LossCase c = ragged("kept, H " + std::to_string(heads) + (with_lse ? "" : ", no lse") +
                            (pred_ops ? ", predictor operands" : ""),
                        true);
    c.heads = heads;
    c.with_lse = with_lse;
    c.holes = true;
    c.future_ids = true;
    SCOPED_TRACE(c.name);
    Inputs in(c);
    const int T = in.d.rows, K = in.d.topk;
    const PredictorOperands po(in, 34);
    if (pred_ops) po.set(in.args);
    const std::size_t kept_floats = static_cast<std::size_t>(T) * (K + 1) * 2;
    DeviceArray<float> kept(kept_floats + 64);  // + a canary no launch may write
    kept.fill_bytes(0xFF);
    const float gs = 0.37f;
    const IndexerLossKernel tc = IndexerLossKernel::tensor_core;
    const Outputs ref_v = run(in, tc, false, 0.0f), ref = run(in, tc, true, gs);
    const Outputs fwd = run(in, tc, false, 0.0f, kept.get());
    EXPECT_EQ(fwd.loss_rows, ref_v.loss_rows) << "storing changed the value";
    EXPECT_EQ(fwd.loss, ref_v.loss);
    const Outputs bwd = run(in, tc, true, gs, kept.get());
    EXPECT_EQ(bwd.loss_rows, ref.loss_rows);
    EXPECT_EQ(bwd.dweff, ref.dweff);
    EXPECT_EQ(bwd.dqi, ref.dqi);
    expect_rel_l2(bwd.dkeys, ref.dkeys, 1e-5, c.name + " dkeys");
    // Row chunks (the deterministic mode's launches, here with atomics) read the rows' own
    // kept values: two launches give the one launch's values.
    {
      const Outputs chunked = run(in, tc, true, gs, kept.get(), false, {{0, T / 2}, {T / 2, T - T / 2}});
      EXPECT_EQ(chunked.loss_rows, bwd.loss_rows) << "chunked";
      EXPECT_EQ(chunked.dweff, bwd.dweff) << "chunked";
      EXPECT_EQ(chunked.dqi, bwd.dqi) << "chunked";
      expect_rel_l2(chunked.dkeys, bwd.dkeys, 1e-5, c.name + " chunked dkeys");
    }
    // A zero upstream gradient on the kept path: the value, exact zero gradients.
    const Outputs zero = run(in, tc, true, 0.0f, kept.get());
    EXPECT_EQ(zero.loss_rows, ref.loss_rows);
    for (float v : zero.dweff) ASSERT_EQ(v, 0.0f);
    for (float v : zero.dqi) ASSERT_EQ(v, 0.0f);
    for (float v : zero.dkeys) ASSERT_EQ(v, 0.0f);
    {
      const std::vector<float> all = kept.download();
      for (std::size_t i = kept_floats; i < all.size(); ++i)
        ASSERT_TRUE(std::isnan(all[i])) << "a launch wrote past the kept values [" << i << "]";
    }

    kept.fill_bytes(0xFF);  // the kept values gone: the rows that read them show it
    const Outputs poisoned = run(in, tc, true, gs, kept.get());
    int kept_rows = 0;
    for (int t = 0; t < T; ++t) {
      const bool reads = in.host_vis[t] > 0 && ((with_lse && !in.host_drop[t]) || heads > 64);
      kept_rows += reads;
      if (reads) {
        EXPECT_TRUE(std::isnan(poisoned.loss_rows[t])) << "row " << t << " did not read its kept values";
      } else {
        EXPECT_EQ(poisoned.loss_rows[t], ref.loss_rows[t]) << "row " << t << " read kept values it has none of";
      }
    }
    if (with_lse || heads > 64) {
      EXPECT_GT(kept_rows, 0);
    }
    EXPECT_GT(T - kept_rows, 0);
  }
}

// The layer's backward (launch_indexer_loss's own_selection: the top-k is the indexer's own,
// every valid id visible) takes the gradient-only instance (kKeptGradients, two CTAs an SM):
// bitwise the general instance's loss rows, dqI and dw', its dK^I up to the atomics' order,
// also in row chunks and with predictor operands (its S comes from the bf16 operands, as the
// general final pass's). A row that breaks the contract (an id the loss drops, 64 heads: it
// has no kept values) gets NaN, never a stale value; with 128 heads every row keeps its
// masses, so such rows are computed too.
TEST(CudaIndexerLoss, GradientOnlyInstanceMatchesTheGeneralOne) {
  SKIP_WITHOUT_GPU();
  for (int heads : {64, 128})
  for (bool pred_ops : {false, true})
  for (bool future_ids : {false, true}) {
    LossCase c = ragged("gradient-only, H " + std::to_string(heads) + (pred_ops ? ", predictor operands" : "") +
                            (future_ids ? ", dropped ids" : ""),
                        true);
    c.heads = heads;
    c.holes = true;
    c.future_ids = future_ids;
    SCOPED_TRACE(c.name);
    Inputs in(c);
    const int T = in.d.rows, HI = in.d.index_heads, K = in.d.topk;
    const PredictorOperands po(in, 36);
    if (pred_ops) po.set(in.args);
    DeviceArray<float> kept(static_cast<std::size_t>(T) * (K + 1) * 2);
    kept.fill_bytes(0xFF);
    const float gs = 0.37f;
    const IndexerLossKernel automatic = IndexerLossKernel::automatic;
    run(in, automatic, false, 0.0f, kept.get());
    const Outputs ref = run(in, automatic, true, gs, kept.get());
    // launch_indexer_loss with own_selection, whole and in two row chunks, on zero-filled
    // outputs: a contract-breaking row's NaN is the kernel's, not the poison's.
    for (const auto& chunks : {std::vector<std::pair<int, int>>{},
                               std::vector<std::pair<int, int>>{{0, T / 2}, {T / 2, T - T / 2}}}) {
      SCOPED_TRACE(chunks.empty() ? "whole" : "two chunks");
      const Outputs g = run(in, automatic, true, gs, kept.get(), /*own_selection=*/true, chunks, /*poison=*/0x00);
      int broken = 0;
      for (int t = 0; t < T; ++t) {
        const bool breaks = in.host_vis[t] > 0 && in.host_drop[t] && heads <= 64;
        broken += breaks;
        const std::size_t q0 = static_cast<std::size_t>(t) * HI * 128, w0 = static_cast<std::size_t>(t) * HI;
        if (breaks) {
          EXPECT_TRUE(std::isnan(g.loss_rows[t])) << "row " << t;
          for (int i = 0; i < HI * 128; ++i) ASSERT_TRUE(std::isnan(g.dqi[q0 + i])) << "row " << t;
          for (int h = 0; h < HI; ++h) ASSERT_TRUE(std::isnan(g.dweff[w0 + h])) << "row " << t;
          continue;
        }
        ASSERT_FALSE(std::isnan(ref.loss_rows[t])) << "row " << t;
        EXPECT_EQ(std::memcmp(&g.loss_rows[t], &ref.loss_rows[t], sizeof(float)), 0) << "row " << t;
        ASSERT_EQ(std::memcmp(&g.dqi[q0], &ref.dqi[q0], sizeof(float) * HI * 128), 0) << "row " << t;
        ASSERT_EQ(std::memcmp(&g.dweff[w0], &ref.dweff[w0], sizeof(float) * HI), 0) << "row " << t;
      }
      EXPECT_EQ(broken > 0, future_ids && heads <= 64);
      // The dropped rows' keys get nothing from them: compare dK^I only where no row broke.
      if (broken == 0) expect_rel_l2(g.dkeys, ref.dkeys, 1e-5, c.name + " dkeys");
    }
  }
}

// The layer's forward (launch_indexer_loss's logits_kept, loss_logits_from_selection): the value
// launch takes the predictor logits of every row with more visible entries than top-k from
// `kept` (where the selection wrote its scores) instead of its predictor pass. Given the logits
// the pass itself computes, the loss is bitwise the same (the same logits, the same order of
// the LSE's sums), the teacher (128 heads: its zeroing) leaves them alone, the gradient launch
// gives the same gradients; given zero logits, exactly those rows' loss is the teacher's KL
// from the uniform predictor.
TEST(CudaIndexerLoss, ValueLaunchTakesTheSelectionsLogits) {
  SKIP_WITHOUT_GPU();
  for (int heads : {64, 128}) {
    LossCase c = ragged("selection's logits, H " + std::to_string(heads), true);
    c.heads = heads;  // no holes, no future ids: the indexer's own rows (ids then -1)
    SCOPED_TRACE(c.name);
    Inputs in(c);
    const int T = in.d.rows, K = in.d.topk;
    // The rows that take the given logits: more visible entries than K (the rows the indexer
    // selects by radix, so the ones whose scores it writes).
    std::vector<char> given(T, 0);
    int n_given = 0;
    for (int t = 0; t < T; ++t) n_given += given[t] = in.host_visible[t] > K;
    ASSERT_GT(n_given, 0);
    ASSERT_LT(n_given, T);
    const std::size_t kept_floats = static_cast<std::size_t>(T) * (K + 1) * 2;
    const IndexerLossKernel automatic = IndexerLossKernel::automatic;
    DeviceArray<float> kept_ref(kept_floats);
    kept_ref.fill_bytes(0xFF);
    const float gs = 0.37f;
    const Outputs ref = run(in, automatic, false, 0.0f, kept_ref.get());
    const Outputs ref_g = run(in, automatic, true, gs, kept_ref.get());
    const std::vector<float> ref_kept = kept_ref.download();

    auto value_with = [&](const std::vector<float>& start, DeviceArray<float>& kept) {
      kept.upload(start);
      DeviceArray<float> rows(T), loss(1);
      rows.fill_bytes(0xFF);
      launch_indexer_loss(in.d, in.meta, in.args, rows.get(), loss.get(), false, 0.0f, nullptr, nullptr,
                          nullptr, kept.get(), nullptr, automatic, /*logits_kept=*/true);
      check(cudaDeviceSynchronize());
      return rows.download();
    };
    // The logits the pass computes (masses and row sums poisoned: recomputed by the launch).
    std::vector<float> start(kept_floats, std::nanf(""));
    for (std::size_t e = 0; e < static_cast<std::size_t>(T) * K; ++e) start[2 * e + 1] = ref_kept[2 * e + 1];
    DeviceArray<float> kept(kept_floats);
    EXPECT_EQ(value_with(start, kept), ref.loss_rows);
    const std::vector<float> after = kept.download();
    for (int t = 0; t < T; ++t)
      if (given[t])
        for (int k = 0; k < K; ++k) {
          const std::size_t e = static_cast<std::size_t>(t) * K + k;
          ASSERT_EQ(std::memcmp(&after[2 * e + 1], &ref_kept[2 * e + 1], sizeof(float)), 0)
              << "row " << t << " logit " << k << " changed";
        }
    const Outputs g = run(in, automatic, true, gs, kept.get());
    EXPECT_EQ(g.loss_rows, ref_g.loss_rows);
    EXPECT_EQ(g.dweff, ref_g.dweff);
    EXPECT_EQ(g.dqi, ref_g.dqi);
    expect_rel_l2(g.dkeys, ref_g.dkeys, 1e-5, c.name + " dkeys");

    // Other logits: the given rows read them, the others compute their own. Not NaN: the
    // sparse predictor's log-probability is clamped by fmaxf (at log FLT_MIN), which drops a
    // NaN. Zero logits make the given rows' predictor uniform, so their loss is the teacher's
    // KL from the uniform distribution: sum_j p_j (log p_j + log n) with p_j = mass_j / sum.
    std::vector<float> zero_start(kept_floats, 0.0f);
    const std::vector<float> rows = value_with(zero_start, kept);
    const std::vector<float> masses = kept.download();
    for (int t = 0; t < T; ++t) {
      if (!given[t]) {
        EXPECT_EQ(rows[t], ref.loss_rows[t]) << "row " << t << " took logits it was not given";
        continue;
      }
      const int n = K;  // the row's candidates: more visible entries than K, so all K
      double sum = 0.0;
      for (int j = 0; j < n; ++j) sum += masses[2 * (static_cast<std::size_t>(t) * K + j)];
      double want = 0.0;
      for (int j = 0; j < n; ++j) {
        const double p = masses[2 * (static_cast<std::size_t>(t) * K + j)] / sum;
        want += p * (std::log(std::max(p, 1e-10)) + std::log(static_cast<double>(n)));
      }
      EXPECT_NEAR(rows[t], want, 1e-4 * std::fabs(want) + 1e-5) << "row " << t << " did not take the given logits";
      EXPECT_GT(std::fabs(rows[t] - ref.loss_rows[t]), 1e-3 * std::fabs(ref.loss_rows[t]))
          << "row " << t << ": the uniform predictor's loss equals the row's own";
    }
  }
}

// kGivenLight (the layer's value launch, with kGivenLogits): the value launch's rows with given
// masses and logits and more visible entries than K take their KL from `kept` alone (warp 0,
// the CTA's other warps leave). Against the same launch without it, on the same kept
// logits: the loss rows, the masses' sum and the LSE it keeps for the gradient launch are
// bitwise the same (the same orders), so are the gradients; the other rows run as before.
// The light rows' top-k ids are -1 when the rows kernel runs, so a row that missed the light
// path shows (its loss would be 0). The ragged batch at top-16 (part of a warp) and one
// Flash sequence at top-512 (16 pairs a lane).
TEST(CudaIndexerLoss, LightRowsTakeTheirKlFromKept) {
  SKIP_WITHOUT_GPU();
  for (int variant = 0; variant < 3; ++variant) {
    const int heads = variant == 1 ? 128 : 64;
    LossCase c = variant < 2 ? ragged("light rows, H " + std::to_string(heads), true)
                             : one_sequence("light rows, flash", true, 64, 512);
    c.heads = heads;  // no holes, no future ids: the indexer's own rows
    SCOPED_TRACE(c.name);
    Inputs in(c);
    const int T = in.d.rows, K = in.d.topk;
    std::vector<char> light(T, 0);  // the rows the indexer selects by radix
    int n_light = 0;
    for (int t = 0; t < T; ++t) n_light += light[t] = in.host_visible[t] > K;
    ASSERT_GT(n_light, 0);
    ASSERT_LT(n_light, T);
    const std::size_t kept_floats = static_cast<std::size_t>(T) * (K + 1) * 2;
    // The predictor logits the rows kernel computes (its own pass), as the selection gives them.
    DeviceArray<float> own(kept_floats);
    own.fill_bytes(0xFF);
    run(in, IndexerLossKernel::automatic, false, 0.0f, own.get());
    const std::vector<float> own_kept = own.download();
    std::vector<float> start(kept_floats, std::nanf(""));
    for (std::size_t e = 0; e < static_cast<std::size_t>(T) * K; ++e) start[2 * e + 1] = own_kept[2 * e + 1];

    // The light rows read neither their top-k ids nor anything but `kept`: with light, their
    // ids are replaced by -1 after the teacher has read them (a row that still ran the slow
    // path would find no candidate and give 0).
    const std::vector<std::int32_t> ids = in.topk.download();
    std::vector<std::int32_t> no_ids = ids;
    for (int t = 0; t < T; ++t)
      if (light[t]) std::fill(no_ids.begin() + static_cast<long>(t) * K, no_ids.begin() + static_cast<long>(t + 1) * K, -1);
    auto value = [&](int given, DeviceArray<float>& kept) {
      kept.upload(start);
      DeviceArray<float> rows(T);
      rows.fill_bytes(0xFF);
      launch_indexer_teacher_wgmma(in.d, in.meta, in.args, kept.get(), nullptr, /*logits_kept=*/true);
      if (given & kGivenLight) {
        check(cudaDeviceSynchronize());
        in.topk.upload(no_ids);
      }
      launch_indexer_loss_rows_mma(in.d, in.meta, in.args, rows.get(), false, 0.0f, nullptr, nullptr, nullptr,
                                   kept.get(), given, nullptr);
      check(cudaDeviceSynchronize());
      in.topk.upload(ids);
      return rows.download();
    };
    DeviceArray<float> kept_plain(kept_floats), kept_light(kept_floats);
    const std::vector<float> plain = value(kGivenMasses | kGivenLogits, kept_plain);
    const std::vector<float> lit = value(kGivenMasses | kGivenLogits | kGivenLight, kept_light);
    const std::vector<float> kp = kept_plain.download(), kl = kept_light.download();
    for (int t = 0; t < T; ++t) {
      const std::size_t sums = (static_cast<std::size_t>(T) * K + t) * 2;
      if (light[t]) {
        ASSERT_TRUE(std::isfinite(lit[t]) && lit[t] > 0.0f) << "row " << t << ": " << lit[t];
      }
      EXPECT_EQ(std::memcmp(&lit[t], &plain[t], sizeof(float)), 0)
          << "row " << t << (light[t] ? " (light)" : " (not light)") << ": " << lit[t] << " vs " << plain[t];
      if (in.host_vis[t] > 0) {  // the row sums the gradient launch reads
        EXPECT_EQ(std::memcmp(&kl[sums], &kp[sums], 2 * sizeof(float)), 0) << "row " << t << " sums";
      }
    }
    const float gs = 0.37f;
    const Outputs g_plain = run(in, IndexerLossKernel::automatic, true, gs, kept_plain.get());
    const Outputs g_light = run(in, IndexerLossKernel::automatic, true, gs, kept_light.get());
    EXPECT_EQ(g_light.loss_rows, g_plain.loss_rows);
    EXPECT_EQ(g_light.dweff, g_plain.dweff);
    EXPECT_EQ(g_light.dqi, g_plain.dqi);
    expect_rel_l2(g_light.dkeys, g_plain.dkeys, 1e-5, c.name + " dkeys");  // (atomics)
  }
}

// The wgmma teacher (indexer_loss_teacher.cu) against the rows kernel's own mma.sync teacher:
// the masses it writes for every served row - the forward's LSE applies: no dropped id, at
// least one candidate - match (to fp32 summation order), it writes nothing else (NaN-poisoned
// entries stay NaN; with 128 heads its launcher zeroes the buffer for the two head blocks'
// sums), and the layer's value launch (automatic: the teacher, then the rows kernel with
// masses_given) gives the rows kernel's loss - bitwise on the rows it does not serve - and is
// bitwise repeatable, the 128-head atomics included; the rows kernel keeps the teacher's
// masses as they are. 16 heads: a partial head block.
TEST(CudaIndexerLoss, WgmmaTeacherMatchesTheRowsKernel) {
  SKIP_WITHOUT_GPU();
  for (int heads : {16, 64, 128}) {
    LossCase c = ragged("wgmma teacher, H " + std::to_string(heads), true);
    // A segment of 1200 tokens: rows of 1 to 256 candidates (top-256), so items of one to
    // four 64-key tiles - a consumer refills its buffer within an item - and n = 129.
    c.real[4] = 1200;
    c.padded[4] = 1204;
    c.topk = 256;
    c.heads = heads;
    c.holes = true;
    c.future_ids = true;
    SCOPED_TRACE(c.name);
    const Inputs in(c);
    const int T = in.d.rows, K = in.d.topk;
    const std::size_t kept_floats = static_cast<std::size_t>(T) * (K + 1) * 2;
    DeviceArray<float> ref(kept_floats), got(kept_floats);
    ref.fill_bytes(0xFF);
    got.fill_bytes(0xFF);
    const Outputs plain = run(in, IndexerLossKernel::tensor_core, false, 0.0f, ref.get());
    launch_indexer_teacher_wgmma(in.d, in.meta, in.args, got.get(), nullptr);
    check(cudaDeviceSynchronize());
    const std::vector<float> r = ref.download(), m = got.download();
    int served = 0;
    for (int t = 0; t < T; ++t) {
      const int n = in.host_vis[t];
      const bool serves = n > 0 && !in.host_drop[t];
      served += serves;
      for (int j = 0; j < K; ++j) {
        const float v = m[(static_cast<std::size_t>(t) * K + j) * 2];
        if (serves && j < n) {
          const float want = r[(static_cast<std::size_t>(t) * K + j) * 2];
          ASSERT_TRUE(std::isfinite(v) && v >= 0.0f) << "row " << t << " candidate " << j << ": " << v;
          ASSERT_NEAR(v, want, 1e-4f * want + 1e-7f) << "row " << t << " candidate " << j;
        } else if (heads > 64) {
          ASSERT_EQ(v, 0.0f) << "row " << t << " entry " << j << " (zeroed, never added to)";
        } else {
          ASSERT_TRUE(std::isnan(v)) << "row " << t << " entry " << j << " was written";
        }
      }
    }
    ASSERT_GT(served, 0);
    ASSERT_LT(served, T);

    int multi_tile = 0;
    for (int t = 0; t < T; ++t) multi_tile += in.host_vis[t] > 128 && !in.host_drop[t];
    ASSERT_GT(multi_tile, 0) << "no row of three or more tiles";

    DeviceArray<float> kept(kept_floats), again(kept_floats);
    kept.fill_bytes(0);  // (entries no launch writes compare equal)
    again.fill_bytes(0);
    const Outputs v1 = run(in, IndexerLossKernel::automatic, false, 0.0f, kept.get());
    const Outputs v2 = run(in, IndexerLossKernel::automatic, false, 0.0f, again.get());
    EXPECT_EQ(v1.loss_rows, v2.loss_rows) << "not repeatable";
    const std::vector<float> k1 = kept.download();
    EXPECT_EQ(k1, again.download()) << "kept values not repeatable";
    for (int t = 0; t < T; ++t) {  // the automatic launch kept the teacher's masses as they are
      if (in.host_vis[t] == 0 || in.host_drop[t]) continue;
      for (int j = 0; j < in.host_vis[t]; ++j) {
        ASSERT_EQ(k1[(static_cast<std::size_t>(t) * K + j) * 2], m[(static_cast<std::size_t>(t) * K + j) * 2])
            << "row " << t << " candidate " << j << ": not the teacher's mass";
      }
    }
    for (int t = 0; t < T; ++t) {
      const bool serves = in.host_vis[t] > 0 && !in.host_drop[t];
      if (serves) {
        EXPECT_NEAR(v1.loss_rows[t], plain.loss_rows[t], 2e-4 * std::fabs(plain.loss_rows[t]) + 2e-6)
            << "row " << t;
      } else {
        EXPECT_EQ(v1.loss_rows[t], plain.loss_rows[t]) << "row " << t << " (not served: the same code)";
      }
    }
    // The backward on those kept values: the rows kernel's gradients to the masses' rounding.
    const float gs = 0.37f;
    const Outputs b1 = run(in, IndexerLossKernel::automatic, true, gs, kept.get());
    const Outputs b0 = run(in, IndexerLossKernel::tensor_core, true, gs);
    expect_rel_l2(b1.dweff, b0.dweff, 1e-4, c.name + " dweff");
    expect_rel_l2(b1.dqi, b0.dqi, 2e-3, c.name + " dqi");
    expect_rel_l2(b1.dkeys, b0.dkeys, 1e-4, c.name + " dkeys");
  }
}

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
