// The DeepSeek-V4 release's block-scaled FP8 linear weights (wq_a, wq_b, wkv, wo_a, wo_b and
// the indexer's wq_b): E4M3 values [rows, cols] beside a `.scale` tensor with one scale per
// 128 x 128 block, [ceil(rows / 128), ceil(cols / 128)], E8M0 as released (F32 accepted).
#pragma once
#include <string>

#include "csattn/tensor.hpp"

namespace csattn {

constexpr int kFp8WeightBlock = 128;

// w[i][j] = e4m3(q[i][j]) * scale[i / 128][j / 128], rounded to bf16 (to nearest even): the
// layer's bf16 contract. Exact for E8M0 scales (a 3-bit mantissa times a power of two) unless
// the product leaves bf16's range. Throws csattn::Error naming `what` for a wrong dtype or
// shape, a NaN value or scale, or a product that overflows.
Tensor dequantize_block_fp8(const Tensor& q, const Tensor& scale, const std::string& what);

}  // namespace csattn
