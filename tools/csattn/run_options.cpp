#include "run_options.hpp"

#include <unistd.h>

#include <cmath>

#include <CLI/CLI.hpp>

#include "cli_util.hpp"
#include "csattn/checkpoint.hpp"
#include "csattn/error.hpp"
#include "csattn/safetensors.hpp"

namespace csattn::cli {

namespace {

// Default batch: one segment shorter than the small preset's window (64), one whose length
// is not a multiple of 4, one longer than 2 * 128 so HCA layers have several entries.
const std::vector<int> kDefaultSeqlens = {50, 301, 700};
const std::vector<int> kDefaultRatios = {0, 4, 128};

const char* kRunFooter = R"(Layers:
  Without --ratio, --config or --layer: one SWA, one CSA and one HCA layer (ratios 0,4,128).
  --ratio selects the layers by compress ratio (layer i of the list gets seed + i);
  --config without --ratio runs every layer of the config's compress_ratios; --layer N runs
  layer N of the config (or preset) only. --weights runs one layer: its ratio comes from
  --ratio or from compress_ratios[N] of --layer N. --layer mtp.K is the K-th multi-token-
  prediction module's layer: compress_ratios lists it after the num_hidden_layers main ones
  (Flash: --layer mtp.0 is --layer 43), and the release names its tensors mtp.K.attn.*.

Checkpoints:
  --weights DIR --layer N (or mtp.K) reads that layer of a Hugging Face checkpoint directory as the
  DeepSeek-V4 release ships it: model.safetensors.index.json and its shards (only the
  layer's tensors are read), config.json as --config unless one is given, and F8_E4M3
  linear weights dequantized with their F8_E8M0 scale per 128 x 128 block (<name>.scale).

Files:
  --inputs FILE   safetensors with hidden_states [T, d_model] (f32/bf16), cu_seqlens i32
                  [B+1], optional cu_seqlens_padded i32 [B+1], optional grad_output
                  [T, d_model] (missing: seeded random).
  --save FILE     safetensors with output [T, d_model], indexer_loss (f32 scalar),
                  topk_indices [T, K] i32 (CSA only), and after backward grad.hidden_states
                  and grad.<release name> for every weight (e.g. grad.attn.wq_a.weight).
                  When several layers run, every name is prefixed with the layer's
                  checkpoint name: layers.<i> (e.g. layers.1.topk_indices), or mtp.<K>
                  for a config's MTP module entry (--config / --layer picks).

Exit status: 0 on success, 2 for a bad option, an inconsistent config or a bad file.)";

const Tensor& require_tensor(const TensorMap& m, const std::string& name,
                             const std::string& file) {
  auto it = m.find(name);
  require(it != m.end(), ErrorKind::Io,
          "--inputs " + file + ": tensor '" + name + "' is missing");
  return it->second;
}

bool is_float_dtype(DType dt) {
  return dt == DType::f32 || dt == DType::bf16 || dt == DType::f16 || dt == DType::f64;
}

std::vector<std::int32_t> read_cu(const Tensor& t, const std::string& name,
                                  const std::string& file) {
  require(t.dtype() == DType::i32 || t.dtype() == DType::i64, ErrorKind::DTypeMismatch,
          "--inputs " + file + ": " + name + " must be i32, got " + dtype_name(t.dtype()));
  require(t.ndim() == 1, ErrorKind::ShapeMismatch,
          "--inputs " + file + ": " + name + " must be 1-D [B+1], got " + shape_str(t.shape()));
  std::vector<std::int32_t> cu;
  cu.reserve(static_cast<std::size_t>(t.numel()));
  for (double v : t.to_f64()) cu.push_back(static_cast<std::int32_t>(v));
  return cu;
}

Tensor read_activation(const Tensor& t, const std::string& name, std::int64_t rows,
                       int d_model, const std::string& file, bool round_to_bf16) {
  require(is_float_dtype(t.dtype()), ErrorKind::DTypeMismatch,
          "--inputs " + file + ": " + name + " must be f32 or bf16, got " +
              dtype_name(t.dtype()));
  const Shape want = {rows, d_model};
  require(t.shape() == want, ErrorKind::ShapeMismatch,
          "--inputs " + file + ": " + name + " has shape " + shape_str(t.shape()) +
              ", expected " + shape_str(want) + " (rows from cu_seqlens, d_model)");
  return f32_tensor(t.to_f32(), want, round_to_bf16);
}

// --layer's position in the model's compress_ratios: N itself (N >= num_hidden_layers being
// an MTP module's layer), num_hidden_layers + K for mtp.K, N < num_hidden_layers for layers.N.
int layer_index(const RunArgs& args, const ModelConfig& model) {
  CheckpointLayer layer(0);
  try {
    layer = CheckpointLayer::parse(args.layer, "--layer");
  } catch (const Error&) {
    bad_option("--layer", "'" + args.layer + "' is not a layer: expected N, layers.N or mtp.K "
                          "(the K-th MTP module's), decimal without leading zeros");
  }
  const std::string source = args.config_file.empty() ? "preset" : "config";
  const int n = static_cast<int>(model.compress_ratios.size());
  const bool plain_number = args.layer.find('.') == std::string::npos;
  if (plain_number && layer.index < n) return layer.index;
  if (const std::optional<int> index = model_layer_index(model, layer)) return *index;
  if (layer.mtp && model.num_hidden_layers == 0)
    bad_option("--layer", args.layer + ": the " + source +
                              " does not give num_hidden_layers, so which compress_ratios entries "
                              "are MTP modules' is unknown (add it to the config beside "
                              "compress_ratios, or take --preset flash / pro)");
  const int main_layers = model.num_hidden_layers > 0 ? model.num_hidden_layers : n;
  std::string has = std::to_string(main_layers) + " main layers (0.." + std::to_string(main_layers - 1) + ")";
  if (main_layers < n)
    has += " and " + std::to_string(n - main_layers) + " MTP module layer" +
           (n - main_layers > 1 ? "s (mtp.0.." + std::to_string(n - main_layers - 1) + ")" : " (mtp.0)");
  bad_option("--layer", args.layer + " does not exist: the " + source + " has " + has);
}

// The layers to run, from --ratio / --config / --layer / --weights.
std::vector<LayerSpec> select_layers(const RunArgs& args, const ModelConfig& model) {
  const bool have_ratio = !args.ratios.empty();
  const std::vector<int> ratios =
      have_ratio ? parse_ratio_list(args.ratios, "--ratio") : std::vector<int>{};
  const bool have_layer = args.layer_opt && args.layer_opt->count() > 0;
  const bool have_weights = !args.weights_file.empty();

  std::vector<std::pair<int, int>> picked;  // (index, ratio)
  // Whether the picks are the config's own layers (so an index past num_hidden_layers is an
  // MTP module's), not positions in a --ratio list.
  bool config_layers = false;
  if (have_layer) {
    const int index = layer_index(args, model);
    if (have_ratio && ratios.size() != 1)
      bad_option("--ratio", "with --layer give exactly one ratio, got " +
                                std::to_string(ratios.size()));
    picked.push_back(
        {index, have_ratio ? ratios[0] : model.compress_ratios[static_cast<std::size_t>(index)]});
    config_layers = true;
  } else if (have_weights) {
    if (!have_ratio)
      bad_option("--weights", "give the layer's compress ratio with --ratio, or --layer N to "
                              "take it from the config's compress_ratios[N]");
    if (ratios.size() != 1)
      bad_option("--ratio", "--weights holds one layer: give exactly one ratio, got " +
                                std::to_string(ratios.size()));
    picked.push_back({0, ratios[0]});
  } else if (have_ratio) {
    for (std::size_t i = 0; i < ratios.size(); ++i)
      picked.push_back({static_cast<int>(i), ratios[i]});
  } else if (!args.config_file.empty()) {
    for (std::size_t i = 0; i < model.compress_ratios.size(); ++i)
      picked.push_back({static_cast<int>(i), model.compress_ratios[i]});
    config_layers = true;
  } else {
    for (std::size_t i = 0; i < kDefaultRatios.size(); ++i)
      picked.push_back({static_cast<int>(i), kDefaultRatios[i]});
  }

  std::vector<LayerSpec> layers;
  for (auto [index, ratio] : picked) {
    LayerSpec s;
    s.index = index;
    s.layer = config_layers ? checkpoint_layer_of(model, index) : CheckpointLayer(index);
    s.cfg = model.base;
    s.cfg.compress_ratio = ratio;
    try {
      s.cfg.validate();
    } catch (const Error& e) {
      throw Error(e.kind(), "layer " + s.layer.label() + ": " + e.what());
    }
    layers.push_back(s);
  }
  return layers;
}

}  // namespace

void add_run_options(CLI::App& run, RunArgs& a) {
  run.footer(kRunFooter);
  a.preset_opt = run.add_option("--preset", a.preset,
                                "Model dimensions: tiny, small, flash or pro (with --config: "
                                "the defaults for keys the file lacks)")
                     ->capture_default_str();
  run.add_option("--config", a.config_file,
                 "DeepSeek-V4 Hugging Face config.json; the flags below override it")
      ->type_name("FILE");
  run.add_option("--ratio", a.ratios,
                 "Compress ratios of the layers to run (0 = SWA, 4 = CSA, 128 = HCA); "
                 "repeatable and/or a comma list [default: 0,4,128]")
      ->delimiter(',')
      ->type_name("LIST");
  auto* seq = run.add_option("--seqlens", a.seqlens,
                             "Real sequence lengths of the packed batch, comma list "
                             "[default: 50,301,700]")
                  ->delimiter(',')
                  ->type_name("LIST");
  auto* padded = run.add_option("--padded-seqlens", a.padded_seqlens,
                                "Physical (padded) lengths, same count as --seqlens, each >= "
                                "the real length")
                     ->delimiter(',')
                     ->type_name("LIST");
  a.topk_opt = run.add_option("--topk", a.topk, "Indexer top-k K (CSA)");
  a.window_opt = run.add_option("--window", a.window, "Sliding window W");
  a.loss_coeff_opt = run.add_option("--loss-coeff", a.loss_coeff, "Indexer KL loss coefficient");
  a.sparse_opt = run.add_flag_callback(
      "--sparse-loss", [&a] { a.sparse_loss = true; },
      "Indexer KL loss over the selected top-k entries (the presets' default)");
  a.dense_opt = run.add_flag_callback(
      "--dense-loss", [&a] { a.sparse_loss = false; },
      "Indexer KL loss over all visible compressed entries");
  a.sparse_opt->excludes(a.dense_opt);
  a.per_token_opt = run.add_flag("--per-token-loss", a.per_token_loss,
                                 "Sum the indexer loss over rows instead of the mean");
  run.add_option("--seed", a.seed, "Seed of the random weights, inputs and grad_output")
      ->capture_default_str();
  auto* bwd = run.add_flag_callback("--backward", [&a] { a.backward = true; },
                                    "Run the backward pass too (the default)");
  auto* no_bwd = run.add_flag_callback("--no-backward", [&a] { a.backward = false; },
                                       "Forward only");
  bwd->excludes(no_bwd);
  run.add_flag("--deterministic", a.deterministic,
               "GPU backward with fixed-order reductions instead of atomics: bitwise-repeatable "
               "gradients (the CPU backend always is)");
  run.add_option("--dtype", a.dtype, "Precision: bf16 or fp32")->capture_default_str();
  run.add_option("--device", a.device, "cpu, cuda, or auto (cuda when a GPU is present)")
      ->capture_default_str();
  a.indexer_precision_opt =
      run.add_option("--indexer-precision", a.indexer_precision,
                     "Operands of the CSA indexer's scoring and top-k: bf16 or mxfp8 (E4M3 q and "
                     "k with an E8M0 scale per 32 elements; index_head_dim % 32 == 0). The "
                     "indexer loss backward stays bf16 / fp32")
          ->capture_default_str();
  auto* weights = run.add_option("--weights", a.weights_file,
                                 "safetensors with one layer (attn.*), a checkpoint "
                                 "(layers.N.attn.*, pick N with --layer), or a sharded "
                                 "checkpoint directory such as the DeepSeek-V4 release (its "
                                 "model.safetensors.index.json; its config.json unless "
                                 "--config; FP8 weights dequantized with their block scales)")
                     ->type_name("PATH");
  a.layer_opt = run.add_option("--layer", a.layer,
                               "Layer N of the config / checkpoint, or mtp.K (the K-th MTP module's)")
                    ->type_name("N|mtp.K");
  auto* inputs = run.add_option("--inputs", a.inputs_file,
                                "safetensors with hidden_states, cu_seqlens, ... (see below)")
                    ->type_name("FILE");
  run.add_option("--save", a.save_file, "Write results to a safetensors file (see below)")
      ->type_name("FILE");
  run.add_flag("--json", a.json, "Print a machine-readable JSON report instead of the table");
  run.add_option("--threads", a.threads, "OpenMP threads (0 = default)");
  run.add_option("--check-rows", a.check_rows,
                 "Rows compared with the fp64 oracle per layer (0 disables the check)")
      ->capture_default_str();
  run.add_flag("-q,--quiet", a.quiet, "No progress lines on stderr");
  inputs->excludes(seq);
  inputs->excludes(padded);
  padded->needs(seq);
  (void)weights;
}

// A checkpoint directory in the Hugging Face layout carries its config.json: --weights DIR
// without --config reads it (the report names the file), as transformers does.
RunArgs with_checkpoint_config(RunArgs args, std::string& config_origin) {
  config_origin = "--config";
  if (args.config_file.empty() && !args.weights_file.empty()) {
    args.config_file = checkpoint_config_file(args.weights_file);
    config_origin = args.config_file + " (the config.json of --weights)";
  }
  return args;
}

RunPlan resolve_run(const RunArgs& raw_args) {
  std::string config_origin;
  const RunArgs args = with_checkpoint_config(raw_args, config_origin);
  RunPlan p;
  p.preset = check_preset(args.preset, "--preset");
  ModelConfig model = ModelConfig::preset(p.preset);
  if (!args.config_file.empty()) {
    try {
      model = ModelConfig::from_hf_json_file(args.config_file, model);
    } catch (const Error& e) {
      throw Error(e.kind(), config_origin + ": " + e.what());
    }
    p.config_file = args.config_file;
  }
  AttentionConfig& base = model.base;
  if (args.topk_opt && args.topk_opt->count()) {
    if (args.topk < 1) bad_option("--topk", std::to_string(args.topk) + " must be >= 1");
    base.index_topk = args.topk;
  }
  if (args.window_opt && args.window_opt->count()) {
    if (args.window < 1) bad_option("--window", std::to_string(args.window) + " must be >= 1");
    base.window = args.window;
  }
  if (args.loss_coeff_opt && args.loss_coeff_opt->count()) {
    if (!(args.loss_coeff >= 0.0) || !std::isfinite(args.loss_coeff))
      bad_option("--loss-coeff", std::to_string(args.loss_coeff) + " must be finite and >= 0");
    base.loss_coeff = args.loss_coeff;
  }
  if ((args.sparse_opt && args.sparse_opt->count()) || (args.dense_opt && args.dense_opt->count()))
    base.sparse_loss = args.sparse_loss;
  if (args.per_token_opt && args.per_token_opt->count()) base.per_token_loss = args.per_token_loss;
  base.indexer_precision = parse_indexer_precision(args.indexer_precision, "--indexer-precision");

  const Precision precision = parse_precision(args.dtype, "--dtype");
  const bool bf16 = precision == Precision::bf16;
  if (args.check_rows < 0)
    bad_option("--check-rows", std::to_string(args.check_rows) + " must be >= 0");

  p.layers = select_layers(args, model);
  p.model = model;
  p.seed = args.seed;
  p.backward = args.backward;
  p.check_rows = args.check_rows;
  p.json = args.json;
  p.save_file = args.save_file;
  p.threads = apply_threads(args.threads, "--threads");
  p.run_options.precision = precision;
  p.run_options.threads = args.threads;
  if (args.device != "auto" && args.device != "cpu" && args.device != "cuda")
    bad_option("--device", "'" + args.device + "' is not one of auto, cpu, cuda");
  std::string why;
  const bool gpu = cuda_available(&why);
  if (args.device == "cuda" && !gpu) bad_option("--device", "cuda: " + why);
  // auto: the GPU when present and when the run is one the GPU backend serves (bf16);
  // otherwise the CPU, which serves everything.
  if (args.device == "cuda" || (args.device == "auto" && gpu && bf16))
    p.run_options.device = Device::cuda;
  p.run_options.deterministic = args.deterministic;
  if (p.run_options.device == Device::cuda && !bf16)
    bad_option("--dtype", "fp32 runs on the CPU only; the GPU computes in bf16");

  const int d_model = base.d_model;
  if (!args.inputs_file.empty()) {
    p.inputs_file = args.inputs_file;
    TensorMap m;
    try {
      m = load_safetensors(args.inputs_file);
    } catch (const Error& e) {
      throw Error(e.kind(), std::string("--inputs: ") + e.what());
    }
    const std::string& f = args.inputs_file;
    std::vector<std::int32_t> cu = read_cu(require_tensor(m, "cu_seqlens", f), "cu_seqlens", f);
    std::vector<std::int32_t> cup;
    if (auto it = m.find("cu_seqlens_padded"); it != m.end())
      cup = read_cu(it->second, "cu_seqlens_padded", f);
    try {
      p.layout = SeqLayout::thd(cu, cup);
    } catch (const Error& e) {
      throw Error(e.kind(), "--inputs " + f + ": " + e.what());
    }
    const std::int64_t rows = p.layout.total_rows();
    p.x = read_activation(require_tensor(m, "hidden_states", f), "hidden_states", rows, d_model,
                          f, bf16);
    if (auto it = m.find("grad_output"); it != m.end()) {
      p.grad_output = read_activation(it->second, "grad_output", rows, d_model, f, bf16);
      p.grad_output_from_file = true;
    }
  } else {
    const std::vector<int> lens =
        args.seqlens.empty() ? kDefaultSeqlens : parse_int_list(args.seqlens, "--seqlens");
    std::vector<int> padded;
    if (!args.padded_seqlens.empty()) {
      padded = parse_int_list(args.padded_seqlens, "--padded-seqlens");
      if (padded.size() != lens.size())
        bad_option("--padded-seqlens", "has " + std::to_string(padded.size()) +
                                           " entries but --seqlens has " +
                                           std::to_string(lens.size()));
      for (std::size_t b = 0; b < lens.size(); ++b)
        if (padded[b] < lens[b])
          bad_option("--padded-seqlens",
                     "entry " + std::to_string(b) + " = " + std::to_string(padded[b]) +
                         " is shorter than the real length " + std::to_string(lens[b]));
    }
    std::int64_t total = 0;
    for (std::size_t b = 0; b < lens.size(); ++b) {
      if (lens[b] < 0)
        bad_option("--seqlens", "entry " + std::to_string(b) + " = " + std::to_string(lens[b]) +
                                    " must be >= 0");
      total += padded.empty() ? lens[b] : padded[b];
    }
    if (total < 1) bad_option("--seqlens", "the batch has no rows");
    if (total > (std::int64_t{1} << 30)) bad_option("--seqlens", "the batch is too large");
    try {
      p.layout = SeqLayout::from_lengths(lens, padded);
    } catch (const Error& e) {
      throw Error(e.kind(), std::string("--seqlens: ") + e.what());
    }
  }
  for (int b = 0; b < p.layout.num_segments(); ++b) {
    p.seqlens.push_back(p.layout.real_len(b));
    p.padded_seqlens.push_back(p.layout.seg_len(b));
  }

  const std::int64_t rows = p.layout.total_rows();
  const Shape act_shape = {rows, d_model};
  const auto n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(d_model);
  if (p.x.nbytes() == 0) p.x = Tensor::from_f32(random_normal(n, p.seed, 1, bf16), act_shape);
  if (p.grad_output.nbytes() == 0)
    p.grad_output = Tensor::from_f32(random_normal(n, p.seed, 2, bf16), act_shape);

  if (!args.weights_file.empty()) {
    p.weights_file = args.weights_file;
    std::optional<CheckpointLayer> layer;
    if (args.layer_opt && args.layer_opt->count()) layer = p.layers.at(0).layer;
    try {
      p.file_weights = LayerWeights::load(args.weights_file, p.layers.at(0).cfg, layer);
    } catch (const Error& e) {
      throw Error(e.kind(), std::string("--weights: ") + e.what());
    }
  }

  const double work = static_cast<double>(rows) * d_model * static_cast<double>(p.layers.size());
  p.progress = !args.quiet && (isatty(STDERR_FILENO) || work >= double(1 << 23));
  return p;
}

}  // namespace csattn::cli
