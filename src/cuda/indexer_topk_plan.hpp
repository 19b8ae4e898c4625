// Geometry of the tiled indexer (indexer_topk_tiled.cu) that the host must know: which
// shapes it takes, how many CTAs it launches at most and its global scratch, so the
// workspace planner and the kernel use one formula.
#pragma once
#include <cstddef>

#include "cuda/params.hpp"

namespace csattn::cuda {

// Query rows scored together per CTA (consecutive rows: nearly the same visible key count).
constexpr int kIdxTiledRows = 4;
// Persistent CTAs at most (2 per SM on a 132-SM H100/H200); each owns one score slot.
constexpr int kIdxTiledMaxCtas = 264;
// Header of the scratch: the CTAs' work counter (zeroed before every launch).
constexpr std::size_t kIdxTiledHeaderBytes = 256;

inline bool indexer_tiled_supported(const LayerDims& d) {
  return d.index_heads >= 1 && d.index_heads <= 64 && (d.index_dim == 64 || d.index_dim == 128);
}

// fp32 scores of one row in a slot, padded to 16 bytes (vector loads in the select).
inline std::size_t indexer_tiled_row_stride(const LayerDims& d) {
  const std::size_t n_max = d.ratio > 0 ? static_cast<std::size_t>(d.max_seg_len / d.ratio) : 0;
  return (n_max + 3) / 4 * 4;
}

// Scratch bytes: header + kIdxTiledMaxCtas slots x kIdxTiledRows rows x round_up(n_max, 4)
// floats, n_max = max_seg_len / ratio (the longest segment's compressed keys). Flash CSA at
// 128K tokens: 256 + 264 * 4 * 32768 * 4 B = 138 MB; never the dense [T x Nc] matrix.
inline std::size_t indexer_topk_scratch_bytes(const LayerDims& d) {
  if (d.ratio != 4 || d.rows <= 0 || !indexer_tiled_supported(d)) return 0;
  return kIdxTiledHeaderBytes + static_cast<std::size_t>(kIdxTiledMaxCtas) * kIdxTiledRows *
                                    indexer_tiled_row_stride(d) * sizeof(float);
}

}  // namespace csattn::cuda
