// csattn::DeviceLayer and plan_device_memory in a build without the CUDA backend: they say why.
#ifndef CSATTN_HAVE_CUDA
#include <string>
#include <vector>

#include "csattn/device_layer.hpp"
#include "csattn/device_memory.hpp"
#include "csattn/error.hpp"
#include "csattn/layer.hpp"

namespace csattn {

namespace {
[[noreturn]] void no_cuda() {
  std::string why;
  cuda_available(&why);
  throw Error(ErrorKind::Unsupported, "DeviceLayer: " + why);
}
}  // namespace

DeviceLayer::DeviceLayer(AttentionConfig cfg, const LayerWeights&, bool) : cfg_(std::move(cfg)) { no_cuda(); }
DeviceLayer::~DeviceLayer() = default;
std::size_t DeviceLayer::forward_workspace_bytes(int, int, int) const { no_cuda(); }
std::size_t DeviceLayer::backward_workspace_bytes(int, int, int) const { no_cuda(); }
void DeviceLayer::forward(const DeviceBatch&, void*, std::size_t, const DeviceForwardOutputs&, void*) const {
  no_cuda();
}
void DeviceLayer::backward(const DeviceBatch&, void*, void*, std::size_t, const void*, float, float*, void*,
                           const float*) const {
  no_cuda();
}
std::map<std::string, std::size_t> DeviceLayer::weight_gradient_offsets(int, int, int) const { no_cuda(); }

DeviceMemoryPlan plan_device_memory(const AttentionConfig&, int, int, int, bool) {
  throw Error(ErrorKind::Unsupported,
              "plan_device_memory: this build has no CUDA backend (its buffers are the CUDA "
              "layer's); rebuild where nvcc is found");
}

std::vector<DeviceMemoryPlan> plan_cp_device_memory(const AttentionConfig& cfg, const CpPartition&, bool) {
  return {plan_device_memory(cfg, 0, 1, 0, false)};  // throws the same reason
}

}  // namespace csattn
#endif
