// HybridAttentionLayer: one DeepSeek-V4 attention layer (SWA, CSA or HCA), forward and
// backward, from hidden states to output, with the indexer KL loss for CSA layers.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "csattn/config.hpp"
#include "csattn/layout.hpp"
#include "csattn/tensor.hpp"
#include "csattn/weights.hpp"

namespace csattn {

// bf16: tensors between operators are rounded to bf16 at the points the GPU path rounds
// them (docs/numerics.md), with fp32 accumulation. fp32: everything stays fp32.
enum class Precision { bf16, fp32 };
const char* precision_name(Precision p);

struct RunOptions {
  Precision precision = Precision::bf16;
  Device device = Device::cpu;
  int threads = 0;  // 0 = OpenMP default
  // Tests: fill device workspaces with NaN bytes before every run, so a value no kernel
  // wrote shows up.
  bool poison_workspace = false;
  // The GPU backward with fixed-order reductions instead of atomics: repeated runs give
  // bitwise-equal gradients, at some speed cost. The CPU backend is always deterministic.
  bool deterministic = false;
};

struct SavedActivations;  // backend-private state kept for backward
namespace cuda { class CudaLayer; }

// True when this build has the CUDA backend and a CUDA device is usable; otherwise `why`
// (if given) says what is missing.
bool cuda_available(std::string* why = nullptr);

struct LayerOutputs {
  Tensor output;          // [T, d_model] f32 (bf16-valued in bf16 mode)
  Tensor topk_indices;    // CSA: [T, index_topk] i32, segment-local compressed ids, -1 padded,
                          // ascending within a row; empty for SWA / HCA
  float indexer_loss = 0.0f;  // lambda * KL (CSA), 0 otherwise
  std::shared_ptr<const SavedActivations> saved;
};

struct LayerGradients {
  Tensor grad_input;                    // [T, d_model] f32
  std::map<std::string, Tensor> grad;  // one per parameter, by release name, f32
};

class HybridAttentionLayer {
 public:
  HybridAttentionLayer(AttentionConfig cfg, LayerWeights weights, RunOptions options = {});

  // x: [T, d_model] (any float dtype). Throws csattn::Error on a bad shape or layout.
  LayerOutputs forward(const Tensor& x, const SeqLayout& layout) const;
  // The same with a caller-supplied CSA selection ([T, index_topk] i32, segment-local ids
  // or -1) instead of the indexer's top-k: for tests and for comparing attention on one
  // selection across backends. The indexer loss then uses this selection too.
  LayerOutputs forward(const Tensor& x, const SeqLayout& layout, const Tensor& topk) const;

  // Upstream gradients: grad_output for the output, grad_indexer_loss for the indexer loss.
  // Indexer parameters are trained only by the indexer loss; with loss_coeff = 0 their
  // gradients are exact zeros.
  LayerGradients backward(const LayerOutputs& fwd, const Tensor& grad_output,
                          float grad_indexer_loss = 1.0f) const;

  const AttentionConfig& config() const { return cfg_; }
  const LayerWeights& weights() const { return weights_; }
  const RunOptions& options() const { return options_; }

 private:
  AttentionConfig cfg_;
  LayerWeights weights_;
  RunOptions options_;
  std::shared_ptr<cuda::CudaLayer> cuda_;  // device state when options_.device == cuda
};

}  // namespace csattn
