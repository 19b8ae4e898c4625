// The GPU side of ContextParallelLayer (include/csattn/cp.hpp, issue 7): one rank's layer on
// the current CUDA device, with its collectives on a Communicator that takes device buffers
// (NCCL, or the in-process group for ranks sharing one GPU). The host-side plan is the CPU
// layer's (src/cp/: partition, halo, compaction, map); this class turns it into metadata
// the single-GPU kernels read, so the kernels are the single-GPU layer's:
//
//  - a rank's ext rows (halo + own, ascending) are the batch, one segment per run of
//    consecutive positions of a sequence (cp/device_view.hpp), with global positions
//    (DeviceMetadata::seg_pos0); halo rows are flagged as padding, so they score no keys and
//    add no loss, and their dy is zero;
//  - the compressors pool only the owned groups, into the rank's all-gather slots
//    (DeviceMetadata::comp_entry_row0 / comp_entry_pos);
//  - after the rank-major all-gathers, every run gets its own copy of the compressed rows
//    its queries can see (its sequence's first E_r rows), so a run addresses them exactly as
//    a one-GPU segment addresses its own; backward sums the copies in a fixed order back to
//    rank-major rows before the reduce-scatter.
//
// No CUDA types here, so the core library can hold one.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/geometry.hpp"
#include "cp/layer_plan.hpp"
#include "csattn/comm.hpp"
#include "csattn/layer.hpp"

namespace csattn::cuda {

struct CudaCpLayerImpl;

// A rank's device allocations besides the weights, planned on the host from the global
// geometry and the rank's plan (what prepare_forward(..., host_io) / prepare_backward
// reserve): plan_cp_device_memory (csattn/device_memory.hpp) sums them per rank.
struct CpRankMemory {
  std::size_t forward_workspace = 0, cp_buffers = 0, backward_workspace = 0, weight_gradients = 0;
};
CpRankMemory plan_cp_rank_memory(const AttentionConfig& c, const BatchGeometry& geo,
                                 const cp::LayerPlan& plan, bool deterministic, bool host_io);

struct CudaCpForward {
  Tensor output;       // [local rows, d_model] f32 (bf16 values)
  Tensor topk;         // CSA: [local rows, K] i32
  float indexer_loss = 0.0f;
};

struct CudaCpGradients {
  Tensor grad_input;                   // [local rows, d_model] f32
  std::map<std::string, Tensor> grad;  // this rank's share
};

struct CudaCpProfile {
  // Medians. forward: without the indexer loss value (as the single-GPU layer's profile);
  // loss: that value's stage alone (0 without a loss); backward: 0 without a backward.
  double forward_ms = 0.0, loss_ms = 0.0, backward_ms = 0.0;
};

class CudaCpLayer {
 public:
  // On the current device (a rank thread or process selects its GPU before).
  CudaCpLayer(const AttentionConfig& cfg, const LayerWeights& weights);
  ~CudaCpLayer();
  CudaCpLayer(const CudaCpLayer&) = delete;
  CudaCpLayer& operator=(const CudaCpLayer&) = delete;

  // Makes the layer's device current for the calling thread.
  void make_current() const;
  void set_poison(bool on);
  void set_deterministic(bool on);

  // A forward or backward is a prepare call (no communication: the plan, buffers and
  // metadata, so an allocation failure happens before the ranks' collectives and can be
  // agreed on) and then the run (collective). geo: the global geometry (this layer's
  // ratio); plan: this rank's. The activations stay on the device for backward();
  // `generation` numbers forwards. host_io: the host-tensor entry points (forward / backward)
  // follow, which stage the rank's rows in device buffers; the device entry points read and
  // write the caller's arrays in place and need none (forward refuses a forward prepared
  // without them).
  void prepare_forward(const Communicator& comm, const BatchGeometry& geo, const cp::LayerPlan& plan,
                       bool host_io);
  CudaCpForward forward(Communicator& comm, const Tensor& x_local);
  std::uint64_t generation() const;
  // The gradients of the last forward.
  // grad_indexer_loss_on_device (device entry points): the loss's upstream gradient read on the
  // device instead of grad_indexer_loss (DeviceLayer::backward's rules).
  void prepare_backward(const Communicator& comm, float grad_indexer_loss,
                        const float* grad_indexer_loss_on_device = nullptr);
  CudaCpGradients backward(Communicator& comm, const Tensor& grad_output_local);

  // The runs on device memory and the caller's stream (ContextParallelLayer::forward_device):
  // x_local / dy_local bf16 [local rows, d_model], y bf16, topk i32 [local rows, K] (null:
  // not wanted), loss one float (null: not wanted), dx_local fp32. The weight gradients of
  // the last backward stay in the layer (device_gradients, fp32, by release name).
  void forward_device(Communicator& comm, const void* x_local, void* y, std::int32_t* topk,
                      float* loss, void* stream);
  void backward_device(Communicator& comm, const void* dy_local, float* dx_local, void* stream);
  std::map<std::string, const float*> device_gradients() const;
  // Collective (every rank calls it): re-runs the last forward's device work (collectives
  // included, host transfers not), its indexer loss stage on its own and, after a backward,
  // the last backward's, `iters` times after `warmup`; each run is host-timed from a barrier
  // to the stream's end. Medians. After the device entry points it reads and writes the
  // caller's arrays of the last calls again: they must still be valid.
  CudaCpProfile profile(Communicator& comm, int warmup, int iters);
  // Device memory held: weights, workspaces, the CP buffers.
  std::size_t device_bytes() const;

 private:
  std::unique_ptr<CudaCpLayerImpl> impl_;
};

}  // namespace csattn::cuda
