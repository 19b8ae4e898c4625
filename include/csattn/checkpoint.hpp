// A checkpoint to read tensors from by name, without reading the rest: one safetensors file,
// or the Hugging Face sharded layout that the DeepSeek-V4 release uses - a directory holding
// model.safetensors.index.json (whose "weight_map" names each tensor's shard), that index
// file itself, or a directory with exactly one .safetensors file.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "csattn/safetensors.hpp"
#include "csattn/tensor.hpp"

namespace csattn {

// "layers.12.attn.wkv.weight" -> 12: the layer of a tensor in a multi-layer checkpoint's
// attention (nullopt for any other name: embeddings, ffn, mtp, ...).
std::optional<int> attention_layer_of(const std::string& name);

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
