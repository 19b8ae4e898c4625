// Individual operators, for users who build their own layer: MXFP8 quantization and scale
// packing, the compact indexer forward + top-k + softmax, and the THD compact K layout.
//
// Every operator takes caller-owned views (tensor.hpp) for inputs, outputs and workspace and
// allocates nothing that depends on the problem size; workspace sizes come from the plans of
// plan.hpp, which depend on static shapes only. These are the signatures the CUDA kernels
// implement. Every input is validated: a bad one throws csattn::Error naming the argument.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "csattn/plan.hpp"
#include "csattn/tensor.hpp"

namespace csattn::ops {

// ---- MXFP8 (spec 03 §5.2) -------------------------------------------------------------------

// x: [..., D] f32 or bf16, D a multiple of 32. data: e4m3, the shape of x. scales: e8m0
// [..., D/32] (logical, row-major: one byte per 32 contiguous elements of a row).
// Per block: amax = max |x| (a NaN anywhere makes it NaN); scale byte = E8M0 of amax * (1/448)
// rounded up to a power of two (fp32 product; NaN -> 0xFF, Inf -> 0xFE, 0 -> 0x00, finite
// saturation at 0xFE); data = E4M3(x * 2^(127 - e)) with round-to-nearest-even, saturating to
// +-448 (the multiplier is 1 for e = 0); NaN elements -> 0x7F.
void quantize_mxfp8(ConstTensorView x, TensorView data, TensorView scales);

// out [..., D] f32 = E4M3(data) * 2^(e - 127) (fp32; scale 0xFF gives NaN).
void dequantize_mxfp8(ConstTensorView data, ConstTensorView scales, TensorView out);

// ---- scale packing (spec 03 §5.5) -----------------------------------------------------------

// logical: e8m0 [plan.logical_rows(), plan.groups]. packed: e8m0 plan.packed_shape(); every
// byte is written (padding rows and groups 0).
// BSHD: slice b holds rows b*S*rows_per_token ... of logical, at local row m.
void pack_mxfp8_scales(const Mxfp8ScalePlan& plan, ConstTensorView logical, TensorView packed);

// THD: cu_seqlens i32 [N+1] in tokens (cu_seqlens[N] == plan.tokens). The padded prefixes
// are computed from THIS cu_seqlens and written to scale_cu_seqlens (i32 [N+1]); token t of
// sequence b, sub-row h lands at row prefix[b]*rows_per_token + (t - cu[b])*rows_per_token + h.
void pack_mxfp8_scales(const Mxfp8ScalePlan& plan, ConstTensorView logical,
                       ConstTensorView cu_seqlens, TensorView packed,
                       TensorView scale_cu_seqlens);

// ---- compact indexer forward + top-k (spec 03 §2-§3) ------------------------------------------

struct CompactIndexerInputs {
  // BSHD: q [B, S_q, H, D], k [B, S_k, D] or [B, S_k, 1, D], weights [B, S_q, H].
  // THD:  q [T_q, H, D],    k [T_k, D] or [T_k, 1, D],       weights [T_q, H].
  // f32 or bf16 each. With mxfp8 precision q and k are quantized inside the call (into the
  // workspace); weights stay as given.
  ConstTensorView q, k, weights;
  // THD only: i32 [B+1] each; cu_seqlens_q[B] == T_q, cu_seqlens_k[B] <= T_k (rows past it
  // are unused capacity). Every segment within the plan's maxima.
  ConstTensorView cu_seqlens_q, cu_seqlens_k;
  // i32 [B], >= 0: the uncompressed position of each segment's first query row (context
  // parallelism). Given iff the plan's geometry says causal_offsets.
  ConstTensorView q_causal_offsets;
  float sm_scale = 1.0f;  // logits = sm_scale * sum_h w ReLU(q . k)
};

struct CompactIndexerOutputs {
  // [B, S_q, K] (BSHD) or [T_q, K] (THD).
  TensorView indices;  // i32: segment-local compressed ids, ascending, then -1
  TensorView logits;   // f32: the selected logits, slot-aligned, -inf padding
  TensorView softmax;  // f32 or absent: softmax over the selected slots, 0 padding
};

// For query row t (local position, causal offset o) and segment K length len_k, scores
// S(t, j) = sm_scale * sum_h w[t,h] ReLU(q[t,h] . k[j]) for the n(t) = clamp((o+t+1) div r, 0,
// len_k) visible j only (fp32 accumulation, heads summed in ascending order), written into the
// compact candidate buffer (never a dense [rows, keys] matrix), then keeps the min(K, n(t))
// largest: ties (bitwise-equal fp32, +0 above -0) go to the smallest local id. Slots hold the
// selected ids in ascending order, then -1 / -inf / 0. softmax = exp(l - max) / sum, fp32; a
// row without candidates is all 0.
// workspace: any dtype, >= plan.workspace_bytes bytes, 16-byte aligned; its contents on entry
// are ignored (every byte read is first written by this call).
void compact_indexer_topk(const CompactIndexerPlan& plan, const CompactIndexerInputs& inputs,
                          const CompactIndexerOutputs& outputs, TensorView workspace);

// ---- THD compact K layout (spec 03 §2.5) ------------------------------------------------------

// The padded physical K layout that satisfies the compact kernel contracts
// (cu_seqlens_k[-1] == rows, seqlen_q <= seqlen_k * r) for a fixed-capacity K buffer: one
// invisible zero row after each real segment, the capacity tail spread over the segments (and
// ceil(padding_q / r) rows for a synthetic trailing Q padding segment). Local ids returned
// against it equal the logical local ids.
struct ThdCompactKLayout {
  int real_segments = 0;          // N
  bool synthetic_segment = false;  // cu_seqlens_q has N+2 entries: the last segment is padding
  std::int64_t k_rows = 0;         // R, rows of the logical K buffer
  std::vector<std::int32_t> cu_seqlens_k;          // compact prefixes, one per Q segment (+1)
  std::vector<std::int32_t> source_row_map;        // [R + N]: logical row, or R (a zero row)
  std::vector<std::int32_t> logical_cu_seqlens_k;  // cu_k, plus R for the synthetic segment
  int max_seqlen_k = 0;  // longest compact segment (<= logical max + 2 when R - cu_k[N] < N)

