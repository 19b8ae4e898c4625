// `csattn checkpoint PATH`: what a checkpoint holds for csattn, without reading its data - the
// attention layers (layers.N.attn.*, and the MTP modules' mtp.K.attn.*), each one's type as
// its tensors say (an indexer: CSA, a compressor without one: HCA, neither: SWA) beside its
// config's compress_ratios entry, its tensor count and bytes, how many linears are
// block-scaled FP8 and which shards hold it.
// With --load every layer is loaded as `csattn run --weights PATH --layer N` would (FP8
// dequantized, every name, shape and dtype checked) and its result reported; the exit status
// is then 2 if any layer fails. For the release checkpoint: `csattn checkpoint DeepSeek-V4-Flash`.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "csattn/checkpoint.hpp"
#include "csattn/config.hpp"
#include "csattn/error.hpp"
#include "csattn/weights.hpp"

namespace csattn::cli {

namespace {

struct CheckpointArgs {
  std::string path;
  std::string config_file;
  std::string preset = "flash";
  bool load = false;
  bool json = false;
  bool quiet = false;
};

struct LayerSummary {
  int tensors = 0;
  int fp8_weights = 0;
  std::uint64_t bytes = 0;
  bool has_compressor = false, has_indexer = false;
  std::set<std::string> files;
  std::optional<int> model_index;   // its compress_ratios entry, where the config has one
  std::optional<int> config_ratio;  // compress_ratios[model_index]
  std::string load_result;          // with --load: "ok" or the error
  const char* tensor_type() const { return has_indexer ? "CSA" : has_compressor ? "HCA" : "SWA"; }
};

std::optional<ModelConfig> config_of(const CheckpointArgs& a, std::string& config_path) {
  config_path = a.config_file.empty() ? checkpoint_config_file(a.path) : a.config_file;
  if (config_path.empty()) return std::nullopt;
  const std::string origin =
      a.config_file.empty() ? config_path + " (the checkpoint's config.json)" : "--config";
  try {
    return ModelConfig::from_hf_json_file(config_path, ModelConfig::preset(check_preset(a.preset, "--preset")));
  } catch (const Error& e) {
    throw Error(e.kind(), origin + ": " + e.what());
  }
}

int run_checkpoint(const CheckpointArgs& a) {
  const Checkpoint ckpt = Checkpoint::open(a.path);
  std::string config_path;
  const std::optional<ModelConfig> model = config_of(a, config_path);

  std::map<CheckpointLayer, LayerSummary> layers;
  const std::vector<std::string> names = ckpt.names();
  for (const std::string& name : names) {
    const std::optional<CheckpointLayer> l = attention_layer_of(name);
    if (!l) continue;
    LayerSummary& s = layers.try_emplace(*l).first->second;
    const SafetensorsReader::Entry& e = ckpt.entry(name);
    s.tensors += 1;
    s.bytes += e.end - e.begin;
    s.files.insert(std::filesystem::path(ckpt.file_of(name)).filename().string());
    s.has_compressor |= name.find(".attn.compressor.") != std::string::npos;
    s.has_indexer |= name.find(".attn.indexer.") != std::string::npos;
    s.fp8_weights += e.file_dtype == "F8_E4M3" ? 1 : 0;
  }
  if (layers.empty())
    throw Error(ErrorKind::InvalidArgument,
                "checkpoint '" + a.path +
                    "' has no attention layers (no tensor named layers.N.attn.* or mtp.K.attn.*)");

  // --load reads every attention tensor (the release's Flash: ~4 GB): a line a layer on
  // stderr when it is a terminal or the read is large, as `csattn run` does.
  std::uint64_t total_bytes = 0;
  for (const auto& [l, s] : layers) total_bytes += s.bytes;
  const bool progress = a.load && !a.quiet && (isatty(STDERR_FILENO) || total_bytes >= (1ull << 30));
  int failed = 0, done = 0;
  for (auto& [l, s] : layers) {
    if (model) s.model_index = model_layer_index(*model, l);
    if (s.model_index) s.config_ratio = model->compress_ratios[static_cast<std::size_t>(*s.model_index)];
    if (!a.load) continue;
    try {
      if (!model) throw Error(ErrorKind::InvalidArgument, "no config to load with (give --config)");
      if (!s.config_ratio)
        throw Error(ErrorKind::InvalidArgument,
                    l.mtp && model->num_hidden_layers == 0
                        ? "the config does not give num_hidden_layers, so its MTP layers are unknown"
                        : fmt::format("the config has no layer {}", l.prefix()));
      const Stopwatch sw;
      (void)LayerWeights::load(ckpt, model->layer(*s.model_index), l);
      s.load_result = "ok";
      if (progress)
        fmt::print(stderr, "csattn: [{}/{}] {}: loaded, {:.1f} MiB in {:.2f} s\n", done + 1, layers.size(),
                   l.prefix(), static_cast<double>(s.bytes) / (1 << 20), sw.ms() / 1e3);
    } catch (const Error& e) {
      s.load_result = one_line(e.what());
      ++failed;
      if (progress)
        fmt::print(stderr, "csattn: [{}/{}] {}: failed: {}\n", done + 1, layers.size(), l.prefix(), s.load_result);
    }
    ++done;
    if (progress) std::fflush(stderr);
  }

  if (a.json) {
    nlohmann::json j;
    j["path"] = a.path;
    j["config_file"] = config_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(config_path);
    j["tensors"] = names.size();
    for (const auto& [layer, s] : layers) {
      nlohmann::json l = {{"layer", layer.mtp ? nlohmann::json(nullptr) : nlohmann::json(layer.index)},
                          {"name", layer.prefix()},
                          {"model_index", s.model_index ? nlohmann::json(*s.model_index) : nlohmann::json(nullptr)},
                          {"type_from_tensors", s.tensor_type()},
                          {"tensors", s.tensors},
                          {"bytes", s.bytes},
                          {"fp8_weights", s.fp8_weights},
                          {"files", std::vector<std::string>(s.files.begin(), s.files.end())}};
      l["config_type"] = s.config_ratio ? nlohmann::json(layer_kind_name(layer_kind(*s.config_ratio)))
                                        : nlohmann::json(nullptr);
      if (a.load) l["load"] = s.load_result;
      j["layers"].push_back(l);
    }
    fmt::print("{}\n", j.dump(1));
  } else {
    fmt::print("checkpoint {}: {} tensors, {} attention layers{}\n", a.path, names.size(),
               layers.size(), config_path.empty() ? "" : ", config " + config_path);
    fmt::print("{:>6}  {:<4} {:<6} {:>7} {:>10} {:>4}  {}\n", "layer", "type", "config", "tensors",
               "MiB", "FP8", a.load ? "load" : "files");
    for (const auto& [layer, s] : layers) {
      const std::string cfg_type =
          s.config_ratio ? layer_kind_name(layer_kind(*s.config_ratio)) : std::string("-");
      const std::string mark = s.config_ratio && cfg_type != s.tensor_type() ? " (differs)" : "";
      std::string files;
      for (const std::string& f : s.files) files += (files.empty() ? "" : " ") + f;
      fmt::print("{:>6}  {:<4} {:<6} {:>7} {:>10.1f} {:>4}  {}{}\n", layer.label(), s.tensor_type(), cfg_type,
                 s.tensors, static_cast<double>(s.bytes) / (1 << 20), s.fp8_weights,
                 a.load ? s.load_result : files, mark);
    }
    if (a.load)
      fmt::print("{} of {} layers load\n", layers.size() - static_cast<std::size_t>(failed), layers.size());
  }
  return failed > 0 ? 2 : 0;
}

}  // namespace

Command add_checkpoint_command(CLI::App& app) {
  auto a = std::make_shared<CheckpointArgs>();
  CLI::App* cmd = app.add_subcommand(
      "checkpoint",
      "The attention layers a checkpoint holds (type, tensors, bytes, FP8 linears, shards), "
      "read from its headers; --load loads each as `run --weights` would");
  cmd->add_option("path", a->path,
                  "A safetensors file, a sharded checkpoint directory (model.safetensors.index.json) "
                  "or its index")
      ->required()
      ->type_name("PATH");
  cmd->add_option("--config", a->config_file,
                  "DeepSeek-V4 config.json (default: PATH/config.json when PATH is a directory)")
      ->type_name("FILE");
  cmd->add_option("--preset", a->preset, "Defaults for keys the config lacks")->capture_default_str();
  cmd->add_flag("--load", a->load, "Load every layer (all its tensors are read; FP8 dequantized)");
  cmd->add_flag("--json", a->json, "One JSON object instead of the table");
  cmd->add_flag("-q,--quiet", a->quiet, "No progress lines on stderr (with --load)");
  return [a]() { return run_checkpoint(*a); };
}

}  // namespace csattn::cli
