#include "core/block_fp8.hpp"

#include <cmath>

#include "csattn/error.hpp"

namespace csattn {

Tensor dequantize_block_fp8(const Tensor& q, const Tensor& scale, const std::string& what) {
  require(q.dtype() == DType::e4m3 && q.shape().size() == 2, ErrorKind::DTypeMismatch,
          what + ": a block-scaled FP8 weight must be 2-D F8_E4M3, got " +
              shape_str(q.shape()) + " " + dtype_name(q.dtype()));
  require(scale.dtype() == DType::e8m0 || scale.dtype() == DType::f32, ErrorKind::DTypeMismatch,
          what + ": its block scales must be F8_E8M0 (as released) or F32, got " +
              dtype_name(scale.dtype()));
  const std::int64_t rows = q.shape()[0], cols = q.shape()[1];
  const Shape want = {(rows + kFp8WeightBlock - 1) / kFp8WeightBlock,
                      (cols + kFp8WeightBlock - 1) / kFp8WeightBlock};
  require(scale.shape() == want, ErrorKind::ShapeMismatch,
          what + ": its block scales have shape " + shape_str(scale.shape()) + ", expected " +
              shape_str(want) + " (one per " + std::to_string(kFp8WeightBlock) + " x " +
              std::to_string(kFp8WeightBlock) + " block of " + shape_str(q.shape()) + ")");
  const std::vector<float> s = scale.to_f32();
  for (std::size_t b = 0; b < s.size(); ++b) {
    require(std::isfinite(s[b]), ErrorKind::InvalidArgument,
            what + ": block scale [" + std::to_string(static_cast<std::int64_t>(b) / want[1]) +
                ", " + std::to_string(static_cast<std::int64_t>(b) % want[1]) + "] is not finite");
  }
  const auto* bytes = static_cast<const std::uint8_t*>(q.data());
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* srow = s.data() + (i / kFp8WeightBlock) * want[1];
    for (std::int64_t j = 0; j < cols; ++j) {
      const float v = e4m3_bits_to_float(bytes[i * cols + j]);
      const float w = round_bf16(v * srow[j / kFp8WeightBlock]);
      if (!std::isfinite(w)) {
        throw Error(ErrorKind::InvalidArgument,
                    what + ": element [" + std::to_string(i) + ", " + std::to_string(j) +
                        "] is " + (std::isnan(v) ? "NaN (E4M3 0x7F / 0xFF)" : "out of range") +
                        " after its block scale");
      }
      out[static_cast<std::size_t>(i * cols + j)] = w;
    }
  }
  return Tensor::from_f32(out, q.shape());
}

}  // namespace csattn
