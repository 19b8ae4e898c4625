// AttentionConfig validation and the presets. The HF config.json mapping is in
// config_json.cpp.
#include "csattn/config.hpp"

#include <cmath>
#include <string>

#include "csattn/error.hpp"

namespace csattn {

LayerKind layer_kind(int compress_ratio) {
  switch (compress_ratio) {
    case 0: return LayerKind::swa;
    case 4: return LayerKind::csa;
    case 128: return LayerKind::hca;
    default:
      throw Error(ErrorKind::InvalidArgument,
                  "compress ratio " + std::to_string(compress_ratio) +
                      " is not supported: expected 0 (SWA), 4 (CSA) or 128 (HCA)");
  }
}

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::swa: return "SWA";
    case LayerKind::csa: return "CSA";
    case LayerKind::hca: return "HCA";
  }
  return "?";
}

const char* indexer_precision_name(IndexerPrecision p) {
  return p == IndexerPrecision::mxfp8 ? "mxfp8" : "bf16";
}

IndexerPrecision parse_indexer_precision(const std::string& value, const std::string& what) {
  if (value == "bf16") return IndexerPrecision::bf16;
  if (value == "mxfp8") return IndexerPrecision::mxfp8;
  throw Error(ErrorKind::InvalidArgument,
              what + " = '" + value + "' is not an indexer precision: expected bf16 or mxfp8");
}

