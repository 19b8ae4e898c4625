// Helpers of the compact indexer tests: a problem (operands + THD layout), running the public
// operator on it, and an independent dense reference (a full [rows, keys] score matrix with
// -inf beyond the visible keys and a stable sort), which only a test may build.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "csattn/ops.hpp"
#include "csattn/plan.hpp"
#include "csattn/tensor.hpp"

namespace csattn::testing_util {

struct IndexerProblem {
  int H = 4, D = 32, K = 5, r = 4;
  std::vector<std::int32_t> cu_q = {0}, cu_k = {0}, offsets;  // offsets empty: none
  std::vector<float> q, k, w;  // [T, H, D], [T_k, D], [T, H]
  std::int64_t k_rows = -1;    // rows of k (default cu_k.back())

  int segments() const { return static_cast<int>(cu_q.size()) - 1; }
  std::int64_t rows() const { return cu_q.back(); }
  std::int64_t key_rows() const { return k_rows >= 0 ? k_rows : cu_k.back(); }
  int max_len(const std::vector<std::int32_t>& cu) const {
    int m = 0;
    for (std::size_t b = 0; b + 1 < cu.size(); ++b) m = std::max(m, cu[b + 1] - cu[b]);
    return m;
  }
};

// Segments with these query / key lengths; values from `fill` (called with the rng).
template <class Fill>
IndexerProblem make_problem(const std::vector<int>& len_q, const std::vector<int>& len_k, int H,
                            int D, int K, std::uint32_t seed, Fill fill) {
  IndexerProblem p;
  p.H = H;
  p.D = D;
  p.K = K;
  for (std::size_t b = 0; b < len_q.size(); ++b) {
    p.cu_q.push_back(p.cu_q.back() + len_q[b]);
    p.cu_k.push_back(p.cu_k.back() + len_k[b]);
  }
  std::mt19937 rng(seed);
  p.q.resize(static_cast<std::size_t>(p.rows()) * H * D);
  p.k.resize(static_cast<std::size_t>(p.key_rows()) * D);
  p.w.resize(static_cast<std::size_t>(p.rows()) * H);
  for (float& v : p.q) v = fill(rng, 0);
  for (float& v : p.k) v = fill(rng, 1);
  for (float& v : p.w) v = fill(rng, 2);
  return p;
}

// Small integers (q, k) and multiples of 1/2 (w): every product and sum is exact in fp32, so
// any accumulation order gives the same bits - and exact ties are everywhere.
inline float exact_value(std::mt19937& rng, int which) {
  if (which == 2) return 0.5f * static_cast<float>(std::uniform_int_distribution<int>(-2, 3)(rng));
  return static_cast<float>(std::uniform_int_distribution<int>(-2, 2)(rng));
}

// bf16-valued normals; the weights carry the indexer's H^-1/2 D^-1/2 scale.
inline float bf16_normal(std::mt19937& rng, int which) {
  std::normal_distribution<float> dist(0.0f, which == 2 ? 0.1f : 1.0f);
  return round_bf16(dist(rng));
}

struct IndexerResult {
  std::vector<std::int32_t> idx;
  std::vector<float> logits, softmax;
};

inline CompactIndexerGeometry thd_geometry(const IndexerProblem& p, IndexerPrecision precision,
                                           int rows_per_pass = 0) {
  CompactIndexerGeometry g;
  g.format = QkvFormat::thd;
  g.batch = p.segments();
  g.q_rows = p.rows();
  g.k_rows = p.key_rows();
  g.max_seqlen_q = p.max_len(p.cu_q);
  g.max_seqlen_k = p.max_len(p.cu_k);
  g.heads = p.H;
  g.head_dim = p.D;
  g.topk = p.K;
  g.ratio = p.r;
  g.causal_offsets = !p.offsets.empty();
  g.precision = precision;
  g.rows_per_pass = rows_per_pass;
  return g;
}

// Runs ops::compact_indexer_topk (THD) with f32 (or bf16) operand views; `ws` reused if given.
inline IndexerResult run_compact(const IndexerProblem& p, const CompactIndexerPlan& plan,
                                 HostWorkspace* ws = nullptr, bool bf16_inputs = false) {
  const std::int64_t T = p.rows(), Tk = p.key_rows();
  const int n = p.segments() + 1;
  IndexerResult r;
  r.idx.assign(static_cast<std::size_t>(T * p.K), 12345);
  r.logits.assign(static_cast<std::size_t>(T * p.K), 12345.0f);
  r.softmax.assign(static_cast<std::size_t>(T * p.K), 12345.0f);
  std::vector<std::uint16_t> qb, kb, wb;
  ops::CompactIndexerInputs in;
  if (bf16_inputs) {
    for (float v : p.q) qb.push_back(float_to_bf16_bits(v));
    for (float v : p.k) kb.push_back(float_to_bf16_bits(v));
    for (float v : p.w) wb.push_back(float_to_bf16_bits(v));
    in.q = {qb.data(), DType::bf16, {T, p.H, p.D}};
    in.k = {kb.data(), DType::bf16, {Tk, p.D}};
    in.weights = {wb.data(), DType::bf16, {T, p.H}};
  } else {
    in.q = {p.q.data(), DType::f32, {T, p.H, p.D}};
    in.k = {p.k.data(), DType::f32, {Tk, p.D}};
    in.weights = {p.w.data(), DType::f32, {T, p.H}};
  }
  in.cu_seqlens_q = {p.cu_q.data(), DType::i32, {n}};
  in.cu_seqlens_k = {p.cu_k.data(), DType::i32, {n}};
  if (!p.offsets.empty()) in.q_causal_offsets = {p.offsets.data(), DType::i32, {n - 1}};
  ops::CompactIndexerOutputs out;
  out.indices = {r.idx.data(), DType::i32, {T, p.K}};
  out.logits = {r.logits.data(), DType::f32, {T, p.K}};
  out.softmax = {r.softmax.data(), DType::f32, {T, p.K}};
  HostWorkspace own(ws ? 0 : workspace_bytes(plan));
  ops::compact_indexer_topk(plan, in, out, ws ? ws->view() : own.view());
  return r;
}

inline IndexerResult run_compact(const IndexerProblem& p,
                                 IndexerPrecision precision = IndexerPrecision::bf16,
                                 int rows_per_pass = 0) {
  return run_compact(p, CompactIndexerPlan::make(thd_geometry(p, precision, rows_per_pass)));
}

// Visible keys of global row t.
inline int visible(const IndexerProblem& p, std::int64_t t, int* segment = nullptr) {
  int b = 0;
  while (p.cu_q[b + 1] <= t) ++b;
  if (segment) *segment = b;
  const int o = p.offsets.empty() ? 0 : p.offsets[b];
  return std::clamp(static_cast<int>((o + (t - p.cu_q[b]) + 1) / p.r), 0, p.cu_k[b + 1] - p.cu_k[b]);
}

// The dense reference: scores of every key of the segment in fp32 (sequential sums), -inf
// for the invisible ones; stable sort by score, descending; the first min(K, n) ascending.
struct DenseRow {
  std::vector<float> scores;    // [segment keys], -inf beyond n
  std::vector<std::int32_t> topk;  // ascending, min(K, n) entries
};
inline DenseRow dense_reference_row(const IndexerProblem& p, std::int64_t t) {
  int b = 0;
  const int n = visible(p, t, &b);
  const int len_k = p.cu_k[b + 1] - p.cu_k[b];
  DenseRow row;
  row.scores.assign(static_cast<std::size_t>(len_k), -INFINITY);
  for (int j = 0; j < n; ++j) {
    float s = 0.0f;
    for (int h = 0; h < p.H; ++h) {
      float dot = 0.0f;
      for (int d = 0; d < p.D; ++d)
        dot += p.q[(static_cast<std::size_t>(t) * p.H + h) * p.D + d] *
               p.k[static_cast<std::size_t>(p.cu_k[b] + j) * p.D + d];
      s += p.w[static_cast<std::size_t>(t) * p.H + h] * std::max(dot, 0.0f);
    }
    row.scores[static_cast<std::size_t>(j)] = s;
  }
  std::vector<std::int32_t> order(static_cast<std::size_t>(len_k));
  for (int j = 0; j < len_k; ++j) order[static_cast<std::size_t>(j)] = j;
  std::stable_sort(order.begin(), order.end(), [&](int a, int c) {
    return row.scores[static_cast<std::size_t>(a)] > row.scores[static_cast<std::size_t>(c)];
  });
  order.resize(static_cast<std::size_t>(std::min(p.K, n)));
  std::sort(order.begin(), order.end());
  row.topk = order;
  return row;
}

}  // namespace csattn::testing_util
