// The `csattn run` job: forward (+ backward) of every planned layer, the fp64-oracle check
// on sampled rows, and the optional --save file.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "csattn/config.hpp"
#include "csattn/layer.hpp"
#include "csattn/layout.hpp"
#include "csattn/weights.hpp"
#include "csattn/safetensors.hpp"
#include "run_options.hpp"

namespace csattn::cli {

struct OracleCheck {
  int rows = 0;                  // rows compared (0 = check disabled)
  double max_abs_diff = 0.0;     // max |backend - oracle| over those rows
  double max_abs_ref = 0.0;      // max |oracle| over those rows (the scale)
  double rel_diff() const { return max_abs_ref > 0.0 ? max_abs_diff / max_abs_ref : max_abs_diff; }
  // CSA: fraction of the sampled rows whose unforced oracle top-k equals the backend's;
  // negative when not applicable.
  double topk_match = -1.0;
  double ms = 0.0;
};

struct LayerResult {
  int index = 0;
  CheckpointLayer layer{0};  // LayerSpec::layer
  int compress_ratio = 0;
  LayerKind kind = LayerKind::swa;
  std::int64_t tokens = 0;
  double forward_ms = 0.0;
  double backward_ms = -1.0;  // negative: backward not run
  double indexer_loss = 0.0;
  double output_norm = 0.0;
  double grad_input_norm = -1.0;    // negative: backward not run
  double grad_weights_norm = -1.0;  // over every weight gradient
  OracleCheck check;
};

struct RunReport {
  std::vector<LayerResult> layers;
  double total_ms = 0.0;
};

// The rows compared with the oracle: the first and last real row of every segment, then
// rows spread evenly over the real rows, n in all (fewer when the batch is smaller).
// Deterministic, ascending.
std::vector<int> sample_rows(const SeqLayout& layout, int n);

RunReport run_job(RunPlan& plan);

// The fp64-oracle check of one layer's forward on the sampled rows of plan.layout (fwd needs
// output and, for CSA, topk_indices over every row of the batch).
OracleCheck check_with_oracle(const AttentionConfig& cfg, const RunPlan& plan,
                              const LayerWeights& weights, const std::vector<double>& x64,
                              const LayerOutputs& fwd);
// The string metadata of a --save file.
std::map<std::string, std::string> save_metadata(const RunPlan& plan);

// One layer's results (global rows): their norms into `res` and, with --save, its tensors
// into `saved` (prefixed `layers.N.` / `mtp.K.` - the checkpoint's name - when several layers run). Shared by the
// single-rank job and the context-parallel one. grad_input / grads are null without backward.
void record_layer(const RunPlan& plan, const LayerSpec& spec, const LayerOutputs& out,
                  const Tensor* grad_input, const std::map<std::string, Tensor>* grads,
                  LayerResult& res, TensorMap& saved);

}  // namespace csattn::cli
