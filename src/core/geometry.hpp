// BatchGeometry: per-row facts of a packed batch for one layer (segment, position, padding)
// and the segment-major layout of the compressed rows. Built once per forward from the
// SeqLayout and the compress ratio; every backend reads the same geometry.
#pragma once
#include <cstdint>
#include <vector>

#include "csattn/layout.hpp"

namespace csattn {

struct BatchGeometry {
  int rows = 0;       // T, physical rows
  int segments = 0;   // B
  int ratio = 0;      // m (0 for SWA)
  std::vector<int> row_segment;   // [T]
  std::vector<int> row_position;  // [T], restarts at 0 per segment (padded geometry)
  std::vector<std::uint8_t> row_is_padding;  // [T], position >= real length
  std::vector<int> seg_start;     // [B], first physical row
  std::vector<int> seg_len;       // [B], physical (padded) length
  std::vector<int> comp_start;    // [B+1], first compressed row of each segment
  std::int64_t real_rows = 0;

  int compressed_rows() const { return comp_start.empty() ? 0 : comp_start.back(); }
  int seg_compressed(int b) const { return comp_start[b + 1] - comp_start[b]; }
  // Compressed entries visible to the query at `row`: floor((pos+1)/m) clamped to N_c.
  int visible_compressed(int row) const;

  static BatchGeometry build(const SeqLayout& layout, int ratio);
};

}  // namespace csattn
