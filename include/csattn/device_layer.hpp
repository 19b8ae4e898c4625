// DeviceLayer: the GPU layer on device memory - for frameworks that own their tensors,
// memory and streams (PyTorch through DLPack, Megatron, vLLM). Activations are bf16 device
// arrays, the workspaces are the caller's (sized by the *_workspace_bytes functions from
// host-known shapes), work goes on the caller's stream, and forward / backward allocate
// nothing and never synchronise with the host, so they can be captured in a CUDA graph
// (after one eager call: the first launch of each kernel sets its shared-memory attribute) and
// replayed with other cu_seqlens values of the same rows, segments and max_seqlen bound.
// The HybridAttentionLayer with Device::cuda is the host-tensor path over the same kernels.
//
// One DeviceLayer serves one thread at a time (it holds one cuBLAS handle). No CUDA types
// appear here: streams are passed as void* (a cudaStream_t; null = the legacy stream).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "csattn/config.hpp"
#include "csattn/weights.hpp"

namespace csattn {

namespace cuda { class CudaLayer; }

struct DeviceBatch {
  const void* x = nullptr;  // bf16 [rows, d_model]; forward only (the backward reads its copy)
  const std::int32_t* cu_seqlens = nullptr;         // [segments + 1], real lengths
  const std::int32_t* cu_seqlens_padded = nullptr;  // [segments + 1], physical lengths
  int rows = 0;                                     // cu_seqlens_padded[segments]
  int segments = 0;
  int max_seqlen = 0;          // >= every padded segment length (a bound is fine)
  // cu_seqlens[segments], checked against rows. Not read by the run: the mean loss divides by
  // the device's cu_seqlens[segments], so a CUDA-graph replay with another packing (new
  // cu_seqlens values, the same pointers) scales by its own real rows.
  std::int64_t real_rows = 0;
  // CSA, optional: [rows, index_topk] segment-local ids, in every row the valid ids first in
  // ascending order, then -1 (the layout the indexer writes), used instead of the indexer's.
  const std::int32_t* forced_topk = nullptr;
};

struct DeviceForwardOutputs {
  void* y = nullptr;               // bf16 [rows, d_model]
  std::int32_t* topk = nullptr;    // CSA, optional: [rows, index_topk]
  float* indexer_loss = nullptr;   // optional: one float (0 without the loss)
};

class DeviceLayer {
 public:
  // Uploads the weights (bf16, fp32 for ape and the sink) to the current device.
  DeviceLayer(AttentionConfig cfg, const LayerWeights& weights, bool deterministic = false);
  ~DeviceLayer();

  // Bytes of the forward workspace (it keeps the activations the backward reads: pass the
  // same one to backward) and of the backward's (it ends with the weight gradients).
  std::size_t forward_workspace_bytes(int rows, int segments, int max_seqlen) const;
  std::size_t backward_workspace_bytes(int rows, int segments, int max_seqlen) const;

  // Workspaces: device memory, 256-byte aligned, any contents on entry. Throws csattn::Error
  // on a bad shape or a workspace that is too small, before enqueuing anything.
  void forward(const DeviceBatch& batch, void* workspace, std::size_t workspace_bytes,
               const DeviceForwardOutputs& out, void* stream) const;
  // The gradients of <y, dy> + grad_indexer_loss * indexer_loss for the batch whose forward
  // left its activations in forward_workspace (pass the same DeviceBatch, forced_topk
  // included: a forced selection changes which operands the sparse loss's predictor reads):
  // dx fp32 [rows, d_model]; the weight gradients (fp32) stay in the backward workspace at
  // weight_gradient_offsets(). grad_indexer_loss_on_device: where the loss's upstream
  // gradient already is on the device (one float, e.g. an autograd gradient tensor), read by
  // the kernels instead of grad_indexer_loss (then ignored) - no host read of a device value.
  // It must be ready on `stream` and stay valid until the backward has run there; it counts
  // as nonzero for the checks made before the launch (a deterministic layer's shape check).
  void backward(const DeviceBatch& batch, void* forward_workspace, void* backward_workspace,
                std::size_t backward_workspace_bytes, const void* dy, float grad_indexer_loss,
                float* dx, void* stream, const float* grad_indexer_loss_on_device = nullptr) const;
  // Byte offset of each parameter's fp32 gradient (its shape: layer_params) in the backward
  // workspace of a batch with these shapes.
  std::map<std::string, std::size_t> weight_gradient_offsets(int rows, int segments,
                                                             int max_seqlen) const;

  const AttentionConfig& config() const { return cfg_; }

 private:
  AttentionConfig cfg_;
  bool deterministic_ = false;
  std::shared_ptr<cuda::CudaLayer> impl_;
};

}  // namespace csattn
