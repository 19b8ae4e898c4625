// Launchers of the backward kernels and of the indexer loss (one .cu per operator).
#pragma once
#include <cuda_runtime.h>

#include "cuda/backward_params.hpp"
#include "cuda/grad_chunk.hpp"
#include "cuda/params.hpp"

namespace csattn::cuda {

// RMSNorm backward over rows of width n: dx (bf16) from x (bf16, the norm's input), the
// weight (null: weightless) and dy (bf16); with dweight, also dweight += sum over rows of
// dy * x * rstd (a fixed-order column sum: each of kNormWeightChunks row chunks summed in row
// order, then the chunks in order). rstd is scratch of rmsnorm_backward_scratch_floats(rows,
// n) floats: the rows' 1 / rms, then (with dweight) the chunks' partial sums. Rows past
// comp_start[segments] are skipped when comp_start is set (compressed rows). n is even (the
// bf16 pairs). reference: the one-block-per-row kernel whatever n (the bench's comparison; the
// default takes a warp a row where n = 32 V, V in {4, 8, 16, 24, 32, 48}, and x, weight, dy and
// dx are aligned to its 8- or 16-byte loads; otherwise the block kernel).
constexpr int kNormWeightChunks = 256;
inline std::size_t rmsnorm_backward_scratch_floats(int rows, int n) {
  return static_cast<std::size_t>(rows > 0 ? rows : 1) + static_cast<std::size_t>(kNormWeightChunks) * n;
}
void launch_rmsnorm_backward(const bf16* x, const bf16* weight, const bf16* dy, int rows, int n,
                             float eps, bf16* dx, float* dweight, float* rstd,
                             const std::int32_t* comp_start, int segments, cudaStream_t stream,
                             bool reference = false);

// The weightless RMSNorm's backward from its output y = r x (bf16) and the r the forward
// stored (NormRopeArgs::rstd): dx = r (dy - y <dy, y> / n) - the input x is not needed. The
// formula commutes with a rotation of y, dy and dx alike, so the query path runs it on the
// RoPE'd q and dq and undoes RoPE after (exact up to the bf16 cos / sin, whose rotation is
// orthogonal to ~2^-8).
// rope_after (token rows; its in / out are ignored): then dx rotated as launch_norm_rope
// would rotate it - in the same pass where the warp kernel runs (the same bits as a second
// pass), else a second pass. The query path's RoPE^T.
struct NormRopeArgs;
void launch_rmsnorm_backward_from_output(const bf16* y, const float* rstd, const bf16* dy, int rows,
                                         int n, bf16* dx, cudaStream_t stream, bool reference = false,
                                         const NormRopeArgs* rope_after = nullptr);

// Sparse attention backward: dq (bf16, overwritten: each (row, head) summed in fp32 by one
// CTA, then rounded to nearest), dkv_acc / dcomp_acc (atomic accumulation),
// dsink_part[t, h] = -P_sink * D_row. Dispatches to the wgmma kernel for
// head_dim 512, else the mma.sync kernel, else the baseline; CSATTN_ATTENTION_BACKWARD=mma or
// =baseline forces an older one (attention_backward.cu).
// `out` is O (params.hpp, OutputRows: whole rows, or the layer's heads with their tails kept
// apart - then with tail_dim = attention_tail_dim(d), which check_output_rows requires; each
// launcher below that reads O checks it).
void check_output_rows(const LayerDims& d, const OutputRows& out);
void launch_attention_backward(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                               const bf16* kv, const bf16* comp, const float* sink,
                               const std::int32_t* topk, OutputRows out, const float* lse,
                               const bf16* dout, bf16* dq, float* dkv_acc,
                               float* dcomp_acc, float* dsink_part, cudaStream_t stream,
                               const GradChunk& chunk = {});
// How many contributions per (row, slot) the kernel launch_attention_backward picks writes in
// deterministic mode (its head blocks: 1 for the baseline).
int attention_backward_copies(const LayerDims& d);
// The kernel launch_attention_backward picks: "wgmma", "mma" or "baseline" (benchmarks).
const char* attention_backward_kernel_name(const LayerDims& d);
// The CUDA-core baseline (any head_dim up to 1024), the reference of the tensor-core kernel.
void launch_attention_backward_baseline(const LayerDims& d, const DeviceMetadata& meta,
                                        const bf16* q, const bf16* kv, const bf16* comp,
                                        const float* sink, const std::int32_t* topk,
                                        OutputRows out, const float* lse, const bf16* dout,
                                        bf16* dq, float* dkv_acc, float* dcomp_acc,
                                        float* dsink_part, cudaStream_t stream,
                                        const GradChunk& chunk = {});
// The wgmma kernel (attention_backward_wgmma.cu, Hopper): head_dim 512 and a CSA top-k row
// that fits its shared memory (any HCA / SWA length); same contract. `writes` other than all
// are measurements only (benchmarks), wrong gradients on purpose: none skips every
// key-gradient write (what the reductions cost); even_head_blocks drops those of the odd head
// blocks (the write traffic a reduction of a token's two head blocks inside the GPU would
// leave: its ceiling at 128 heads; perf.md, fifth session of 2026-12-04). The fast mode's
// launches without phase stamps take the rotated tile order (attention_backward_wgmma.cu):
// their dQ sums run in a timing-dependent order, so dQ is not bitwise repeatable there.
enum class KeyGradWrites { all, none, even_head_blocks };
bool attention_backward_wgmma_supported(const LayerDims& d);
void launch_attention_backward_wgmma(const LayerDims& d, const DeviceMetadata& meta,
                                     const bf16* q, const bf16* kv, const bf16* comp,
                                     const float* sink, const std::int32_t* topk,
                                     OutputRows out, const float* lse, const bf16* dout,
                                     bf16* dq, float* dkv_acc, float* dcomp_acc,
                                     float* dsink_part, cudaStream_t stream,
                                     const GradChunk& chunk = {},
                                     KeyGradWrites writes = KeyGradWrites::all,
                                     unsigned* phase_stamps = nullptr);
// Measurement only (benchmarks): the wgmma backward's phase_stamps, the multiprocessor's
// 32-bit clock() with its lowest bit set (never 0: 0 means "not reached"; subtract modulo
// 2^32), written by the first thread of each warpgroup of CTAs 0 .. ctas - 1 (fast mode), at
// stamps[((cta * 2 + warpgroup) * (tiles + 1) + row) * phases + p]. Row i < tiles is key tile
// i: p = 0 loop top, 1 key tile ready, 2 S (WG0) / dP (WG1) done, 3 hand-over done (WG0: dS
// ready; WG1: dS written), 4 dQ done, 5 dK chunk 0 done, 6 chunk 0 flushed, 7 chunk 1 done and
// flushed. Row `tiles`: p = 0 kernel entry, 1 loop entry, 2 loop exit, 3 kernel exit.
// Stamps not reached stay as the caller left them (zero them first).
struct AttentionBackwardStamps {
  static constexpr int ctas = 132, tiles = 24, phases = 8;
  static constexpr long count() { return static_cast<long>(ctas) * 2 * (tiles + 1) * phases; }
};
// The mma.sync kernel (attention_backward_mma.cu): head_dim 512 and a key list that fits
// its shared memory; same contract.
bool attention_backward_mma_supported(const LayerDims& d);
void launch_attention_backward_mma(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                                   const bf16* kv, const bf16* comp, const float* sink,
                                   const std::int32_t* topk, OutputRows out, const float* lse,
                                   const bf16* dout, bf16* dq, float* dkv_acc,
                                   float* dcomp_acc, float* dsink_part, cudaStream_t stream,
                                   const GradChunk& chunk = {});

// The deterministic mode's gradients of HCA's compressed rows, key-stationary
// (attention_backward_keyed.cu, its kernel attention_backward_keyed_wgmma.cu): dcomp_acc[e] = sum over the rows that see entry e, in
// ascending row order, and their heads, of P^T dO + dS^T Q (P, dS recomputed from lse and
// D_row = dO . O, which this writes into drow [rows x heads floats]), by chunks of rows whose
// partial sums (scratch, comp_grad_keyed_scratch_bytes) are then added in chunk order. Rows
// of dcomp_acc with an entry are overwritten, the others left alone. Bitwise repeatable; the
// attention backward's deterministic chunks then write only their window slots
// (GradChunk::window_only). Applies to HCA layers with head_dim 512.
// The layer's deterministic backward (and its plan) takes this pass wherever it applies.
bool comp_grad_keyed_applies(const LayerDims& d);
int comp_grad_keyed_chunks(const LayerDims& d);
std::size_t comp_grad_keyed_scratch_bytes(const LayerDims& d);
void launch_comp_grad_keyed(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                            const bf16* comp, OutputRows out, const float* lse,
                            const bf16* dout, float* drow, float* dcomp_acc, float* scratch,
                            std::size_t scratch_bytes, cudaStream_t stream);
// The kernel's entries a CTA, and its launch alone (blocks = key blocks x chunks;
// partials: chunk c's sums at partials + c * comp_capacity * 512; D_row already in drow).
int comp_grad_keyed_wgmma_entries();
void launch_comp_grad_keyed_wgmma_kernel(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                                         const bf16* comp, const float* lse, const float* drow,
                                         const bf16* dout, float* partials, long blocks, int key_blocks,
                                         int chunk_rows, int head_blocks, cudaStream_t stream);

// dst[i] += sum over rows of part[row, i] in a fixed order (deterministic): up to
// kColumnSumChunks row chunks, each summed in row order (8 warps interleaved, then the warps
// in order) into its own first row - part is scratch and is overwritten - then the chunks
// in order. (One thread a column over every row left the GPU idle: 64 threads for the sink's
// gradient over all T rows.)
constexpr int kColumnSumChunks = 256;
void launch_column_sum(float* part, int rows, int cols, float* dst, cudaStream_t stream);
void launch_f32_to_bf16(const float* src, bf16* dst, long n, cudaStream_t stream);

// Compressor pooling backward: da, dg (zeroed first) from dpooled; dape += per-slot sums.
void launch_compressor_pool_backward(const LayerDims& d, const DeviceMetadata& meta, int width_d,
                                     const bf16* a, const bf16* g, const float* ape,
                                     const bf16* dpooled, bf16* da, bf16* dg, float* dape,
                                     cudaStream_t stream);

// The indexer KL loss: per-row KL into loss_rows and its fixed-order sum times `*scale` into
// loss[0]; with grads, also dqi (bf16, per row), dweff and dkeys_acc (atomic) of
// grad_loss * loss, i.e. of grad_loss * *scale * (the sum of the rows' KL).
struct IndexerLossArgs {
  const bf16* qi = nullptr;      // [T, H_I*D_I]
  const float* w_eff = nullptr;  // [T, H_I]
  const bf16* keys = nullptr;    // [Nc, D_I]
  // The sparse loss's predictor operands where they differ from qi / keys (the MXFP8
  // indexer: its selection's scores are the predictor; the gradients still flow through the
  // bf16 scores' ReLU masks, spec 03 / numerics.md). Null: qi / keys (each on its own).
  // Ignored by the dense loss.
  const bf16* pred_qi = nullptr;
  const bf16* pred_keys = nullptr;
  const bf16* q = nullptr;       // [T, H*D]
  const bf16* kv = nullptr;      // [T, D]
  const bf16* comp = nullptr;    // [Nc, D]
  const float* sink = nullptr;   // [H]
  const std::int32_t* topk = nullptr;
  // The forward attention's LSE [T, H] (sink + window + top-k): for the sparse loss exactly
  // the teacher's denominator, so the tensor-core kernel skips recomputing it. May be null.
  const float* lse = nullptr;
  bool sparse = true;
  // Device, one float: lambda / N_real_rows (or lambda per token), DeviceMetadata::loss_scale;
  // read by the kernels, so a graph replay uses the replayed batch's.
  const float* scale = nullptr;
  // The rows of this launch and, deterministic mode, the key-gradient scratch (slots: the
  // candidates of a row, d.topk sparse or max_seg_len / ratio dense).
  GradChunk chunk;
};
// Which kernel computes the rows: automatic = the tensor-core one where supported (and, for
// the sparse loss's value launch with `kept` and the forward's LSE, the wgmma teacher before
// it), unless CSATTN_INDEXER_LOSS=baseline (the CUDA-core reference). tensor_core: the
// tensor-core rows kernel alone (its own mma.sync teacher); tests name one explicitly.
enum class IndexerLossKernel { automatic, baseline, tensor_core };
// `kept`: what the sparse loss's backward reuses from its forward (the tensor-core kernel; the
// CUDA-core one ignores it), [T, topk, 2] per candidate then [T, 2] per row. For each row
// whose candidates' teacher masses the kernel keeps (the one-pass teacher with the forward's
// LSE, or more than 64 heads), a launch without gradients stores each candidate's (teacher
// mass, predictor logit) and the row's (teacher L1 sum, predictor LSE); a launch with
// gradients on the same inputs reads them instead of recomputing them - the teacher is the
// main attention's scores over 512 dims, most of the loss's work - and gives bitwise the
// same results. Both launches must see the same inputs and pick the same kernel (the
// automatic choice does). Null: every launch computes everything. (A parameter, not a field
// of IndexerLossArgs: a larger argument struct makes the 128-head instance spill.)
// logits_kept (the layer's forward, loss_logits_from_selection): the value launch's `kept` already
// holds, as the predictor logit of each candidate of every row with more visible entries than
// top-k, the score the indexer selected it with (launch_indexer_topk's SelectedScores, stride
// 2 into kept's logit entries); those rows skip the predictor pass. Only the automatic
// kernel's value launch with the wgmma teacher reads them; every other launch computes them.
// own_selection (the layer's backward when its top-k is the indexer's own, not forced): every
// valid top-k id is visible, so the gradient launch with `kept` reads every row's kept values
// and takes the tensor-core kernel's gradient-only instance (kKeptGradients).
void launch_indexer_loss(const LayerDims& d, const DeviceMetadata& meta, const IndexerLossArgs& a,
                         float* loss_rows, float* loss, bool grads, float grad_loss, bf16* dqi,
                         float* dweff, float* dkeys_acc, float* kept, cudaStream_t stream,
                         IndexerLossKernel kernel = IndexerLossKernel::automatic,
                         bool logits_kept = false, bool own_selection = false);
// out[0] = grad_loss[0] * scale[0] on the device: the scale of a backward whose loss gradient
// is on the device (a framework's autograd tensor, never read back), for IndexerLossArgs::scale
// with a launch grad_loss of 1. (A field for it in IndexerLossArgs made the tensor-core
// kernel's 128-head instance spill.)
void launch_loss_gradient_scale(const float* grad_loss, const float* scale, float* out,
                                cudaStream_t stream);
// The tensor-core rows kernel (indexer_loss_mma.cu): head_dim 512, index_head_dim 128, at
// most 64 index heads and 128 heads.
bool indexer_loss_mma_supported(const LayerDims& d);
// given: what `kept` already holds for the value launch's rows with the forward's LSE -
// kGivenMasses (the wgmma teacher ran), kGivenLogits (the indexer wrote the selected ids'
// scores as the predictor logits, for the rows with more visible entries than top-k);
// kGivenLight (set only with both, after the wgmma teacher, so the forward's LSE is there;
// the sparse loss): warp 0 forms those rows' KL from
// `kept` alone (indexer_loss_mma.cu) without reading their top-k ids - the caller's contract
// is that each such row holds K visible ids (no -1, none >= its visible count), as the
// indexer's own selection does (the only caller: the layer's forward, logits_kept).
// kKeptGradients (the gradient launch of the sparse loss with `kept`): every row with
// candidates reads its kept values - its valid top-k ids are all visible (none the loss
// drops), as the indexer's own selection gives - so the gradient-only instance runs, two
// CTAs an SM (a row breaking the contract gets NaN loss and gradients).
constexpr int kGivenMasses = 1, kGivenLogits = 2, kGivenLight = 4, kKeptGradients = 8;
void launch_indexer_loss_rows_mma(const LayerDims& d, const DeviceMetadata& meta,
                                  const IndexerLossArgs& a, float* loss_rows, bool grads,
                                  float grad_loss, bf16* dqi, float* dweff, float* dkeys_acc,
                                  float* kept, int given, cudaStream_t stream);
// The sparse loss's teacher masses on wgmma (indexer_loss_teacher.cu): for every row whose
// valid top-k ids are all visible, mass_j = sum_h exp(scale q_h . K_j - LSE_h) of its valid ids
// j (in order) into kept[(t * topk + j) * 2], the entries launch_indexer_loss_rows_mma reads
// with kGivenMasses. Needs a.sparse, a.lse, head_dim 512. The value launch of
// launch_indexer_loss runs it first where supported.
// logits_kept: kept's logit entries already hold the predictor logits (launch_indexer_loss's
// logits_kept), so where the head blocks' masses must start from zero only the masses are
// zeroed.
bool indexer_teacher_wgmma_supported(const LayerDims& d);
void launch_indexer_teacher_wgmma(const LayerDims& d, const DeviceMetadata& meta,
                                  const IndexerLossArgs& a, float* kept, cudaStream_t stream,
                                  bool logits_kept = false);

// dw_raw = bf16(dweff * H_I^-1/2 * D_I^-1/2).
void launch_indexer_weights_backward(const LayerDims& d, const float* dweff, bf16* dwraw,
                                     cudaStream_t stream);

}  // namespace csattn::cuda
