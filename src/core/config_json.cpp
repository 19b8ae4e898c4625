// ModelConfig <-> DeepSeek-V4 Hugging Face config.json.
//
// Keys read (everything else is ignored; a missing key, or one set to null, keeps the value
// of `defaults`):
//   hidden_size -> d_model            num_attention_heads -> n_heads
//   head_dim -> head_dim              qk_rope_head_dim -> rope_dim
//   q_lora_rank, o_groups, o_lora_rank
//   sliding_window -> window          compress_ratios -> compress_ratios (one per layer)
//   num_hidden_layers (the main layers; compress_ratios lists the MTP modules' after them;
//                      read only beside compress_ratios)
//   index_n_heads, index_head_dim, index_topk
//   rope_theta, compress_rope_theta   rms_norm_eps -> norm_eps
//   rope_scaling.{factor -> yarn_factor, original_max_position_embeddings ->
//                 yarn_original_max_pos, beta_fast, beta_slow}   (other keys, e.g. "type", ignored)
//
// indexer_precision has no key: it is how csattn runs the indexer (like Megatron's
// --dsa-indexer-precision run option), not a property of the model, and DeepSeek-V4's
// config.json has no such field; it keeps the value of `defaults`.
//
// compress_ratios: some DeepSeek-V4 configs in the wild write 1 instead of 0 for the
// uncompressed (sliding-window only) layers (vLLM's DeepSeek-V4 tests use [1, 4, 128];
// vllm-ascend's DeepseekV4Config maps both 0 and 1 to an uncompressed layer). A ratio of 1 is
// therefore read as 0. Every other value outside {0, 4, 128} is rejected by validate().
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "csattn/config.hpp"
#include "csattn/error.hpp"

namespace csattn {

namespace {

using nlohmann::json;

const char* json_type_name(const json& v) { return v.type_name(); }

[[noreturn]] void wrong_type(const std::string& key, const json& v, const char* expected) {
  std::string shown = v.dump();
  if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  throw Error(ErrorKind::InvalidArgument, "config.json key '" + key + "' must be " + expected +
                                              ", got " + json_type_name(v) + " " + shown);
}

// An integer value: a JSON integer, or a float with an integral value (4096.0).
int as_int(const std::string& key, const json& v) {
  if (v.is_number_integer()) {
    // number_unsigned and number_integer both land here.
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<int>::max()))
        throw Error(ErrorKind::InvalidArgument,
                    "config.json key '" + key + "' = " + v.dump() + " is out of range");
      return static_cast<int>(u);
    }
    const auto i = v.get<std::int64_t>();
    if (i > std::numeric_limits<int>::max() || i < std::numeric_limits<int>::min())
      throw Error(ErrorKind::InvalidArgument,
                  "config.json key '" + key + "' = " + v.dump() + " is out of range");
    return static_cast<int>(i);
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) <= 2147483647.0)
      return static_cast<int>(d);
  }
  wrong_type(key, v, "an integer");
}

double as_double(const std::string& key, const json& v) {
  if (v.is_number()) return v.get<double>();
  wrong_type(key, v, "a number");
}

// Reads obj[key] into dst when present and not null.
void read_int(const json& obj, const char* key, const std::string& path, int& dst) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return;
  dst = as_int(path, *it);
}

void read_double(const json& obj, const char* key, const std::string& path, double& dst) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return;
  dst = as_double(path, *it);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  require(static_cast<bool>(in), ErrorKind::Io, "cannot open config file '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  require(!in.bad(), ErrorKind::Io, "cannot read config file '" + path + "'");
  return ss.str();
}

}  // namespace

