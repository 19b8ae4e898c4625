// The inputs of the sparse attention kernel benchmarks (cuda_bench_lib.cpp, the phase
// measurements of cuda_bench_phases.cpp): device buffers at FlashMLA's anchor shapes.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_random.hpp"
#include "one_sequence_metadata.hpp"
#include "csattn/layer.hpp"
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/workspace.hpp"

namespace csattn::bench {

using cuda::bf16;

// The inputs of the sparse attention microbenchmarks: `queries` rows at the end of a long
// sequence, each attending to its 128-row window plus `topk` random distinct compressed keys
// out of `keys`; with `backward`, also dO and the gradient buffers.
struct SparseAttentionInputs {
  static constexpr int D = 512, W = 128;
  int heads, topk, keys, queries;
  cuda::LayerDims d;
  cuda::DeviceMetadata m;
  bf16 *q = nullptr, *kv = nullptr, *comp = nullptr, *out = nullptr, *dout = nullptr,
       *dq = nullptr;
  float *lse = nullptr, *sink = nullptr, *dkv = nullptr, *dcomp = nullptr, *dsink = nullptr;
  std::int32_t *meta_buf = nullptr, *topk_dev = nullptr;

  SparseAttentionInputs(int heads_, int topk_, int keys_, int queries_, bool backward)
      : heads(heads_), topk(topk_), keys(keys_), queries(queries_) {
    AttentionConfig cfg = ModelConfig::preset(heads == 128 ? "pro" : "flash").base;
    cfg.compress_ratio = 4;
    cfg.index_topk = topk;
    const int S = queries + W;  // raw rows: the queries and the window before the first one
    d = cuda::make_dims(cfg, queries, 1, 4 * keys);
    d.comp_capacity = keys;
    const std::size_t qn = static_cast<std::size_t>(queries) * heads * D;
    CSATTN_CUDA_CHECK(cudaMalloc(&q, sizeof(bf16) * qn));
    CSATTN_CUDA_CHECK(cudaMalloc(&kv, sizeof(bf16) * S * D));
    CSATTN_CUDA_CHECK(cudaMalloc(&comp, sizeof(bf16) * static_cast<std::size_t>(keys) * D));
    CSATTN_CUDA_CHECK(cudaMalloc(&out, sizeof(bf16) * qn));
    CSATTN_CUDA_CHECK(cudaMalloc(&lse, sizeof(float) * queries * heads));
    CSATTN_CUDA_CHECK(cudaMalloc(&sink, sizeof(float) * heads));
    CSATTN_CUDA_CHECK(cudaMalloc(&topk_dev, sizeof(std::int32_t) * queries * topk));
    CSATTN_CUDA_CHECK(cudaMalloc(&meta_buf, one_sequence_metadata_bytes(queries)));
    fill_random_bf16(q, qn, 3, 0.05f);
    fill_random_bf16(kv, static_cast<std::size_t>(S) * D, 4);
    fill_random_bf16(comp, static_cast<std::size_t>(keys) * D, 5);
    std::vector<float> sink_h(heads, 0.5f);
    CSATTN_CUDA_CHECK(cudaMemcpy(sink, sink_h.data(), heads * 4, cudaMemcpyHostToDevice));
    // Random distinct ascending ids per row.
    std::mt19937_64 rng(6);
    std::vector<std::int32_t> sel(static_cast<std::size_t>(queries) * topk);
    std::vector<std::int32_t> pool(keys);
    for (int i = 0; i < keys; ++i) pool[i] = i;
    for (int t = 0; t < queries; ++t) {
      for (int k = 0; k < topk; ++k) std::swap(pool[k], pool[k + rng() % (keys - k)]);
      std::vector<std::int32_t> row(pool.begin(), pool.begin() + topk);
      std::sort(row.begin(), row.end());
      std::copy(row.begin(), row.end(), sel.begin() + static_cast<long>(t) * topk);
    }
    CSATTN_CUDA_CHECK(cudaMemcpy(topk_dev, sel.data(), sel.size() * 4, cudaMemcpyHostToDevice));
    // Metadata: one segment of S raw rows; query t sits at position W + t.
    m = upload_one_sequence_metadata(meta_buf, queries, S, keys, W);
    d.rows = queries;
    if (backward) {
      CSATTN_CUDA_CHECK(cudaMalloc(&dout, sizeof(bf16) * qn));
      CSATTN_CUDA_CHECK(cudaMalloc(&dq, sizeof(bf16) * qn));
      CSATTN_CUDA_CHECK(cudaMalloc(&dkv, sizeof(float) * S * D));
      CSATTN_CUDA_CHECK(cudaMalloc(&dcomp, sizeof(float) * static_cast<std::size_t>(keys) * D));
      CSATTN_CUDA_CHECK(cudaMalloc(&dsink, sizeof(float) * queries * heads));
      fill_random_bf16(dout, qn, 7, 0.05f);
      CSATTN_CUDA_CHECK(cudaMemset(dkv, 0, sizeof(float) * S * D));
      CSATTN_CUDA_CHECK(cudaMemset(dcomp, 0, sizeof(float) * static_cast<std::size_t>(keys) * D));
    }
  }
  ~SparseAttentionInputs() {
    for (void* p : {static_cast<void*>(q), static_cast<void*>(kv), static_cast<void*>(comp),
                    static_cast<void*>(out), static_cast<void*>(dout), static_cast<void*>(lse),
                    static_cast<void*>(sink), static_cast<void*>(dq), static_cast<void*>(dkv),
                    static_cast<void*>(dcomp), static_cast<void*>(dsink),
                    static_cast<void*>(meta_buf), static_cast<void*>(topk_dev)})
      if (p) cudaFree(p);
  }
  SparseAttentionInputs(const SparseAttentionInputs&) = delete;
  SparseAttentionInputs& operator=(const SparseAttentionInputs&) = delete;

  void forward() const {
    cuda::launch_sparse_attention(d, m, q, kv, comp, sink, topk_dev, out, lse, nullptr);
  }
  // Key gradients keep accumulating across repetitions (the layer zeroes them per run; the
  // memset is not part of the kernel's time).
  void backward() const {
    cuda::launch_attention_backward(d, m, q, kv, comp, sink, topk_dev, out, lse, dout, dq, dkv,
                                    dcomp, dsink, nullptr);
  }
  nlohmann::json record(double ms, double flops_per_query_key, double gemm_tflops) const {
    const double flops = flops_per_query_key * heads * static_cast<double>(topk + W) * queries;
    nlohmann::json j{{"heads", heads}, {"topk", topk},   {"keys", keys}, {"queries", queries},
                     {"window", W},   {"ms", ms},
                     {"tflops", flops / (ms * 1e-3) / 1e12}};
    j["fraction_of_gemm"] = j["tflops"].get<double>() / gemm_tflops;
    return j;
  }
  // The key rows a query reads (window + top-k, 1 KB each) per second: the forward at 32K+
  // keys is bound by the memory system (perf.md, twenty-sixth session), and this rate, set
  // beside the copy bandwidth, shows it. (The kernels gather each row once per 64-head block.)
  // Forward records only: the backward moves other bytes (dK reductions), so the rate would
  // not be one it achieves.
  double key_tbps(double ms) const {
    return static_cast<double>(topk + W) * queries * 512 * 2 / (ms * 1e-3) / 1e12;
  }
};

}  // namespace csattn::bench
