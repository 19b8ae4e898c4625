#include "core/geometry.hpp"

#include <algorithm>

namespace csattn {

int BatchGeometry::visible_compressed(int row) const {
  if (ratio <= 1) return 0;
  const int b = row_segment[row];
  return std::min((row_position[row] + 1) / ratio, seg_compressed(b));
}

BatchGeometry BatchGeometry::build(const SeqLayout& layout, int ratio) {
  BatchGeometry g;
  g.rows = static_cast<int>(layout.total_rows());
  g.segments = layout.num_segments();
  g.ratio = ratio;
  g.row_segment.resize(g.rows);
  g.row_position.resize(g.rows);
  g.row_is_padding.resize(g.rows);
  g.seg_start.resize(g.segments);
  g.seg_len.resize(g.segments);
  g.comp_start.assign(static_cast<std::size_t>(g.segments) + 1, 0);
  for (int b = 0; b < g.segments; ++b) {
    const int start = layout.seg_start(b), len = layout.seg_len(b), real = layout.real_len(b);
    g.seg_start[b] = start;
    g.seg_len[b] = len;
    for (int p = 0; p < len; ++p) {
      g.row_segment[start + p] = b;
      g.row_position[start + p] = p;
      g.row_is_padding[start + p] = p >= real ? 1 : 0;
    }
    g.comp_start[b + 1] = g.comp_start[b] + (ratio > 1 ? len / ratio : 0);
  }
  g.real_rows = layout.real_rows();
  return g;
}

}  // namespace csattn
