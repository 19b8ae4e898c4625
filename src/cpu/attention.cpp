#include "cpu/attention.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/attention_index.hpp"
#include "cpu/blas.hpp"
#include "cpu/elementwise.hpp"

namespace csattn::cpu {

namespace {

// Copies the valid key rows of one index row into buf [n, D]; returns n and compacts the
// row ids into ids.
int gather_keys(const IndexedAttentionArgs& a, const std::int32_t* index, int* ids,
                float* buf) {
  int n = 0;
  for (int k = 0; k < a.width; ++k) {
    const int v = index[k];
    if (v < 0) continue;
    const float* src = v < a.kv.raw_rows ? a.kv.raw + static_cast<long>(v) * a.dim
                                         : a.kv.comp + static_cast<long>(v - a.kv.raw_rows) * a.dim;
    std::memcpy(buf + static_cast<long>(n) * a.dim, src, sizeof(float) * a.dim);
    ids[n++] = v;
  }
  return n;
}

}  // namespace

void attention_forward(int nq, const IndexedAttentionArgs& a, float* out, float* lse) {
  const int H = a.heads, D = a.dim;
  const bool invariant = batch_invariant();
#pragma omp parallel
  {
    BatchInvariantScope scope(invariant);
    std::vector<int> ids(static_cast<std::size_t>(a.width));
    std::vector<float> keys(static_cast<std::size_t>(a.width) * D);
    std::vector<float> p(static_cast<std::size_t>(H) * std::max(a.width, 1));
#pragma omp for schedule(dynamic, 16)
    for (int t = 0; t < nq; ++t) {
      const int n = gather_keys(a, a.index + static_cast<long>(t) * a.width, ids.data(),
                                keys.data());
      const float* q = a.q + static_cast<long>(t) * H * D;
      float* o = out + static_cast<long>(t) * H * D;
      gemm(false, true, H, n, D, a.scale, q, D, keys.data(), D, 0.0f, p.data(), n);
      for (int h = 0; h < H; ++h) {
        float* ph = p.data() + static_cast<long>(h) * n;
        float mx = a.sink[h];
        for (int k = 0; k < n; ++k) mx = std::max(mx, ph[k]);
        float z = std::exp(a.sink[h] - mx);
        for (int k = 0; k < n; ++k) z += (ph[k] = std::exp(ph[k] - mx));
        const float inv = 1.0f / z;
        for (int k = 0; k < n; ++k) ph[k] *= inv;
        lse[static_cast<long>(t) * H + h] = mx + std::log(z);
      }
      if (n == 0) {
        std::memset(o, 0, sizeof(float) * H * D);  // only the sink: output 0
      } else {
        gemm(false, false, H, D, n, 1.0f, p.data(), n, keys.data(), D, 0.0f, o, D);
      }
      round_to_storage(o, static_cast<long>(H) * D, a.bf16);
    }
  }
}

void attention_backward(int nq, const IndexedAttentionArgs& a, const float* out,
                        const float* lse, const float* dout, float* dq, float* draw,
                        float* dcomp, float* dsink) {
  const int H = a.heads, D = a.dim;
  const int nthreads = omp_get_max_threads();
  const long key_rows = static_cast<long>(a.kv.raw_rows) + a.kv.comp_rows;
  // Per-thread key gradients over all kv_full rows and sink gradients.
  std::vector<float> dkey_parts(static_cast<std::size_t>(nthreads) * key_rows * D, 0.0f);
  std::vector<double> dsink_parts(static_cast<std::size_t>(nthreads) * H, 0.0);
#pragma omp parallel
  {
    const int tid = omp_get_thread_num();
    float* dkey = dkey_parts.data() + static_cast<std::size_t>(tid) * key_rows * D;
    double* ds = dsink_parts.data() + static_cast<std::size_t>(tid) * H;
    const std::size_t w = static_cast<std::size_t>(std::max(a.width, 1));
    std::vector<int> ids(w);
    std::vector<float> keys(w * D);
    std::vector<float> p(static_cast<std::size_t>(H) * w);
    std::vector<float> dp(static_cast<std::size_t>(H) * w);
    std::vector<float> dk(w * D);
#pragma omp for schedule(static)
    for (int t = 0; t < nq; ++t) {
      const int n = gather_keys(a, a.index + static_cast<long>(t) * a.width, ids.data(),
                                keys.data());
      const float* q = a.q + static_cast<long>(t) * H * D;
      const float* o = out + static_cast<long>(t) * H * D;
      const float* g = dout + static_cast<long>(t) * H * D;
      // P from the saved LSE; dP = dO V^T.
      gemm(false, true, H, n, D, a.scale, q, D, keys.data(), D, 0.0f, p.data(), n);
      gemm(false, true, H, n, D, 1.0f, g, D, keys.data(), D, 0.0f, dp.data(), n);
      for (int h = 0; h < H; ++h) {
        const float l = lse[static_cast<long>(t) * H + h];
        double drow = 0.0;  // D_row = dO . o
        for (int d = 0; d < D; ++d) drow += static_cast<double>(g[h * D + d]) * o[h * D + d];
        float* ph = p.data() + static_cast<long>(h) * n;
        float* dph = dp.data() + static_cast<long>(h) * n;
        for (int k = 0; k < n; ++k) {
          ph[k] = std::exp(ph[k] - l);
          dph[k] = ph[k] * (dph[k] - static_cast<float>(drow));  // dz
        }
        ds[h] -= std::exp(static_cast<double>(a.sink[h]) - l) * drow;
      }
      float* dqt = dq + static_cast<long>(t) * H * D;
      if (n == 0) {
        std::memset(dqt, 0, sizeof(float) * H * D);
        continue;
      }
      // dq = tau dz K ; dK = P^T dO + tau dz^T q
      gemm(false, false, H, D, n, a.scale, dp.data(), n, keys.data(), D, 0.0f, dqt, D);
      gemm(true, false, n, D, H, 1.0f, p.data(), n, g, D, 0.0f, dk.data(), D);
      gemm(true, false, n, D, H, a.scale, dp.data(), n, q, D, 1.0f, dk.data(), D);
      for (int k = 0; k < n; ++k) {
        float* dst = dkey + static_cast<long>(ids[k]) * D;
        const float* src = dk.data() + static_cast<long>(k) * D;
        for (int d = 0; d < D; ++d) dst[d] += src[d];
      }
    }
  }
  // Reduce in thread order: raw rows into draw, compressed rows into dcomp.
#pragma omp parallel for schedule(static)
  for (long r = 0; r < key_rows; ++r) {
    float* dst = r < a.kv.raw_rows ? draw + r * D : dcomp + (r - a.kv.raw_rows) * D;
    for (int th = 0; th < nthreads; ++th) {
      const float* src = dkey_parts.data() + (static_cast<std::size_t>(th) * key_rows + r) * D;
      for (int d = 0; d < D; ++d) dst[d] += src[d];
    }
  }
  for (int h = 0; h < H; ++h) {
    double acc = 0.0;
    for (int th = 0; th < nthreads; ++th) acc += dsink_parts[static_cast<std::size_t>(th) * H + h];
    dsink[h] += static_cast<float>(acc);
  }
}

// ---- single-rank form ----

namespace {

AttentionIndex single_rank_index(const BatchGeometry& geo, const AttentionArgs& a) {
  int max_len = 0;
  for (int b = 0; b < geo.segments; ++b) max_len = std::max(max_len, geo.seg_len[b]);
  const bool csa = a.kind == LayerKind::csa;
  // Top-k width for CSA, every visible entry of the longest segment for HCA, none for SWA.
  const int cw = csa ? a.topk_width : (a.kind == LayerKind::hca ? max_len / geo.ratio : 0);
  KvLowering low;
  low.compressed_base = geo.rows;
  return build_attention_index(QueryRows::all(geo),
                               csa ? IndexMode::selected : IndexMode::all_visible, a.window,
                               cw, csa ? a.topk : nullptr, low);
}

IndexedAttentionArgs indexed_args(const BatchGeometry& geo, const AttentionArgs& a,
                                  const AttentionIndex& idx) {
  IndexedAttentionArgs ia;
  ia.heads = a.heads;
  ia.dim = a.dim;
  ia.scale = a.scale;
  ia.q = a.q;
  ia.kv = {a.kv, geo.rows, a.comp, geo.compressed_rows()};
  ia.sink = a.sink;
  ia.index = idx.index.data();
  ia.width = idx.width();
  ia.bf16 = a.bf16;
  return ia;
}

}  // namespace

void attention_forward(const BatchGeometry& geo, const AttentionArgs& a, float* out,
                       float* lse) {
  const AttentionIndex idx = single_rank_index(geo, a);
  attention_forward(geo.rows, indexed_args(geo, a, idx), out, lse);
}

void attention_backward(const BatchGeometry& geo, const AttentionArgs& a, const float* out,
                        const float* lse, const float* dout, float* dq, float* dkv,
                        float* dcomp, float* dsink) {
  const AttentionIndex idx = single_rank_index(geo, a);
  attention_backward(geo.rows, indexed_args(geo, a, idx), out, lse, dout, dq, dkv, dcomp,
                     dsink);
}

}  // namespace csattn::cpu
