// `csattn memory`: the device memory the GPU layer will allocate, planned on the host from
// the shapes (csattn/device_memory.hpp) - no GPU needed. Per model, sequence length and layer
// type: weights, the forward workspace (activations kept for the backward), the backward's,
// a forward-only run and a training step; then the model's attention layers together. With
// --cp-ranks: the context-parallel layer's rank that needs the most.
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "csattn/config.hpp"
#include "csattn/cp.hpp"
#include "csattn/device_memory.hpp"
#include "csattn/error.hpp"
#include "csattn/layout.hpp"

namespace csattn::cli {

namespace {

struct MemoryArgs {
  std::vector<std::string> presets{"flash", "pro"};
  std::string config_file;
  std::vector<std::string> seqlens{"65536"};
  std::vector<std::string> ratios;
  bool deterministic = false;
  bool json = false;
  int cp_ranks = 1;  // > 1: the context-parallel layer, per rank
  std::string cp_mode = "two_chunk";
};

const char* layer_type(int ratio) { return ratio == 0 ? "SWA" : ratio == 4 ? "CSA" : "HCA"; }

double gib(std::size_t bytes) { return static_cast<double>(bytes) / (1u << 30); }

struct Model {
  std::string name;
  ModelConfig config;
};

std::vector<Model> models_of(const MemoryArgs& a) {
  std::vector<Model> out;
  if (!a.config_file.empty()) {
    try {
      // The first preset supplies what the file leaves out.
      const ModelConfig defaults = ModelConfig::preset(check_preset(a.presets.front(), "--preset"));
      out.push_back({a.config_file, ModelConfig::from_hf_json_file(a.config_file, defaults)});
    } catch (const Error& e) {
      throw Error(e.kind(), std::string("--config: ") + e.what());
    }
    return out;
  }
  for (const std::string& p : a.presets) out.push_back({p, ModelConfig::preset(check_preset(p, "--preset"))});
  return out;
}

nlohmann::json plan_json(const DeviceMemoryPlan& m, int tokens) {
  nlohmann::json j;
  for (const auto& [name, bytes] : m.fields()) j[std::string(name) + "_bytes"] = bytes;
  j["training_step_bytes_per_token"] = tokens > 0 ? static_cast<double>(m.training_step()) / tokens : 0.0;
  return j;
}

// One layer on one GPU, or with --cp-ranks P the context-parallel rank that needs the most
// (one sequence of L tokens, padded as the mode needs).
DeviceMemoryPlan plan_of(const AttentionConfig& cfg, int L, const MemoryArgs& a) {
  if (a.cp_ranks <= 1) return plan_device_memory(cfg, L, 1, L, a.deterministic);
  const CpMode mode = parse_cp_mode(a.cp_mode);
  const CpPartition part = CpPartition::build(
      pad_for_context_parallel(SeqLayout::from_lengths({L}), mode, a.cp_ranks), mode, a.cp_ranks);
  DeviceMemoryPlan worst;
  for (const DeviceMemoryPlan& m : plan_cp_device_memory(cfg, part, a.deterministic))
    if (m.training_step() > worst.training_step()) worst = m;
  return worst;
}

int run_memory(const MemoryArgs& a) {
  if (a.cp_ranks < 1) bad_option("--cp-ranks", std::to_string(a.cp_ranks) + " must be >= 1");
  if (a.cp_ranks > 1) {
    try {
      parse_cp_mode(a.cp_mode);
    } catch (const Error& e) {
      bad_option("--cp-mode", e.what());
    }
  }
  const std::vector<int> seqlens = parse_int_list(a.seqlens, "--seqlens");
  for (int L : seqlens)
    if (L < 1) bad_option("--seqlens", std::to_string(L) + " must be >= 1");
  const std::vector<int> only = a.ratios.empty() ? std::vector<int>{} : parse_ratio_list(a.ratios, "--ratios");
  nlohmann::json report = nlohmann::json::array();
  for (const Model& model : models_of(a)) {
    model.config.validate();
    // The layer types to show: --ratios, else those of the model's layers.
    const std::set<int> in_model(model.config.compress_ratios.begin(), model.config.compress_ratios.end());
    const std::vector<int> types = only.empty() ? std::vector<int>(in_model.begin(), in_model.end()) : only;
    for (int L : seqlens) {
      nlohmann::json entry{{"model", model.name}, {"seqlen", L}, {"deterministic", a.deterministic}};
      if (a.cp_ranks > 1) entry["context_parallel"] = {{"ranks", a.cp_ranks}, {"mode", a.cp_mode}};
      const bool cp = a.cp_ranks > 1;
      if (!a.json) {
        fmt::print("{}, one sequence of {} tokens{}{}\n", model.name, L,
                   cp ? fmt::format(", context parallel over {} GPUs ({}): the rank that needs "
                                    "the most", a.cp_ranks, a.cp_mode)
                      : std::string(),
                   a.deterministic ? ", deterministic backward" : "");
        fmt::print("  {:<5} {:>10} {:>13}{} {:>14} {:>13} {:>14} {:>12}\n", "layer", "weights",
                   "fwd workspace", cp ? fmt::format(" {:>10}", "cp buffers") : std::string(),
                   "bwd workspace", "forward only", "training step", "KiB/token");
      }
      // One plan per layer type (the model's layers repeat three types).
      std::map<int, DeviceMemoryPlan> plans;
      AttentionConfig cfg = model.config.base;
      auto plan = [&](int ratio) -> const DeviceMemoryPlan& {
        auto it = plans.find(ratio);
        if (it != plans.end()) return it->second;
        cfg.compress_ratio = ratio;
        return plans[ratio] = plan_of(cfg, L, a);
      };
      const double rank_tokens = static_cast<double>(L) / a.cp_ranks;
      for (int ratio : types) {
        const DeviceMemoryPlan& m = plan(ratio);
        entry["layers"][layer_type(ratio)] = plan_json(m, L);
        if (!a.json)
          fmt::print("  {:<5} {:>6.2f} GiB {:>9.2f} GiB{} {:>10.2f} GiB {:>9.2f} GiB {:>10.2f} GiB {:>12.1f}\n",
                     layer_type(ratio), gib(m.weights), gib(m.forward_workspace),
                     cp ? fmt::format(" {:>6.2f} GiB", gib(m.context_parallel)) : std::string(),
                     gib(m.backward_workspace), gib(m.forward_only()), gib(m.training_step()),
                     static_cast<double>(m.training_step()) / 1024.0 / rank_tokens);
      }
      // Every attention layer of the model: all weights and every layer's kept activations
      // (and context-parallel buffers), plus the largest backward workspace (one layer's
      // backward at a time).
      std::size_t weights = 0, activations = 0, backward = 0;
      for (int ratio : model.config.compress_ratios) {
        const DeviceMemoryPlan& m = plan(ratio);
        weights += m.weights;
        activations += m.forward_workspace + m.context_parallel;
        backward = std::max(backward, m.backward_workspace);
      }
      const std::size_t layers = model.config.compress_ratios.size();
      entry["all_layers"] = {{"layers", layers},
                             {"weights_bytes", weights},
                             {"forward_workspaces_bytes", activations},
                             {"largest_backward_workspace_bytes", backward},
                             {"training_step_bytes", weights + activations + backward}};
      if (!a.json)
        fmt::print("  all {} attention layers, every layer's activations kept: {:.2f} GiB weights + "
                   "{:.2f} GiB activations + {:.2f} GiB for one backward = {:.2f} GiB{}\n\n",
                   layers, gib(weights), gib(activations), gib(backward),
                   gib(weights + activations + backward), cp ? " per rank" : "");
      report.push_back(entry);
    }
  }
  if (a.json) fmt::print("{}\n", report.dump(2));
  else
    fmt::print("Planned from the shapes (the plans the GPU layer allocates by); not counted: the "
               "CUDA context,\ncuBLAS's own allocations, the communicators' buffers under context "
               "parallelism, the\nframework's tensors. Measured peaks: docs/perf.md.\n");
  return 0;
}

}  // namespace

Command add_memory_command(CLI::App& app) {
  auto a = std::make_shared<MemoryArgs>();
  CLI::App* cmd = app.add_subcommand(
      "memory", "The GPU layer's device memory per layer type and length, planned on the host "
                "(no GPU needed)");
  cmd->add_option("--preset", a->presets, "Models: tiny, small, flash, pro (with --config: the "
                                          "defaults for what the file leaves out)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--config", a->config_file, "A DeepSeek-V4 Hugging Face config.json instead of presets");
  cmd->add_option("--seqlens", a->seqlens, "Lengths of one-sequence batches (tokens)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--ratios", a->ratios,
                  "Layer types to list: 0 (SWA), 4 (CSA), 128 (HCA); default: the model's")
      ->delimiter(',');
  cmd->add_flag("--deterministic", a->deterministic,
                "The deterministic backward (its fixed-order scratch included)");
  cmd->add_option("--cp-ranks", a->cp_ranks,
                  "GPUs of a context-parallel layer (> 1: the per-rank plan, the largest rank)")
      ->capture_default_str();
  cmd->add_option("--cp-mode", a->cp_mode, "Context-parallel partition: contiguous or two_chunk")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "A JSON array instead of the tables");
  return [a]() { return run_memory(*a); };
}

}  // namespace csattn::cli
