// bf16_rows_tensor_map and bf16_heads_tensor_map (tma.hpp).
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

// A bf16 map of `rank` dimensions (dims[0] contiguous, strides in bytes for dims 1..), in
// 128-byte-swizzled boxes; `what` names the shape in the error.
CUtensorMap encode_bf16(const bf16* base, cuuint32_t rank, const cuuint64_t* dims, const cuuint64_t* strides,
                        const cuuint32_t* box, const std::string& what) {
  CUtensorMap map{};
  const cuuint32_t step[3] = {1, 1, 1};
  const CUresult r = encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<bf16*>(base), dims,
                               strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  require(r == CUDA_SUCCESS, ErrorKind::Unsupported,
          "cuTensorMapEncodeTiled refused a " + what + " bf16 map (error " + std::to_string(static_cast<int>(r)) +
              "; the base must be 16-byte aligned and each row a multiple of 16 bytes)");
  return map;
}

}  // namespace

CUtensorMap bf16_rows_tensor_map(const bf16* base, long rows, int cols, int box_rows, int box_cols) {
  const std::string what = std::to_string(rows) + " x " + std::to_string(cols);
  require(rows > 0 && cols > 0 && box_cols * 2 == 128 && box_rows > 0 && box_rows <= 256,
          ErrorKind::InvalidArgument,
          "bf16_rows_tensor_map: bad shape " + what + ", box " + std::to_string(box_rows) + " x " +
              std::to_string(box_cols));
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};  // bytes, rows after the first
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  return encode_bf16(base, 2, dims, strides, box, what);
}

CUtensorMap bf16_heads_tensor_map(bf16* base, long tokens, int heads, int cols, int box_heads, int box_cols) {
  const std::string what = std::to_string(tokens) + " x " + std::to_string(heads) + " x " + std::to_string(cols);
  require(tokens > 0 && heads > 0 && cols > 0 && box_cols * 2 == 128 && box_heads > 0 && box_heads <= 256,
          ErrorKind::InvalidArgument,
          "bf16_heads_tensor_map: bad shape " + what + ", box " + std::to_string(box_heads) + " x " +
              std::to_string(box_cols));
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(tokens)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(cols) * 2, static_cast<cuuint64_t>(cols) * 2 * heads};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_heads), 1};
  return encode_bf16(base, 3, dims, strides, box, what);
}

}  // namespace csattn::cuda
