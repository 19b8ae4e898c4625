// Printing the `csattn run` report: a readable table, or JSON (--json).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "run_job.hpp"
#include "run_options.hpp"

namespace csattn::cli {

// The header (config summary) and one row per layer, to stdout.
void print_run_table(const RunPlan& plan, const RunReport& report);

nlohmann::ordered_json run_report_json(const RunPlan& plan, const RunReport& report);

// A number for JSON: null for NaN / infinity (JSON has neither).
nlohmann::ordered_json json_number(double v);

}  // namespace csattn::cli
