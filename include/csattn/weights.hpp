// LayerWeights: the parameters of one attention layer under the DeepSeek-V4 release names
// (`attn.wq_a.weight`, ...), held as f32 host tensors; safetensors load and save.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "csattn/checkpoint.hpp"
#include "csattn/config.hpp"
#include "csattn/tensor.hpp"

namespace csattn {

// Who trains a parameter: the main loss (main), or only the indexer loss (indexer).
enum class ParamGroup { main, indexer };

struct ParamInfo {
  std::string name;  // release name, e.g. "attn.compressor.ape"
  Shape shape;
  DType file_dtype;  // bf16, except fp32 for ape and attn_sink
  ParamGroup group;
};

// The parameters a layer of this config has, in a fixed order.
std::vector<ParamInfo> layer_params(const AttentionConfig& cfg);

class LayerWeights {
 public:
  LayerWeights() = default;

  // Random weights from a seed (values rounded to the file dtype, so a save/load round trip
  // is exact). Scales keep activations O(1) at any preset.
  static LayerWeights random(const AttentionConfig& cfg, std::uint64_t seed);
  // All-zero weights with the right shapes (used for gradients).
  static LayerWeights zeros(const AttentionConfig& cfg);

  // Load one layer. A file with `attn.*` names is one layer; a checkpoint with
  // `layers.N.attn.*` names needs `layer` = N (or CheckpointLayer::mtp_module(K) for the
  // release's `mtp.K.attn.*`). `path` is a safetensors file or a sharded
  // checkpoint (a directory with model.safetensors.index.json, or that index: see
  // checkpoint.hpp); only the layer's tensors are read. A bf16 linear weight may be stored
  // as the DeepSeek-V4 release stores it - F8_E4M3 with a `.scale` per 128 x 128 block - and
  // is dequantized (block_fp8.hpp). Every missing, extra or mis-shaped tensor, wrong dtype,
  // missing or mis-shaped block scale or truncated file is a csattn::Error naming the tensor.
  static LayerWeights load(const std::string& path, const AttentionConfig& cfg,
                           std::optional<CheckpointLayer> layer = std::nullopt);
  // The same from an opened checkpoint (several layers without reopening its shards).
  static LayerWeights load(const Checkpoint& ckpt, const AttentionConfig& cfg,
                           std::optional<CheckpointLayer> layer = std::nullopt);
  void save(const std::string& path) const;

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const Tensor& get(const std::string& name) const;
  Tensor& get(const std::string& name);
  const float* f32(const std::string& name) const { return get(name).ptr<float>(); }
  float* f32(const std::string& name) { return get(name).ptr<float>(); }
  const std::vector<ParamInfo>& params() const { return params_; }
  const AttentionConfig& config() const { return cfg_; }

  // Checks names, shapes and dtypes against the config (throws csattn::Error).
  void check(const AttentionConfig& cfg) const;

 private:
  AttentionConfig cfg_;
  std::vector<ParamInfo> params_;
  std::map<std::string, Tensor> tensors_;  // always f32 in memory
};

}  // namespace csattn
