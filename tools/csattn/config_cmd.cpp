// `csattn config`: print a preset as a Hugging Face config.json.
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "cli_util.hpp"
#include "commands.hpp"
#include "csattn/config.hpp"

namespace csattn::cli {

Command add_config_command(CLI::App& app) {
  auto preset = std::make_shared<std::string>("small");
  CLI::App* cmd = app.add_subcommand(
      "config", "Print a preset as a DeepSeek-V4 Hugging Face config.json (for --config)");
  cmd->add_option("--preset", *preset, "tiny, small, flash or pro")->capture_default_str();
  return [preset]() {
    const ModelConfig m = ModelConfig::preset(check_preset(*preset, "--preset"));
    fmt::print("{}", m.to_hf_json());
    return 0;
  };
}

}  // namespace csattn::cli
