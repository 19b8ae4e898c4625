#include "core/attention_index.hpp"

#include <algorithm>

#include "csattn/error.hpp"

namespace csattn {

int compressed_width(const AttentionConfig& cfg, int max_seqlen, bool has_topk) {
  if (has_topk) return cfg.index_topk;
  return cfg.compress_ratio > 1 ? max_seqlen / cfg.compress_ratio : 0;
}

AttentionIndex build_attention_index(const QueryRows& q, IndexMode mode, int window,
                                     int cw, const std::int32_t* topk,
                                     const KvLowering& low) {
  const BatchGeometry& geo = *q.geo;
  require(mode == IndexMode::all_visible || topk != nullptr || q.count == 0, ErrorKind::Internal,
          "build_attention_index: modes 0 and 2 need a top-k");
  AttentionIndex out;
  out.window = window;
  out.compressed_width = cw;
  const int width = window + cw;
  out.index.assign(static_cast<std::size_t>(q.count) * width, -1);
  if (mode != IndexMode::indexer_loss) out.length.assign(static_cast<std::size_t>(q.count), 0);
  if (mode == IndexMode::indexer_loss)
    out.indexer_rank_major.assign(static_cast<std::size_t>(q.count) * cw, -1);
  const int R = geo.ratio;
  const int S = low.seq_to_rank_row ? low.seq_major_rows : geo.compressed_rows();

  // Rank-major row of compressed entry c of segment s, or -1.
  auto lower = [&](int s, int c) -> int {
    if (c < 0 || c >= geo.seg_compressed(s)) return -1;
    const int j = geo.comp_start[s] + c;
    if (j >= S) return -1;
    return low.seq_to_rank_row ? low.seq_to_rank_row[j] : j;
  };

#pragma omp parallel for schedule(static)
  for (int i = 0; i < q.count; ++i) {
    const int g = q.row(i);
    const int s = geo.row_segment[g], pos = geo.row_position[g];
    const int w0 = std::max(pos - window + 1, 0);  // in-sequence start of the window
    const int nw = pos - w0 + 1;
    const int self = q.kv_row(i);
    std::int32_t* row = out.index.data() + static_cast<std::size_t>(i) * width;
    const std::int32_t* sel = topk ? topk + static_cast<std::size_t>(i) * cw : nullptr;
    if (mode == IndexMode::indexer_loss) {
      std::int32_t* rm = out.indexer_rank_major.data() + static_cast<std::size_t>(i) * cw;
      for (int k = 0; k < cw; ++k) {
        const int m = lower(s, sel[k]);
        rm[k] = m;
        row[k] = m < 0 ? -1 : low.compressed_base + m;
      }
      for (int w = 0; w < nw; ++w) row[cw + w] = self - (nw - 1) + w;
      continue;
    }
    int n = 0;
    for (int w = 0; w < nw; ++w) row[n++] = self - (nw - 1) + w;
    if (mode == IndexMode::selected) {
      for (int k = 0; k < cw; ++k) {
        const int m = lower(s, sel[k]);
        if (m >= 0) row[n++] = low.compressed_base + m;
      }
    } else if (R > 1) {
      const int nc = std::min({(pos + 1) / R, cw, geo.seg_compressed(s)});
      for (int c = 0; c < nc; ++c) {
        const int m = lower(s, c);
        if (m >= 0) row[n++] = low.compressed_base + m;
      }
    }
    out.length[i] = n;
  }
  return out;
}

}  // namespace csattn
