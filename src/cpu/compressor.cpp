#include "cpu/compressor.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/blas.hpp"

namespace csattn::cpu {

namespace {

// One pooling candidate of a compressed entry, for one channel c of the output: the value
// and the gate logit live at column `col` of row `token` of the projections; `slot` picks
// the ape row.
struct Candidate {
  int token;
  int col;
  int slot;
};

// Enumerates the candidates of an entry for channel c (at most 2m): m = 4 takes the previous
// block's A half (when there is one) and its own block's B half; m = 128 its own block.
int candidates(const CompressorEntry& e, int m, int c, int d, Candidate* out) {
  int n = 0;
  if (m == 4) {
    if (e.prev_row >= 0)
      for (int i = 0; i < m; ++i) out[n++] = {e.prev_row + i, c, i};
    for (int i = 0; i < m; ++i) out[n++] = {e.first_row + i, d + c, i};
  } else {
    for (int i = 0; i < m; ++i) out[n++] = {e.first_row + i, c, i};
  }
  return n;
}

// Softmax weights of the candidates (fp32, max-subtracted).
void pool_weights(const Candidate* cand, int n, const float* g, const float* ape, int width,
                  float* p) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int k = 0; k < n; ++k) {
    p[k] = g[static_cast<long>(cand[k].token) * width + cand[k].col] +
           ape[cand[k].slot * width + cand[k].col];
    mx = std::max(mx, p[k]);
  }
  float z = 0.0f;
  for (int k = 0; k < n; ++k) z += (p[k] = std::exp(p[k] - mx));
  for (int k = 0; k < n; ++k) p[k] /= z;
}

}  // namespace

std::vector<CompressorEntry> compressor_entries(const BatchGeometry& geo) {
  std::vector<CompressorEntry> entries;
  entries.reserve(static_cast<std::size_t>(geo.compressed_rows()));
  const int m = geo.ratio;
  for (int b = 0; b < geo.segments; ++b)
    for (int j = 0; j < geo.seg_compressed(b); ++j) {
      const int first = geo.seg_start[b] + j * m;
      entries.push_back({first, j > 0 ? first - m : -1, j * m});
    }
  return entries;
}

void compressor_forward(const CompressorEntry* entries, int nc, int m,
                        const CompressorSpec& spec, const RopeTable& rope, const float* x,
                        int rows, int d_model, const CompressorWeights& w,
                        CompressorState& st) {
  const int d = spec.d;
  const int width = (m == 4 ? 2 : 1) * d;
  st.a.assign(static_cast<std::size_t>(rows) * width, 0.0f);
  st.g.assign(static_cast<std::size_t>(rows) * width, 0.0f);
  linear(x, rows, d_model, w.wkv, width, st.a.data());
  linear(x, rows, d_model, w.wgate, width, st.g.data());
  round_to_storage(st.a.data(), static_cast<long>(st.a.size()), spec.bf16);
  round_to_storage(st.g.data(), static_cast<long>(st.g.size()), spec.bf16);

  st.pooled.assign(static_cast<std::size_t>(nc) * d, 0.0f);
#pragma omp parallel
  {
    std::vector<Candidate> cand(2 * static_cast<std::size_t>(m));
    std::vector<float> p(2 * static_cast<std::size_t>(m));
#pragma omp for schedule(static)
    for (int e = 0; e < nc; ++e) {
      for (int c = 0; c < d; ++c) {
        const int n = candidates(entries[e], m, c, d, cand.data());
        pool_weights(cand.data(), n, st.g.data(), w.ape, width, p.data());
        float acc = 0.0f;
        for (int k = 0; k < n; ++k)
          acc += p[k] * st.a[static_cast<long>(cand[k].token) * width + cand[k].col];
        st.pooled[static_cast<long>(e) * d + c] = acc;
      }
    }
  }
  round_to_storage(st.pooled.data(), static_cast<long>(st.pooled.size()), spec.bf16);

  st.out.assign(st.pooled.size(), 0.0f);
  st.rstd.assign(static_cast<std::size_t>(nc), 0.0f);
  rmsnorm_forward(st.pooled.data(), w.norm, nc, d, spec.eps, st.out.data(), st.rstd.data());
  round_to_storage(st.out.data(), static_cast<long>(st.out.size()), spec.bf16);
#pragma omp parallel for schedule(static)
  for (int e = 0; e < nc; ++e) {
    float* row = st.out.data() + static_cast<long>(e) * d;
    rope.rotate(row + d - spec.rope_dim, entries[e].position, +1);
    if (spec.rotate) {
      hadamard(row, d);
      round_to_storage(row, d, spec.bf16);
    }
  }
}

