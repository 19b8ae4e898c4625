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
#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

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

// Each rank of a context-parallel layer (two ranks on this GPU, the host-tensor entry points,
// whose staging the plan includes with host_io) holds the weights and what
// plan_cp_rank_memory plans; plan_cp_device_memory is the same without the staging.
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
  std::vector<std::size_t> got(P, 0), want(P, 0), staging(P, 0);
  std::vector<std::string> errors(P);
  run_local_ranks(P, [&](Communicator& comm) {
    const int r = comm.rank();
    try {
      const cp::LayerPlan plan = cp::build_layer_plan(geo, part, r, cfg.window);
      const int n = static_cast<int>(part.local_rows(r));
      cuda::CudaCpLayer layer(cfg, w);
      layer.prepare_forward(comm, geo, plan, true);
      layer.forward(comm, random_tensor(n, cfg.d_model, 85 + r, true));
      layer.prepare_backward(comm, 1.0f);
      layer.backward(comm, random_tensor(n, cfg.d_model, 87 + r, true));
      got[r] = layer.device_bytes();
      const cuda::CpRankMemory m = cuda::plan_cp_rank_memory(cfg, geo, plan, false, true);
      want[r] = device_io[r].weights + m.forward_workspace + m.cp_buffers + m.backward_workspace;
      staging[r] = m.cp_buffers - device_io[r].context_parallel;
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < P; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(got[r], want[r]) << "rank " << r;
    EXPECT_GT(staging[r], 0u) << "rank " << r << ": the host entry points stage the rank's rows";
    EXPECT_EQ(device_io[r].training_step() + staging[r], want[r]) << "rank " << r;
  }
}

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