ModelConfig ModelConfig::from_hf_json_text(const std::string& text,
                                           const ModelConfig& defaults) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(ErrorKind::InvalidArgument,
                std::string("config.json is not valid JSON: ") + e.what());
  }
  if (!j.is_object())
    throw Error(ErrorKind::InvalidArgument,
                std::string("config.json must hold a JSON object, got ") + j.type_name());

  ModelConfig m = defaults;
  AttentionConfig& c = m.base;
  read_int(j, "hidden_size", "hidden_size", c.d_model);
  read_int(j, "num_attention_heads", "num_attention_heads", c.n_heads);
  read_int(j, "head_dim", "head_dim", c.head_dim);
  read_int(j, "qk_rope_head_dim", "qk_rope_head_dim", c.rope_dim);
  read_int(j, "q_lora_rank", "q_lora_rank", c.q_lora_rank);
  read_int(j, "o_groups", "o_groups", c.o_groups);
  read_int(j, "o_lora_rank", "o_lora_rank", c.o_lora_rank);
  read_int(j, "sliding_window", "sliding_window", c.window);
  read_int(j, "index_n_heads", "index_n_heads", c.index_n_heads);
  read_int(j, "index_head_dim", "index_head_dim", c.index_head_dim);
  read_int(j, "index_topk", "index_topk", c.index_topk);
  read_double(j, "rope_theta", "rope_theta", c.rope_theta);
  read_double(j, "compress_rope_theta", "compress_rope_theta", c.compress_rope_theta);
  read_double(j, "rms_norm_eps", "rms_norm_eps", c.norm_eps);

  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    const json& rs = *it;
    if (!rs.is_object()) wrong_type("rope_scaling", rs, "an object");
    read_double(rs, "factor", "rope_scaling.factor", c.yarn_factor);
    read_int(rs, "original_max_position_embeddings",
             "rope_scaling.original_max_position_embeddings", c.yarn_original_max_pos);
    read_double(rs, "beta_fast", "rope_scaling.beta_fast", c.yarn_beta_fast);
    read_double(rs, "beta_slow", "rope_scaling.beta_slow", c.yarn_beta_slow);
  }

  if (auto it = j.find("compress_ratios"); it != j.end() && !it->is_null()) {
    const json& list = *it;
    if (!list.is_array()) wrong_type("compress_ratios", list, "a list of integers");
    std::vector<int> ratios;
    ratios.reserve(list.size());
    for (std::size_t i = 0; i < list.size(); ++i) {
      int r = as_int("compress_ratios[" + std::to_string(i) + "]", list[i]);
      if (r == 1) r = 0;  // "no compression" written as 1 (see the top of this file)
      ratios.push_back(r);
    }
    m.compress_ratios = std::move(ratios);
    // num_hidden_layers splits this list into main and MTP layers; without it in the file
    // the split is unknown (the defaults' count belongs to their own list).
    m.num_hidden_layers = 0;
    read_int(j, "num_hidden_layers", "num_hidden_layers", m.num_hidden_layers);
  }
  // A num_hidden_layers without compress_ratios beside it is not read: it would split the
  // defaults' list by another model's count (the split only names MTP layers' tensors).

  m.validate();
  return m;
}

ModelConfig ModelConfig::from_hf_json_file(const std::string& path,
                                           const ModelConfig& defaults) {
  const std::string text = read_text_file(path);
  try {
    return from_hf_json_text(text, defaults);
  } catch (const Error& e) {
    throw Error(e.kind(), path + ": " + e.what());
  }
}

std::string ModelConfig::to_hf_json() const {
  using ojson = nlohmann::ordered_json;
  const AttentionConfig& c = base;
  ojson j;
  j["hidden_size"] = c.d_model;
  j["num_attention_heads"] = c.n_heads;
  j["head_dim"] = c.head_dim;
  j["qk_rope_head_dim"] = c.rope_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["sliding_window"] = c.window;
  if (num_hidden_layers > 0) j["num_hidden_layers"] = num_hidden_layers;
  j["compress_ratios"] = compress_ratios;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["rope_theta"] = c.rope_theta;
  j["compress_rope_theta"] = c.compress_rope_theta;
  ojson rs;
  rs["type"] = "yarn";
  rs["factor"] = c.yarn_factor;
  rs["original_max_position_embeddings"] = c.yarn_original_max_pos;
  rs["beta_fast"] = c.yarn_beta_fast;
  rs["beta_slow"] = c.yarn_beta_slow;
  j["rope_scaling"] = rs;
  j["rms_norm_eps"] = c.norm_eps;
  return j.dump(2) + "\n";
}

}  // namespace csattn
