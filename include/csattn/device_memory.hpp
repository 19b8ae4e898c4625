// The device memory of the GPU layer, planned on the host from the shapes alone (no GPU
// needed): what the layer allocates - its weights, the forward workspace (it keeps the
// activations the backward reads) and the backward's (it ends with the fp32 weight
// gradients) - so that a run can be sized before a GPU is at hand (`csattn memory`). The same
// plans size DeviceLayer's *_workspace_bytes. Not counted: the CUDA context, cuBLAS's own
// allocations and, for context parallelism, the communicators' buffers.
#pragma once
#include <cstddef>

#include "csattn/config.hpp"

namespace csattn {

struct DeviceMemoryPlan {
  std::size_t weights = 0;             // bf16 parameters (fp32 ape / sink), RoPE frequencies
  std::size_t forward_workspace = 0;   // activations kept for the backward, metadata, cuBLAS scratch
  std::size_t backward_workspace = 0;  // activation gradients, then the weight gradients
  std::size_t weight_gradients = 0;    // the part of backward_workspace that the weight gradients take
  std::size_t forward_only() const { return weights + forward_workspace; }
  std::size_t training_step() const { return weights + forward_workspace + backward_workspace; }
};

// One packed batch of `rows` rows (padding included) in `segments` segments, none longer
// than max_seqlen; deterministic: the backward's fixed-order scratch too. Throws
// csattn::Error (InvalidArgument) on a bad shape or config, (Unsupported) in a build without
// the CUDA backend.
DeviceMemoryPlan plan_device_memory(const AttentionConfig& cfg, int rows, int segments,
                                    int max_seqlen, bool deterministic = false);

}  // namespace csattn
