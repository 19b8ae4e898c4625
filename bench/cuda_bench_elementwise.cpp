// The bandwidth-bound kernels of the forward at the Flash shape (one 4096-token sequence):
// norm / RoPE / Hadamard passes and the compressors' gated pooling, in TB/s over the bytes
// each must move (read its inputs once, write its outputs once) and as a fraction of the
// copy bandwidth measured in the same run. The norm / RoPE figures are given for the
// warp-per-row kernel the layer uses and for the one-block-per-row reference kernel.
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_bench.hpp"

#include "csattn/config.hpp"
#include "csattn/layer.hpp"
#include "core/rope_table.hpp"
#include "cuda/check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/timing.hpp"
#include "cuda/workspace.hpp"

namespace csattn::bench {

using namespace csattn::cuda;
using json = nlohmann::json;

namespace {

void fill_bf16(bf16* dev, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<std::uint16_t> h(n);
  for (auto& x : h) x = float_to_bf16_bits(dist(rng));
  CSATTN_CUDA_CHECK(cudaMemcpy(dev, h.data(), n * 2, cudaMemcpyHostToDevice));
}

template <class T>
T* device_alloc(std::size_t n) {
  T* p = nullptr;
  CSATTN_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
  return p;
}

}  // namespace

json elementwise_benchmarks(double copy_tbps) {
  const int T = 4096;
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  cfg.compress_ratio = 4;
  const std::vector<float> omega = rope_frequencies(cfg);
  LayerDims d = make_dims(cfg, T, 1, T);
  const int H = d.heads, D = d.head_dim, HI = d.index_heads, DI = d.index_dim;

  // Metadata of one segment of T tokens, built by the layer's own kernels.
  std::int32_t* cu = device_alloc<std::int32_t>(2);
  const std::int32_t cu_h[2] = {0, T};
  CSATTN_CUDA_CHECK(cudaMemcpy(cu, cu_h, sizeof cu_h, cudaMemcpyHostToDevice));
  DeviceMetadata m;
  m.cu_real = cu;
  m.cu_padded = cu;
  m.row_segment = device_alloc<std::int32_t>(T);
  m.row_position = device_alloc<std::int32_t>(T);
  m.row_is_padding = device_alloc<std::uint8_t>(T);
  m.comp_start = device_alloc<std::int32_t>(2);
  m.rope_table = device_alloc<__nv_bfloat162>(static_cast<std::size_t>(T) * (d.rope_dim / 2));
  float* omega_dev = device_alloc<float>(omega.size());
  CSATTN_CUDA_CHECK(cudaMemcpy(omega_dev, omega.data(), omega.size() * 4, cudaMemcpyHostToDevice));
  launch_metadata(d, m, nullptr);
  launch_rope_table(d, omega_dev, m.rope_table, nullptr);
  DeviceWeights w;
  w.omega = omega_dev;

  const std::size_t big = static_cast<std::size_t>(T) * H * D;
  bf16* in = device_alloc<bf16>(big);
  bf16* out = device_alloc<bf16>(big);
  bf16* weight = device_alloc<bf16>(std::max(D, cfg.q_lora_rank));
  fill_bf16(in, big, 1);
  fill_bf16(weight, std::max(D, cfg.q_lora_rank), 2);
  float* ape = device_alloc<float>(static_cast<std::size_t>(128) * 2 * D);
  CSATTN_CUDA_CHECK(cudaMemset(ape, 0, sizeof(float) * 128 * 2 * D));

  json cases = json::array();
  std::printf("\nelementwise kernels (flash shape, %d tokens; fraction of the %.2f TB/s copy)\n", T, copy_tbps);
  std::printf("%-34s %9s %9s %8s %9s %8s\n", "kernel", "MB moved", "ms", "TB/s", "of copy", "ref ms");
  auto report = [&](const std::string& name, double bytes, double ms, double ref_ms) {
    const double tbps = bytes / (ms * 1e-3) / 1e12;
    json j{{"kernel", name}, {"bytes", bytes}, {"ms", ms}, {"tbps", tbps},
           {"fraction_of_copy", tbps / copy_tbps}};
    if (ref_ms > 0) j["reference_kernel_ms"] = ref_ms;
    std::printf("%-34s %9.1f %9.4f %8.2f %9.2f %8s\n", name.c_str(), bytes / 1e6, ms, tbps,
                tbps / copy_tbps, ref_ms > 0 ? std::to_string(ref_ms).substr(0, 6).c_str() : "-");
    cases.push_back(j);
  };
  auto norm_rope_case = [&](const std::string& name, NormRopeArgs a) {
    const double bytes = 2.0 * 2.0 * a.rows * static_cast<double>(a.n);
    const double ms = median_event_ms([&] { launch_norm_rope(a, nullptr); }, nullptr, 3, 20);
    const double ref = median_event_ms([&] { launch_norm_rope_reference(a, nullptr); }, nullptr, 3, 20);
    report(name, bytes, ms, ref);
  };
  {
    NormRopeArgs a = token_rows_args(d, w, m, in, out, T * H, D, H);
    a.norm = true;
    a.rope_dim = d.rope_dim;
    norm_rope_case("q: norm + RoPE [T*H, 512]", a);
  }
  {
    NormRopeArgs a = token_rows_args(d, w, m, in, out, T * H, D, H);
    a.rope_dim = d.rope_dim;
    a.rope_sign = -1;
    norm_rope_case("output: inverse RoPE [T*H, 512]", a);
  }
  {
    NormRopeArgs a = token_rows_args(d, w, m, in, out, T * HI, DI, HI);
    a.rope_dim = d.rope_dim;
    a.hadamard = true;
    norm_rope_case("indexer q: RoPE + Hadamard [T*64, 128]", a);
  }
  {
    NormRopeArgs a = token_rows_args(d, w, m, in, out, T, cfg.q_lora_rank, 1);
    a.norm = true;
    a.weight = weight;
    norm_rope_case("cq: norm [T, 1024]", a);
  }
  // Gated pooling: reads the A / G projections once, writes the pooled rows.
  for (auto [ratio, width_d, name] : {std::tuple{4, D, "compressor pool m=4 (D 512)"},
                                      std::tuple{128, D, "compressor pool m=128 (D 512)"},
                                      std::tuple{4, DI, "indexer compressor pool m=4 (128)"}}) {
    LayerDims cd = d;
    cd.ratio = ratio;
    cd.coff = ratio == 4 ? 2 : 1;
    cd.comp_capacity = T / ratio;
    launch_metadata(cd, m, nullptr);
    const int width = cd.coff * width_d;
    const double bytes = 2.0 * 2.0 * T * width + 2.0 * cd.comp_capacity * width_d +
                         4.0 * ratio * width;
    const double ms = median_event_ms([&] {
      launch_compressor_pool(cd, m, width_d, in, in + static_cast<std::size_t>(T) * width, ape,
                             out, nullptr);
    }, nullptr, 3, 20);
    report(name, bytes, ms, -1.0);
  }
  for (void* p : {static_cast<void*>(cu), static_cast<void*>(m.row_segment),
                  static_cast<void*>(m.row_position), static_cast<void*>(m.row_is_padding),
                  static_cast<void*>(m.comp_start), static_cast<void*>(m.rope_table),
                  static_cast<void*>(omega_dev), static_cast<void*>(in), static_cast<void*>(out),
                  static_cast<void*>(weight), static_cast<void*>(ape)})
    cudaFree(p);
  return cases;
}

}  // namespace csattn::bench
