// A checkpoint to read tensors from by name, without reading the rest: one safetensors file,
// or the Hugging Face sharded layout that the DeepSeek-V4 release uses - a directory holding
// model.safetensors.index.json (whose "weight_map" names each tensor's shard), that index
// file itself, or a directory with exactly one .safetensors file.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "csattn/config.hpp"
#include "csattn/safetensors.hpp"
#include "csattn/tensor.hpp"

namespace csattn {

// One attention layer of a multi-layer checkpoint: `layers.N.attn.*` of the main stack, or
// `mtp.K.attn.*` of the release's K-th multi-token-prediction module.
// A bare int converts to `layers.N` (so LayerWeights::load(path, cfg, 3) reads layers.3.*);
// the model's layer index - a position in compress_ratios, which may be an MTP module's - is
// another number: checkpoint_layer_of maps it.
struct CheckpointLayer {
  bool mtp = false;
  int index = 0;  // N, or K for an MTP module

  CheckpointLayer(int main_layer) : index(main_layer) {}  // NOLINT(google-explicit-constructor)
  CheckpointLayer(bool) = delete;  // load(path, cfg, true) is a bug, not layers.1
  static CheckpointLayer mtp_module(int k) {
    CheckpointLayer l(k);
    l.mtp = true;
    return l;
  }
  // "12" or "layers.12" -> layer 12; "mtp.0" -> MTP module 0 (decimal, at most six digits,
  // no leading zeros). Throws InvalidArgument (naming `what`, e.g. "--layer") otherwise.
  static CheckpointLayer parse(const std::string& text, const std::string& what);
  std::string prefix() const;  // "layers.12" / "mtp.0": the names' prefix before ".attn."
  std::string label() const;   // "12" / "mtp.0": how tables and messages show it
  auto operator<=>(const CheckpointLayer&) const = default;
};

// "layers.12.attn.wkv.weight" -> layer 12, "mtp.0.attn.wkv.weight" -> MTP module 0: the layer
// of a tensor of a multi-layer checkpoint's attention (nullopt for any other name:
// embeddings, ffn, the MTP module's own projections, ...).
std::optional<CheckpointLayer> attention_layer_of(const std::string& name);

// The model's layer `index` (its position in compress_ratios) as the checkpoint names it, and
// back. DeepSeek-V4's config lists one ratio per main layer, then one per MTP module (Flash:
// 43 + 1 = 44), so with num_hidden_layers = M, index M + K is mtp.K; with M = 0 (unknown)
// every index is a main layer. model_layer_index is nullopt where the config has no entry
// for the layer (or, for an MTP module, does not give M).
CheckpointLayer checkpoint_layer_of(const ModelConfig& model, int index);
std::optional<int> model_layer_index(const ModelConfig& model, const CheckpointLayer& layer);

// The config.json that comes with a checkpoint in the Hugging Face layout: <dir>/config.json
// for a checkpoint directory or for an index file's directory; "" when there is none.
std::string checkpoint_config_file(const std::string& path);

class Checkpoint {
 public:
  // Throws csattn::Error (ErrorKind::Io) for a missing path, a malformed index, or a
  // directory that is neither layout; the message says which layouts are read.
  static Checkpoint open(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // every tensor, in name order
  bool contains(const std::string& name) const { return shard_of_.count(name) != 0; }
  // The tensor's header entry (dtype, shape), opening its shard on first use. Throws Io for
  // an unknown name, a missing shard, or a shard that does not hold what the index says.
  const SafetensorsReader::Entry& entry(const std::string& name) const;
  Tensor read(const std::string& name) const;
  // The file a tensor lives in (for messages).
  const std::string& file_of(const std::string& name) const;

 private:
  const SafetensorsReader& shard(const std::string& name) const;

  std::string path_;
  std::map<std::string, std::string> shard_of_;          // tensor -> file
  mutable std::map<std::string, SafetensorsReader> open_;  // file -> reader, opened lazily
};

}  // namespace csattn