  std::int64_t physical_rows() const { return cu_seqlens_k.back(); }
  // Row of the local id `local` of segment `segment` in the logical / physical K buffer.
  std::int64_t logical_row(int segment, std::int32_t local) const;
  std::int64_t physical_row(int segment, std::int32_t local) const;
};

// cu_seqlens_q: N+1 or N+2 entries (the latter: a synthetic padding segment last);
// cu_seqlens_k: N+1 logical compressed prefixes; k_rows: R >= cu_seqlens_k[N], with
// R - cu_seqlens_k[N] >= ceil(padding_q / r) so the physical buffer has exactly R + N rows.
ThdCompactKLayout build_thd_compact_k_layout(std::span<const std::int32_t> cu_seqlens_q,
                                             std::span<const std::int32_t> cu_seqlens_k,
                                             std::int64_t k_rows, int ratio);

// The static bound of the compact max_seqlen_k: logical max + 2 (one mandatory zero row plus
// at most one capacity row, which holds when the capacity is min(T div r, N (max_len div r))).
inline int thd_compact_max_seqlen_k(int logical_max_seqlen_k) { return logical_max_seqlen_k + 2; }

// out[p] = k[source_row_map[p]] (zero rows for the sentinel R). k: [R, D] (or [R, 1, D]) f32
// or bf16; out: [R + N, D] of the same dtype.
void pack_thd_compact_k(ConstTensorView k, const ThdCompactKLayout& layout, TensorView out);

}  // namespace csattn::ops
