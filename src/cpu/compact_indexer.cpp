#include "cpu/compact_indexer.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/compact_layout.hpp"
#include "core/mxfp8_layout.hpp"
#include "cpu/blas.hpp"
#include "cpu/mxfp8.hpp"
#include "cpu/topk_select.hpp"
#include "csattn/error.hpp"
#include "csattn/tensor.hpp"

namespace csattn::cpu {

std::int64_t PackedScaleAddress::offset(int segment, std::int64_t local_token, int sub,
                                        int group) const {
  if (thd) {
    const std::int64_t m = (prefixes[segment] + local_token) * rows_per_token + sub;
    return csattn::mxfp8::scale_byte_offset(m, group, groups_padded);
  }
  const std::int64_t m = local_token * rows_per_token + sub;
  return segment * slice_bytes + csattn::mxfp8::scale_byte_offset(m, group, groups_padded);
}

const float* OperandRows::load(int segment, std::int64_t token, std::int64_t local,
                               std::int64_t count, std::vector<float>& scratch) const {
  const std::int64_t row_values = std::int64_t{rows_per_token} * cols;
  const std::int64_t first = token * row_values;
  if (kind == Kind::f32) return static_cast<const float*>(data) + first;
  scratch.resize(static_cast<std::size_t>(count * row_values));
  if (kind == Kind::bf16) {
    const auto* src = static_cast<const std::uint16_t*>(data) + first;
    for (std::int64_t i = 0; i < count * row_values; ++i) scratch[i] = bf16_bits_to_float(src[i]);
    return scratch.data();
  }
  // MXFP8: the scales are read through the packed layout, as the GPU reads them.
  const auto* src = static_cast<const std::uint8_t*>(data) + first;
  const int groups = cols / csattn::mxfp8::kBlock;
  for (std::int64_t t = 0; t < count; ++t)
    for (int h = 0; h < rows_per_token; ++h) {
      const std::int64_t row = t * rows_per_token + h;
      for (int g = 0; g < groups; ++g) {
        const std::int64_t v = row * cols + std::int64_t{g} * csattn::mxfp8::kBlock;
        cpu::mxfp8::dequantize_block(src + v, packed_scales[scales.offset(segment, local + t, h, g)],
                                     scratch.data() + v);
      }
    }
  return scratch.data();
}

namespace {

constexpr int kRowsPerBlock = 32;  // query rows scored together (one GEMM M = 32 H)
constexpr int kKeyTile = 256;      // keys per GEMM N tile: bounds the dots scratch

struct RowBlock {
  int segment;
  std::int64_t first_local, rows;  // local rows [first_local, first_local + rows)
};

struct Segment {
  std::int64_t q_start, len_q, k_start, len_k, offset, cand_start;
};

Segment segment(const CompactIndexerCall& c, int b) {
  return {c.cu_q[b], c.cu_q[b + 1] - c.cu_q[b], c.cu_k[b], c.cu_k[b + 1] - c.cu_k[b],
          c.offsets.empty() ? 0 : c.offsets[b], c.cand_batch_offsets[b]};
}

// Start of local row `local` of segment `s` in the one-pass candidate layout.
std::int64_t row_start(const CompactIndexerCall& c, const Segment& s, std::int64_t local) {
  return s.cand_start + compact::rows_candidates_before(s.offset, local, c.ratio, s.len_k);
}

// One-pass candidate offset of global row `row` (row == T: the total). A pass of rows
// [p0, p1) occupies [global_start(p0), global_start(p1)) of the one-pass layout.
std::int64_t global_start(const CompactIndexerCall& c, std::int64_t row) {
  const int B = static_cast<int>(c.cu_q.size()) - 1;
  // The last segment whose start is <= row; empty segments before it hold no candidates.
  const auto it = std::upper_bound(c.cu_q.begin(), c.cu_q.end() - 1, row);
  const int b = static_cast<int>(it - c.cu_q.begin()) - 1;
  if (b >= B || row >= c.cu_q[B]) return c.cand_batch_offsets[B];
  const Segment s = segment(c, b);
  return row_start(c, s, row - s.q_start);
}

std::vector<RowBlock> pass_blocks(const CompactIndexerCall& c, std::int64_t p0, std::int64_t p1) {
  std::vector<RowBlock> blocks;
  const int B = static_cast<int>(c.cu_q.size()) - 1;
  for (int b = 0; b < B; ++b) {
    const std::int64_t s0 = std::max<std::int64_t>(c.cu_q[b], p0);
    const std::int64_t s1 = std::min<std::int64_t>(c.cu_q[b + 1], p1);
    for (std::int64_t r = s0; r < s1; r += kRowsPerBlock)
      blocks.push_back({b, r - c.cu_q[b], std::min<std::int64_t>(kRowsPerBlock, s1 - r)});
  }
  return blocks;
}

struct Scratch {
  std::vector<float> q, k, w, dots, acc;
  std::vector<std::uint64_t> select;
};

// Scores the block's rows into their slabs of `cand` (pass base subtracted), then selects.
void process_block(const CompactIndexerCall& c, const RowBlock& blk, std::int64_t pass_base,
                   Scratch& s) {
  const int H = c.heads, D = c.dim, K = c.topk;
  const Segment seg = segment(c, blk.segment);
  const std::int64_t nrows = blk.rows;
  const std::int64_t last = blk.first_local + nrows - 1;
  const std::int64_t ncols = compact::row_candidates(seg.offset, last, c.ratio, seg.len_k);
  const std::int64_t g0 = seg.q_start + blk.first_local;  // first global row

  if (ncols > 0) {
    const float* q = c.q.load(blk.segment, g0, blk.first_local, nrows, s.q);
    const float* w = c.w.load(blk.segment, g0, blk.first_local, nrows, s.w);
    for (std::int64_t c0 = 0; c0 < ncols; c0 += kKeyTile) {
      const int tile = static_cast<int>(std::min<std::int64_t>(kKeyTile, ncols - c0));
      const float* k = c.k.load(blk.segment, seg.k_start + c0, c0, tile, s.k);
      // dots[(r H + h), j] = q[row r, head h] . k[c0 + j]
      s.dots.resize(static_cast<std::size_t>(nrows * H * tile));
      gemm(false, true, static_cast<int>(nrows * H), tile, D, 1.0f, q, D, k, D, 0.0f,
           s.dots.data(), tile);
      for (std::int64_t r = 0; r < nrows; ++r) {
        const std::int64_t local = blk.first_local + r;
        const std::int64_t n = compact::row_candidates(seg.offset, local, c.ratio, seg.len_k);
        const int valid = static_cast<int>(std::clamp<std::int64_t>(n - c0, 0, tile));
        if (valid == 0) continue;
        // Heads summed in ascending order for every key: the accumulation order is fixed.
        s.acc.assign(static_cast<std::size_t>(valid), 0.0f);
        const float* wr = w + r * H;
        for (int h = 0; h < H; ++h) {
          const float* dh = s.dots.data() + (r * H + h) * tile;
          const float wh = wr[h];
          for (int j = 0; j < valid; ++j) s.acc[j] += wh * std::max(dh[j], 0.0f);
        }
        float* slab = c.cand + (row_start(c, seg, local) - pass_base) + c0;
        for (int j = 0; j < valid; ++j) slab[j] = s.acc[j] * c.sm_scale;
      }
    }
  }

  for (std::int64_t r = 0; r < nrows; ++r) {
    const std::int64_t local = blk.first_local + r;
    const int n = static_cast<int>(compact::row_candidates(seg.offset, local, c.ratio, seg.len_k));
    const float* slab = c.cand + (row_start(c, seg, local) - pass_base);
    const std::int64_t out = (g0 + r) * K;
    std::int32_t* idx = c.indices + out;
    const int count = select_topk(slab, n, K, idx, s.select);
    float* lg = c.logits + out;
    for (int j = 0; j < count; ++j) lg[j] = slab[idx[j]];
    for (int j = count; j < K; ++j) lg[j] = -INFINITY;
    if (c.softmax) softmax_selected(lg, count, K, c.softmax + out);
  }
}

}  // namespace

void compact_indexer_topk(const CompactIndexerCall& c) {
  // Offsets from this call's layout, every call (nothing is carried over between calls).
  compact::cand_batch_offsets(c.cu_q, c.cu_k, c.offsets, c.ratio, c.cand_batch_offsets);
  const std::int64_t T = c.cu_q.back();
  for (std::int64_t p0 = 0; p0 < T; p0 += c.pass_rows) {
    const std::int64_t p1 = std::min(T, p0 + c.pass_rows);
    const std::int64_t base = global_start(c, p0);
    const std::int64_t need = global_start(c, p1) - base;
    require(need <= c.cand_capacity, ErrorKind::Internal,
            "compact indexer: rows [" + std::to_string(p0) + ", " + std::to_string(p1) +
                ") need " + std::to_string(need) + " candidate floats, the buffer holds " +
                std::to_string(c.cand_capacity));
    const std::vector<RowBlock> blocks = pass_blocks(c, p0, p1);
    const bool invariant = batch_invariant();  // the caller's GEMM mode, on every worker
#pragma omp parallel
    {
      const BatchInvariantScope scope(invariant);
      Scratch s;
#pragma omp for schedule(dynamic, 1)
      for (std::size_t i = 0; i < blocks.size(); ++i) process_block(c, blocks[i], base, s);
    }
  }
}

}  // namespace csattn::cpu
