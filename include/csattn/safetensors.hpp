// A small safetensors reader and writer (the format: 8-byte little-endian header length,
// a JSON header of {name: {dtype, shape, data_offsets}} plus optional __metadata__, then
// the raw little-endian data).
#pragma once
#include <map>
#include <string>

#include "csattn/tensor.hpp"

namespace csattn {

using TensorMap = std::map<std::string, Tensor>;

// Reads every tensor. Throws csattn::Error (ErrorKind::Io) for a missing file, a truncated
// file, a malformed header, overlapping or out-of-range offsets, or an unknown dtype; the
// message names the file and the tensor.
TensorMap load_safetensors(const std::string& path);

// Writes tensors in name order (optionally with string metadata).
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace csattn
