// GPU context parallelism against CP = 1 (the `cp` section of `csattn bench --device cuda`):
// one Flash-shape sequence per layer type, CP = 1 (one rank, the same context-parallel code,
// over NCCL) and P = every visible GPU (NCCL, one GPU per rank, ranks as threads) in both
// partition modes; on one GPU, CP = 1 alone. Per run: the slowest rank's forward (without the
// indexer loss value, as in the `layer` section), its loss stage alone, and its backward
// (medians of re-runs that include the collectives, from a barrier to the stream's end), the
// train-step tokens/s (forward + backward, as in the `layer` section), and the
// largest rank's device memory (what the layer's allocations took from the GPU, measured
// with cudaMemGetInfo around the layer's life, NCCL's own buffers included).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/geometry.hpp"
#include "cp/layer_plan.hpp"
#include "csattn/comm.hpp"
#include "csattn/cp.hpp"
#include "csattn/device_memory.hpp"
#include "csattn/error.hpp"
#include "cuda/check.hpp"
#include "cuda/cp_layer.hpp"
#include "cuda_bench.hpp"
#include "env_list.hpp"

namespace csattn::bench {

namespace {

using json = nlohmann::json;

// Cheap reproducible inputs in [-1, 1) (a host normal generator takes seconds per GiB).
Tensor uniform_rows(std::int64_t rows, int cols, std::uint64_t seed) {
  Tensor t(DType::f32, {rows, cols});
  float* p = t.ptr<float>();
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = static_cast<float>(static_cast<double>(s >> 40) / static_cast<double>(1ull << 24) * 2.0 - 1.0);
  }
  return t;
}

struct RankResult {
  double forward_ms = 0.0, loss_ms = 0.0, backward_ms = 0.0;
  std::size_t peak_bytes = 0;
  std::uint64_t comm_bytes = 0;  // sent, forward + backward
};

json cp_case(const AttentionConfig& cfg, int tokens, int P, CpMode mode) {
  const SeqLayout layout = SeqLayout::from_lengths({tokens});
  const CpPartition part = CpPartition::build(layout, mode, P);
  const BatchGeometry geo = BatchGeometry::build(layout, cfg.compress_ratio);
  const LayerWeights w = LayerWeights::random(cfg, 11);
  std::vector<RankResult> res(static_cast<std::size_t>(P));
  run_local_ranks(P, [&](Communicator& boot) {
    const int r = boot.rank();
    CSATTN_CUDA_CHECK(cudaSetDevice(r));
    // NCCL at P = 1 too: the in-process group would stage reductions on the host and make
    // the baseline slower than it is.
    std::unique_ptr<Communicator> nccl = nccl_communicator(boot, r);
    Communicator& comm = *nccl;
    const cp::LayerPlan plan = cp::build_layer_plan(geo, part, r, cfg.window);
    const std::int64_t n = part.local_rows(r);
    const Tensor x = uniform_rows(n, cfg.d_model, 100 + static_cast<std::uint64_t>(r));
    const Tensor dy = uniform_rows(n, cfg.d_model, 200 + static_cast<std::uint64_t>(r));
    std::size_t free_before = 0, free_after = 0, total = 0;
    CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
    CSATTN_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
    {
      cuda::CudaCpLayer layer(cfg, w);
      const CommStats before = comm.stats();
      layer.prepare_forward(comm, geo, plan, true);  // the host-tensor entry points below
      layer.forward(comm, x);
      layer.prepare_backward(comm, 1.0f);
      layer.backward(comm, dy);
      const CommStats after = comm.stats();
      const cuda::CudaCpProfile prof = layer.profile(comm, 1, 3);
      CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
      CSATTN_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
      RankResult& rr = res[static_cast<std::size_t>(r)];
      rr.forward_ms = prof.forward_ms;
      rr.loss_ms = prof.loss_ms;
      rr.backward_ms = prof.backward_ms;
      rr.peak_bytes = free_before > free_after ? free_before - free_after : 0;
      rr.comm_bytes = after.bytes_sent - before.bytes_sent;
    }
  });
  json j{{"type", layer_kind_name(cfg.kind())}, {"tokens", tokens}, {"ranks", P},
         {"mode", P > 1 ? cp_mode_name(mode) : "single"}};
  double fwd = 0.0, loss = 0.0, bwd = 0.0, peak = 0.0, sent = 0.0;
  for (const RankResult& rr : res) {
    fwd = std::max(fwd, rr.forward_ms);
    loss = std::max(loss, rr.loss_ms);
    bwd = std::max(bwd, rr.backward_ms);
    peak = std::max(peak, static_cast<double>(rr.peak_bytes));
    sent = std::max(sent, static_cast<double>(rr.comm_bytes));
    j["per_rank"].push_back(json{{"forward_ms", rr.forward_ms}, {"loss_ms", rr.loss_ms}, {"backward_ms", rr.backward_ms},
                                 {"peak_bytes", rr.peak_bytes}, {"sent_bytes", rr.comm_bytes}});
  }
  // The host plans: csattn memory --cp-ranks (the device entry points), and this benchmark's
  // host-tensor path with its staging of the rank's rows; the measured peak adds NCCL's
  // buffers to the second.
  std::size_t planned = 0, planned_host_io = 0;
  const std::vector<DeviceMemoryPlan> plans = plan_cp_device_memory(cfg, part);
  for (int r = 0; r < P; ++r) {
    const cuda::CpRankMemory m =
        cuda::plan_cp_rank_memory(cfg, geo, cp::build_layer_plan(geo, part, r, cfg.window), false, true);
    planned = std::max(planned, plans[static_cast<std::size_t>(r)].training_step());
    planned_host_io = std::max(planned_host_io, plans[static_cast<std::size_t>(r)].weights + m.forward_workspace +
                                                    m.cp_buffers + m.backward_workspace);
  }
  j["planned_bytes_per_rank"] = planned;
  j["planned_bytes_per_rank_host_io"] = planned_host_io;
  j["forward_ms"] = fwd;
  j["loss_ms"] = loss;
  j["backward_ms"] = bwd;
  j["train_step_tokens_per_s"] = tokens / ((fwd + bwd) * 1e-3);  // as the `layer` section
  j["peak_bytes_per_rank"] = peak;
  j["max_sent_bytes"] = sent;
  return j;
}

}  // namespace

