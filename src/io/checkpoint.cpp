// Checkpoint: tensor names -> the safetensors files that hold them. An index is a file from
// outside like the shards: every field is checked, every error names the index (and the
// tensor and shard where there is one).
#include "csattn/checkpoint.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "csattn/error.hpp"

namespace csattn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::Io, "checkpoint '" + path + "': " + what);
}

std::map<std::string, std::string> read_index(const std::string& index_path) {
  std::ifstream in(index_path);
  if (!in) fail(index_path, "cannot open the index for reading");
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::parse_error& e) {
    fail(index_path, std::string("the index is not valid JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object())
    fail(index_path, "the index has no \"weight_map\" object (tensor name -> shard file)");
  const fs::path dir = fs::path(index_path).parent_path();
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : j.at("weight_map").items()) {
    if (!file.is_string() || file.get<std::string>().empty())
      fail(index_path, "weight_map[\"" + name + "\"] is not a shard file name");
    const fs::path shard(file.get<std::string>());
    bool leaves = shard.is_absolute();
    for (const fs::path& part : shard) leaves |= part == "..";
    if (leaves)
      fail(index_path, "weight_map[\"" + name + "\"] = '" + shard.string() +
                           "' leaves the index's directory; shards are named relative to it");
    out.emplace(name, (dir / shard).string());
  }
  return out;
}

}  // namespace

namespace {

// A decimal layer number of at most six digits at text[pos, end), without leading zeros (so
// that "043" is not quietly 43); nullopt otherwise.
std::optional<int> layer_number(const std::string& text, std::size_t pos, std::size_t end) {
  if (end <= pos || end - pos > 6 || (end - pos > 1 && text[pos] == '0')) return std::nullopt;
  for (std::size_t i = pos; i < end; ++i)
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
  return std::stoi(text.substr(pos, end - pos));
}

// "layers.12<rest>" / "mtp.0<rest>": the layer and where <rest> starts.
std::optional<std::pair<CheckpointLayer, std::size_t>> leading_layer(const std::string& text) {
  for (const bool mtp : {false, true}) {
    const std::string stack = mtp ? "mtp." : "layers.";
    if (text.rfind(stack, 0) != 0) continue;
    std::size_t end = text.find('.', stack.size());
    if (end == std::string::npos) end = text.size();
    const std::optional<int> n = layer_number(text, stack.size(), end);
    if (!n) return std::nullopt;
    return std::pair{mtp ? CheckpointLayer::mtp_module(*n) : CheckpointLayer(*n), end};
  }
  return std::nullopt;
}

}  // namespace

CheckpointLayer CheckpointLayer::parse(const std::string& text, const std::string& what) {
  if (const std::optional<int> n = layer_number(text, 0, text.size())) return CheckpointLayer(*n);
  if (const auto l = leading_layer(text); l && l->second == text.size()) return l->first;
  throw Error(ErrorKind::InvalidArgument,
              what + ": '" + text + "' is not a layer: expected N, layers.N or mtp.K (K-th "
                     "multi-token-prediction module)");
}

std::string CheckpointLayer::prefix() const {
  return (mtp ? "mtp." : "layers.") + std::to_string(index);
}

std::string CheckpointLayer::label() const { return mtp ? prefix() : std::to_string(index); }

std::optional<CheckpointLayer> attention_layer_of(const std::string& name) {
  const auto l = leading_layer(name);
  if (!l || name.compare(l->second, 6, ".attn.") != 0) return std::nullopt;
  return l->first;
}

CheckpointLayer checkpoint_layer_of(const ModelConfig& model, int index) {
  const int m = model.num_hidden_layers;
  return m > 0 && index >= m ? CheckpointLayer::mtp_module(index - m) : CheckpointLayer(index);
}

std::optional<int> model_layer_index(const ModelConfig& model, const CheckpointLayer& layer) {
  const int m = model.num_hidden_layers;
  const int n = static_cast<int>(model.compress_ratios.size());
  if (layer.index < 0 || (layer.mtp && m == 0)) return std::nullopt;
  if (layer.mtp) return layer.index < n - m ? std::optional<int>(m + layer.index) : std::nullopt;
  // layers.N past the main layers would be an MTP module's entry.
  return layer.index < (m > 0 ? m : n) ? std::optional<int>(layer.index) : std::nullopt;
}

std::string checkpoint_config_file(const std::string& path) {
  std::error_code ec;
  fs::path dir;
  if (fs::is_directory(path, ec)) dir = path;
  else if (fs::path(path).filename().string().ends_with(".index.json")) dir = fs::path(path).parent_path();
  else return "";
  const fs::path cfg = dir / "config.json";
  return fs::is_regular_file(cfg, ec) ? cfg.string() : "";
}

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  c.path_ = path;
  std::error_code ec;
  std::string single;  // a one-file checkpoint
  if (fs::is_directory(path, ec)) {
    const fs::path index = fs::path(path) / kIndexName;
    if (fs::is_regular_file(index, ec)) {
      c.shard_of_ = read_index(index.string());
      return c;
    }
    std::vector<std::string> files;
    fs::directory_iterator it(path, ec);
    for (; !ec && it != fs::directory_iterator(); it.increment(ec))
      if (it->is_regular_file(ec) && it->path().extension() == ".safetensors")
        files.push_back(it->path().string());
    if (ec) fail(path, "cannot list the directory: " + ec.message());
    if (files.size() != 1)
      fail(path, "a directory is read through its " + std::string(kIndexName) +
                     " (the sharded Hugging Face layout) or its one .safetensors file; it has no "
                     "index and " + std::to_string(files.size()) + " .safetensors files");
    single = files[0];
  } else if (fs::is_regular_file(path, ec)) {
    if (fs::path(path).filename().string().ends_with(".index.json")) {
      c.shard_of_ = read_index(path);
      return c;
    }
    single = path;
  } else {
    fail(path, "no such file or directory");
  }
  SafetensorsReader reader(single);
  for (const auto& [name, e] : reader.entries()) c.shard_of_.emplace(name, single);
  c.open_.emplace(single, std::move(reader));
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(shard_of_.size());
  for (const auto& [name, file] : shard_of_) out.push_back(name);
  return out;
}

const std::string& Checkpoint::file_of(const std::string& name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) fail(path_, "no tensor named '" + name + "'");
  return it->second;
}

const SafetensorsReader& Checkpoint::shard(const std::string& name) const {
  const std::string& file = file_of(name);
  auto it = open_.find(file);
  if (it == open_.end()) {
    std::error_code ec;
    if (!fs::is_regular_file(file, ec))
      fail(path_, "tensor '" + name + "' is in shard '" + file + "', which does not exist");
    it = open_.emplace(file, SafetensorsReader(file)).first;
  }
  if (!it->second.contains(name))
    fail(path_, "the index puts tensor '" + name + "' in shard '" + file +
                    "', which does not hold it");
  return it->second;
}

const SafetensorsReader::Entry& Checkpoint::entry(const std::string& name) const {
  return shard(name).entry(name);
}

Tensor Checkpoint::read(const std::string& name) const { return shard(name).read(name); }

}  // namespace csattn
