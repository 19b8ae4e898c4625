// The launchers of the two multi-row indexers, called by launch_indexer_topk: the tiled
// mma.sync kernel (indexer_topk_tiled.cu) and its wgmma successor (indexer_topk_wgmma.cu),
// which share the shapes they take, the scratch and the result bit for bit.
#pragma once
#include <cuda_runtime.h>

#include "cuda/params.hpp"

namespace csattn::cuda {

// scratch: indexer_topk_scratch_bytes(d) bytes (indexer_topk_plan.hpp), any contents.
void launch_indexer_topk_tiled(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                               const float* w_eff, const bf16* keys, std::int32_t* topk,
                               void* scratch, cudaStream_t stream);
void launch_indexer_topk_wgmma(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                               const float* w_eff, const bf16* keys, std::int32_t* topk,
                               void* scratch, cudaStream_t stream);

}  // namespace csattn::cuda
