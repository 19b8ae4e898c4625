// csattn::DeviceLayer (device_layer.hpp) over the CUDA backend's device-memory entry points
// (CudaLayer::forward_device / backward_device).
#include "csattn/device_layer.hpp"

#include "cuda/cuda_layer.hpp"

namespace csattn {

DeviceLayer::DeviceLayer(AttentionConfig cfg, const LayerWeights& weights, bool deterministic)
    : cfg_(std::move(cfg)), deterministic_(deterministic) {
  cfg_.validate();
  weights.check(cfg_);
  impl_ = std::make_shared<cuda::CudaLayer>(cfg_, weights);
  impl_->set_deterministic(deterministic_);
}

DeviceLayer::~DeviceLayer() = default;

std::size_t DeviceLayer::forward_workspace_bytes(int rows, int segments, int max_seqlen) const {
  return impl_->device_forward_bytes(rows, segments, max_seqlen);
}

std::size_t DeviceLayer::backward_workspace_bytes(int rows, int segments, int max_seqlen) const {
  return impl_->device_backward_bytes(rows, segments, max_seqlen);
}

void DeviceLayer::forward(const DeviceBatch& batch, void* workspace, std::size_t workspace_bytes,
                          const DeviceForwardOutputs& out, void* stream) const {
  impl_->forward_device(batch, workspace, workspace_bytes, out, stream);
}

void DeviceLayer::backward(const DeviceBatch& batch, void* forward_workspace, void* backward_workspace,
                           std::size_t backward_workspace_bytes, const void* dy, float grad_indexer_loss,
                           float* dx, void* stream, const float* grad_indexer_loss_on_device) const {
  impl_->backward_device(batch, forward_workspace, backward_workspace, backward_workspace_bytes, dy,
                         grad_indexer_loss, dx, stream, grad_indexer_loss_on_device);
}

std::map<std::string, std::size_t> DeviceLayer::weight_gradient_offsets(int rows, int segments,
                                                                        int max_seqlen) const {
  return impl_->device_gradient_offsets(rows, segments, max_seqlen);
}

}  // namespace csattn
