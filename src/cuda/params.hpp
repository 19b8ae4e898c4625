// The one contract between the host side of the CUDA backend and its kernels: plain structs
// of dimensions and device pointers. Host code validates everything before filling them;
// kernels trust them. Lengths that vary per batch live in device metadata (read by kernels),
// grid sizes come from the host-known maxima here, so a run never synchronises with the host.
#pragma once
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

namespace csattn::cuda {

using bf16 = __nv_bfloat16;

struct LayerDims {
  int rows = 0;          // T
  int segments = 0;      // B
  int max_seg_len = 0;   // largest padded segment length (host-known maximum)
  int d_model = 0, heads = 0, head_dim = 0, rope_dim = 0, q_lora_rank = 0;
  int o_groups = 0, o_lora_rank = 0, window = 0;
  int ratio = 0;         // m
  int coff = 1;          // 2 for m = 4
  int comp_capacity = 0; // compressed-row capacity: T / m (>= the real count)
  int index_heads = 0, index_dim = 0, topk = 0;
  float eps = 1e-6f;
  float scale = 0.0f;    // D^-1/2
  // indexer_precision = mxfp8: the selection scores the indexer queries and keys rounded
  // through MXFP8 (mxfp8.cu); the loss gradients keep the bf16 ones.
  bool mxfp8_indexer = false;
  // The indexer loss's lambda and reduction (config constants): the per-batch scale,
  // lambda / real rows or lambda per token, is DeviceMetadata::loss_scale.
  double loss_coeff = 0.0;  // as the config holds it: the scale rounds like loss_scale_of
  bool per_token_loss = false;
};

// Most keys any query can have (window + top-k, or window + the longest segment's entries).
__host__ __device__ inline int max_keys_per_query(const LayerDims& d) {
  return d.window + (d.ratio == 4 ? d.topk : (d.ratio > 1 ? d.max_seg_len / d.ratio : 0));
}

struct DeviceWeights {
  const bf16 *wq_a = nullptr, *q_norm = nullptr, *wq_b = nullptr, *wkv = nullptr,
             *kv_norm = nullptr, *wo_a = nullptr, *wo_b = nullptr;
  const float* sink = nullptr;
  const bf16 *c_wkv = nullptr, *c_wgate = nullptr, *c_norm = nullptr;
  const float* c_ape = nullptr;
  const bf16 *i_wq_b = nullptr, *i_wproj = nullptr, *ic_wkv = nullptr, *ic_wgate = nullptr,
             *ic_norm = nullptr;
  const float* ic_ape = nullptr;
  const float* omega = nullptr;  // RoPE frequencies [rope_dim / 2]
};

// The attention output O [T, H, D] as the backward reads it (D_row = dO . O): whole rows at
// `rows`; or, as the layer keeps it, each head row's first D - tail_dim dims at `rows` and
// its RoPE tail's values apart at `tail` [T * H, tail_dim] - forward_output rotates the tail
// of `rows` in place into the output projection's input and keeps the original tail there.
// Implicitly built from a pointer to whole rows.
struct OutputRows {
  const bf16* rows = nullptr;
  const bf16* tail = nullptr;  // null: whole rows
  int tail_dim = 0;            // attention_tail_dim
  OutputRows() = default;
  OutputRows(const bf16* whole) : rows(whole) {}  // NOLINT(google-explicit-constructor)
  OutputRows(const bf16* head, const bf16* tail_values, int dim) : rows(head), tail(tail_values), tail_dim(dim) {}
  // Element e (and the ones after it in its group of 8) of head row `row` = t * H + h.
  __host__ __device__ const bf16* at(long row, int e, int D) const {
    const int t0 = D - tail_dim;
    return tail != nullptr && e >= t0 ? tail + row * tail_dim + (e - t0) : rows + row * D + e;
  }
};

// How many of each attention output row's last elements forward_output keeps apart
// (OutputRows::tail_dim): the RoPE dims, widened to whole 16-byte groups where rows are made
// of them, so the kernels that read O by 16-byte groups never meet a group split across the
// two places (the widening's dims are kept but not rotated).
__host__ __device__ inline int attention_tail_dim(const LayerDims& d) {
  return d.head_dim % 8 == 0 ? (d.rope_dim + 7) / 8 * 8 : d.rope_dim;
}

// Where the indexer writes the selected ids' scores (launch_indexer_topk): row t's k-th at
// base[(t * K + k) * stride]; base null: not written.
struct SelectedScores {
  float* base = nullptr;
  int stride = 1;
};

// Per-batch metadata on the device, rebuilt from cu_seqlens on every run.
struct DeviceMetadata {
  const std::int32_t* cu_real = nullptr;    // [B+1]
  const std::int32_t* cu_padded = nullptr;  // [B+1]
  std::int32_t* row_segment = nullptr;      // [T]
  std::int32_t* row_position = nullptr;     // [T]
  std::uint8_t* row_is_padding = nullptr;   // [T]
  std::int32_t* comp_start = nullptr;       // [B+1]
  // GPU context parallelism (cuda/cp_layer.cpp); null on one GPU. A rank's "segments" are
  // runs of its halo + own rows: seg_pos0[b] is the global position of run b's first row
  // (row_position holds global positions, so "the row of position p" is
  // cu_padded[b] + p - seg_pos0[b]). Its compressed rows are its owned groups in all-gather
  // slots: entry e's block starts at row comp_entry_row0[e] (-1: an unused slot) at
  // position comp_entry_pos[e] (= group * m).
  const std::int32_t* seg_pos0 = nullptr;        // [B]
  const std::int32_t* comp_entry_row0 = nullptr; // [comp_capacity]
  const std::int32_t* comp_entry_pos = nullptr;  // [comp_capacity]
  // RoPE (cos, sin) per position and frequency, [max_seg_len, rope_dim / 2], bf16 values as
  // the host's table; built per run from omega (null: kernels compute them per row).
  __nv_bfloat162* rope_table = nullptr;
  // CSA: the indexer loss's scale, lambda / cu_real[B] (the mean over real rows) or lambda
  // (per-token sums); one float, written by launch_metadata from the device cu_real, so a
  // graph replay with a new packing scales by its own real-row count (a context-parallel
  // rank uploads the global one).
  float* loss_scale = nullptr;
};

// What the compressor kernels need to find compressed row e's block (compressed_entry,
// device_util.cuh): the segments' rows and compressed offsets, or the explicit table.
struct CompEntries {
  const std::int32_t *cu_padded = nullptr, *comp_start = nullptr;
  int segments = 0, ratio = 0;
  const std::int32_t *row0 = nullptr, *pos = nullptr;  // the table (both or neither)
};
inline CompEntries comp_entries(const LayerDims& d, const DeviceMetadata& m) {
  return {m.cu_padded, m.comp_start, d.segments, d.ratio, m.comp_entry_row0, m.comp_entry_pos};
}

// Activations of the forward (bf16 unless noted); the backward (issue 6) reads them.
struct DeviceActivations {
  bf16* x = nullptr;                           // [T, d_model]
  bf16 *q_proj = nullptr, *cq = nullptr;       // [T, r_q]
  // q: the up-projection, then in place its per-head norm and RoPE; q_rstd the norm's 1 / rms
  // per (token, head) (the backward reads q and q_rstd, not the projection).
  bf16* q = nullptr;                           // [T, H*D]
  float* q_rstd = nullptr;                     // [T, H]
  bf16 *kv_proj = nullptr, *kv = nullptr;      // [T, D]
  bf16 *c_a = nullptr, *c_g = nullptr;         // [T, coff*D]
  bf16 *c_pooled = nullptr, *comp = nullptr;   // [Nc_cap, D]
  // qi_proj: the projection before RoPE / Hadamard; dead after them, so with the MXFP8
  // indexer it then holds the MXFP8-rounded qi the selection reads.
  bf16 *qi_proj = nullptr, *qi = nullptr;      // [T, H_I*D_I]
  bf16* w_raw = nullptr;                       // [T, H_I]
  float* w_eff = nullptr;                      // [T, H_I] (bf16 values)
  bf16 *i_a = nullptr, *i_g = nullptr;         // [T, 2*D_I]
  bf16 *i_pooled = nullptr, *i_keys = nullptr; // [Nc_cap, D_I]
  bf16* i_keys_mx = nullptr;                   // MXFP8 indexer: i_keys rounded through MXFP8
  std::int32_t* topk = nullptr;                // [T, K]
  void* topk_scratch = nullptr;                // the tiled indexer's (indexer_topk_plan.hpp)
  float* loss_rows = nullptr;                  // [T] per-row indexer KL (CSA)
  float* loss = nullptr;                       // [1] the reduced indexer loss (CSA)
  // The sparse loss's per-candidate teacher masses and predictor logits, then its per-row
  // sums, kept by the forward's loss launch for the backward's (launch_indexer_loss's `kept`).
  float* loss_kept = nullptr;                  // [T, K, 2] then [T, 2]
  // The attention output, then (forward_output) with each head row's RoPE tail rotated back
  // in place: the grouped output projection's input, which the wo_a gradient reads again;
  // the tail's values before that rotation kept in attn_tail (O for the backward: OutputRows).
  bf16* attn = nullptr;                        // [T, H, D]
  bf16* attn_tail = nullptr;                   // [T, H, attention_tail_dim]
  float* lse = nullptr;                        // [T, H]
  bf16* u = nullptr;                           // [T, G*r_o]
  bf16* y = nullptr;                           // [T, d_model]
};

struct ForwardParams {
  LayerDims dims;
  DeviceWeights w;
  DeviceMetadata meta;
  DeviceActivations act;
  bool forced_topk = false;  // act.topk already holds the caller's selection
  // cuBLAS's scratch, from the caller's workspace: with it cuBLAS allocates nothing inside a
  // run (needed for CUDA-graph capture). The backward reuses it (same stream, in order).
  void* blas_workspace = nullptr;
  std::size_t blas_workspace_bytes = 0;
};

}  // namespace csattn::cuda
