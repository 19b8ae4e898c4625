// safetensors reader and writer. Files come from outside, so every header field is checked
// before it is used, and every error names the file (and the tensor, when there is one).
#include "csattn/safetensors.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "csattn/error.hpp"

namespace csattn {
namespace {

using nlohmann::json;

// The safetensors reference implementation refuses headers above 100 MB; a larger length
// field is a corrupt file, not a real header.
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr const char* kMetadataKey = "__metadata__";

[[noreturn]] void fail_file(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::Io, "safetensors file '" + path + "': " + what);
}

[[noreturn]] void fail_tensor(const std::string& path, const std::string& name,
                              const std::string& what) {
  fail_file(path, "tensor '" + name + "': " + what);
}

std::optional<DType> dtype_from_file(const std::string& s) {
  if (s == "F32") return DType::f32;
  if (s == "F64") return DType::f64;
  if (s == "BF16") return DType::bf16;
  if (s == "F16") return DType::f16;
  if (s == "I32") return DType::i32;
  if (s == "I64") return DType::i64;
  if (s == "F8_E4M3") return DType::e4m3;
  // safetensors has no standard E8M0 name in older readers; we write U8 and accept both.
  if (s == "F8_E8M0" || s == "U8") return DType::e8m0;
  return std::nullopt;
}

const char* dtype_to_file(DType dt) {
  switch (dt) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::e4m3: return "F8_E4M3";
    case DType::e8m0: return "U8";
  }
  throw Error(ErrorKind::Internal, "safetensors: invalid DType value");
}

std::uint64_t read_u64_le(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string parse_dtype(const std::string& path, const std::string& name, const json& e) {
  const auto it = e.find("dtype");
  if (it == e.end() || !it->is_string()) fail_tensor(path, name, "missing string field 'dtype'");
  return it->get<std::string>();
}

[[noreturn]] void fail_unknown_dtype(const std::string& path, const SafetensorsReader::Entry& e) {
  fail_tensor(path, e.name,
              "unknown dtype '" + e.file_dtype +
                  "' (supported: F32, F64, BF16, F16, I32, I64, F8_E4M3, F8_E8M0, U8)");
}

Shape parse_shape(const std::string& path, const std::string& name, const json& e) {
  const auto it = e.find("shape");
  if (it == e.end() || !it->is_array()) fail_tensor(path, name, "missing array field 'shape'");
  Shape shape;
  for (const json& d : *it) {
    // The parser stores non-negative integers as unsigned, negative ones as signed.
    if (!d.is_number_unsigned()) {
      fail_tensor(path, name, "shape " + it->dump() + " must hold non-negative integers");
    }
    if (d.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
      fail_tensor(path, name, "shape " + it->dump() + " has a dimension above int64");
    }
    shape.push_back(d.get<std::int64_t>());
  }
  return shape;
}

std::pair<std::uint64_t, std::uint64_t> parse_offsets(const std::string& path,
                                                      const std::string& name, const json& e) {
  const auto it = e.find("data_offsets");
  if (it == e.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_number_unsigned() ||
      !(*it)[1].is_number_unsigned()) {
    fail_tensor(path, name, "'data_offsets' must be two non-negative integers [begin, end]");
  }
  return {(*it)[0].get<std::uint64_t>(), (*it)[1].get<std::uint64_t>()};
}

// An entry of a dtype csattn does not know (a checkpoint's packed FP4 experts, ...) keeps
// its dtype text and fails only when it is read: a layer can be loaded from a shard that
// holds such tensors beside it.
SafetensorsReader::Entry parse_entry(const std::string& path, const std::string& name,
                                     const json& e, std::uint64_t data_bytes) {
  if (!e.is_object()) fail_tensor(path, name, "header entry is not a JSON object");
  SafetensorsReader::Entry out;
  out.name = name;
  out.file_dtype = parse_dtype(path, name, e);
  out.dtype = dtype_from_file(out.file_dtype);
  out.shape = parse_shape(path, name, e);
  std::tie(out.begin, out.end) = parse_offsets(path, name, e);
  const std::string range =
      "data_offsets [" + std::to_string(out.begin) + ", " + std::to_string(out.end) + "]";
  if (out.begin > out.end) fail_tensor(path, name, range + " has begin > end");
  if (out.end > data_bytes) {
    fail_tensor(path, name,
                range + " exceed the data section (" + std::to_string(data_bytes) +
                    " bytes; file truncated?)");
  }
  std::int64_t numel = 0;
  try {
    numel = shape_numel(out.shape);
  } catch (const Error& err) {
    fail_tensor(path, name, err.what());
  }
  if (!out.dtype) return out;  // its size is unknown: checked when read (never)
  const std::uint64_t size = dtype_size(*out.dtype);
  // Compare numel with the range before multiplying so a huge shape cannot overflow.
  const std::uint64_t span = out.end - out.begin;
  if (static_cast<std::uint64_t>(numel) > span / size ||
      static_cast<std::uint64_t>(numel) * size != span) {
    fail_tensor(path, name,
                range + " span " + std::to_string(span) + " bytes but shape " +
                    shape_str(out.shape) + " of " + dtype_name(*out.dtype) + " needs " +
                    std::to_string(static_cast<std::uint64_t>(numel)) + " x " +
                    std::to_string(size) + " bytes");
  }
  return out;
}

void check_no_overlap(const std::string& path, std::vector<SafetensorsReader::Entry> entries) {
  using Entry = SafetensorsReader::Entry;
  // Empty tensors occupy no bytes and cannot overlap anything.
  std::erase_if(entries, [](const Entry& e) { return e.begin == e.end; });
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].begin < entries[i - 1].end) {
      fail_tensor(path, entries[i].name,
                  "data overlaps tensor '" + entries[i - 1].name + "' (bytes " +
                      std::to_string(entries[i].begin) + " < " +
                      std::to_string(entries[i - 1].end) + ")");
    }
  }
}

