#include "cpu/indexer_loss.hpp"

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/blas.hpp"

namespace csattn::cpu {

namespace {

int candidate_count(const BatchGeometry& geo, int row) {
  return geo.row_is_padding[row] ? 0 : geo.visible_compressed(row);
}

// Work buffers of one thread for the per-row loss.
struct LossScratch {
  std::vector<int> cand;            // segment-local candidate ids
  std::vector<int> slot;            // sparse: the top-k slot of each candidate
  std::vector<float> keys, dots;    // indexer keys [n, DI], qI.K [HI, n]
  std::vector<float> logits;        // I [n]
  std::vector<float> ckeys, z;      // main compressed rows [n, D], logits [H, n]
  std::vector<float> wkeys, zw;     // window rows [nw, D], logits [H, nw]
  std::vector<double> target, logp, p;
  std::vector<float> g, ddots, dkeys;
};

// KL of one row; with `want_grad`, also its gradient (scaled by `scale`) into qI, w' and
// the thread's key-gradient buffer.
// Query index t of `queries` (its inputs are row t of the per-query tensors; its facts come
// from its global row g).
double row_loss(const QueryRows& queries, const LossArgs& a, int t, LossScratch& s,
                bool want_grad, float scale, float* dq, float* dw, float* dkeys_thread) {
  const BatchGeometry& geo = *queries.geo;
  const int g = queries.row(t);
  const IndexerArgs& ix = a.indexer;
  const TeacherArgs& te = a.teacher;
  const int HI = ix.heads, DI = ix.dim, H = te.heads, D = te.dim;
  const int vis = candidate_count(geo, g);
  s.cand.clear();
  s.slot.clear();
  if (a.sparse) {
    const std::int32_t* sel = a.topk + static_cast<long>(t) * ix.topk;
    for (int k = 0; k < ix.topk; ++k)
      if (sel[k] >= 0 && sel[k] < vis) {
        s.cand.push_back(sel[k]);
        s.slot.push_back(k);
      }
  } else {
    for (int j = 0; j < vis; ++j) s.cand.push_back(j);
  }
  const int n = static_cast<int>(s.cand.size());
  if (n == 0) return 0.0;
  const int b = geo.row_segment[g];
  const int c0 = geo.comp_start[b];

  // Predictor p over the candidates: the compact indexer's softmax when given (sparse loss),
  // else softmax(I) of the scores recomputed here. The q.k products are needed either way
  // for the gradient (ReLU mask and dw), from the bf16 / fp32 operands.
  const bool given = a.sparse && a.predict != nullptr;
  const float* qi = ix.q + static_cast<long>(t) * HI * DI;
  const float* wi = ix.weights + static_cast<long>(t) * HI;
  if (!given || want_grad) {
    s.keys.resize(static_cast<std::size_t>(n) * DI);
    for (int k = 0; k < n; ++k)
      std::memcpy(&s.keys[static_cast<std::size_t>(k) * DI],
                  ix.keys + static_cast<long>(c0 + s.cand[k]) * DI, sizeof(float) * DI);
    s.dots.resize(static_cast<std::size_t>(HI) * n);
    gemm(false, true, HI, n, DI, 1.0f, qi, DI, s.keys.data(), DI, 0.0f, s.dots.data(), n);
  }
  s.logp.resize(static_cast<std::size_t>(n));
  s.p.resize(static_cast<std::size_t>(n));
  if (given) {
    const float* pr = a.predict + static_cast<long>(t) * ix.topk;
    for (int k = 0; k < n; ++k) {
      s.p[k] = pr[s.slot[k]];
      // The fused kernels clamp the predictor at the fp32 tiny value (spec 01 §6.3).
      s.logp[k] = std::log(std::max(s.p[k], static_cast<double>(FLT_MIN)));
    }
  } else {
    s.logits.assign(static_cast<std::size_t>(n), 0.0f);
    for (int h = 0; h < HI; ++h)
      for (int k = 0; k < n; ++k) s.logits[k] += wi[h] * std::max(s.dots[h * n + k], 0.0f);
    float imax = -INFINITY;
    for (int k = 0; k < n; ++k) imax = std::max(imax, s.logits[k]);
    double isum = 0.0;
    for (int k = 0; k < n; ++k) isum += std::exp(static_cast<double>(s.logits[k]) - imax);
    const double ilse = imax + std::log(isum);
    for (int k = 0; k < n; ++k) {
      s.logp[k] = s.logits[k] - ilse;
      s.p[k] = std::exp(s.logp[k]);
    }
  }

  // Teacher: per-head attention mass on the candidates with the full CSA denominator
  // (sink + window + candidates), head-summed, L1-normalised.
  // The window rows sit right before the query's own K=V row in te.kv.
  const int pos = geo.row_position[g];
  const int w0 = std::max(0, pos - te.window + 1), nw = pos - w0 + 1;
  const long first_window_row = queries.kv_row(t) - (nw - 1);
  s.ckeys.resize(static_cast<std::size_t>(n) * D);
  for (int k = 0; k < n; ++k)
    std::memcpy(&s.ckeys[static_cast<std::size_t>(k) * D],
                te.comp + static_cast<long>(c0 + s.cand[k]) * D, sizeof(float) * D);
  s.z.resize(static_cast<std::size_t>(H) * n);
  s.zw.resize(static_cast<std::size_t>(H) * nw);
  const float* q = te.q + static_cast<long>(t) * H * D;
  gemm(false, true, H, n, D, te.scale, q, D, s.ckeys.data(), D, 0.0f, s.z.data(), n);
  gemm(false, true, H, nw, D, te.scale, q, D, te.kv + first_window_row * D, D,
       0.0f, s.zw.data(), nw);
  s.target.assign(static_cast<std::size_t>(n), 0.0);
  for (int h = 0; h < H; ++h) {
    double mx = te.sink[h];
    for (int k = 0; k < nw; ++k) mx = std::max(mx, static_cast<double>(s.zw[h * nw + k]));
    for (int k = 0; k < n; ++k) mx = std::max(mx, static_cast<double>(s.z[h * n + k]));
    double zsum = std::exp(te.sink[h] - mx);
    for (int k = 0; k < nw; ++k) zsum += std::exp(s.zw[h * nw + k] - mx);
    for (int k = 0; k < n; ++k) zsum += std::exp(s.z[h * n + k] - mx);
    const double lse = mx + std::log(zsum);
    for (int k = 0; k < n; ++k) s.target[k] += std::exp(s.z[h * n + k] - lse);
  }
  double tsum = 0.0;
  for (int k = 0; k < n; ++k) tsum += s.target[k];
  tsum = std::max(tsum, static_cast<double>(FLT_MIN));
  double kl = 0.0;
  for (int k = 0; k < n; ++k) {
    s.target[k] /= tsum;
    kl += s.target[k] * (std::log(std::max(s.target[k], 1e-10)) - s.logp[k]);
  }
  if (!want_grad) return kl;

  // dLoss/dI_j = scale * (p_j - T_j), then through the ReLU-weighted head sum.
  s.g.resize(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k)
    s.g[k] = scale * static_cast<float>(s.p[k] - s.target[k]);
  s.ddots.resize(static_cast<std::size_t>(HI) * n);
  float* dwr = dw + static_cast<long>(t) * HI;
  for (int h = 0; h < HI; ++h) {
    double acc = 0.0;
    for (int k = 0; k < n; ++k) {
      const float dot = s.dots[h * n + k];
      acc += static_cast<double>(s.g[k]) * std::max(dot, 0.0f);
      s.ddots[h * n + k] = dot > 0.0f ? s.g[k] * wi[h] : 0.0f;
    }
    dwr[h] = static_cast<float>(acc);
  }
  gemm(false, false, HI, DI, n, 1.0f, s.ddots.data(), n, s.keys.data(), DI, 0.0f,
       dq + static_cast<long>(t) * HI * DI, DI);
  s.dkeys.resize(static_cast<std::size_t>(n) * DI);
  gemm(true, false, n, DI, HI, 1.0f, s.ddots.data(), n, qi, DI, 0.0f, s.dkeys.data(), DI);
  for (int k = 0; k < n; ++k) {
    float* dst = dkeys_thread + static_cast<long>(c0 + s.cand[k]) * DI;
    const float* src = s.dkeys.data() + static_cast<long>(k) * DI;
    for (int d = 0; d < DI; ++d) dst[d] += src[d];
  }
  return kl;
}

double reduction_scale(const BatchGeometry& geo, const LossArgs& a) {
  if (a.per_token) return a.coeff;
  return geo.real_rows > 0 ? a.coeff / static_cast<double>(geo.real_rows) : 0.0;
}

}  // namespace

double indexer_loss_forward(const QueryRows& q, const LossArgs& a) {
  const int T = q.count;
  std::vector<double> row_kl(static_cast<std::size_t>(T), 0.0);
  const bool invariant = batch_invariant();
#pragma omp parallel
  {
    BatchInvariantScope scope(invariant);
    LossScratch s;
#pragma omp for schedule(dynamic, 16)
    for (int t = 0; t < T; ++t) row_kl[t] = row_loss(q, a, t, s, false, 0.0f, nullptr, nullptr, nullptr);
  }
  double sum = 0.0;  // fixed order: independent of the thread count
  for (double v : row_kl) sum += v;
  return reduction_scale(*q.geo, a) * sum;
}

void indexer_loss_backward(const QueryRows& q, const LossArgs& a, float grad_loss, float* dq,
                           float* dweights, float* dkeys) {
  const int T = q.count, HI = a.indexer.heads, DI = a.indexer.dim;
  const int nc = q.geo->compressed_rows();
  std::memset(dq, 0, sizeof(float) * static_cast<std::size_t>(T) * HI * DI);
  std::memset(dweights, 0, sizeof(float) * static_cast<std::size_t>(T) * HI);
  const float scale = static_cast<float>(reduction_scale(*q.geo, a) * grad_loss);
  const int nthreads = omp_get_max_threads();
  std::vector<float> parts(static_cast<std::size_t>(nthreads) * nc * DI, 0.0f);
#pragma omp parallel
  {
    LossScratch s;
    float* mine = parts.data() + static_cast<std::size_t>(omp_get_thread_num()) * nc * DI;
#pragma omp for schedule(static)
    for (int t = 0; t < T; ++t) row_loss(q, a, t, s, true, scale, dq, dweights, mine);
  }
  for (int th = 0; th < nthreads; ++th)
    for (long i = 0; i < static_cast<long>(nc) * DI; ++i)
      dkeys[i] += parts[static_cast<std::size_t>(th) * nc * DI + i];
}

double indexer_loss_forward(const BatchGeometry& geo, const LossArgs& a) {
  return indexer_loss_forward(QueryRows::all(geo), a);
}

void indexer_loss_backward(const BatchGeometry& geo, const LossArgs& a, float grad_loss,
                           float* dq, float* dweights, float* dkeys) {
  indexer_loss_backward(QueryRows::all(geo), a, grad_loss, dq, dweights, dkeys);
}

}  // namespace csattn::cpu
