// `csattn run`: resolve the options, run the job, print the report.
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "cli_util.hpp"
#include "commands.hpp"
#include "cp_run.hpp"
#include "report.hpp"
#include "run_job.hpp"
#include "run_options.hpp"

namespace csattn::cli {

Command add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* run = app.add_subcommand(
      "run",
      "Forward + backward of one SWA, one CSA and one HCA layer (by default the small preset "
      "on a packed batch of three segments), checked against the fp64 oracle on sampled rows");
  add_run_options(*run, *args);
  auto cp = std::make_shared<CpArgs>();
  add_cp_options(*run, *cp);
  return [args, cp]() {
    RunPlan plan = resolve_run(*args);
    if (wants_context_parallel(*cp)) return run_context_parallel(plan, *cp);
    const RunReport report = run_job(plan);
    if (plan.json)
      fmt::print("{}\n", run_report_json(plan, report).dump(2));
    else
      print_run_table(plan, report);
    return 0;
  };
}

}  // namespace csattn::cli
