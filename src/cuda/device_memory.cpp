// plan_device_memory / plan_cp_device_memory (csattn/device_memory.hpp): the GPU layers'
// allocations from the same plans that size them - weight_store_layout, plan_forward,
// plan_backward, and a context-parallel rank's plan_cp_rank_memory.
#include "csattn/device_memory.hpp"

#include <string>

#include "core/geometry.hpp"
#include "core/rope_table.hpp"
#include "cp/layer_plan.hpp"
#include "csattn/cp.hpp"
#include "csattn/error.hpp"
#include "csattn/weights.hpp"
#include "cuda/cp_layer.hpp"
#include "cuda/device_weights.hpp"
#include "cuda/workspace.hpp"

namespace csattn {

DeviceMemoryPlan plan_device_memory(const AttentionConfig& cfg, int rows, int segments,
                                    int max_seqlen, bool deterministic) {
  cfg.validate();
  require(rows >= 0 && segments >= 1 && max_seqlen >= 0 &&
              static_cast<long long>(segments) * max_seqlen >= rows,
          ErrorKind::InvalidArgument,
          "plan_device_memory: rows = " + std::to_string(rows) + ", segments = " +
              std::to_string(segments) + ", max_seqlen = " + std::to_string(max_seqlen) +
              " (need rows >= 0, segments >= 1, rows <= segments * max_seqlen)");
  DeviceMemoryPlan m;
  m.weights = cuda::weight_store_layout(layer_params(cfg), rope_frequencies(cfg).size()).bytes;
  const cuda::WorkspacePlan f = cuda::plan_forward(cfg, rows, segments, max_seqlen);
  const cuda::BackwardPlan b = cuda::plan_backward(cfg, f.dims, deterministic);
  m.forward_workspace = f.bytes;
  m.backward_workspace = b.bytes;
  m.weight_gradients = b.grads_bytes;
  return m;
}

std::vector<DeviceMemoryPlan> plan_cp_device_memory(const AttentionConfig& cfg,
                                                    const CpPartition& part, bool deterministic) {
  cfg.validate();
  const BatchGeometry geo = BatchGeometry::build(part.layout(), cfg.compress_ratio);
  const std::size_t weights =
      cuda::weight_store_layout(layer_params(cfg), rope_frequencies(cfg).size()).bytes;
  std::vector<DeviceMemoryPlan> out;
  for (int rank = 0; rank < part.ranks(); ++rank) {
    const cp::LayerPlan plan = cp::build_layer_plan(geo, part, rank, cfg.window);
    // The device entry points (forward_device / backward_device: what frameworks call); the
    // host-tensor ones stage the rank's rows too (10 x d_model + 4 x index_topk bytes a row).
    const cuda::CpRankMemory r = cuda::plan_cp_rank_memory(cfg, geo, plan, deterministic, false);
    DeviceMemoryPlan m;
    m.weights = weights;
    m.forward_workspace = r.forward_workspace;
    m.backward_workspace = r.backward_workspace;
    m.weight_gradients = r.weight_gradients;
    m.context_parallel = r.cp_buffers;
    out.push_back(m);
  }
  return out;
}

}  // namespace csattn
