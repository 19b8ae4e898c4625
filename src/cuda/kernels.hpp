// Launchers of the forward kernels (one .cu per operator). Each launcher checks the launch
// and returns without synchronising.
#pragma once
#include <cuda_runtime.h>

#include "cuda/params.hpp"

namespace csattn::cuda {

// row_segment / row_position / row_is_padding and comp_start from cu_seqlens (metadata.cu).
void launch_metadata(const LayerDims& d, const DeviceMetadata& meta, cudaStream_t stream);

// Row-wise RMSNorm (optional), RoPE on the last rope_dim dims (optional) and Hadamard
// rotation (optional), with a bf16 rounding after each stage (norm_rope.cu).
struct NormRopeArgs {
  const bf16* in = nullptr;
  bf16* out = nullptr;
  int rows = 0;              // grid size (host-known maximum)
  int n = 0;                 // row width
  bool norm = false;
  const bf16* weight = nullptr;  // null: weightless norm
  float eps = 1e-6f;
  int rope_dim = 0;          // 0: no RoPE
  int rope_sign = 1;         // +1 forward rotation, -1 inverse
  const float* omega = nullptr;
  // Positions: token rows (row / rows_per_token indexes row_position), or compressed rows
  // (position j*m of entry j of its segment; rows past comp_start[B] are skipped).
  int rows_per_token = 1;
  const std::int32_t* row_position = nullptr;
  bool compressed = false;
  const std::int32_t* comp_start = nullptr;
  int segments = 0, ratio = 0;
  const std::int32_t* comp_entry_pos = nullptr;  // the explicit table (DeviceMetadata)
  bool hadamard = false;     // n must be a power of two
  const __nv_bfloat162* rope_table = nullptr;  // [positions, rope_dim / 2] (cos, sin); null:
                                               // computed per row
  // With norm, optional: each row's 1 / rms (the factor the norm applied) stored here, for a
  // backward that reads the norm's output instead of its input (rmsnorm_backward_from_output).
  float* rstd = nullptr;
  // RoPE alone in place, optional: each row's last keep_tail_dim elements (>= rope_dim, even)
  // as they were before the rotation, [rows, keep_tail_dim] (the attention output's tails,
  // OutputRows).
  bf16* keep_tail = nullptr;
  int keep_tail_dim = 0;
};
// The kernel launch_norm_rope runs for `a` (host-side, no device access; tests check the
// choice): the in-place RoPE tail by 16-byte pieces or a thread a pair (4-byte or 2-byte
// accesses), the warp-per-row kernels by width, else the one-block-per-row reference. Throws
// InvalidArgument where keep_tail is asked for outside its contract.
enum class NormRopePath {
  none, tail_vec, tail_pair, tail_pair_unaligned, warp_n128, warp_n256, warp_n512, warp_n1024, reference
};
NormRopePath norm_rope_path(const NormRopeArgs& a);
void launch_norm_rope(const NormRopeArgs& a, cudaStream_t stream);
// Always the one-block-per-row kernel (the reference for tests and benchmarks).
void launch_norm_rope_reference(const NormRopeArgs& a, cudaStream_t stream);

// The RoPE table of meta.rope_table for positions [0, d.max_seg_len): cos / sin of
// position * omega[i] through double, rounded to bf16 (norm_rope.cu).
void launch_rope_table(const LayerDims& d, const float* omega, __nv_bfloat162* table,
                       cudaStream_t stream);

// NormRopeArgs for `rows` token rows of width n (position = row_position[row / per_token])
// and for the compressed rows (position j*m, rows past the real count skipped), with every
// stage off: callers switch on the norm, RoPE and Hadamard they need.
inline NormRopeArgs token_rows_args(const LayerDims& d, const DeviceWeights& w,
                                    const DeviceMetadata& m, const bf16* in, bf16* out,
                                    int rows, int n, int per_token) {
  NormRopeArgs a;
  a.in = in;
  a.out = out;
  a.rows = rows;
  a.n = n;
  a.eps = d.eps;
  a.omega = w.omega;
  a.rows_per_token = per_token;
  a.row_position = m.row_position;
  a.rope_table = m.rope_table;
  return a;
}
inline NormRopeArgs compressed_rows_args(const LayerDims& d, const DeviceWeights& w,
                                         const DeviceMetadata& m, const bf16* in, bf16* out,
                                         int n) {
  NormRopeArgs a;
  a.in = in;
  a.out = out;
  a.rows = d.comp_capacity;
  a.n = n;
  a.eps = d.eps;
  a.omega = w.omega;
  a.compressed = true;
  a.comp_start = m.comp_start;
  a.comp_entry_pos = m.comp_entry_pos;
  a.segments = d.segments;
  a.ratio = d.ratio;
  a.rope_table = m.rope_table;
  return a;
}

// Gated pooling of the compressor (compressor.cu): pooled[e, c] for every compressed row
// (rows past the batch's entries untouched). The layer's vectorised kernel, and the
// one-thread-per-channel reference it falls back to (and is tested against).
void launch_compressor_pool(const LayerDims& d, const DeviceMetadata& meta, int width_d,
                            const bf16* a, const bf16* g, const float* ape, bf16* pooled,
                            cudaStream_t stream);
void launch_compressor_pool_reference(const LayerDims& d, const DeviceMetadata& meta, int width_d,
                                      const bf16* a, const bf16* g, const float* ape,
                                      bf16* pooled, cudaStream_t stream);

// out = bf16(dequantize(quantize_mxfp8(in))) per 32-element block of rows of `cols`
// (mxfp8.cu): exact in bf16, so the bf16 indexer on `out` scores the MXFP8 operands. in and
// out 16-byte aligned; they may be the same buffer.
void launch_mxfp8_roundtrip(const bf16* in, bf16* out, long rows, int cols, cudaStream_t stream);

// w_eff = bf16(bf16(w_raw * H_I^-1/2) * D_I^-1/2) (indexer_topk.cu).
void launch_indexer_weights(const LayerDims& d, const bf16* w_raw, float* w_eff,
                            cudaStream_t stream);

// Index scores over the visible entries of each row and the deterministic top-k (ties to
// the smallest index), written in ascending index order then -1 (indexer_topk.cu). Kernels:
// wgmma (4 rows per CTA on warpgroup MMAs, scored then selected by the whole CTA; any
// length, needs `scratch` of indexer_topk_scratch_bytes(d) bytes, indexer_topk_plan.hpp),
// tiled (the same contract on mma.sync, kept as its reference), and the one-row references
// mma1 (tensor cores) and baseline (CUDA cores), whose segments must fit one row's scores in
// shared memory. wgmma_overlap (the default where indexer_tiled_supported): the wgmma kernel
// with a third warpgroup selecting one block while the other two score the next, the same
// ids and scores. automatic: CSATTN_INDEXER=baseline|mma1|tiled|wgmma, else the best supported one
// (indexer_kernel_for). keys: [d.comp_capacity, D_I] (the layer's workspace; rows past the
// real count may be read, as whole 64-key tiles, but are never selected).
// scores (the sparse loss's predictor logits from the selection, forward.cpp's
// loss_logits_from_selection): where base is set, the wgmma kernel also writes each
// selected id's score, row t's k-th at base[(t * K + k) * stride], for the rows it selects by
// radix (n > K: more visible entries than K; the rows with n <= K are not scored); the other
// kernels leave them (indexer_writes_selected_scores says which).
enum class IndexerKernel { automatic, baseline, mma1, tiled, wgmma, wgmma_overlap };
IndexerKernel indexer_kernel_for(const LayerDims& d);
// Whether kernel k (not automatic) writes SelectedScores where it is given them: the wgmma
// kernels (their radix select has each selected id's score at hand); the others do not.
bool indexer_writes_selected_scores(IndexerKernel k);
void launch_indexer_topk(const LayerDims& d, const DeviceMetadata& meta, const bf16* qi,
                         const float* w_eff, const bf16* keys, std::int32_t* topk, void* scratch,
                         cudaStream_t stream, IndexerKernel which = IndexerKernel::automatic,
                         const SelectedScores& scores = {});

// Sparse attention with the sink over window + compressed keys (sparse_attention.cu): the
// wgmma kernel for head_dim 512 where it fits, else the mma kernel, else the CUDA-core
// baseline; CSATTN_ATTENTION=wgmma|mma|baseline picks one (read once per process).
void launch_sparse_attention(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                             const bf16* kv, const bf16* comp, const float* sink,
                             const std::int32_t* topk, bf16* out, float* lse,
                             cudaStream_t stream);

// The tensor-core version for head_dim 512 (sparse_attention_mma.cu); same contract.
bool sparse_attention_mma_supported(const LayerDims& d);
void launch_sparse_attention_mma(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                                 const bf16* kv, const bf16* comp, const float* sink,
                                 const std::int32_t* topk, bf16* out, float* lse,
                                 cudaStream_t stream);

// The warp-specialised wgmma version for head_dim 512 (sparse_attention_wgmma.cu: key tiles
// in pairs, one per consumer warpgroup); same contract, except that `out` must be 16-byte
// aligned (O leaves through a TMA map; launch_sparse_attention takes the mma kernel for
// another). Supported while its shared memory (about 210 KB + 4 bytes per top-k id) fits.
bool sparse_attention_wgmma_supported(const LayerDims& d);
void launch_sparse_attention_wgmma(const LayerDims& d, const DeviceMetadata& meta,
                                   const bf16* q, const bf16* kv, const bf16* comp,
                                   const float* sink, const std::int32_t* topk, bf16* out,
                                   float* lse, cudaStream_t stream,
                                   unsigned* phase_stamps = nullptr);
// Measurement only (benchmarks): the wgmma forward's phase_stamps, the multiprocessor's
// 32-bit clock() with its lowest bit set (0 means "not reached"; subtract modulo 2^32),
// written by the first thread of each warpgroup w (0 producer, 1 consumer 0, 2 consumer 1)
// of CTAs 0 .. ctas - 1 for the CTA's work item number `item` (counted from 0 per CTA: a
// steady-state item, the previous one's tail overlapping its set-up), at
// stamps[((cta * 3 + w) * (pairs + 1) + row) * phases + p]. Row i < pairs is key-tile pair i:
//   producer:   0 pair top, 1-4 free waits done (buffer 0 dims 0-255, buffer 0 dims 256-511,
//               buffer 1 dims 256-511, buffer 1 dims 0-255), 5 the last gather issued;
//   consumer 0: 0 pair top (S_0 in registers), 1 softmax done (m_0 and P_0 published), 2
//               P_0 V_0 done, 3 m_1 / P_1 received, 4 O moved to m_1, 5 the next pair's buffer
//               0 dims 0-255 ready, 6 P_1 V_1 done and dims 256-511 ready, 7 pair end (the
//               next S_0 done); on the last pair 5 = P_1 V_1 done, 6 and 7 right after;
//   consumer 1: 0 pair top, 1-2 buffer-1 halves ready (dims 256-511, then 0-255), 3 S_1
//               done, 4 m_0 / P_0 received (the wait alone: consumer 0's stamp 1 minus this
//               one's 3, one multiprocessor's clock), 5 softmax done, P_1 published (P_0 V_0
//               in flight), 6 P_0 V_0 done and O moved to m_1, 7 pair end (P_1 V_1 done).
// Row `pairs`: 0 item top, 1 producer: key list built / consumers: Q ready, 2 producer: last
// gather issued / consumers: loop exit, 3 item end. Stamps not reached stay as the caller left
// them (zero them first).
struct AttentionForwardStamps {
  static constexpr int ctas = 132, item = 2, pairs = 12, phases = 8;
  static constexpr long count() { return static_cast<long>(ctas) * 3 * (pairs + 1) * phases; }
};

// The CUDA-core reference kernel (any head_dim up to 1024; sparse_attention.cu).
void launch_sparse_attention_baseline(const LayerDims& d, const DeviceMetadata& meta,
                                      const bf16* q, const bf16* kv, const bf16* comp,
                                      const float* sink, const std::int32_t* topk, bf16* out,
                                      float* lse, cudaStream_t stream);

}  // namespace csattn::cuda
