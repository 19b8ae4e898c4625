// csattn_cuda_bench [JSON] [SVG]: the GPU benchmarks without the CLI (scripts/gpu-check.sh).
#include "cuda_bench.hpp"

int main(int argc, char** argv) {
  return csattn::bench::run_cuda_bench(argc > 1 ? argv[1] : "cuda_bench.json",
                                       argc > 2 ? argv[2] : "");
}
