// The tiled indexer's launcher (indexer_topk_tiled.cu), called by launch_indexer_topk.
#pragma once
#include <cuda_runtime.h>

#include "cuda/params.hpp"

namespace csattn::cuda {

// scratch: indexer_topk_scratch_bytes(d) bytes (indexer_topk_plan.hpp), any contents.
void launch_indexer_topk_tiled(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                               const float* w_eff, const bf16* keys, std::int32_t* topk,
                               void* scratch, cudaStream_t stream);

}  // namespace csattn::cuda
