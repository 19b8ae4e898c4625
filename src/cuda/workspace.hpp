// The forward's workspace plan: every activation and metadata buffer as an offset into one
// caller-owned allocation, sized from host-known maxima (rows, segments, longest segment).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "cuda/backward_params.hpp"
#include "cuda/params.hpp"
#include "csattn/config.hpp"
#include "csattn/tensor.hpp"

namespace csattn::cuda {

struct WorkspacePlan {
  LayerDims dims;
  std::size_t bytes = 0;  // total, 256-byte aligned pieces
  // Offsets of the buffers (bytes from the base).
  std::size_t cu_real = 0, cu_padded = 0, row_segment = 0, row_position = 0,
              row_is_padding = 0, comp_start = 0, loss_scale = 0, rope_table = 0;
  std::size_t x = 0, q_proj = 0, cq = 0, q = 0, q_rstd = 0, kv_proj = 0, kv = 0;
  std::size_t c_a = 0, c_g = 0, c_pooled = 0, comp = 0;
  std::size_t qi_proj = 0, qi = 0, w_raw = 0, w_eff = 0, i_a = 0, i_g = 0, i_pooled = 0,
              i_keys = 0, i_keys_mx = 0, topk = 0, topk_scratch = 0, loss_rows = 0, loss = 0,
              loss_kept = 0;  // 0: not planned (no sparse loss)
  std::size_t attn = 0, attn_tail = 0, lse = 0, u = 0, y = 0;
  std::size_t blas = 0;  // cuBLAS scratch (kBlasWorkspaceBytes)
  static constexpr std::size_t kBlasWorkspaceBytes = 32u << 20;  // cuBLAS's Hopper guidance

  // Pointers into a workspace of at least `bytes` bytes.
  DeviceMetadata metadata(void* base) const;
  DeviceActivations activations(void* base) const;
};

// The backward's buffers and fp32 weight gradients, in a second caller-owned allocation
// (the forward's workspace keeps the activations the backward reads, and the indexer loss,
// so a forward-only caller never needs this one).
struct BackwardPlan {
  std::size_t bytes = 0;
  std::size_t grads_offset = 0, grads_bytes = 0;  // the weight gradients, zeroed per backward
  BackwardBuffers buffers(void* base) const;
  DeviceGradients gradients(void* base) const;
  // Offsets (bytes) of the buffers.
  std::size_t dy = 0, du = 0, dattn = 0, dq = 0, dkv_acc = 0, dcomp_acc = 0,
              dsink_part = 0, dkv = 0, dnormed = 0, dqb = 0, dcq = 0, rstd = 0, dx = 0,
              dcomp = 0, dpooled = 0, da = 0, dg = 0, dqi = 0, dweff = 0, dwraw = 0,
              dkeys_acc = 0, loss_grad_scale = 0, det_scratch = 0, det_scratch_bytes = 0;
  // The deterministic scratch: kDeterministicScratchBytes, or more where a chunk of that size
  // would launch fewer than kDeterministicMinChunkCtas CTAs (~2 waves on an H100 / H200):
  // rows whose contributions are large - long HCA segments (a slot per visible entry), the
  // dense loss (a slot per visible entry) - would otherwise run chunks of a few CTAs each.
  // Never more than kDeterministicMaxScratchBytes, never more than the whole batch needs.
  static constexpr std::size_t kDeterministicScratchBytes = 256u << 20;
  static constexpr std::size_t kDeterministicMaxScratchBytes = 4ull << 30;
  static constexpr int kDeterministicMinChunkCtas = 256;
  std::size_t g_wq_a = 0, g_q_norm = 0, g_wq_b = 0, g_wkv = 0, g_kv_norm = 0, g_wo_a = 0,
              g_wo_b = 0, g_sink = 0, g_c_wkv = 0, g_c_wgate = 0, g_c_norm = 0, g_c_ape = 0,
              g_i_wq_b = 0, g_i_wproj = 0, g_ic_wkv = 0, g_ic_wgate = 0, g_ic_norm = 0,
              g_ic_ape = 0;
};
// deterministic: also a scratch for the fixed-order key-gradient sums (sized as
// kDeterministicScratchBytes says).
BackwardPlan plan_backward(const AttentionConfig& cfg, const LayerDims& d,
                           bool deterministic = false);

// comp_capacity: the compressed rows the buffers hold; -1: rows / ratio (one GPU). A
// context-parallel rank passes its own (cp_layer.cpp). max_seg_len bounds every position
// (the RoPE table's rows).
LayerDims make_dims(const AttentionConfig& cfg, int rows, int segments, int max_seg_len,
                    int comp_capacity = -1);
WorkspacePlan plan_forward(const AttentionConfig& cfg, int rows, int segments, int max_seg_len,
                           int comp_capacity = -1);

// The indexer loss's scale: lambda / N_real (the mean over the batch's real rows) or lambda
// (per-token sums).
float loss_scale_of(const AttentionConfig& c, std::int64_t real_rows);

// The weight gradients of a backward workspace as device pointers, by release name (fp32).
std::map<std::string, const float*> gradient_pointers(const AttentionConfig& c, const BackwardPlan& plan,
                                                      const void* grad_workspace);
// The weight gradients of a backward workspace, by release name (fp32); synchronises
// `stream` (a cudaStream_t) after the copy.
std::map<std::string, Tensor> gradients_to_host(const AttentionConfig& c, const BackwardPlan& plan,
                                                const void* grad_workspace, void* stream);

}  // namespace csattn::cuda
