// CudaLayer: the host side of the CUDA backend for one layer. It owns the device weights, a
// stream, a cuBLAS handle and a grow-only workspace sized by plan_forward; forward() uploads
// the batch, runs the launch sequence (no allocation, no sync inside) and downloads the
// results. This header has no CUDA types so host-only code can hold a CudaLayer.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "csattn/device_layer.hpp"
#include "csattn/layer.hpp"

namespace csattn::cuda {

// True when a CUDA device is usable; otherwise `why` says what is missing.
bool device_available(std::string* why = nullptr);

struct StageTime {
  std::string name;
  double ms = 0.0;
};

// Median timings of a launch sequence (the forward or the backward).
struct StageProfile {
  double total_ms = 0.0;               // median over the timed runs
  std::vector<StageTime> stages;       // median per stage
  std::size_t workspace_bytes = 0;     // the forward's workspace
};
using ForwardProfile = StageProfile;

struct CudaLayerImpl;

class CudaLayer {
 public:
  CudaLayer(const AttentionConfig& cfg, const LayerWeights& weights);
  ~CudaLayer();
  CudaLayer(const CudaLayer&) = delete;
  CudaLayer& operator=(const CudaLayer&) = delete;

  // forced_topk: empty, or [T, K] i32 already validated by the caller. The activations of
  // the last forward stay on the device for backward(); `generation` numbers forwards.
  LayerOutputs forward(const Tensor& x, const SeqLayout& layout, const Tensor& forced_topk);
  std::uint64_t generation() const;

  // Gradients of the last forward: grad_output [T, d_model] for the output and
  // grad_indexer_loss for the indexer loss. Weight gradients by release name, fp32.
  LayerGradients backward(const Tensor& grad_output, float grad_indexer_loss);

  // Tests: fill the workspace with 0xFF bytes (bf16/fp32 NaN) before every run, so a value
  // no kernel wrote shows up as NaN.
  void set_poison(bool on);
  // Backward with fixed-order reductions (bitwise-repeatable gradients) instead of atomics.
  void set_deterministic(bool on);
  // Re-runs the last forward `iters` times (after `warmup`) and reports median timings.
  ForwardProfile profile(int warmup, int iters);
  // Device memory this layer holds: weights + forward workspace + backward buffers and
  // weight gradients (the CUDA context and cuBLAS's own workspace not included).
  std::size_t device_bytes() const;
  // Re-runs the last backward (after backward()) and reports median timings, per stage too.
  StageProfile profile_backward(int warmup, int iters);
  // CUDA-graph check (tests): captures the last forward's launch sequence into a graph in
  // global capture mode - where any allocation or host synchronisation inside the run makes
  // the capture fail - then, per layout, writes its cu_seqlens into the workspace (outside
  // the graph) and replays it, returning the outputs. Each layout needs the last forward's
  // rows and segment count and no longer a segment (the maxima the launches were sized by).
  std::vector<Tensor> replay_forward_graph(const std::vector<SeqLayout>& layouts);

  // The device-memory entry points behind csattn::DeviceLayer (device_layer.hpp): caller
  // workspaces and stream (a cudaStream_t as void*), no allocation, no host sync. They use
  // neither the layer's own workspaces nor its last-forward state.
  std::size_t device_forward_bytes(int rows, int segments, int max_seqlen) const;
  std::size_t device_backward_bytes(int rows, int segments, int max_seqlen) const;
  void forward_device(const DeviceBatch& batch, void* workspace, std::size_t bytes,
                      const DeviceForwardOutputs& out, void* stream) const;
  void backward_device(const DeviceBatch& batch, void* forward_workspace, void* backward_workspace,
                       std::size_t bytes, const void* dy, float grad_indexer_loss, float* dx,
                       void* stream, const float* grad_indexer_loss_on_device = nullptr) const;
  std::map<std::string, std::size_t> device_gradient_offsets(int rows, int segments,
                                                            int max_seqlen) const;

 private:
  std::unique_ptr<CudaLayerImpl> impl_;
};

}  // namespace csattn::cuda
