// The naive fp64 oracle of the DeepSeek-V4 attention layer (SWA / CSA / HCA), written
// straight from shared/spec/01-attention-math.md: §2 layer, §3 compressor, §4 indexer,
// §5 attention with sink, §6 indexer loss, §7 THD. Double precision everywhere, plain loops,
// no BLAS and nothing shared with the optimized backends except the config, the layout and
// the parameter names.
//
// Structure: every packed segment is processed on its own (everything restarts per segment,
// nothing crosses one). Per segment:
//   1. the K/V path: kv_s for the rows the queried windows need (all rows by default);
//   2. the compressors: C_j (main) and K^I_j (indexer, m = 4) for the blocks the queried rows
//      can see (all blocks by default);
//   3. per query row t: the Q path, the indexer scores and top-k (CSA), the attention with
//      the sink, the inverse RoPE, the grouped O projection, and the row's KL term (CSA).
#include "oracle.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "csattn/error.hpp"

namespace csattn::oracle {
namespace {

using Vec = std::vector<double>;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- parameters ---------------------------------------------------------------------------

// A row-major [rows, cols] view of one parameter.
struct Mat {
  const double* data = nullptr;
  int rows = 0;
  int cols = 0;
  const double* row(int r) const { return data + static_cast<std::size_t>(r) * cols; }
};

Mat param(const Weights64& w, const std::string& name, int rows, int cols) {
  auto it = w.find(name);
  require(it != w.end(), ErrorKind::InvalidArgument,
          "oracle: missing parameter '" + name + "'");
  const std::size_t want = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  require(it->second.size() == want, ErrorKind::ShapeMismatch,
          "oracle: parameter '" + name + "' has " + std::to_string(it->second.size()) +
              " values, expected [" + std::to_string(rows) + ", " + std::to_string(cols) +
              "] = " + std::to_string(want));
  return Mat{it->second.data(), rows, cols};
}

const double* param_vec(const Weights64& w, const std::string& name, int n) {
  return param(w, name, 1, n).data;
}

// Parameters of one compressor (§3): wkv, wgate [coff*d, d_model], norm [d], ape [m, coff*d].
struct CompressorParams {
  Mat wkv, wgate, ape;
  const double* norm = nullptr;
  int d = 0;     // output dim
  int coff = 1;  // 2 for the overlapping m = 4 compressor
  bool hadamard = false;
};

struct Params {
  Mat wq_a, wq_b, wkv, wo_a, wo_b;
  const double* q_norm = nullptr;
  const double* kv_norm = nullptr;
  const double* sink = nullptr;
  CompressorParams comp;      // m > 1
  CompressorParams idx_comp;  // m = 4
  Mat idx_wq_b, idx_weights;  // m = 4
};

Params load_params(const AttentionConfig& cfg, const Weights64& w) {
  const int dm = cfg.d_model, H = cfg.n_heads, D = cfg.head_dim, rq = cfg.q_lora_rank;
  const int G = cfg.o_groups, ro = cfg.o_lora_rank, m = cfg.compress_ratio;
  Params p;
  p.wq_a = param(w, "attn.wq_a.weight", rq, dm);
  p.q_norm = param_vec(w, "attn.q_norm.weight", rq);
  p.wq_b = param(w, "attn.wq_b.weight", H * D, rq);
  p.wkv = param(w, "attn.wkv.weight", D, dm);
  p.kv_norm = param_vec(w, "attn.kv_norm.weight", D);
  p.wo_a = param(w, "attn.wo_a.weight", G * ro, H * D / G);
  p.wo_b = param(w, "attn.wo_b.weight", dm, G * ro);
  p.sink = param_vec(w, "attn.attn_sink", H);
  if (m > 1) {
    const int coff = (m == 4) ? 2 : 1;
    CompressorParams& c = p.comp;
    c.d = D;
    c.coff = coff;
    c.wkv = param(w, "attn.compressor.wkv.weight", coff * D, dm);
    c.wgate = param(w, "attn.compressor.wgate.weight", coff * D, dm);
    c.norm = param_vec(w, "attn.compressor.norm.weight", D);
    c.ape = param(w, "attn.compressor.ape", m, coff * D);
  }
  if (m == 4) {
    const int HI = cfg.index_n_heads, DI = cfg.index_head_dim;
    p.idx_wq_b = param(w, "attn.indexer.wq_b.weight", HI * DI, rq);
    p.idx_weights = param(w, "attn.indexer.weights_proj.weight", HI, dm);
    CompressorParams& c = p.idx_comp;
    c.d = DI;
    c.coff = 2;
    c.hadamard = true;
    c.wkv = param(w, "attn.indexer.compressor.wkv.weight", 2 * DI, dm);
    c.wgate = param(w, "attn.indexer.compressor.wgate.weight", 2 * DI, dm);
    c.norm = param_vec(w, "attn.indexer.compressor.norm.weight", DI);
    c.ape = param(w, "attn.indexer.compressor.ape", 4, 2 * DI);
  }
  return p;
}

// ---- elementary operations ----------------------------------------------------------------

// y = W x, W [out, in].
Vec linear(const Mat& W, const double* x) {
  Vec y(W.rows, 0.0);
  for (int o = 0; o < W.rows; ++o) {
    const double* wr = W.row(o);
    double acc = 0.0;
    for (int i = 0; i < W.cols; ++i) acc += wr[i] * x[i];
    y[o] = acc;
  }
  return y;
}

// In place: v <- v / sqrt(mean(v^2) + eps) * w (w == nullptr: weightless).
void rmsnorm(double* v, int n, const double* w, double eps) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += v[i] * v[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) v[i] = v[i] * inv * (w ? w[i] : 1.0);
}

double dot(const double* a, const double* b, int n) {
  double acc = 0.0;
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// RoPE frequencies omega_i, i in [0, d_r/2) (§2.5): plain for SWA, YaRN for m > 1.
Vec rope_omega(const AttentionConfig& cfg) {
  const int dim = cfg.rope_dim;
  const int half = dim / 2;
  Vec omega(half);
  if (cfg.compress_ratio == 0) {
    for (int i = 0; i < half; ++i)
      omega[i] = std::pow(cfg.rope_theta, -2.0 * i / dim);
    return omega;
  }
  const double base = cfg.compress_rope_theta;
  const double s = cfg.yarn_factor;
  const double L_orig = cfg.yarn_original_max_pos;
  auto corr = [&](double r) {
    return dim * std::log(L_orig / (2.0 * std::numbers::pi * r)) / (2.0 * std::log(base));
  };
  const double low = std::max(std::floor(corr(cfg.yarn_beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(cfg.yarn_beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    const double extra = std::pow(base, -2.0 * i / dim);
    const double inter = extra / s;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    omega[i] = inter * ramp + extra * (1.0 - ramp);
  }
  return omega;
}

// Rotates the interleaved pairs of the rotary sub-vector v (2 * omega.size() dims) by
// angle pos * omega_i; sign = -1 is the inverse rotation.
void rope(double* v, const Vec& omega, double pos, double sign = 1.0) {
  for (std::size_t i = 0; i < omega.size(); ++i) {
    const double angle = sign * pos * omega[i];
    const double c = std::cos(angle), s = std::sin(angle);
    const double x0 = v[2 * i], x1 = v[2 * i + 1];
    v[2 * i] = x0 * c - x1 * s;
    v[2 * i + 1] = x0 * s + x1 * c;
  }
}

// RoPE on the last d_r dims of a head vector of n dims.
void rope_tail(double* head, int n, int d_r, const Vec& omega, double pos, double sign = 1.0) {
  rope(head + (n - d_r), omega, pos, sign);
}

// Orthonormal Sylvester-Walsh-Hadamard transform, straight from its definition:
// Had(v)[i] = n^-1/2 sum_j (-1)^popcount(i & j) v[j].
void hadamard(double* v, int n) {
  Vec out(n, 0.0);
  for (int i = 0; i < n; ++i) {
    double acc = 0.0;
    for (int j = 0; j < n; ++j) acc += (std::popcount(static_cast<unsigned>(i & j)) & 1) ? -v[j] : v[j];
    out[i] = acc / std::sqrt(static_cast<double>(n));
  }
  std::copy(out.begin(), out.end(), v);
}

// ---- compressor (§3.1) --------------------------------------------------------------------

// Compressed entries C_0 .. C_{n_blocks-1} of one segment whose rows start at x_seg
// (n_blocks <= floor(L / m), so only full blocks are read). Returns [n_blocks][d].
std::vector<Vec> compress(const AttentionConfig& cfg, const CompressorParams& cp,
                          const Vec& omega, const double* x_seg, int n_blocks) {
  const int m = cfg.compress_ratio, d = cp.d, dm = cfg.d_model;
  const int n_rows = n_blocks * m;
  // a_t = wkv x_t, g_t = wgate x_t for the rows of the used blocks.
  std::vector<Vec> a(n_rows), g(n_rows);
  for (int t = 0; t < n_rows; ++t) {
    const double* xt = x_seg + static_cast<std::size_t>(t) * dm;
    a[t] = linear(cp.wkv, xt);
    g[t] = linear(cp.wgate, xt);
  }
  std::vector<Vec> C(n_blocks, Vec(d, 0.0));
  std::vector<double> score, value;
  for (int j = 0; j < n_blocks; ++j) {
    for (int c = 0; c < d; ++c) {
      score.clear();
      value.clear();
      if (m == 4) {
        if (j > 0) {  // previous block, A half [0, d)
          for (int i = 0; i < m; ++i) {
            const int t = (j - 1) * m + i;
            score.push_back(g[t][c] + cp.ape.row(i)[c]);
            value.push_back(a[t][c]);
          }
        }
        for (int i = 0; i < m; ++i) {  // current block, B half [d, 2d)
          const int t = j * m + i;
          score.push_back(g[t][d + c] + cp.ape.row(i)[d + c]);
          value.push_back(a[t][d + c]);
        }
      } else {
        for (int i = 0; i < m; ++i) {
          const int t = j * m + i;
          score.push_back(g[t][c] + cp.ape.row(i)[c]);
          value.push_back(a[t][c]);
        }
      }
      // Per-channel softmax over the candidates, then the weighted sum.
      const double mx = *std::max_element(score.begin(), score.end());
      double z = 0.0, acc = 0.0;
      for (std::size_t k = 0; k < score.size(); ++k) {
        const double e = std::exp(score[k] - mx);
        z += e;
        acc += e * value[k];
      }
      C[j][c] = acc / z;
    }
    rmsnorm(C[j].data(), d, cp.norm, cfg.norm_eps);
    rope_tail(C[j].data(), d, cfg.rope_dim, omega, static_cast<double>(j) * m);
    if (cp.hadamard) hadamard(C[j].data(), d);
  }
  return C;
}

// ---- indexer (§4) -------------------------------------------------------------------------

// Index scores I[t, j] for j < n_vis: sum_h w_{t,h} * D_I^-1/2 * ReLU(qI_{t,h} . KI_j).
Vec index_scores(const AttentionConfig& cfg, const Params& p, const Vec& omega,
                 const double* x_t, const Vec& c_t, int t, const std::vector<Vec>& KI,
                 int n_vis) {
  const int HI = cfg.index_n_heads, DI = cfg.index_head_dim;
  Vec qI = linear(p.idx_wq_b, c_t.data());  // [H_I * D_I]
  for (int h = 0; h < HI; ++h) {
    double* qh = qI.data() + static_cast<std::size_t>(h) * DI;
    rope_tail(qh, DI, cfg.rope_dim, omega, t);
    hadamard(qh, DI);
  }
  Vec wts = linear(p.idx_weights, x_t);  // [H_I]
  for (int h = 0; h < HI; ++h) wts[h] *= 1.0 / std::sqrt(static_cast<double>(HI));
  const double tau_I = 1.0 / std::sqrt(static_cast<double>(DI));
  Vec I(n_vis, 0.0);
  for (int j = 0; j < n_vis; ++j) {
    double acc = 0.0;
    for (int h = 0; h < HI; ++h) {
      const double s = dot(qI.data() + static_cast<std::size_t>(h) * DI, KI[j].data(), DI);
      acc += wts[h] * tau_I * std::max(s, 0.0);
    }
    I[j] = acc;
  }
  return I;
}

// The min(K, n) largest scores, ties toward the smallest index; returned ascending.
std::vector<int> topk(const Vec& scores, int K) {
  std::vector<int> idx(scores.size());
  for (std::size_t j = 0; j < idx.size(); ++j) idx[j] = static_cast<int>(j);
  const int k_eff = std::min<int>(K, static_cast<int>(scores.size()));
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int a, int b) { return scores[a] > scores[b]; });  // stable: j asc on ties
  idx.resize(k_eff);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// ---- attention (§5) and indexer loss (§6) -------------------------------------------------

// log(exp(sigma) + sum_k exp(z_k)), max-subtracted.
double log_sum_exp_with_sink(double sigma, const Vec& z) {
  double mx = sigma;
  for (double v : z) mx = std::max(mx, v);
  double s = std::exp(sigma - mx);
  for (double v : z) s += std::exp(v - mx);
  return mx + std::log(s);
}

// KL_t of §6.1-6.3 over the candidate set S (non-empty) of one row.
//   q: [H*D] (rotated, normalized) queries; window: the kv rows of Wnd(t); C: main compressed
//   entries; I: the row's visible index scores.
double row_kl(const AttentionConfig& cfg, const Params& p, const Vec& q,
              const std::vector<const double*>& window, const std::vector<Vec>& C,
              const std::vector<int>& S, const Vec& I) {
  const int H = cfg.n_heads, D = cfg.head_dim;
  const double tau = 1.0 / std::sqrt(static_cast<double>(D));
  Vec teacher(S.size(), 0.0);  // sum_h P_h(t, j)
  Vec z_all;
  for (int h = 0; h < H; ++h) {
    const double* qh = q.data() + static_cast<std::size_t>(h) * D;
    z_all.clear();
    for (const double* kv : window) z_all.push_back(tau * dot(qh, kv, D));
    Vec z_S(S.size());
    for (std::size_t k = 0; k < S.size(); ++k) {
      z_S[k] = tau * dot(qh, C[S[k]].data(), D);
      z_all.push_back(z_S[k]);
    }
    const double lse = log_sum_exp_with_sink(p.sink[h], z_all);  // full denominator
    for (std::size_t k = 0; k < S.size(); ++k) teacher[k] += std::exp(z_S[k] - lse);
  }
  double denom = 0.0;
  for (double v : teacher) denom += v;
  denom = std::max(denom, static_cast<double>(FLT_MIN));
  // Predictor: log-softmax of I over S.
  double mx = -std::numeric_limits<double>::infinity();
  for (int j : S) mx = std::max(mx, I[j]);
  double se = 0.0;
  for (int j : S) se += std::exp(I[j] - mx);
  const double lse_I = mx + std::log(se);
  double kl = 0.0;
  for (std::size_t k = 0; k < S.size(); ++k) {
    const double T = teacher[k] / denom;
    const double log_p = I[S[k]] - lse_I;
    kl += T * (std::log(std::max(T, 1e-10)) - log_p);
  }
  return kl;
}

void check_config(const AttentionConfig& cfg) {
  cfg.validate();
  // What this file relies on (validate() should already guarantee it).
  const int m = cfg.compress_ratio;
  require(m == 0 || m == 4 || m == 128, ErrorKind::InvalidArgument,
          "oracle: compress_ratio must be 0, 4 or 128, got " + std::to_string(m));
  require(cfg.rope_dim % 2 == 0 && cfg.rope_dim <= cfg.head_dim, ErrorKind::InvalidArgument,
          "oracle: rope_dim must be even and <= head_dim");
  require(cfg.o_groups > 0 && cfg.n_heads % cfg.o_groups == 0, ErrorKind::InvalidArgument,
          "oracle: n_heads must be divisible by o_groups");
  if (m == 4) {
    const int DI = cfg.index_head_dim;
    require(DI > 0 && (DI & (DI - 1)) == 0 && cfg.rope_dim <= DI, ErrorKind::InvalidArgument,
            "oracle: index_head_dim must be a power of two >= rope_dim");
    require(cfg.index_topk > 0, ErrorKind::InvalidArgument, "oracle: index_topk must be > 0");
  }
}

}  // namespace

Result forward(const AttentionConfig& cfg, const SeqLayout& layout, const Weights64& w,
               const std::vector<double>& x, const Options& options) {
  check_config(cfg);
  const int dm = cfg.d_model, H = cfg.n_heads, D = cfg.head_dim, d_r = cfg.rope_dim;
  const int G = cfg.o_groups, ro = cfg.o_lora_rank, W = cfg.window, m = cfg.compress_ratio;
  const int K = cfg.index_topk;
  const bool csa = (m == 4), hca = (m == 128);
  require(x.size() % static_cast<std::size_t>(dm) == 0, ErrorKind::ShapeMismatch,
          "oracle: x has " + std::to_string(x.size()) + " values, not a multiple of d_model = " +
              std::to_string(dm));
  const std::int64_t T = static_cast<std::int64_t>(x.size() / dm);
  layout.check_rows(T);
  const Params p = load_params(cfg, w);
  const Vec omega = rope_omega(cfg);

  // Which rows are queried.
  std::vector<char> queried(T, options.query_rows ? 0 : 1);
  if (options.query_rows) {
    for (int r : *options.query_rows) {
      require(r >= 0 && r < T, ErrorKind::InvalidArgument,
              "oracle: query row " + std::to_string(r) + " outside [0, " + std::to_string(T) +
                  ")");
      queried[r] = 1;
    }
  }
  const std::vector<std::int32_t>* forced = csa ? options.forced_topk : nullptr;
  if (forced) {
    require(forced->size() == static_cast<std::size_t>(T) * K, ErrorKind::ShapeMismatch,
            "oracle: forced_topk has " + std::to_string(forced->size()) +
                " entries, expected [T, K] = [" + std::to_string(T) + ", " + std::to_string(K) +
                "]");
  }

  Result res;
  res.output.assign(static_cast<std::size_t>(T) * dm, kNaN);
  if (csa) {
    res.topk.assign(static_cast<std::size_t>(T) * K, -1);
    res.index_scores.assign(T, {});
  }
  double kl_sum = 0.0;
  const double tau = 1.0 / std::sqrt(static_cast<double>(D));
  const int HDg = H * D / G;

  for (int b = 0; b < layout.num_segments(); ++b) {
    const int s0 = layout.seg_start(b), L = layout.seg_len(b), R = layout.real_len(b);
    const double* x_seg = x.data() + static_cast<std::size_t>(s0) * dm;
    int t_max = -1;  // last queried local position
    for (int t = 0; t < L; ++t)
      if (queried[s0 + t]) t_max = t;
    if (t_max < 0) continue;

    // 1. K/V path for the rows the queried windows need.
    std::vector<Vec> kv(L);
    for (int t = 0; t <= t_max; ++t) {
      if (!queried[s0 + t]) continue;
      for (int s = std::max(0, t - W + 1); s <= t; ++s) {
        if (!kv[s].empty()) continue;
        kv[s] = linear(p.wkv, x_seg + static_cast<std::size_t>(s) * dm);
        rmsnorm(kv[s].data(), D, p.kv_norm, cfg.norm_eps);
        rope_tail(kv[s].data(), D, d_r, omega, s);
      }
    }

    // 2. Compressed entries the queried rows can see: j < min(N_c, floor((t_max+1)/m)).
    const int N_c = (m > 1) ? L / m : 0;
    const int n_blocks = (m > 1) ? std::min(N_c, (t_max + 1) / m) : 0;
    std::vector<Vec> C, KI;
    if (m > 1) C = compress(cfg, p.comp, omega, x_seg, n_blocks);
    if (csa) KI = compress(cfg, p.idx_comp, omega, x_seg, n_blocks);

    // 3. Query rows.
    for (int t = 0; t <= t_max; ++t) {
      const std::int64_t row = s0 + t;
      if (!queried[row]) continue;
      const double* x_t = x_seg + static_cast<std::size_t>(t) * dm;
      const bool padding = t >= R;
      const int n_vis = (m > 1) ? std::min(N_c, (t + 1) / m) : 0;

      // Q path (§2.2).
      Vec c_t = linear(p.wq_a, x_t);
      rmsnorm(c_t.data(), cfg.q_lora_rank, p.q_norm, cfg.norm_eps);
      Vec q = linear(p.wq_b, c_t.data());
      for (int h = 0; h < H; ++h) {
        double* qh = q.data() + static_cast<std::size_t>(h) * D;
        rmsnorm(qh, D, nullptr, cfg.norm_eps);
        rope_tail(qh, D, d_r, omega, t);
      }

      // Compressed keys of this row (§5.1).
      std::vector<int> sel;  // ascending ids into C
      Vec I;
      if (hca) {
        for (int j = 0; j < n_vis; ++j) sel.push_back(j);
      } else if (csa) {
        if (!padding) {
          I = index_scores(cfg, p, omega, x_t, c_t, t, KI, n_vis);
          res.index_scores[row] = I;
        }
        if (forced) {
          const std::int32_t* fr = forced->data() + static_cast<std::size_t>(row) * K;
          for (int k = 0; k < K; ++k) {
            if (fr[k] < 0) continue;
            require(fr[k] < n_vis, ErrorKind::InvalidArgument,
                    "oracle: forced_topk row " + std::to_string(row) + " selects entry " +
                        std::to_string(fr[k]) + ", but only " + std::to_string(n_vis) +
                        " are visible");
            sel.push_back(fr[k]);
          }
          std::sort(sel.begin(), sel.end());
          require(std::adjacent_find(sel.begin(), sel.end()) == sel.end(),
                  ErrorKind::InvalidArgument,
                  "oracle: forced_topk row " + std::to_string(row) + " repeats an entry");
        } else if (!padding) {
          sel = topk(I, K);
        }
        for (std::size_t k = 0; k < sel.size(); ++k)
          res.topk[static_cast<std::size_t>(row) * K + k] = sel[k];
      }

      // Attention with sink (§5.2), inverse RoPE (§2.6).
      std::vector<const double*> window;
      for (int s = std::max(0, t - W + 1); s <= t; ++s) window.push_back(kv[s].data());
      std::vector<const double*> keys = window;
      for (int j : sel) keys.push_back(C[j].data());
      Vec o(static_cast<std::size_t>(H) * D, 0.0);
      Vec z(keys.size());
      for (int h = 0; h < H; ++h) {
        const double* qh = q.data() + static_cast<std::size_t>(h) * D;
        double* oh = o.data() + static_cast<std::size_t>(h) * D;
        for (std::size_t k = 0; k < keys.size(); ++k) z[k] = tau * dot(qh, keys[k], D);
        const double lse = log_sum_exp_with_sink(p.sink[h], z);  // log Z
        for (std::size_t k = 0; k < keys.size(); ++k) {
          const double P = std::exp(z[k] - lse);
          for (int d = 0; d < D; ++d) oh[d] += P * keys[k][d];
        }
        rope_tail(oh, D, d_r, omega, t, -1.0);
      }

      // Grouped O projection and wo_b (§2.6).
      Vec u(static_cast<std::size_t>(G) * ro, 0.0);
      for (int g = 0; g < G; ++g) {
        const double* a = o.data() + static_cast<std::size_t>(g) * HDg;
        for (int r = 0; r < ro; ++r) u[g * ro + r] = dot(p.wo_a.row(g * ro + r), a, HDg);
      }
      Vec y = linear(p.wo_b, u.data());
      std::copy(y.begin(), y.end(), res.output.begin() + row * dm);

      // Indexer loss term (§6), real rows only.
      if (csa && !padding && !options.query_rows) {
        std::vector<int> S;
        if (cfg.sparse_loss) {
          S = sel;
        } else {
          for (int j = 0; j < n_vis; ++j) S.push_back(j);
        }
        if (!S.empty()) kl_sum += row_kl(cfg, p, q, window, C, S, I);
      }
    }
  }

  if (options.query_rows) {
    res.indexer_loss = kNaN;
  } else if (csa) {
    const std::int64_t n_real = layout.real_rows();
    if (cfg.per_token_loss)
      res.indexer_loss = cfg.loss_coeff * kl_sum;
    else
      res.indexer_loss = n_real > 0 ? cfg.loss_coeff * kl_sum / static_cast<double>(n_real) : 0.0;
  }
  return res;
}

IndexerTopk indexer_topk(const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& w, int heads, int dim,
                         const std::vector<int>& cu_q, const std::vector<int>& cu_k,
                         const std::vector<int>& offsets, int ratio, int K, double sm_scale) {
  IndexerTopk r;
  const int T = cu_q.back();
  r.scores.resize(static_cast<std::size_t>(T));
  r.topk.resize(static_cast<std::size_t>(T));
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const int o = offsets.empty() ? 0 : offsets[b];
    const int len_k = cu_k[b + 1] - cu_k[b];
    for (int t = cu_q[b]; t < cu_q[b + 1]; ++t) {
      const int n = std::clamp((o + (t - cu_q[b]) + 1) / ratio, 0, len_k);
      Vec& S = r.scores[static_cast<std::size_t>(t)];
      S.assign(static_cast<std::size_t>(n), 0.0);
      for (int j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int h = 0; h < heads; ++h) {
          const double* qh = q.data() + (static_cast<std::size_t>(t) * heads + h) * dim;
          const double* kj = k.data() + static_cast<std::size_t>(cu_k[b] + j) * dim;
          acc += w[static_cast<std::size_t>(t) * heads + h] * std::max(dot(qh, kj, dim), 0.0);
        }
        S[static_cast<std::size_t>(j)] = sm_scale * acc;
      }
      r.topk[static_cast<std::size_t>(t)] = topk(S, K);
    }
  }
  return r;
}

Weights64 weights64(const LayerWeights& w) {
  Weights64 out;
  for (const ParamInfo& p : w.params()) out[p.name] = w.get(p.name).to_f64();
  return out;
}

}  // namespace csattn::oracle
