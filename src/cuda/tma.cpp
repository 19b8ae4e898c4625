// bf16_rows_tensor_map (tma.hpp).
#include "cuda/tma.hpp"

#include <cudaTypedefs.h>

#include <string>

#include "cuda/check.hpp"

namespace csattn::cuda {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
    require(err == cudaSuccess && found == cudaDriverEntryPointSuccess && p != nullptr,
            ErrorKind::Unsupported, "the CUDA driver has no cuTensorMapEncodeTiled (TMA needs 12.0+)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

CUtensorMap bf16_rows_tensor_map(const bf16* base, long rows, int cols, int box_rows, int box_cols) {
  require(rows > 0 && cols > 0 && box_cols * 2 == 128 && box_rows > 0 && box_rows <= 256,
          ErrorKind::InvalidArgument,
          "bf16_rows_tensor_map: bad shape " + std::to_string(rows) + " x " + std::to_string(cols) +
              ", box " + std::to_string(box_rows) + " x " + std::to_string(box_cols));
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};  // bytes, rows after the first
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t step[2] = {1, 1};
  const CUresult r = encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(base), dims,
                               strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  require(r == CUDA_SUCCESS, ErrorKind::Unsupported,
          "cuTensorMapEncodeTiled refused a " + std::to_string(rows) + " x " + std::to_string(cols) +
              " bf16 map (error " + std::to_string(static_cast<int>(r)) +
              "; the base must be 16-byte aligned and each row a multiple of 16 bytes)");
  return map;
}

}  // namespace csattn::cuda