void compressor_backward(const CompressorEntry* entries, int nc, int m,
                         const CompressorSpec& spec, const RopeTable& rope, const float* x,
                         int rows, int d_model, const CompressorWeights& w,
                         const CompressorState& st, const float* dout,
                         const CompressorGrads& grads, float* dx) {
  const int d = spec.d;
  const int width = (m == 4 ? 2 : 1) * d;
  RopeTable rope_grad = rope;
  rope_grad.bf16 = false;  // gradients stay fp32

  // Through the Hadamard rotation (self-inverse, symmetric) and RoPE^T.
  std::vector<float> dnormed(dout, dout + static_cast<std::size_t>(nc) * d);
#pragma omp parallel for schedule(static)
  for (int e = 0; e < nc; ++e) {
    float* row = dnormed.data() + static_cast<long>(e) * d;
    if (spec.rotate) hadamard(row, d);
    rope_grad.rotate(row + d - spec.rope_dim, entries[e].position, -1);
  }
  std::vector<float> dpooled(dnormed.size());
  rmsnorm_backward(st.pooled.data(), w.norm, st.rstd.data(), dnormed.data(), nc, d,
                   dpooled.data(), grads.norm);

  // Pooling backward. Every (token, column) of the projections feeds at most one entry, so
  // entries write disjoint parts of da / dg; ape is summed per thread, then in thread order.
  std::vector<float> da(static_cast<std::size_t>(rows) * width, 0.0f);
  std::vector<float> dg(da.size(), 0.0f);
  const int nthreads = omp_get_max_threads();
  std::vector<float> dape_parts(static_cast<std::size_t>(nthreads) * m * width, 0.0f);
#pragma omp parallel
  {
    std::vector<Candidate> cand(2 * static_cast<std::size_t>(m));
    std::vector<float> p(2 * static_cast<std::size_t>(m));
    float* dape = dape_parts.data() + static_cast<std::size_t>(omp_get_thread_num()) * m * width;
#pragma omp for schedule(static)
    for (int e = 0; e < nc; ++e) {
      for (int c = 0; c < d; ++c) {
        const int n = candidates(entries[e], m, c, d, cand.data());
        pool_weights(cand.data(), n, st.g.data(), w.ape, width, p.data());
        const float grad = dpooled[static_cast<long>(e) * d + c];
        // The pooled value as computed (unrounded) for the softmax Jacobian.
        float pooled = 0.0f;
        for (int k = 0; k < n; ++k)
          pooled += p[k] * st.a[static_cast<long>(cand[k].token) * width + cand[k].col];
        for (int k = 0; k < n; ++k) {
          const long idx = static_cast<long>(cand[k].token) * width + cand[k].col;
          da[idx] += p[k] * grad;
          const float dscore = p[k] * (st.a[idx] - pooled) * grad;
          dg[idx] += dscore;
          dape[cand[k].slot * width + cand[k].col] += dscore;
        }
      }
    }
  }
  for (int t = 0; t < nthreads; ++t)
    for (int i = 0; i < m * width; ++i)
      grads.ape[i] += dape_parts[static_cast<std::size_t>(t) * m * width + i];

  linear_grad_weight(da.data(), rows, width, x, d_model, grads.wkv, true);
  linear_grad_weight(dg.data(), rows, width, x, d_model, grads.wgate, true);
  if (dx) {
    linear_grad_input(da.data(), rows, width, w.wkv, d_model, dx, true);
    linear_grad_input(dg.data(), rows, width, w.wgate, d_model, dx, true);
  }
}

void compressor_forward(const BatchGeometry& geo, const CompressorSpec& spec,
                        const RopeTable& rope, const float* x, int d_model,
                        const CompressorWeights& w, CompressorState& st) {
  const std::vector<CompressorEntry> entries = compressor_entries(geo);
  compressor_forward(entries.data(), static_cast<int>(entries.size()), geo.ratio, spec, rope, x,
                     geo.rows, d_model, w, st);
}

void compressor_backward(const BatchGeometry& geo, const CompressorSpec& spec,
                         const RopeTable& rope, const float* x, int d_model,
                         const CompressorWeights& w, const CompressorState& st,
                         const float* dout, const CompressorGrads& grads, float* dx) {
  const std::vector<CompressorEntry> entries = compressor_entries(geo);
  compressor_backward(entries.data(), static_cast<int>(entries.size()), geo.ratio, spec, rope,
                      x, geo.rows, d_model, w, st, dout, grads, dx);
}

}  // namespace csattn::cpu
