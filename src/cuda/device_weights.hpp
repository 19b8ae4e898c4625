// A layer's parameters on the device: one allocation holding every parameter (bf16, or fp32
// for ape / sink) and the RoPE frequencies, and the DeviceWeights pointing into it. Shared
// by the single-GPU layer (cuda_layer.cpp) and the context-parallel one (cp_layer.cpp).
#pragma once
#include <cstddef>
#include <vector>

#include "csattn/config.hpp"
#include "csattn/weights.hpp"
#include "cuda/params.hpp"

namespace csattn::cuda {

// Where each parameter of `params` (in that order) and the `omega_floats` RoPE frequencies
// sit in the store's one allocation (each piece 256-byte aligned), and its size: what the
// store allocates and what plan_device_memory reports.
struct WeightStoreLayout {
  std::vector<std::size_t> param_offsets;
  std::size_t omega_offset = 0, bytes = 0;
};
WeightStoreLayout weight_store_layout(const std::vector<ParamInfo>& params, std::size_t omega_floats);

class DeviceWeightStore {
 public:
  // Uploads `weights` to the current device; returns after the copies have landed.
  DeviceWeightStore(const AttentionConfig& cfg, const LayerWeights& weights);
  ~DeviceWeightStore();
  DeviceWeightStore(const DeviceWeightStore&) = delete;
  DeviceWeightStore& operator=(const DeviceWeightStore&) = delete;
  const DeviceWeights& weights() const { return w_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* mem_ = nullptr;
  std::size_t bytes_ = 0;
  DeviceWeights w_;
};

}  // namespace csattn::cuda
