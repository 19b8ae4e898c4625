// `csattn run` under context parallelism: `mpirun -np P csattn run --cp-mode two_chunk ...`
// (the ranks come from mpirun's environment) or `csattn run --cp-mode MODE --cp-ranks P`
// (P ranks as threads of one process). Every rank resolves the same run plan (same files,
// same seeds), takes its rows, runs the layers with ContextParallelLayer, and rank 0 gathers
// the global results: the oracle check, --save (the same file a single-rank run writes) and
// the report with every rank's work and traffic per layer.
#pragma once
#include <string>

#include "run_options.hpp"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace csattn::cli {

struct CpArgs {
  std::string mode;   // empty: not requested
  int ranks = 0;      // --cp-ranks (in-process); 0: from mpirun, else 1
  CLI::Option* mode_opt = nullptr;
};

void add_cp_options(CLI::App& run, CpArgs& args);

// True when this invocation runs context-parallel (--cp-mode given, or launched by mpirun
// with several ranks, which then requires --cp-mode).
bool wants_context_parallel(const CpArgs& args);

// Runs the plan context-parallel and prints the report on rank 0. Returns the exit status.
int run_context_parallel(const RunPlan& plan, const CpArgs& args);

}  // namespace csattn::cli
