// Tensor Memory Accelerator (TMA) descriptors on the host: a CUtensorMap for a row-major
// [rows x cols] bf16 matrix, loaded in [box_rows x box_cols] boxes with the 128-byte swizzle
// that wgmma's K-major operand layout uses (the 16-byte chunk c of box row r lands at
// r * 128 + ((c ^ (r & 7)) << 4): wgmma_desc_sw128's layout, 1024-byte aligned boxes).
// The driver's encoder is reached through the runtime's entry-point query, so csattn does not
// link libcuda itself. Rows past `rows` read as zeros. The map holds `base`: a CUDA graph that
// captures a launch with it replays it on the same buffer.
#pragma once
#include <cuda.h>

#include "cuda/params.hpp"

namespace csattn::cuda {

// Throws csattn::Error: InvalidArgument for a bad shape (rows, cols, box_rows <= 0, box_rows
// > 256, box_cols * 2 != 128), checked before the driver is asked; Unsupported when the driver
// lacks the encoder or refuses the map (base not 16-byte aligned, cols * 2 not a multiple of 16).
CUtensorMap bf16_rows_tensor_map(const bf16* base, long rows, int cols, int box_rows, int box_cols);

// A row-major [tokens x heads x cols] bf16 tensor (an attention output) in [1 x box_heads x
// box_cols] boxes, same swizzle. A box's heads at or past `heads` are outside the map: a TMA
// store leaves them unwritten (they are the next token's rows), so a head block whose last
// rows pass H needs no special case. Errors as bf16_rows_tensor_map (box_heads <= 256).
CUtensorMap bf16_heads_tensor_map(bf16* base, long tokens, int heads, int cols, int box_heads, int box_cols);

}  // namespace csattn::cuda
