// Sparse attention with a per-head sink over one shared K=V head (spec 01 §5): the keys of
// a query are its window (segment-local, including itself) plus compressed rows (HCA: all
// visible; CSA: the top-k selection). LSE is natural-log and includes the sink.
#pragma once
#include <cstdint>

#include "core/geometry.hpp"
#include "csattn/config.hpp"

namespace csattn::cpu {

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

// Key ids of the query at `row`: values < T are raw rows, values >= T are T + compressed
// row. Returns the count. `ids` must hold window + max(topk, max visible) entries.
int attention_keys(const BatchGeometry& geo, const AttentionArgs& a, int row, int* ids);
// The most keys any query of this batch can have (buffer sizing).
int max_attention_keys(const BatchGeometry& geo, const AttentionArgs& a);

// out: [T, H, D] (rounded to bf16 in bf16 mode); lse: [T, H] fp32.
void attention_forward(const BatchGeometry& geo, const AttentionArgs& a, float* out,
                       float* lse);

// Gradients from dout [T, H, D]: dq [T, H, D] (overwritten), dkv [T, D] and dcomp [Nc, D]
// (accumulated), dsink [H] (accumulated). Per-thread partial sums are reduced in thread
// order, so results are repeatable for a fixed thread count.
void attention_backward(const BatchGeometry& geo, const AttentionArgs& a, const float* out,
                        const float* lse, const float* dout, float* dq, float* dkv,
                        float* dcomp, float* dsink);

}  // namespace csattn::cpu
