// The GPU benchmarks (ceilings, sparse attention at FlashMLA's shapes, layer forward +
// backward, indexer at 32K-128K tokens). Needs a CUDA build and a GPU.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace csattn::bench {

// Prints the tables; writes the JSON report and the SVG chart where the paths are non-empty.
// Returns a process exit status (0 ok, 1 failure, 2 no GPU).
int run_cuda_bench(const std::string& json_path, const std::string& svg_path);

// The bandwidth-bound forward kernels (cuda_bench_elementwise.cpp): a JSON array, and a table.
nlohmann::json elementwise_benchmarks(double copy_tbps);

}  // namespace csattn::bench
