// A small safetensors reader and writer (the format: 8-byte little-endian header length,
// a JSON header of {name: {dtype, shape, data_offsets}} plus optional __metadata__, then
// the raw little-endian data).
#pragma once
#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "csattn/tensor.hpp"

namespace csattn {

using TensorMap = std::map<std::string, Tensor>;

// One file opened for selective reads: the header is parsed and every entry checked at
// construction (the same errors as load_safetensors), the data is read tensor by tensor on
// request - loading one layer from a multi-GB checkpoint shard reads that layer's bytes only.
// An entry of a dtype csattn does not know (packed FP4 experts stored as I8, ...) is listed
// and fails only when read.
class SafetensorsReader {
 public:
  struct Entry {
    std::string name;
    std::string file_dtype;      // as the header spells it ("BF16", "F8_E4M3", "I8", ...)
    std::optional<DType> dtype;  // empty for a dtype csattn does not read
    Shape shape;
    std::uint64_t begin = 0, end = 0;  // bytes, relative to the data section
  };

  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;

  const std::string& path() const { return path_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const Entry& entry(const std::string& name) const;  // throws Io for an unknown name
  const std::map<std::string, Entry>& entries() const { return entries_; }
  Tensor read(const std::string& name) const;  // not thread-safe (one stream)

 private:
  std::string path_;
  std::map<std::string, Entry> entries_;
  std::uint64_t data_start_ = 0;
  std::unique_ptr<std::ifstream> in_;
};

// Reads every tensor. Throws csattn::Error (ErrorKind::Io) for a missing file, a truncated
// file, a malformed header, overlapping or out-of-range offsets, or an unknown dtype; the
// message names the file and the tensor.
TensorMap load_safetensors(const std::string& path);

// Writes tensors in name order (optionally with string metadata).
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace csattn
