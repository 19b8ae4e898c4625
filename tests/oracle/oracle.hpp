// The naive fp64 oracle: the DeepSeek-V4 attention layer written straight from the
// equations of shared/spec/01-attention-math.md, in double precision, with plain loops and
// no shared code with the optimized backends (only the config, layout and parameter names).
// It is the reference the CPU (and later CUDA) backends are compared with, and finite
// differences of it are the reference for every gradient.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "csattn/config.hpp"
#include "csattn/layout.hpp"
#include "csattn/weights.hpp"

namespace csattn::oracle {

// Parameters by release name ("attn.wq_a.weight", ...), row-major, in double.
using Weights64 = std::map<std::string, std::vector<double>>;
// A layer's weights in that form (every parameter of layer_params, widened from f32).
Weights64 weights64(const LayerWeights& w);

struct Result {
  std::vector<double> output;      // [T, d_model]
  std::vector<std::int32_t> topk;  // CSA: [T, K] segment-local ids, ascending, -1 padded
  double indexer_loss = 0.0;       // lambda * reduced KL (CSA), else 0
  // Index scores I[t, j] for visible j (CSA), row-major per row: scores[t] has
  // floor((t+1)/4) clamped to N_c entries. For tests of the top-k.
  std::vector<std::vector<double>> index_scores;
};

struct Options {
  // CSA only, [T, K]: replaces the oracle's own selection (rows may hold -1). The
  // finite-difference tests use it so that a perturbation cannot flip a selection, and
  // bf16 comparisons use it to compare attention on the backend's selection.
  const std::vector<std::int32_t>* forced_topk = nullptr;
  // When set, only these query rows are computed (output, topk, index_scores of other rows
  // are NaN / -1 / empty) and indexer_loss is NaN. Keys are always computed for all rows.
  // Lets `csattn run` check sampled rows of large presets cheaply.
  const std::vector<int>* query_rows = nullptr;
};

// x: [T, d_model] row-major.
Result forward(const AttentionConfig& cfg, const SeqLayout& layout, const Weights64& w,
               const std::vector<double>& x, const Options& options = {});

// The indexer scores and top-k of one packed batch in fp64, from given operands (spec 03 §1):
// for query row t of segment b (local position p, causal offset o_b) and key j < n(p) =
// clamp((o_b + p + 1) div r, 0, len_k(b)):
//   S(t, j) = sm_scale * sum_h w[t, h] * max(q[t, h, :] . k[cu_k[b] + j, :], 0),
// and the min(K, n) largest, ties toward the smallest index, ascending. The reference the
// compact indexer is gated against (MXFP8: run on the dequantized q and k).
struct IndexerTopk {
  std::vector<std::vector<double>> scores;  // [T][n(t)]
  std::vector<std::vector<int>> topk;       // [T][min(K, n(t))], ascending
};
IndexerTopk indexer_topk(const std::vector<double>& q,  // [T, H, D]
                         const std::vector<double>& k,  // [T_k, D]
                         const std::vector<double>& w,  // [T, H]
                         int heads, int dim, const std::vector<int>& cu_q,
                         const std::vector<int>& cu_k,
                         const std::vector<int>& offsets,  // [B] or empty
                         int ratio, int topk, double sm_scale = 1.0);

}  // namespace csattn::oracle
