// Sparse attention with a per-head sink over one shared K=V head (spec 01 §5). The general
// operator reads explicit index lists into `kv_full` (spec 02 §7, core/attention_index.hpp):
// the single-rank layer and the context-parallel ranks build those lists with the same
// builder and call the same operator. LSE is natural-log and includes the sink.
#pragma once
#include <cstdint>

#include "core/geometry.hpp"
#include "csattn/config.hpp"

namespace csattn::cpu {

// kv_full = cat(raw [raw_rows, D], comp [comp_rows, D]); an index value v < raw_rows reads
// raw row v, a larger one compressed row v - raw_rows.
struct KvFull {
  const float* raw = nullptr;
  int raw_rows = 0;
  const float* comp = nullptr;
  int comp_rows = 0;
};

struct IndexedAttentionArgs {
  int heads = 0, dim = 0;
  float scale = 0.0f;                  // tau = D^-1/2
  const float* q = nullptr;            // [nq, H, D]
  KvFull kv;
  const float* sink = nullptr;         // [H]
  const std::int32_t* index = nullptr;  // [nq, width] kv_full rows, -1 = empty slot
  int width = 0;
  bool bf16 = false;
};

// out: [nq, H, D] (rounded to bf16 in bf16 mode); lse: [nq, H] fp32. Keys are taken in the
// order of the index row (the order is part of the arithmetic: the same index rows give the
// same bits).
void attention_forward(int nq, const IndexedAttentionArgs& a, float* out, float* lse);

// Gradients from dout [nq, H, D]: dq [nq, H, D] (overwritten), draw [raw_rows, D] and dcomp
// [comp_rows, D] (accumulated), dsink [H] (accumulated). Per-thread partial sums are reduced
// in thread order, so results are repeatable for a fixed thread count.
void attention_backward(int nq, const IndexedAttentionArgs& a, const float* out,
                        const float* lse, const float* dout, float* dq, float* draw,
                        float* dcomp, float* dsink);

// ---- The single-rank form used by HybridAttentionLayer: keys from the batch geometry ----

struct AttentionArgs {
  LayerKind kind = LayerKind::swa;
  int heads = 0, dim = 0, window = 0;
  float scale = 0.0f;                 // tau = D^-1/2
  const float* q = nullptr;           // [T, H, D]
  const float* kv = nullptr;          // [T, D]
  const float* comp = nullptr;        // [Nc, D] compressed rows (HCA / CSA)
  const float* sink = nullptr;        // [H]
  const std::int32_t* topk = nullptr;  // CSA: [T, topk] segment-local ids or -1
  int topk_width = 0;
  bool bf16 = false;
};

// All T rows: builds the index lists (window + top-k or all visible compressed entries) and
// calls the indexed operator with kv_full = cat(kv, comp).
void attention_forward(const BatchGeometry& geo, const AttentionArgs& a, float* out,
                       float* lse);
void attention_backward(const BatchGeometry& geo, const AttentionArgs& a, const float* out,
                        const float* lse, const float* dout, float* dq, float* dkv,
                        float* dcomp, float* dsink);

}  // namespace csattn::cpu
