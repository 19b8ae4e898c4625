// The device memory plans (csattn/device_memory.hpp, `csattn memory`) against what the GPU
// layers allocate: the single-GPU layer after a forward and after a backward, both backward
// modes; a context-parallel rank's layer (ranks sharing one GPU) after a training step.
// The host-side properties of the plans are in test_cuda_plan.cpp. Written 2026-12-05
// without a GPU: first run pending. Skips where no GPU is present.
#ifdef CSATTN_HAVE_CUDA
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/geometry.hpp"
#include "cp/layer_plan.hpp"
#include "csattn/comm.hpp"
#include "csattn/cp.hpp"
#include "csattn/device_memory.hpp"
#include "cuda/cp_layer.hpp"
#include "cuda/cuda_layer.hpp"
#include "cuda_test_util.hpp"
#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;
using testing_util::DeviceArray;

// The host plan (csattn memory, plan_device_memory) is what the layer allocates: weights,
// the forward workspace and, after a backward, the backward's - for both backward modes.
TEST(CudaLayerMemory, AllocatesWhatThePlanSays) {
  SKIP_WITHOUT_GPU();
  for (int ratio : {0, 4, 128})
    for (bool deterministic : {false, true}) {
      AttentionConfig cfg = ModelConfig::preset("flash").base;
      cfg.compress_ratio = ratio;
      cfg.loss_coeff = 0.5;
      const SeqLayout layout = SeqLayout::from_lengths({200, 3, 497}, {200, 8, 500});
      const int T = static_cast<int>(layout.total_rows());
      cuda::CudaLayer layer(cfg, LayerWeights::random(cfg, 81));
      layer.set_deterministic(deterministic);
      layer.forward(random_tensor(T, cfg.d_model, 82, true), layout, Tensor());
      const DeviceMemoryPlan plan =
          plan_device_memory(cfg, T, layout.num_segments(), layout.max_seg_len(), deterministic);
      EXPECT_EQ(layer.device_bytes(), plan.forward_only()) << "ratio " << ratio;
      layer.backward(random_tensor(T, cfg.d_model, 83, true), 1.0f);
      EXPECT_EQ(layer.device_bytes(), plan.training_step()) << "ratio " << ratio << " det " << deterministic;
    }
}

// Each rank of a context-parallel layer (two ranks on this GPU) holds the weights and what
// its plan says: through the device entry points (forward_device / backward_device: what
// plan_cp_device_memory and `csattn memory --cp-ranks` report) and through the host-tensor
// ones (which stage the rank's rows too: plan_cp_rank_memory with host_io).
TEST(CudaCpMemory, RanksAllocateWhatThePlanSays) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("small").base;
  cfg.compress_ratio = 4;
  cfg.loss_coeff = 0.5;
  constexpr int P = 2;
  const SeqLayout layout =
      pad_for_context_parallel(SeqLayout::from_lengths({300, 37, 500}), CpMode::two_chunk, P);
  const CpPartition part = CpPartition::build(layout, CpMode::two_chunk, P);
  const BatchGeometry geo = BatchGeometry::build(layout, cfg.compress_ratio);
  const LayerWeights w = LayerWeights::random(cfg, 84);
  const std::vector<DeviceMemoryPlan> device_io = plan_cp_device_memory(cfg, part);
  ASSERT_EQ(device_io.size(), static_cast<std::size_t>(P));
  std::vector<std::size_t> got_device(P, 0), got_host(P, 0), want_host(P, 0);
  // A failure on one rank aborts the group and is rethrown here (no assertions in threads).
  run_local_ranks(P, [&](Communicator& comm) {
    const int r = comm.rank();
    const cp::LayerPlan plan = cp::build_layer_plan(geo, part, r, cfg.window);
    const int n = static_cast<int>(part.local_rows(r));
    const std::size_t rows = static_cast<std::size_t>(n) * cfg.d_model;
    {  // device entry points, on the caller's arrays
      cuda::CudaCpLayer layer(cfg, w);
      DeviceArray<std::uint16_t> x(rows), y(rows), dy(rows);
      DeviceArray<std::int32_t> topk(static_cast<std::size_t>(n) * cfg.index_topk);
      DeviceArray<float> loss(1), dx(rows);
      x.fill_bytes(0);
      dy.fill_bytes(0);
      layer.prepare_forward(comm, geo, plan, false);
      layer.forward_device(comm, x.get(), y.get(), topk.get(), loss.get(), nullptr);
      layer.prepare_backward(comm, 1.0f);
      layer.backward_device(comm, dy.get(), dx.get(), nullptr);
      cuda_ok(cudaDeviceSynchronize(), "device entry points");
      got_device[r] = layer.device_bytes();
    }
    cuda::CudaCpLayer layer(cfg, w);  // host-tensor entry points
    layer.prepare_forward(comm, geo, plan, true);
    layer.forward(comm, random_tensor(n, cfg.d_model, 85 + r, true));
    layer.prepare_backward(comm, 1.0f);
    layer.backward(comm, random_tensor(n, cfg.d_model, 87 + r, true));
    got_host[r] = layer.device_bytes();
    const cuda::CpRankMemory m = cuda::plan_cp_rank_memory(cfg, geo, plan, false, true);
    want_host[r] = device_io[r].weights + m.forward_workspace + m.cp_buffers + m.backward_workspace;
  });
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(got_device[r], device_io[r].training_step()) << "rank " << r;
    EXPECT_EQ(got_host[r], want_host[r]) << "rank " << r;
    EXPECT_GT(want_host[r], device_io[r].training_step()) << "rank " << r << ": the host path stages its rows";
  }
}

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
