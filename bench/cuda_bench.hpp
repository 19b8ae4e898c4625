// The GPU benchmarks (ceilings, sparse attention at FlashMLA's shapes, layer forward +
// backward, indexer at 32K-128K tokens). Needs a CUDA build and a GPU.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace csattn::bench {

// The benchmark sections, in run order: the names `csattn bench --sections` and
// CSATTN_BENCH_SECTIONS take.
inline const std::vector<std::string>& cuda_bench_sections() {
  static const std::vector<std::string> names = {"attention",     "attention_backward", "reductions",
                                                 "gathers",       "layer",              "deterministic",
                                                 "indexer",       "elementwise",        "indexer_loss",
                                                 "cp"};
  return names;
}

// Prints the tables; writes the JSON report and the SVG chart where the paths are non-empty.
// `sections`: the sections to run (validated by the caller); empty: those of
// CSATTN_BENCH_SECTIONS (a comma list), or all. Returns a process exit status (0 ok,
// 1 failure, 2 no GPU).
int run_cuda_bench(const std::string& json_path, const std::string& svg_path,
                   const std::vector<std::string>& sections = {});

// The bandwidth-bound forward kernels (cuda_bench_elementwise.cpp): a JSON array, and a table.
nlohmann::json elementwise_benchmarks(double copy_tbps);

// Where the wgmma kernels' time goes (cuda_bench_phases.cpp): per-phase cycles from clock()
// stamps of one launch (the attention kernels at the Flash and Pro shapes); JSON, and a table.
nlohmann::json attention_forward_phases();
nlohmann::json attention_backward_phases();
nlohmann::json indexer_phases();  // the wgmma indexer on one 32K-token sequence

// GPU context parallelism against CP = 1 (cuda_bench_cp.cpp): a JSON array, and a table.
nlohmann::json cp_benchmarks();

}  // namespace csattn::bench
