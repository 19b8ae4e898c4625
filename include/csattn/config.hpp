// AttentionConfig: the dimensions and hyper-parameters of one DeepSeek-V4 attention layer,
// and ModelConfig: the shared dimensions plus the per-layer compress ratios, with presets
// and the Hugging Face config.json mapping.
#pragma once
#include <string>
#include <vector>

namespace csattn {

// Which attention a layer computes, from its compress ratio m.
enum class LayerKind { swa, csa, hca };
LayerKind layer_kind(int compress_ratio);  // 0 -> swa, 4 -> csa, 128 -> hca; else Error
const char* layer_kind_name(LayerKind k);  // "SWA", "CSA", "HCA"

// Operand precision of the CSA indexer's forward scoring and top-k (spec 03 §5). mxfp8
// quantizes indexer Q and K (E4M3 values, one E8M0 scale per 32 elements); the weights, the
// logits and the whole indexer-loss backward stay bf16 / fp32.
enum class IndexerPrecision { bf16, mxfp8 };
const char* indexer_precision_name(IndexerPrecision p);  // "bf16", "mxfp8"
// "bf16" / "mxfp8"; anything else throws csattn::Error naming `what` (e.g. an option name).
IndexerPrecision parse_indexer_precision(const std::string& value, const std::string& what);

struct AttentionConfig {
  int d_model = 256;        // hidden size
  int n_heads = 8;          // H, query heads
  int head_dim = 64;        // D: head dim of Q, K=V and O
  int rope_dim = 16;        // d_r: rotary dims at the end of every head vector
  int q_lora_rank = 128;    // r_q
  int o_groups = 2;         // G
  int o_lora_rank = 128;    // r_o
  int window = 64;          // W, sliding window (includes the query itself)
  int compress_ratio = 0;   // m: 0 (SWA), 4 (CSA), 128 (HCA)
  int index_n_heads = 8;    // H_I
  int index_head_dim = 64;  // D_I (a power of two: Hadamard rotation)
  int index_topk = 32;      // K
  // bf16: scores from the layer's indexer Q/K as they are (bf16-valued in bf16 mode, fp32 in
  // fp32 mode). mxfp8: needs index_head_dim % 32 == 0.
  IndexerPrecision indexer_precision = IndexerPrecision::bf16;

  double rope_theta = 10000.0;           // plain RoPE base (SWA layers)
  double compress_rope_theta = 40000.0;  // YaRN base (CSA / HCA layers)
  double yarn_factor = 4.0;              // s
  int yarn_original_max_pos = 65536;     // L_orig
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;
  double norm_eps = 1e-6;

  // Indexer KL loss (CSA layers only).
  double loss_coeff = 0.01;   // lambda
  bool sparse_loss = true;    // true: KL over the top-k set; false: over all visible entries
  bool per_token_loss = false;  // true: sum over rows; false: mean over real rows

  LayerKind kind() const { return layer_kind(compress_ratio); }
  bool has_compressor() const { return compress_ratio > 1; }
  bool has_indexer() const { return compress_ratio == 4; }
  int coff() const { return compress_ratio == 4 ? 2 : 1; }  // overlapping compressor halves
  int nope_dim() const { return head_dim - rope_dim; }
  // Extra rows a query block needs before it for compression: 8 for m = 4 (two blocks), m
  // for m = 128, 0 for SWA.
  int compress_halo() const { return compress_ratio == 4 ? 8 : compress_ratio; }

  // Throws csattn::Error naming the first inconsistent field.
  void validate() const;
};

// A model: shared dimensions and one compress ratio per layer.
struct ModelConfig {
  AttentionConfig base;              // compress_ratio unused here
  std::vector<int> compress_ratios;  // one per layer
  // The main stack's layer count (config.json's num_hidden_layers): compress_ratios lists
  // the main layers, then the multi-token-prediction modules' (checkpoint.hpp maps an index
  // to its `layers.N` / `mtp.K` tensors). 0: not known - every layer is a main one.
  int num_hidden_layers = 0;

  AttentionConfig layer(int index) const;  // base with the layer's ratio; validates index
  void validate() const;

  static std::vector<std::string> preset_names();  // tiny, small, flash, pro
  static ModelConfig preset(const std::string& name);
  // DeepSeek-V4 config.json (Hugging Face keys); unknown keys are ignored, missing keys
  // keep the values already in `defaults`.
  static ModelConfig from_hf_json_text(const std::string& text, const ModelConfig& defaults);
  static ModelConfig from_hf_json_file(const std::string& path, const ModelConfig& defaults);
  std::string to_hf_json() const;  // pretty-printed, the same keys
};

}  // namespace csattn
