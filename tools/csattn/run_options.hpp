// `csattn run`: its command-line options (RunArgs), and their resolution into a RunPlan —
// the model config, the layers to run, the batch layout and the input tensors — with every
// inconsistency reported as a csattn::Error before any work starts.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "csattn/checkpoint.hpp"
#include "csattn/config.hpp"
#include "csattn/layer.hpp"
#include "csattn/layout.hpp"
#include "csattn/tensor.hpp"
#include "csattn/weights.hpp"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace csattn::cli {

// Raw option values as CLI11 fills them.
struct RunArgs {
  std::string preset = "small";
  std::string config_file;
  std::vector<std::string> ratios;
  std::vector<std::string> seqlens;
  std::vector<std::string> padded_seqlens;
  int topk = 0;
  int window = 0;
  double loss_coeff = 0.0;
  bool sparse_loss = true;
  bool per_token_loss = false;
  std::uint64_t seed = 42;
  bool backward = true;
  bool deterministic = false;
  std::string dtype = "bf16";
  std::string device = "auto";
  std::string indexer_precision = "bf16";
  std::string weights_file;
  std::string layer;  // N, layers.N or mtp.K (checkpoint.hpp's CheckpointLayer::parse)
  std::string inputs_file;
  std::string save_file;
  bool json = false;
  int threads = 0;
  int check_rows = 16;
  bool quiet = false;

  // Set by add_run_options; count() tells whether an option was given.
  CLI::Option* preset_opt = nullptr;
  CLI::Option* topk_opt = nullptr;
  CLI::Option* window_opt = nullptr;
  CLI::Option* loss_coeff_opt = nullptr;
  CLI::Option* sparse_opt = nullptr;
  CLI::Option* dense_opt = nullptr;
  CLI::Option* per_token_opt = nullptr;
  CLI::Option* layer_opt = nullptr;
  CLI::Option* indexer_precision_opt = nullptr;
};

void add_run_options(CLI::App& run, RunArgs& args);

// One layer to run: its index (the seed offset of its random weights, and the name prefix
// `layers.<index>.`, or `mtp.K.` for an MTP module's, in --save files when several layers run) and its config.
struct LayerSpec {
  int index = 0;
  // The checkpoint's layer: layers.<index>, or mtp.K for a config's entry past
  // num_hidden_layers (--layer or --config picks). Its prefix() prefixes --save names, its
  // label() is what reports show, and --weights DIR --layer reads its tensors.
  CheckpointLayer layer{0};
  AttentionConfig cfg;
};

struct RunPlan {
  std::string preset;       // the preset that gave the defaults
  std::string config_file;  // empty without --config
  ModelConfig model;        // after --config and the flag overrides
  std::vector<LayerSpec> layers;
  SeqLayout layout;
  std::vector<int> seqlens;         // real lengths per segment
  std::vector<int> padded_seqlens;  // physical lengths per segment
  Tensor x;            // [T, d_model] f32 (bf16-valued in bf16 mode)
  Tensor grad_output;  // [T, d_model] f32
  bool grad_output_from_file = false;
  std::optional<LayerWeights> file_weights;  // --weights
  std::string weights_file;
  std::string inputs_file;
  std::string save_file;
  RunOptions run_options;
  int threads = 1;  // in effect
  std::uint64_t seed = 42;
  bool backward = true;
  int check_rows = 16;
  bool json = false;
  bool progress = false;  // per-layer progress lines on stderr
};

// Validates everything and loads the files (config, inputs, weights).
RunPlan resolve_run(const RunArgs& args);

}  // namespace csattn::cli
