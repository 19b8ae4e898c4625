// The bandwidth-bound kernels of the forward at the Flash shape (one 4096-token sequence):
// norm / RoPE / Hadamard passes and the compressors' gated pooling, in TB/s over the bytes
// each must move (read its inputs once, write its outputs once) and as a fraction of the
// copy bandwidth measured in the same run (2 GiB copied: the ceiling), and against a
// cudaMemcpy of the kernel's own byte count (a pass of ~0.1 ms pays a ramp and a tail that
// the 1 ms ceiling copy amortises: this column says how much of the gap is the size). The
// norm / RoPE figures are given for the warp-per-row kernel the layer uses and for the
// one-block-per-row reference kernel.
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_random.hpp"
#include "cuda_bench.hpp"

#include "csattn/config.hpp"
#include "csattn/layer.hpp"
#include "core/rope_table.hpp"
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/timing.hpp"
#include "cuda/workspace.hpp"

namespace csattn::bench {

using namespace csattn::cuda;
using json = nlohmann::json;

namespace {

template <class T>
T* device_alloc(std::size_t n) {
  T* p = nullptr;
  CSATTN_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
  return p;
}

// Metadata of one segment of `tokens` tokens, built by the layer's own kernels, in arrays
// sized for the largest case.
struct BenchBatch {
  static constexpr int kMaxTokens = 262144;
  DeviceMetadata m;
  std::int32_t* cu = nullptr;  // {0, tokens}: cu_real = cu_padded
  float* omega = nullptr;

