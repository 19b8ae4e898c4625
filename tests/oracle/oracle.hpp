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

namespace csattn::oracle {

// Parameters by release name ("attn.wq_a.weight", ...), row-major, in double.
using Weights64 = std::map<std::string, std::vector<double>>;

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

}  // namespace csattn::oracle
