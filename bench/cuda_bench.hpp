// The GPU benchmarks (ceilings, sparse attention at FlashMLA's shapes, layer forward +
// backward, indexer at 32K-128K tokens). Needs a CUDA build and a GPU.
#pragma once
#include <string>

namespace csattn::bench {

// Prints the tables; writes the JSON report and the SVG chart where the paths are non-empty.
// Returns a process exit status (0 ok, 1 failure, 2 no GPU).
int run_cuda_bench(const std::string& json_path, const std::string& svg_path);

}  // namespace csattn::bench