  explicit BenchBatch(const AttentionConfig& cfg) {
    cu = device_alloc<std::int32_t>(2);
    m.cu_real = cu;
    m.cu_padded = cu;
    m.row_segment = device_alloc<std::int32_t>(kMaxTokens);
    m.row_position = device_alloc<std::int32_t>(kMaxTokens);
    m.row_is_padding = device_alloc<std::uint8_t>(kMaxTokens);
    m.comp_start = device_alloc<std::int32_t>(2);
    m.rope_table = device_alloc<__nv_bfloat162>(static_cast<std::size_t>(kMaxTokens) * (cfg.rope_dim / 2));
    const std::vector<float> om = rope_frequencies(cfg);
    omega = device_alloc<float>(om.size());
    CSATTN_CUDA_CHECK(cudaMemcpy(omega, om.data(), om.size() * 4, cudaMemcpyHostToDevice));
  }
  ~BenchBatch() {
    for (void* p : {static_cast<void*>(cu), static_cast<void*>(m.row_segment),
                    static_cast<void*>(m.row_position), static_cast<void*>(m.row_is_padding),
                    static_cast<void*>(m.comp_start), static_cast<void*>(m.rope_table),
                    static_cast<void*>(omega)})
      cudaFree(p);
  }
  // Dims for `tokens` tokens of `cfg` (its ratio), metadata rebuilt for them.
  LayerDims set(const AttentionConfig& cfg, int tokens) {
    LayerDims d = make_dims(cfg, tokens, 1, tokens);
    const std::int32_t cu_h[2] = {0, tokens};
    CSATTN_CUDA_CHECK(cudaMemcpy(cu, cu_h, sizeof cu_h, cudaMemcpyHostToDevice));
    launch_metadata(d, m, nullptr);
    launch_rope_table(d, omega, m.rope_table, nullptr);
    CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
    return d;
  }
};

}  // namespace

json elementwise_benchmarks(double copy_tbps) {
  // Each kernel runs at the token count where it moves about 256 MiB: small passes (a few
  // MB at 4K tokens) only measure launch latency, not the kernel's bandwidth.
  constexpr double kTargetBytes = 256.0 * (1 << 20);
  auto tokens_for = [&](double bytes_per_token) {
    int t = 4096;
    while (t < BenchBatch::kMaxTokens && t * bytes_per_token < kTargetBytes) t *= 2;
    return t;
  };
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  cfg.compress_ratio = 4;
  BenchBatch batch(cfg);
  const DeviceMetadata& m = batch.m;
  DeviceWeights w;
  w.omega = batch.omega;
  const int H = cfg.n_heads, D = cfg.head_dim, HI = cfg.index_n_heads, DI = cfg.index_head_dim;

  const std::size_t big = static_cast<std::size_t>(kTargetBytes / 2) + (1u << 20);  // bf16 elements
  bf16* in = device_alloc<bf16>(big);
  bf16* out = device_alloc<bf16>(big);
  // The same-size copies' buffers: the largest case moves ~805 MB (the q backward's three
  // [4096 * 64, 512] passes), so half of it is read and half written.
  constexpr std::size_t kCopyBytes = std::size_t{512} << 20;
  unsigned char* copy_src = device_alloc<unsigned char>(kCopyBytes);
  unsigned char* copy_dst = device_alloc<unsigned char>(kCopyBytes);
  CSATTN_CUDA_CHECK(cudaMemset(copy_src, 1, kCopyBytes));
  bf16* weight = device_alloc<bf16>(std::max(D, cfg.q_lora_rank));
  fill_random_bf16(in, big, 1);
  fill_random_bf16(weight, std::max(D, cfg.q_lora_rank), 2);
  float* ape = device_alloc<float>(static_cast<std::size_t>(128) * 2 * D);
  CSATTN_CUDA_CHECK(cudaMemset(ape, 0, sizeof(float) * 128 * 2 * D));

  json cases = json::array();
  std::printf("\nelementwise kernels (flash shape, one sequence; fraction of the %.2f TB/s copy)\n", copy_tbps);
  std::printf("%-34s %7s %9s %9s %8s %9s %12s %8s\n", "kernel", "tokens", "MB moved", "ms", "TB/s", "of copy",
              "of same-size", "ref ms");
  auto report = [&](const std::string& name, int tokens, double bytes, double ms, double ref_ms) {
    const double tbps = bytes / (ms * 1e-3) / 1e12;
    // A device copy moving the same bytes (half read, half written).
    const std::size_t half = static_cast<std::size_t>(bytes / 2.0);
    require(half <= kCopyBytes, ErrorKind::Internal,
            "the elementwise benchmark's same-size copy needs " + std::to_string(half) + " bytes a buffer");
    const double copy_ms = median_event_ms(
        [&] { CSATTN_CUDA_CHECK(cudaMemcpyAsync(copy_dst, copy_src, half, cudaMemcpyDeviceToDevice, nullptr)); },
        nullptr, 3, 20);
    const double same_size_tbps = 2.0 * half / (copy_ms * 1e-3) / 1e12;
    json j{{"kernel", name}, {"tokens", tokens}, {"bytes", bytes}, {"ms", ms}, {"tbps", tbps},
           {"fraction_of_copy", tbps / copy_tbps}, {"same_size_copy_tbps", same_size_tbps},
           {"fraction_of_same_size_copy", tbps / same_size_tbps}};
    if (ref_ms > 0) {
      j["reference_kernel_ms"] = ref_ms;
      j["reference_fraction_of_copy"] = bytes / (ref_ms * 1e-3) / 1e12 / copy_tbps;
    }
    std::printf("%-34s %7d %9.1f %9.4f %8.2f %9.2f %12.2f %8s\n", name.c_str(), tokens, bytes / 1e6, ms, tbps,
                tbps / copy_tbps, tbps / same_size_tbps,
                ref_ms > 0 ? std::to_string(ref_ms).substr(0, 6).c_str() : "-");
    cases.push_back(j);
  };
  // Norm / RoPE / Hadamard over [tokens * per_token, n] rows: read and write each once.
  auto norm_rope_case = [&](const std::string& name, int per_token, int n, auto configure) {
    const int T = tokens_for(2.0 * 2.0 * per_token * n);
    const LayerDims d = batch.set(cfg, T);
    NormRopeArgs a = token_rows_args(d, w, m, in, out, T * per_token, n, per_token);
    configure(a, d);
    const double bytes = 2.0 * 2.0 * a.rows * static_cast<double>(a.n);
    const double ms = median_event_ms([&] { launch_norm_rope(a, nullptr); }, nullptr, 3, 20);
    const double ref = median_event_ms([&] { launch_norm_rope_reference(a, nullptr); }, nullptr, 3, 20);
    report(name, T, bytes, ms, ref);
  };
  norm_rope_case("q: norm + RoPE [T*H, 512]", H, D, [](NormRopeArgs& a, const LayerDims& d) {
    a.norm = true;
    a.rope_dim = d.rope_dim;
  });
  // The attention output's RoPE passes, in place on each head row's tail (the tail kernel):
  // the forward's inverse RoPE, which also keeps the tail's values (reads the tails, writes
  // them and the kept copy), and the backward's transpose on the output's gradient (reads and
  // writes the tails). Whole [T*H, 512] rows in their own buffer, only the tails moved.
  {
    const int span = attention_tail_dim(make_dims(cfg, 1, 1, 1));
    const int T = tokens_for(3.0 * 2.0 * H * span);
    const LayerDims d = batch.set(cfg, T);
    const std::size_t rows = static_cast<std::size_t>(T) * H;
    bf16* o = device_alloc<bf16>(rows * D);
    bf16* kept = device_alloc<bf16>(rows * span);
    fill_random_bf16(o, rows * D, 3);
    for (const bool forward : {true, false}) {
      NormRopeArgs a = token_rows_args(d, w, m, o, o, static_cast<int>(rows), D, H);
      a.rope_dim = d.rope_dim;
      a.rope_sign = forward ? -1 : 1;
      if (forward) {
        a.keep_tail = kept;
        a.keep_tail_dim = span;
      }
      const double bytes = (forward ? 3.0 : 2.0) * 2.0 * static_cast<double>(rows) * (forward ? span : d.rope_dim);
      const double ms = median_event_ms([&] { launch_norm_rope(a, nullptr); }, nullptr, 3, 20);
      report(forward ? "output: inverse RoPE, tails [T*H, 512]" : "output backward: RoPE^T, tails", T, bytes, ms, -1.0);
    }
    // The tails' access pattern alone: a 2D device copy of each row's rotated tail (128 of its
    // 1,024 bytes) onto the head of the same row - the bytes the backward's row above moves,
    // at the same stride and within the same rows as its in-place pass, without the RoPE
    // (the rows' heads are not needed after it). What the stride itself allows: the tail rows
    // against it, not only against a contiguous copy.
    const std::size_t pitch = sizeof(bf16) * static_cast<std::size_t>(D);
    const std::size_t tail = sizeof(bf16) * static_cast<std::size_t>(d.rope_dim);
    const double strided_ms = median_event_ms(
        [&] {
          CSATTN_CUDA_CHECK(cudaMemcpy2DAsync(o, pitch, o + D - d.rope_dim, pitch, tail, rows,
                                              cudaMemcpyDeviceToDevice, nullptr));
        },
        nullptr, 3, 20);
    report("strided copy: the tails alone (ref.)", T, 2.0 * static_cast<double>(rows) * tail, strided_ms, -1.0);
    cudaFree(o);
    cudaFree(kept);
  }
  norm_rope_case("indexer q: RoPE + Hadamard [T*64, 128]", HI, DI, [](NormRopeArgs& a, const LayerDims& d) {
    a.rope_dim = d.rope_dim;
    a.hadamard = true;
  });
  norm_rope_case("cq: norm [T, 1024]", 1, cfg.q_lora_rank, [&](NormRopeArgs& a, const LayerDims&) {
    a.norm = true;
    a.weight = weight;
  });
  // RMSNorm backward rows: read x (or the norm's output) and dy once, write dx once (the
  // weight and rstd are a few KB / rows x 4 bytes). The reference: one block a row.
  bf16* dx = device_alloc<bf16>(big);
  float* rstd = device_alloc<float>(std::size_t{1} << 20);
  {
    const std::vector<float> ones(std::size_t{1} << 20, 1.0f);
    CSATTN_CUDA_CHECK(cudaMemcpy(rstd, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  }
  auto norm_backward_case = [&](const std::string& name, int per_token, int n, bool from_output) {
    const int T = tokens_for(3.0 * 2.0 * per_token * n);
    const int rows = T * per_token;
    const double bytes = 3.0 * 2.0 * rows * static_cast<double>(n);
    auto run = [&](bool reference) {
      if (from_output)
        launch_rmsnorm_backward_from_output(in, rstd, out, rows, n, dx, nullptr, reference);
      else
        launch_rmsnorm_backward(in, weight, out, rows, n, static_cast<float>(cfg.norm_eps), dx, nullptr, rstd,
                                nullptr, 0, nullptr,
                                reference);
    };
    const double ms = median_event_ms([&] { run(false); }, nullptr, 3, 20);
    const double ref = median_event_ms([&] { run(true); }, nullptr, 3, 20);
    report(name, T, bytes, ms, ref);
  };
  norm_backward_case("q backward: norm from output [T*H, 512]", H, D, true);
  norm_backward_case("kv backward: norm [T, 512]", 1, D, false);
  norm_backward_case("cq backward: norm [T, 1024]", 1, cfg.q_lora_rank, false);
  // Gated pooling: reads the A / G projections once, writes the pooled rows (ape is a few
  // KB and cached).
  for (auto [ratio, width_d, name] : {std::tuple{4, D, "compressor pool m=4 (D 512)"},
                                      std::tuple{128, D, "compressor pool m=128 (D 512)"},
                                      std::tuple{4, DI, "indexer compressor pool m=4 (128)"}}) {
    AttentionConfig pc = cfg;
    pc.compress_ratio = ratio;
    const int width = (ratio == 4 ? 2 : 1) * width_d;
    const int T = tokens_for(2.0 * 2.0 * width + 2.0 * width_d / ratio);
    const LayerDims cd = batch.set(pc, T);
    const double bytes = 2.0 * 2.0 * T * width + 2.0 * cd.comp_capacity * width_d + 4.0 * ratio * width;
    const bf16* g = in + static_cast<std::size_t>(T) * width;
    const double ms = median_event_ms([&] { launch_compressor_pool(cd, m, width_d, in, g, ape, out, nullptr); },
                                      nullptr, 3, 20);
    const double ref = median_event_ms(
        [&] { launch_compressor_pool_reference(cd, m, width_d, in, g, ape, out, nullptr); }, nullptr, 3, 20);
    report(name, T, bytes, ms, ref);
  }
  for (void* p : {static_cast<void*>(in), static_cast<void*>(out), static_cast<void*>(weight),
                  static_cast<void*>(ape), static_cast<void*>(dx), static_cast<void*>(rstd),
                  static_cast<void*>(copy_src), static_cast<void*>(copy_dst)})
    cudaFree(p);
  return cases;
}

}  // namespace csattn::bench
