// csattn: the command-line program. Subcommands: run (the main job), config, bench,
// bench-indexer, comm-check, info, memory, checkpoint.
// Errors: one line "csattn: error: <message>" on stderr; exit status 2 for bad options,
// inconsistent configs and bad files (any csattn::Error), 1 for anything unexpected.
#include <cstdio>
#include <exception>
#include <map>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "cli_util.hpp"
#include "commands.hpp"
#include "csattn/build_info.hpp"
#include "csattn/error.hpp"
#include "csattn/host_memory.hpp"

namespace {

int fail(const std::string& message, int status) {
  std::fflush(stdout);
  fmt::print(stderr, "csattn: error: {}\n", csattn::cli::one_line(message));
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  // Large activations reused from the heap instead of fresh zero-filled mappings per layer
  // call (csattn/host_memory.hpp: 25-43% of a Flash-shape CPU training step).
  csattn::retain_freed_host_memory();
  CLI::App app{"csattn: DeepSeek-V4 hybrid attention (SWA / CSA / HCA layers), forward and "
               "backward on the CPU or a Hopper GPU, checked against an fp64 oracle"};
  app.name("csattn");
  app.set_version_flag("--version", "csattn " + csattn::version());
  app.require_subcommand(1);
  app.footer("Run `csattn <command> --help` for the options of a command.");

  std::map<const CLI::App*, csattn::cli::Command> commands;
  auto add = [&](csattn::cli::Command (*make)(CLI::App&)) {
    csattn::cli::Command cmd = make(app);
    commands[app.get_subcommands([](CLI::App*) { return true; }).back()] = std::move(cmd);
  };
  add(&csattn::cli::add_run_command);
  add(&csattn::cli::add_config_command);
  add(&csattn::cli::add_bench_command);
  add(&csattn::cli::add_bench_indexer_command);
  add(&csattn::cli::add_comm_check_command);
  add(&csattn::cli::add_info_command);
  add(&csattn::cli::add_memory_command);
  add(&csattn::cli::add_checkpoint_command);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    return fail(e.what(), 2);
  }

  try {
    for (const CLI::App* sub : app.get_subcommands()) {
      auto it = commands.find(sub);
      if (it != commands.end()) return it->second();
    }
    return fail("no command given", 2);
  } catch (const csattn::Error& e) {
    return fail(e.what(), 2);
  } catch (const std::exception& e) {
    return fail(std::string("unexpected failure: ") + e.what(), 1);
  }
}
