// Device scaffolding of the kernel-level GPU tests: an owning device array and the layer's
// per-run metadata (built by the layer's own kernels) for a ragged THD batch.
// Include only under CSATTN_HAVE_CUDA.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "csattn/config.hpp"
#include "csattn/tensor.hpp"
#include "core/rope_table.hpp"
#include "cuda/kernels.hpp"
#include "cuda/workspace.hpp"

namespace csattn::testing_util {

// n bf16 bit patterns of N(0, sd) values, seeded.
inline std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint64_t seed, float sd = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16_bits(dist(rng));
  return v;
}

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// An owning device array of n elements (never a null pointer, so kernels may take it; an
// empty array still holds one element). Errors throw std::runtime_error.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n = 0) { resize(n); }
  explicit DeviceArray(const std::vector<T>& host) { upload(host); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(p_); }

  void resize(std::size_t n) {
    cudaFree(p_);
    p_ = nullptr;
    n_ = n;
    cuda_ok(cudaMalloc(&p_, sizeof(T) * (n ? n : 1)), "cudaMalloc");
  }
  // Copies host in; reallocates only when the size changes, so pointers taken from get()
  // before an upload of the same size stay valid.
  // Synchronous too: a pageable upload may return before its DMA has landed, and kernels
  // or collectives on a non-blocking stream would not wait for it.
  void upload(const std::vector<T>& host) {
    if (!p_ || host.size() != n_) resize(host.size());
    if (!n_) return;
    cuda_ok(cudaMemcpy(p_, host.data(), sizeof(T) * n_, cudaMemcpyHostToDevice), "upload");
    cuda_ok(cudaDeviceSynchronize(), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) cuda_ok(cudaMemcpy(host.data(), p_, sizeof(T) * n_, cudaMemcpyDeviceToHost), "download");
    return host;
  }
  // Synchronous: cudaMemset runs on the legacy default stream, which work on a
  // non-blocking stream does not wait for, so the fill is finished before returning.
  void fill_bytes(int byte) {
    if (!n_) return;
    cuda_ok(cudaMemset(p_, byte, sizeof(T) * n_), "memset");
    cuda_ok(cudaDeviceSynchronize(), "memset");
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// The array's storage as another element type of the same size, e.g. a bf16 view of an
// array uploaded as raw 16-bit patterns: dev_cast<cuda::bf16>(a).
template <class U, class T>
U* dev_cast(const DeviceArray<T>& a) {
  static_assert(sizeof(U) == sizeof(T), "dev_cast: element sizes differ");
  return reinterpret_cast<U*>(a.get());
}

// The layer's per-run metadata arrays on the device (DeviceMetadata without the RoPE
// table), filled by the layer's own kernel from a batch's cu_seqlens.
class DeviceMetadataArrays {
 public:
  // Uploads the cu_seqlens, sizes the per-row arrays for `d`, runs launch_metadata and
  // waits for it. The pointers stay valid until the next build with other sizes.
  const cuda::DeviceMetadata& build(const cuda::LayerDims& d, const std::vector<std::int32_t>& cu_real,
                                    const std::vector<std::int32_t>& cu_padded) {
    const std::size_t T = static_cast<std::size_t>(d.rows), B1 = static_cast<std::size_t>(d.segments) + 1;
    cu_real_.upload(cu_real);
    cu_padded_.upload(cu_padded);
    if (row_segment_.size() != T) {
      row_segment_.resize(T);
      row_position_.resize(T);
      row_is_padding_.resize(T);
    }
    if (comp_start_.size() != B1) comp_start_.resize(B1);
    meta_.cu_real = cu_real_.get();
    meta_.cu_padded = cu_padded_.get();
    meta_.row_segment = row_segment_.get();
    meta_.row_position = row_position_.get();
    meta_.row_is_padding = row_is_padding_.get();
    meta_.comp_start = comp_start_.get();
    cuda::launch_metadata(d, meta_, nullptr);
    cuda_ok(cudaDeviceSynchronize(), "metadata");
    return meta_;
  }
  const cuda::DeviceMetadata& meta() const { return meta_; }
  std::vector<std::int32_t> comp_start() const { return comp_start_.download(); }

 private:
  cuda::DeviceMetadata meta_;
  DeviceArray<std::int32_t> cu_real_, cu_padded_, row_segment_, row_position_, comp_start_;
  DeviceArray<std::uint8_t> row_is_padding_;
};

// Dims and device metadata (with the RoPE table) of a THD batch with the given real and
// padded lengths, as the layer builds them (launch_metadata, launch_rope_table).
class DeviceBatch {
 public:
  DeviceBatch(const AttentionConfig& cfg, const std::vector<int>& real, const std::vector<int>& padded) {
    std::vector<std::int32_t> cu_real(1, 0), cu_padded(1, 0);
    int max_len = 1;
    for (std::size_t b = 0; b < real.size(); ++b) {
      cu_real.push_back(cu_real.back() + real[b]);
      cu_padded.push_back(cu_padded.back() + padded[b]);
      max_len = std::max(max_len, padded[b]);
    }
    const int T = cu_padded.back(), B = static_cast<int>(real.size());
    dims = cuda::make_dims(cfg, T, B, max_len);
    meta = arrays_.build(dims, cu_real, cu_padded);
    omega_.upload(rope_frequencies(cfg));
    rope_table_.resize(static_cast<std::size_t>(max_len) * std::max(cfg.rope_dim / 2, 1));
    meta.rope_table = rope_table_.get();
    cuda::launch_rope_table(dims, omega_.get(), rope_table_.get(), nullptr);
    cuda_ok(cudaDeviceSynchronize(), "RoPE table");
    host_cu_padded = cu_padded;
    host_comp_start = arrays_.comp_start();
  }

  cuda::LayerDims dims;
  cuda::DeviceMetadata meta;
  std::vector<std::int32_t> host_cu_padded, host_comp_start;
  const float* omega() const { return omega_.get(); }

 private:
  DeviceMetadataArrays arrays_;
  DeviceArray<float> omega_;
  DeviceArray<__nv_bfloat162> rope_table_;
};

}  // namespace csattn::testing_util
