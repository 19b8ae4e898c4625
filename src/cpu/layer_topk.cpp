#include "cpu/layer_topk.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/compact_layout.hpp"
#include "csattn/ops.hpp"
#include "csattn/plan.hpp"

namespace csattn::cpu {

namespace {

// The compact THD segments of one call.
struct CompactSegments {
  std::vector<std::int32_t> cu_q = {0}, cu_k = {0};
  std::vector<std::int32_t> offsets;  // causal offset of each segment's first row
  std::vector<int> key_source;        // gather: first sequence-major key row of each segment
  int max_q = 0, max_k = 0;

  void add(int q_end, int len_k, int offset, int key_row) {
    max_q = std::max(max_q, q_end - cu_q.back());
    max_k = std::max(max_k, len_k);
    cu_q.push_back(q_end);
    cu_k.push_back(cu_k.back() + len_k);
    offsets.push_back(offset);
    key_source.push_back(key_row);
  }
  int count() const { return static_cast<int>(offsets.size()); }
  bool any_offset() const {
    return std::any_of(offsets.begin(), offsets.end(), [](std::int32_t o) { return o != 0; });
  }
};

// Every row: per sequence its real rows with all its keys, then its padding rows.
CompactSegments whole_batch(const BatchGeometry& geo) {
  CompactSegments s;
  for (int b = 0; b < geo.segments; ++b) {
    int real = 0;
    while (real < geo.seg_len[b] && !geo.row_is_padding[geo.seg_start[b] + real]) ++real;
    s.add(geo.seg_start[b] + real, geo.seg_compressed(b), 0, geo.comp_start[b]);
    s.add(geo.seg_start[b] + geo.seg_len[b], 0, 0, geo.comp_start[b + 1]);
  }
  return s;
}

// A row set: per run of consecutive rows of one sequence, its real rows with the keys its
// last real row sees (the others see a prefix of them), then its padding rows (a suffix of
// the run, as padding rows end every sequence).
CompactSegments row_runs(const QueryRows& q) {
  const BatchGeometry& geo = *q.geo;
  CompactSegments s;
  int i = 0;
  while (i < q.count) {
    const int first = q.row(i), b = geo.row_segment[first];
    int j = i + 1;
    while (j < q.count && q.row(j) == q.row(j - 1) + 1 && geo.row_segment[q.row(j)] == b) ++j;
    int m = i;
    while (m < j && !geo.row_is_padding[q.row(m)]) ++m;
    const int len_k = m > i ? geo.visible_compressed(q.row(m - 1)) : 0;
    s.add(m, len_k, geo.row_position[first], geo.comp_start[b]);
    s.add(j, 0, m < j ? geo.row_position[q.row(m)] : 0, geo.comp_start[b]);
    i = j;
  }
  return s;
}

}  // namespace

void layer_indexer_topk(const QueryRows& queries, const IndexerArgs& a,
                        IndexerPrecision precision, std::int32_t* topk, float* logits,
                        float* softmax) {
  const BatchGeometry& geo = *queries.geo;
  const int T = queries.count, K = a.topk, HI = a.heads, DI = a.dim;
  if (T == 0) return;
  const bool whole = queries.rows == nullptr && T == geo.rows;
  const CompactSegments seg = whole ? whole_batch(geo) : row_runs(queries);

  // Keys: the sequence-major rows in place for the whole batch, else gathered per segment.
  std::vector<float> gathered;
  const float* keys = a.keys;
  std::int64_t k_rows = geo.compressed_rows();
  if (!whole) {
    k_rows = seg.cu_k.back();
    gathered.resize(static_cast<std::size_t>(k_rows) * DI);
    for (int c = 0; c < seg.count(); ++c)
      if (seg.cu_k[c + 1] > seg.cu_k[c])
        std::memcpy(gathered.data() + static_cast<std::size_t>(seg.cu_k[c]) * DI,
                    a.keys + static_cast<std::size_t>(seg.key_source[c]) * DI,
                    sizeof(float) * DI * static_cast<std::size_t>(seg.cu_k[c + 1] - seg.cu_k[c]));
    keys = gathered.data();
  }

  CompactIndexerGeometry g;
  g.format = QkvFormat::thd;
  g.batch = seg.count();
  g.q_rows = T;
  g.k_rows = k_rows;
  g.max_seqlen_q = seg.max_q;
  g.max_seqlen_k = seg.max_k;
  g.heads = HI;
  g.head_dim = DI;
  g.topk = K;
  g.ratio = geo.ratio;
  g.precision = precision;
  g.causal_offsets = seg.any_offset();
  if (g.causal_offsets && seg.max_k > 0) {
    // With offsets the one-pass bound is rows * max_seqlen_k; passes of
    // ceil(candidates / max_seqlen_k) rows keep the buffer at this call's candidate count.
    std::int64_t candidates = 0;
    for (int c = 0; c < seg.count(); ++c)
      candidates += compact::rows_candidates_before(seg.offsets[c], seg.cu_q[c + 1] - seg.cu_q[c],
                                                    geo.ratio, seg.cu_k[c + 1] - seg.cu_k[c]);
    const std::int64_t rows = (candidates + seg.max_k - 1) / seg.max_k;
    g.rows_per_pass = static_cast<int>(std::clamp<std::int64_t>(rows, 1, T));
  }
  const CompactIndexerPlan plan = CompactIndexerPlan::make(g);
  HostWorkspace ws(workspace_bytes(plan));

  const std::int64_t nseg = seg.count();
  ops::CompactIndexerInputs in;
  in.q = {a.q, DType::f32, {T, HI, DI}};
  in.k = {keys, DType::f32, {k_rows, DI}};
  in.weights = {a.weights, DType::f32, {T, HI}};
  in.cu_seqlens_q = {seg.cu_q.data(), DType::i32, {nseg + 1}};
  in.cu_seqlens_k = {seg.cu_k.data(), DType::i32, {nseg + 1}};
  if (g.causal_offsets) in.q_causal_offsets = {seg.offsets.data(), DType::i32, {nseg}};
  ops::CompactIndexerOutputs out;
  out.indices = {topk, DType::i32, {T, K}};
  out.logits = {logits, DType::f32, {T, K}};
  if (softmax) out.softmax = {softmax, DType::f32, {T, K}};
  ops::compact_indexer_topk(plan, in, out, ws.view());
}

}  // namespace csattn::cpu