json cp_benchmarks() {
  int gpus = 0;
  CSATTN_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  json out = json::array();
  std::printf("\ncontext parallelism (flash shape, one sequence; slowest rank; CP = 1 is the same "
              "code on one rank)\n");
  if (!nccl_available()) {
    std::printf("  (skipped: this build has no NCCL)\n");
    return out;
  }
  // One GPU: CP = 1 only (what the context-parallel code costs against the single-GPU layer
  // of the `layer` section); P > 1 needs a GPU per rank.
  const int P = std::min(gpus, 8);
  if (P < 2) std::printf("  (one GPU here: CP = 1 only; P > 1 needs a GPU per rank)\n");
  std::printf("%5s %7s %3s %11s %9s %9s %9s %12s %9s %9s\n", "type", "tokens", "P", "mode", "fwd ms", "loss ms",
              "bwd ms", "tokens/s", "GiB/rank", "MiB sent");
  // CSATTN_BENCH_CP_TOKENS (comma list) picks the sequence lengths.
  std::vector<int> defaults;
  for (int t : {32768, 65536}) defaults.push_back((t + 2 * P - 1) / (2 * P) * (2 * P));  // both modes' rule
  const std::vector<int> token_list =
      int_list_from_env("CSATTN_BENCH_CP_TOKENS", defaults, "token counts", 1, 2 * P);
  for (int tokens : token_list)
    for (int ratio : {0, 4, 128}) {
      AttentionConfig cfg = ModelConfig::preset("flash").base;
      cfg.compress_ratio = ratio;
      const std::vector<std::pair<int, CpMode>> runs =
          P < 2 ? std::vector<std::pair<int, CpMode>>{{1, CpMode::contiguous}}
                : std::vector<std::pair<int, CpMode>>{{1, CpMode::contiguous}, {P, CpMode::contiguous}, {P, CpMode::two_chunk}};
      for (auto [ranks, mode] : runs) {
        std::fprintf(stderr, "cuda_bench: cp ratio %d tokens %d P %d %s\n", ratio, tokens, ranks, cp_mode_name(mode));
        json j = cp_case(cfg, tokens, ranks, mode);
        std::printf("%5s %7d %3d %11s %9.2f %9.2f %9.2f %12.0f %9.2f %9.1f\n", j["type"].get<std::string>().c_str(),
                    tokens, ranks, j["mode"].get<std::string>().c_str(), j["forward_ms"].get<double>(),
                    j["loss_ms"].get<double>(), j["backward_ms"].get<double>(), j["train_step_tokens_per_s"].get<double>(),
                    j["peak_bytes_per_rank"].get<double>() / (1u << 30), j["max_sent_bytes"].get<double>() / (1u << 20));
        std::fflush(stdout);
        out.push_back(j);
      }
    }
  return out;
}

}  // namespace csattn::bench
