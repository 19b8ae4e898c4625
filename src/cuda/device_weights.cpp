#include "cuda/device_weights.hpp"

#include <map>
#include <string>
#include <vector>

#include "core/rope_table.hpp"
#include "cuda/check.hpp"
#include "cuda/host_bf16.hpp"

namespace csattn::cuda {

WeightStoreLayout weight_store_layout(const std::vector<ParamInfo>& params, std::size_t omega_floats) {
  // Every parameter in bf16, or fp32 for ape / sink (their file dtype), then the frequencies.
  WeightStoreLayout l;
  auto take = [&](std::size_t bytes) {
    const std::size_t off = l.bytes;
    l.bytes += (bytes + 255) / 256 * 256;
    return off;
  };
  for (const ParamInfo& p : params)
    l.param_offsets.push_back(take(static_cast<std::size_t>(shape_numel(p.shape)) *
                                   (p.file_dtype == DType::f32 ? 4 : 2)));
  l.omega_offset = take(omega_floats * sizeof(float));
  return l;
}

DeviceWeightStore::DeviceWeightStore(const AttentionConfig& cfg, const LayerWeights& weights) {
  const std::vector<ParamInfo>& params = weights.params();
  const std::vector<float> omega = rope_frequencies(cfg);
  const WeightStoreLayout layout = weight_store_layout(params, omega.size());
  const std::vector<std::size_t>& offsets = layout.param_offsets;
  const std::size_t omega_off = layout.omega_offset;
  CSATTN_CUDA_CHECK(cudaMalloc(&mem_, layout.bytes));
  bytes_ = layout.bytes;
  auto* base = static_cast<unsigned char*>(mem_);
  std::map<std::string, const void*> ptr;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    const Tensor& t = weights.get(p.name);
    if (p.file_dtype == DType::f32) {
      CSATTN_CUDA_CHECK(cudaMemcpy(base + offsets[i], t.data(), t.nbytes(), cudaMemcpyHostToDevice));
    } else {
      const auto bits = to_bf16_bits(t.ptr<float>(), static_cast<std::size_t>(t.numel()));
      CSATTN_CUDA_CHECK(cudaMemcpy(base + offsets[i], bits.data(), bits.size() * 2,
                                   cudaMemcpyHostToDevice));
    }
    ptr[p.name] = base + offsets[i];
  }
  CSATTN_CUDA_CHECK(cudaMemcpy(base + omega_off, omega.data(), omega.size() * sizeof(float),
                               cudaMemcpyHostToDevice));
  auto b = [&](const char* name) { return static_cast<const bf16*>(ptr.at(name)); };
  auto f = [&](const char* name) { return static_cast<const float*>(ptr.at(name)); };
  DeviceWeights& w = w_;
  w.wq_a = b("attn.wq_a.weight");
  w.q_norm = b("attn.q_norm.weight");
  w.wq_b = b("attn.wq_b.weight");
  w.wkv = b("attn.wkv.weight");
  w.kv_norm = b("attn.kv_norm.weight");
  w.wo_a = b("attn.wo_a.weight");
  w.wo_b = b("attn.wo_b.weight");
  w.sink = f("attn.attn_sink");
  if (cfg.has_compressor()) {
    w.c_wkv = b("attn.compressor.wkv.weight");
    w.c_wgate = b("attn.compressor.wgate.weight");
    w.c_norm = b("attn.compressor.norm.weight");
    w.c_ape = f("attn.compressor.ape");
  }
  if (cfg.has_indexer()) {
    w.i_wq_b = b("attn.indexer.wq_b.weight");
    w.i_wproj = b("attn.indexer.weights_proj.weight");
    w.ic_wkv = b("attn.indexer.compressor.wkv.weight");
    w.ic_wgate = b("attn.indexer.compressor.wgate.weight");
    w.ic_norm = b("attn.indexer.compressor.norm.weight");
    w.ic_ape = f("attn.indexer.compressor.ape");
  }
  w.omega = reinterpret_cast<const float*>(base + omega_off);
  // cudaMemcpy from pageable memory may return before the DMA lands, and s.stream does not
  // wait for the legacy stream: finish the uploads before any run.
  CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
}

DeviceWeightStore::~DeviceWeightStore() {
  if (mem_) cudaFree(mem_);
}

}  // namespace csattn::cuda
