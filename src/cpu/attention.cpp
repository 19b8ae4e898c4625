#include "cpu/attention.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/blas.hpp"
#include "cpu/elementwise.hpp"

namespace csattn::cpu {

int attention_keys(const BatchGeometry& geo, const AttentionArgs& a, int row, int* ids) {
  const int b = geo.row_segment[row], pos = geo.row_position[row];
  const int start = geo.seg_start[b];
  int n = 0;
  for (int s = std::max(0, pos - a.window + 1); s <= pos; ++s) ids[n++] = start + s;
  if (a.kind == LayerKind::hca) {
    const int vis = geo.visible_compressed(row);
    for (int j = 0; j < vis; ++j) ids[n++] = geo.rows + geo.comp_start[b] + j;
  } else if (a.kind == LayerKind::csa) {
    const std::int32_t* sel = a.topk + static_cast<long>(row) * a.topk_width;
    for (int k = 0; k < a.topk_width; ++k)
      if (sel[k] >= 0) ids[n++] = geo.rows + geo.comp_start[b] + sel[k];
  }
  return n;
}

int max_attention_keys(const BatchGeometry& geo, const AttentionArgs& a) {
  int most_visible = 0;
  for (int b = 0; b < geo.segments; ++b) most_visible = std::max(most_visible, geo.seg_compressed(b));
  const int extra = a.kind == LayerKind::csa ? a.topk_width
                    : a.kind == LayerKind::hca ? most_visible : 0;
  return a.window + extra;
}

namespace {

// Copies the key rows of `ids` into buf [n, D].
void gather_rows(const AttentionArgs& a, int rows, const int* ids, int n, float* buf) {
  for (int k = 0; k < n; ++k) {
    const float* src = ids[k] < rows ? a.kv + static_cast<long>(ids[k]) * a.dim
                                     : a.comp + static_cast<long>(ids[k] - rows) * a.dim;
    std::memcpy(buf + static_cast<long>(k) * a.dim, src, sizeof(float) * a.dim);
  }
}

}  // namespace

void attention_forward(const BatchGeometry& geo, const AttentionArgs& a, float* out,
                       float* lse) {
  const int H = a.heads, D = a.dim, T = geo.rows;
  const int max_keys = max_attention_keys(geo, a);
#pragma omp parallel
  {
    std::vector<int> ids(static_cast<std::size_t>(max_keys));
    std::vector<float> keys(static_cast<std::size_t>(max_keys) * D);
    std::vector<float> p(static_cast<std::size_t>(H) * max_keys);
#pragma omp for schedule(dynamic, 16)
    for (int t = 0; t < T; ++t) {
      const int n = attention_keys(geo, a, t, ids.data());
      gather_rows(a, T, ids.data(), n, keys.data());
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
      gemm(false, false, H, D, n, 1.0f, p.data(), n, keys.data(), D, 0.0f, o, D);
      round_to_storage(o, static_cast<long>(H) * D, a.bf16);
    }
  }
}

void attention_backward(const BatchGeometry& geo, const AttentionArgs& a, const float* out,
                        const float* lse, const float* dout, float* dq, float* dkv,
                        float* dcomp, float* dsink) {
  const int H = a.heads, D = a.dim, T = geo.rows, nc = geo.compressed_rows();
  const int max_keys = max_attention_keys(geo, a);
  const int nthreads = omp_get_max_threads();
  const long key_rows = static_cast<long>(T) + nc;
  // Per-thread key gradients over all key rows (raw then compressed) and sink gradients.
  std::vector<float> dkey_parts(static_cast<std::size_t>(nthreads) * key_rows * D, 0.0f);
  std::vector<double> dsink_parts(static_cast<std::size_t>(nthreads) * H, 0.0);
#pragma omp parallel
  {
    const int tid = omp_get_thread_num();
    float* dkey = dkey_parts.data() + static_cast<std::size_t>(tid) * key_rows * D;
    double* ds = dsink_parts.data() + static_cast<std::size_t>(tid) * H;
    std::vector<int> ids(static_cast<std::size_t>(max_keys));
    std::vector<float> keys(static_cast<std::size_t>(max_keys) * D);
    std::vector<float> p(static_cast<std::size_t>(H) * max_keys);
    std::vector<float> dp(static_cast<std::size_t>(H) * max_keys);
    std::vector<float> dk(static_cast<std::size_t>(max_keys) * D);
    std::vector<float> qbuf(static_cast<std::size_t>(H) * D);
#pragma omp for schedule(static)
    for (int t = 0; t < T; ++t) {
      const int n = attention_keys(geo, a, t, ids.data());
      gather_rows(a, T, ids.data(), n, keys.data());
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
      // dq = tau dz K ; dK = P^T dO + tau dz^T q
      gemm(false, false, H, D, n, a.scale, dp.data(), n, keys.data(), D, 0.0f,
           dq + static_cast<long>(t) * H * D, D);
      gemm(true, false, n, D, H, 1.0f, p.data(), n, g, D, 0.0f, dk.data(), D);
      gemm(true, false, n, D, H, a.scale, dp.data(), n, q, D, 1.0f, dk.data(), D);
      for (int k = 0; k < n; ++k) {
        float* dst = dkey + static_cast<long>(ids[k]) * D;
        const float* src = dk.data() + static_cast<long>(k) * D;
        for (int d = 0; d < D; ++d) dst[d] += src[d];
      }
    }
  }
  // Reduce in thread order: raw rows into dkv, compressed rows into dcomp.
#pragma omp parallel for schedule(static)
  for (long r = 0; r < key_rows; ++r) {
    float* dst = r < T ? dkv + r * D : dcomp + (r - T) * D;
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

}  // namespace csattn::cpu