namespace {

void require_positive(int value, const char* name) {
  require(value > 0, ErrorKind::InvalidArgument,
          std::string(name) + " = " + std::to_string(value) + " must be positive");
}

bool is_power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

void AttentionConfig::validate() const {
  require_positive(d_model, "d_model");
  require_positive(n_heads, "n_heads");
  require_positive(head_dim, "head_dim");
  require_positive(rope_dim, "rope_dim");
  require_positive(q_lora_rank, "q_lora_rank");
  require_positive(o_groups, "o_groups");
  require_positive(o_lora_rank, "o_lora_rank");
  require_positive(window, "window");
  require(rope_dim % 2 == 0, ErrorKind::InvalidArgument,
          "rope_dim = " + std::to_string(rope_dim) + " must be even (interleaved pairs)");
  require(rope_dim <= head_dim, ErrorKind::InvalidArgument,
          "rope_dim = " + std::to_string(rope_dim) + " must not exceed head_dim = " +
              std::to_string(head_dim));
  require(n_heads % o_groups == 0, ErrorKind::InvalidArgument,
          "n_heads = " + std::to_string(n_heads) + " must be divisible by o_groups = " +
              std::to_string(o_groups));
  layer_kind(compress_ratio);  // throws for a ratio outside {0, 4, 128}
  if (has_indexer()) {
    require_positive(index_n_heads, "index_n_heads");
    require_positive(index_topk, "index_topk");
    require(is_power_of_two(index_head_dim), ErrorKind::InvalidArgument,
            "index_head_dim = " + std::to_string(index_head_dim) +
                " must be a power of two (Hadamard rotation)");
    require(rope_dim <= index_head_dim, ErrorKind::InvalidArgument,
            "rope_dim = " + std::to_string(rope_dim) + " must not exceed index_head_dim = " +
                std::to_string(index_head_dim));
    // MXFP8 scales cover 32 contiguous elements of a head vector; any head count works.
    require(indexer_precision != IndexerPrecision::mxfp8 || index_head_dim % 32 == 0,
            ErrorKind::InvalidArgument,
            "indexer_precision = mxfp8 needs index_head_dim to be a multiple of 32 (one E8M0 "
            "scale per 32 elements), got index_head_dim = " + std::to_string(index_head_dim));
  }
  require(rope_theta > 1.0 && std::isfinite(rope_theta), ErrorKind::InvalidArgument,
          "rope_theta = " + std::to_string(rope_theta) + " must be a finite number > 1");
  require(compress_rope_theta > 1.0 && std::isfinite(compress_rope_theta),
          ErrorKind::InvalidArgument,
          "compress_rope_theta = " + std::to_string(compress_rope_theta) +
              " must be a finite number > 1");
  require(yarn_factor > 0.0 && std::isfinite(yarn_factor), ErrorKind::InvalidArgument,
          "yarn_factor = " + std::to_string(yarn_factor) + " must be positive");
  require_positive(yarn_original_max_pos, "yarn_original_max_pos");
  require(yarn_beta_fast > 0.0 && yarn_beta_slow > 0.0, ErrorKind::InvalidArgument,
          "yarn beta_fast and beta_slow must be positive");
  require(norm_eps > 0.0 && std::isfinite(norm_eps), ErrorKind::InvalidArgument,
          "norm_eps = " + std::to_string(norm_eps) + " must be positive");
  require(loss_coeff >= 0.0 && std::isfinite(loss_coeff), ErrorKind::InvalidArgument,
          "loss_coeff = " + std::to_string(loss_coeff) + " must be finite and >= 0");
}

AttentionConfig ModelConfig::layer(int index) const {
  require(index >= 0 && index < static_cast<int>(compress_ratios.size()),
          ErrorKind::InvalidArgument,
          "layer " + std::to_string(index) + " does not exist: the config has " +
              std::to_string(compress_ratios.size()) + " layers");
  AttentionConfig cfg = base;
  cfg.compress_ratio = compress_ratios[static_cast<std::size_t>(index)];
  cfg.validate();
  return cfg;
}

void ModelConfig::validate() const {
  require(!compress_ratios.empty(), ErrorKind::InvalidArgument,
          "compress_ratios is empty: a model needs at least one layer");
  require(num_hidden_layers >= 0 &&
              num_hidden_layers <= static_cast<int>(compress_ratios.size()),
          ErrorKind::InvalidArgument,
          "num_hidden_layers = " + std::to_string(num_hidden_layers) + " but compress_ratios has " +
              std::to_string(compress_ratios.size()) +
              " entries: DeepSeek-V4 lists one ratio per main layer, then one per MTP module");
  for (std::size_t i = 0; i < compress_ratios.size(); ++i) {
    AttentionConfig cfg = base;
    cfg.compress_ratio = compress_ratios[i];
    try {
      cfg.validate();
    } catch (const Error& e) {
      throw Error(e.kind(), "layer " + std::to_string(i) + ": " + e.what());
    }
  }
}

std::vector<std::string> ModelConfig::preset_names() { return {"tiny", "small", "flash", "pro"}; }

ModelConfig ModelConfig::preset(const std::string& name) {
  ModelConfig m;
  AttentionConfig& c = m.base;
  if (name == "tiny") {
    c.d_model = 64; c.n_heads = 4; c.head_dim = 32; c.rope_dim = 16;
    c.q_lora_rank = 32; c.o_groups = 2; c.o_lora_rank = 32; c.window = 16;
    c.index_n_heads = 4; c.index_head_dim = 32; c.index_topk = 8;
    m.compress_ratios = {0, 4, 128};
  } else if (name == "small") {
    c.d_model = 256; c.n_heads = 8; c.head_dim = 64; c.rope_dim = 16;
    c.q_lora_rank = 128; c.o_groups = 2; c.o_lora_rank = 128; c.window = 64;
    c.index_n_heads = 8; c.index_head_dim = 64; c.index_topk = 32;
    m.compress_ratios = {0, 4, 128};
  } else if (name == "flash") {
    // DeepSeek-V4-Flash (spec 01 §1.3; Megatron recipe rope parameters).
    c.d_model = 4096; c.n_heads = 64; c.head_dim = 512; c.rope_dim = 64;
    c.q_lora_rank = 1024; c.o_groups = 8; c.o_lora_rank = 1024; c.window = 128;
    c.index_n_heads = 64; c.index_head_dim = 128; c.index_topk = 512;
    m.compress_ratios = {0, 0, 4};
    for (int i = 0; i < 20; ++i) { m.compress_ratios.push_back(128); m.compress_ratios.push_back(4); }
    m.compress_ratios.push_back(0);  // the MTP module's layer
    m.num_hidden_layers = 43;
  } else if (name == "pro") {
    c.d_model = 7168; c.n_heads = 128; c.head_dim = 512; c.rope_dim = 64;
    c.q_lora_rank = 1536; c.o_groups = 16; c.o_lora_rank = 1024; c.window = 128;
    c.index_n_heads = 64; c.index_head_dim = 128; c.index_topk = 1024;
    m.compress_ratios = {128, 128, 4};
    for (int i = 0; i < 29; ++i) { m.compress_ratios.push_back(128); m.compress_ratios.push_back(4); }
    m.compress_ratios.push_back(0);  // the MTP module's layer
    m.num_hidden_layers = 61;
  } else {
    throw Error(ErrorKind::InvalidArgument,
                "unknown preset '" + name + "': expected tiny, small, flash or pro");
  }
  // Shared defaults (AttentionConfig's member initialisers hold the rest): recipe values
  // rope 10000 / compress 40000, YaRN factor 4 over 65536, beta 32 / 1, eps 1e-6.
  m.validate();
  return m;
}

}  // namespace csattn
