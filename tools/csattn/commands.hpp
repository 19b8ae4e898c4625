// The csattn subcommands. Each add_* function registers a subcommand and its options on the
// app and returns the function that runs it (called by main after a successful parse).
#pragma once
#include <functional>

namespace CLI {
class App;
}

namespace csattn::cli {

using Command = std::function<int()>;

Command add_run_command(CLI::App& app);     // run_cmd.cpp
Command add_config_command(CLI::App& app);  // config_cmd.cpp
Command add_bench_command(CLI::App& app);   // bench.cpp
Command add_bench_indexer_command(CLI::App& app);  // bench_indexer.cpp
Command add_comm_check_command(CLI::App& app);     // comm_check.cpp
Command add_info_command(CLI::App& app);           // info_cmd.cpp
Command add_memory_command(CLI::App& app);         // memory_cmd.cpp
Command add_checkpoint_command(CLI::App& app);     // checkpoint_cmd.cpp

}  // namespace csattn::cli
