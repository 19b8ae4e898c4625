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

// The query rows an operator computes: a subset of the batch's rows, in the operator's row
// order, with their facts read from the (global) geometry. The single-rank layer computes
// every row (rows = nullptr); a context-parallel rank computes its own rows. kv_rows gives the
// row of each query's own K=V in the raw key buffer the operator reads (nullptr: the same as
// the global row, i.e. a buffer of all T rows); the window rows of a query sit immediately
// before it in that buffer.
struct QueryRows {
  const BatchGeometry* geo = nullptr;
  int count = 0;
  const int* rows = nullptr;     // [count] global row ids, or nullptr for 0..count-1
  const int* kv_rows = nullptr;  // [count] raw key rows, or nullptr for the global row

  int row(int i) const { return rows ? rows[i] : i; }
  int kv_row(int i) const { return kv_rows ? kv_rows[i] : row(i); }
  static QueryRows all(const BatchGeometry& g) { return {&g, g.rows, nullptr, nullptr}; }
};

}  // namespace csattn
