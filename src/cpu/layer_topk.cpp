#include "cpu/layer_topk.hpp"

#include <algorithm>
#include <vector>

#include "csattn/ops.hpp"
#include "csattn/plan.hpp"

namespace csattn::cpu {

void layer_indexer_topk(const BatchGeometry& geo, const IndexerArgs& a,
                        IndexerPrecision precision, std::int32_t* topk, float* logits,
                        float* softmax) {
  const int B = geo.segments, T = geo.rows, K = a.topk;
  const int HI = a.heads, DI = a.dim, Nc = geo.compressed_rows();
  std::vector<std::int32_t> cu_q = {0}, cu_k = {0};
  int max_q = 0, max_k = 0;
  for (int b = 0; b < B; ++b) {
    int real = 0;
    while (real < geo.seg_len[b] && !geo.row_is_padding[geo.seg_start[b] + real]) ++real;
    cu_q.push_back(geo.seg_start[b] + real);           // real rows ...
    cu_q.push_back(geo.seg_start[b] + geo.seg_len[b]);  // ... then padding rows
    cu_k.push_back(geo.comp_start[b + 1]);
    cu_k.push_back(geo.comp_start[b + 1]);               // padding rows see no keys
    max_q = std::max(max_q, geo.seg_len[b]);
    max_k = std::max(max_k, geo.seg_compressed(b));
  }
  CompactIndexerGeometry g;
  g.format = QkvFormat::thd;
  g.batch = 2 * B;
  g.q_rows = T;
  g.k_rows = Nc;
  g.max_seqlen_q = max_q;
  g.max_seqlen_k = max_k;
  g.heads = HI;
  g.head_dim = DI;
  g.topk = K;
  g.ratio = geo.ratio;
  g.precision = precision;
  const CompactIndexerPlan plan = CompactIndexerPlan::make(g);
  HostWorkspace ws(workspace_bytes(plan));

  const std::int64_t n2 = static_cast<std::int64_t>(cu_q.size());
  ops::CompactIndexerInputs in;
  in.q = {a.q, DType::f32, {T, HI, DI}};
  in.k = {a.keys, DType::f32, {Nc, DI}};
  in.weights = {a.weights, DType::f32, {T, HI}};
  in.cu_seqlens_q = {cu_q.data(), DType::i32, {n2}};
  in.cu_seqlens_k = {cu_k.data(), DType::i32, {n2}};
  ops::CompactIndexerOutputs out;
  out.indices = {topk, DType::i32, {T, K}};
  out.logits = {logits, DType::f32, {T, K}};
  if (softmax) out.softmax = {softmax, DType::f32, {T, K}};
  ops::compact_indexer_topk(plan, in, out, ws.view());
}

}  // namespace csattn::cpu
