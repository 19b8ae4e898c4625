// The device memory of the GPU layer, planned on the host from the shapes alone (no GPU
// needed): what the layer allocates - its weights, the forward workspace (it keeps the
// activations the backward reads) and the backward's (it ends with the fp32 weight
// gradients) - so that a run can be sized before a GPU is at hand (`csattn memory`). The same
// plans size DeviceLayer's *_workspace_bytes. Not counted: the CUDA context, cuBLAS's own
// allocations and, for context parallelism, the communicators' buffers.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "csattn/config.hpp"

namespace csattn {

class CpPartition;

struct DeviceMemoryPlan {
  std::size_t weights = 0;             // bf16 parameters (fp32 ape / sink), RoPE frequencies
  std::size_t forward_workspace = 0;   // activations kept for the backward, metadata, cuBLAS scratch
  std::size_t backward_workspace = 0;  // activation gradients, then the weight gradients
  std::size_t weight_gradients = 0;    // the part of backward_workspace that the weight gradients take
  // Context parallelism: the rank's own buffers (its rows in and out, halo rows, the gathered
  // compressed rows and their gradients, index lists), held from the forward to the backward.
  std::size_t context_parallel = 0;
  std::size_t forward_only() const { return weights + forward_workspace + context_parallel; }
  std::size_t training_step() const { return forward_only() + backward_workspace; }
  // Every figure by name, the parts then the totals (what `csattn memory --json` and the
  // Python functions report).
  std::vector<std::pair<const char*, std::size_t>> fields() const {
    return {{"weights", weights},
            {"forward_workspace", forward_workspace},
            {"backward_workspace", backward_workspace},
            {"weight_gradients", weight_gradients},
            {"context_parallel", context_parallel},
            {"forward_only", forward_only()},
            {"training_step", training_step()}};
  }
};

// One packed batch of `rows` rows (padding included) in `segments` segments, none longer
// than max_seqlen; deterministic: the backward's fixed-order scratch too. Throws
// csattn::Error (InvalidArgument) on a bad shape or config, (Unsupported) in a build without
// the CUDA backend.
DeviceMemoryPlan plan_device_memory(const AttentionConfig& cfg, int rows, int segments,
                                    int max_seqlen, bool deterministic = false);

// The GPU context-parallel layer (ContextParallelLayer with Device::cuda): one plan per rank
// of `part` (its padded layout, mode and rank count, as the layer would run it). The
// communicators' own buffers (NCCL's) are not counted.
std::vector<DeviceMemoryPlan> plan_cp_device_memory(const AttentionConfig& cfg,
                                                    const CpPartition& part,
                                                    bool deterministic = false);

}  // namespace csattn