json parse_header_json(const std::string& path, const std::string& text) {
  json header;
  try {
    header = json::parse(text);
  } catch (const json::parse_error& e) {
    fail_file(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail_file(path, "header is not a JSON object");
  if (header.contains(kMetadataKey) && !header.at(kMetadataKey).is_object()) {
    fail_file(path, "'__metadata__' is not a JSON object");
  }
  return header;
}

}  // namespace

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path_, ec)) fail_file(path_, "no such file");
  const std::uint64_t file_bytes = std::filesystem::file_size(path_, ec);
  if (ec) fail_file(path_, "cannot get the file size: " + ec.message());
  in_ = std::make_unique<std::ifstream>(path_, std::ios::binary);
  std::ifstream& in = *in_;
  if (!in) fail_file(path_, "cannot open for reading");
  if (file_bytes < 8) {
    fail_file(path_, "file has " + std::to_string(file_bytes) +
                         " bytes, fewer than the 8-byte header length");
  }

  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  const std::uint64_t header_bytes = read_u64_le(len_bytes);
  if (header_bytes > kMaxHeaderBytes) {
    fail_file(path_, "header length " + std::to_string(header_bytes) +
                         " is implausibly large (corrupt file?)");
  }
  if (header_bytes > file_bytes - 8) {
    fail_file(path_, "header length " + std::to_string(header_bytes) + " exceeds the " +
                         std::to_string(file_bytes - 8) +
                         " bytes after the length field (file truncated?)");
  }
  std::string header_text(header_bytes, '\0');
  in.read(header_text.data(), static_cast<std::streamsize>(header_bytes));
  if (!in) fail_file(path_, "cannot read the header");

  const json header = parse_header_json(path_, header_text);
  data_start_ = 8 + header_bytes;
  const std::uint64_t data_bytes = file_bytes - data_start_;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) continue;
    entries.push_back(parse_entry(path_, name, value, data_bytes));
  }
  check_no_overlap(path_, entries);
  for (Entry& e : entries) entries_.emplace(e.name, std::move(e));
}

SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) fail_tensor(path_, name, "no such tensor in the file");
  return it->second;
}

Tensor SafetensorsReader::read(const std::string& name) const {
  const Entry& e = entry(name);
  if (!e.dtype) fail_unknown_dtype(path_, e);
  // Straight into the tensor's buffer: no copy of the file in memory.
  Tensor t(*e.dtype, e.shape);
  in_->clear();
  in_->seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  in_->read(static_cast<char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
  if (!*in_) fail_tensor(path_, e.name, "cannot read its data");
  return t;
}

TensorMap load_safetensors(const std::string& path) {
  const SafetensorsReader file(path);
  TensorMap out;
  for (const auto& [name, e] : file.entries()) {
    if (!e.dtype) fail_unknown_dtype(path, e);
  }
  for (const auto& [name, e] : file.entries()) out.emplace(name, file.read(name));
  return out;
}

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {  // std::map: name order
    if (name.empty() || name == kMetadataKey) {
      fail_tensor(path, name, "is not a valid tensor name");
    }
    if (t.empty() && t.shape().empty()) {
      fail_tensor(path, name, "is a default-constructed tensor with no shape and no data");
    }
    const auto expected = static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
    if (t.nbytes() != expected) {
      fail_tensor(path, name,
                  "holds " + std::to_string(t.nbytes()) + " bytes but shape " +
                      shape_str(t.shape()) + " of " + dtype_name(t.dtype()) + " needs " +
                      std::to_string(expected) + " (default-constructed tensor?)");
    }
    header[name] = {{"dtype", dtype_to_file(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;

  // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned.
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail_file(path, "cannot open for writing");
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  out.write(reinterpret_cast<const char*>(len_bytes), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, t] : tensors) {
    out.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
  }
  out.close();
  if (!out) fail_file(path, "write failed (disk full or permission denied?)");
}

}  // namespace csattn
