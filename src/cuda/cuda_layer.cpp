#include "cuda/cuda_layer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/geometry.hpp"
#include "core/rope_table.hpp"
#include "cuda/check.hpp"
#include "cuda/device_arena.hpp"
#include "cuda/host_bf16.hpp"
#include "cuda/device_weights.hpp"
#include "cuda/backward.hpp"
#include "cuda/backward_kernels.hpp"
#include "cuda/forward.hpp"
#include "cuda/workspace.hpp"

namespace csattn::cuda {

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    if (why)
      *why = err != cudaSuccess ? std::string("no usable CUDA device (") + cudaGetErrorString(err) + ")"
                                : std::string("no CUDA device");
    cudaGetLastError();  // clear the sticky error of a failed query
    return false;
  }
  return true;
}

struct CudaLayerImpl {
  AttentionConfig cfg;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::unique_ptr<DeviceWeightStore> weights;
  DeviceWeights w;
  DeviceArena workspace;
  bool poison = false;
  bool deterministic = false;
  ForwardParams last;  // the last run's parameters (for profile and backward)
  bool has_last = false;
  std::uint64_t generation = 0;
  DeviceArena grad_workspace;  // backward buffers + weight gradients
  BackwardPlan grad_plan;
  BackwardParams last_backward;
  bool has_backward = false;

  ~CudaLayerImpl() {
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }

  // The indexer loss's value is part of every forward with lambda > 0: the layer reports it,
  // and its launch keeps what the loss's backward reuses (launch_indexer_loss's `kept`).
  bool forward_has_loss() const { return cfg.has_indexer() && cfg.loss_coeff > 0.0; }
  void forward_loss(const ForwardParams& p, cudaStream_t on) const {
    BackwardParams bp;  // the loss reads only its mode (its buffers and scale are the forward's)
    bp.sparse_loss = cfg.sparse_loss;
    bp.deterministic = deterministic;
    run_indexer_loss(p, bp, on);
  }
};

namespace {


// The launch parameters of a forward whose buffers lie in `workspace` (planned by `plan`).
ForwardParams params_on(const WorkspacePlan& plan, void* workspace, const DeviceWeights& w) {
  ForwardParams p;
  p.dims = plan.dims;
  p.w = w;
  p.meta = plan.metadata(workspace);
  p.act = plan.activations(workspace);
  p.blas_workspace = static_cast<unsigned char*>(workspace) + plan.blas;
  p.blas_workspace_bytes = WorkspacePlan::kBlasWorkspaceBytes;
  return p;
}

// NaN in every float buffer, top-k ids a huge positive id (tests: unwritten values show).
void poison_forward(const AttentionConfig& c, const WorkspacePlan& plan, void* workspace, int T,
                    cudaStream_t stream) {
  auto* base = static_cast<unsigned char*>(workspace);
  CSATTN_CUDA_CHECK(cudaMemsetAsync(workspace, 0xFF, plan.bytes, stream));
  if (c.has_indexer())
    CSATTN_CUDA_CHECK(cudaMemsetAsync(base + plan.topk, 0x7F,
                                      static_cast<std::size_t>(T) * c.index_topk * 4, stream));
}



}  // namespace

CudaLayer::CudaLayer(const AttentionConfig& cfg, const LayerWeights& weights)
    : impl_(std::make_unique<CudaLayerImpl>()) {
  std::string why;
  const bool ok = device_available(&why);  // before the message is built from `why`
  require(ok, ErrorKind::Unsupported, "device cuda: " + why);
  CudaLayerImpl& s = *impl_;
  s.cfg = cfg;
  CSATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  CSATTN_CUBLAS_CHECK(cublasCreate(&s.blas));

  s.weights = std::make_unique<DeviceWeightStore>(cfg, weights);
  s.w = s.weights->weights();
}

CudaLayer::~CudaLayer() = default;

void CudaLayer::set_poison(bool on) { impl_->poison = on; }
void CudaLayer::set_deterministic(bool on) { impl_->deterministic = on; }

LayerOutputs CudaLayer::forward(const Tensor& x, const SeqLayout& layout,
                                const Tensor& forced_topk) {
  CudaLayerImpl& s = *impl_;
  const AttentionConfig& c = s.cfg;
  const int T = static_cast<int>(x.dim(0));
  // From here on the previous forward's activations may be overwritten: invalidate them
  // first, so a forward that throws half-way can never be followed by a backward (or a
  // profile) on clobbered or freed buffers.
  ++s.generation;
  s.has_last = false;
  s.has_backward = false;
  const WorkspacePlan plan = plan_forward(c, T, layout.num_segments(), layout.max_seg_len());
  unsigned char* base = s.workspace.reserve(plan.bytes);  // grown outside the run
  if (s.poison) poison_forward(c, plan, base, T, s.stream);
  ForwardParams p = params_on(plan, base, s.w);
  const std::vector<std::int32_t>& cu = layout.cu_seqlens();
  const std::vector<std::int32_t>& cup = layout.cu_seqlens_padded();
  const std::vector<std::uint16_t> xb = to_bf16_bits(x.to_f32().data(), static_cast<std::size_t>(x.numel()));
  CSATTN_CUDA_CHECK(cudaMemcpyAsync(base + plan.cu_real, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice, s.stream));
  CSATTN_CUDA_CHECK(cudaMemcpyAsync(base + plan.cu_padded, cup.data(), cup.size() * 4, cudaMemcpyHostToDevice, s.stream));
  CSATTN_CUDA_CHECK(cudaMemcpyAsync(p.act.x, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice, s.stream));
  if (c.has_indexer() && !forced_topk.empty()) {
    // Valid ids first in ascending order, then -1: the layout every consumer expects.
    std::vector<std::int32_t> sel(forced_topk.ptr<std::int32_t>(),
                                  forced_topk.ptr<std::int32_t>() + forced_topk.numel());
    const int K = c.index_topk;
    for (int t = 0; t < T; ++t) {
      auto row = sel.begin() + static_cast<long>(t) * K;
      std::sort(row, row + K, [](int a, int b) { return (a < 0) != (b < 0) ? a >= 0 : a < b; });
    }
    CSATTN_CUDA_CHECK(cudaMemcpyAsync(p.act.topk, sel.data(), sel.size() * 4, cudaMemcpyHostToDevice, s.stream));
    p.forced_topk = true;
  }
  run_forward(p, s.blas, s.stream);
  s.last = p;
  s.has_last = true;
  const bool with_loss = s.forward_has_loss();
  if (with_loss) s.forward_loss(p, s.stream);
  float loss_value = 0.0f;

  LayerOutputs out;
  std::vector<std::uint16_t> yb(static_cast<std::size_t>(T) * c.d_model);
  CSATTN_CUDA_CHECK(cudaMemcpyAsync(yb.data(), p.act.y, yb.size() * 2, cudaMemcpyDeviceToHost, s.stream));
  if (c.has_indexer()) {
    out.topk_indices = Tensor(DType::i32, {T, c.index_topk});
    CSATTN_CUDA_CHECK(cudaMemcpyAsync(out.topk_indices.data(), p.act.topk,
                                      out.topk_indices.nbytes(), cudaMemcpyDeviceToHost, s.stream));
  }
  if (with_loss)
    CSATTN_CUDA_CHECK(cudaMemcpyAsync(&loss_value, p.act.loss, sizeof(float), cudaMemcpyDeviceToHost, s.stream));
  CSATTN_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  out.output = tensor_from_bf16_bits(yb, T, c.d_model);
  out.indexer_loss = loss_value;
  return out;
}

std::uint64_t CudaLayer::generation() const { return impl_->generation; }

std::size_t CudaLayer::device_bytes() const {
  return impl_->weights->bytes() + impl_->workspace.capacity + impl_->grad_workspace.capacity;
}

LayerGradients CudaLayer::backward(const Tensor& grad_output, float grad_indexer_loss) {
  CudaLayerImpl& s = *impl_;
  require(s.has_last, ErrorKind::InvalidArgument, "backward needs a forward first");
  const AttentionConfig& c = s.cfg;
  const ForwardParams& f = s.last;
  const int T = f.dims.rows;
  check_backward_supported(c, f, s.deterministic, grad_indexer_loss);
  // The backward's buffers are sized here, outside the run (grow-only), so a forward-only
  // caller never holds them.
  s.grad_plan = plan_backward(c, f.dims, s.deterministic);
  if (s.grad_plan.bytes > s.grad_workspace.capacity) s.has_backward = false;  // its buffers go
  unsigned char* gbase = s.grad_workspace.reserve(s.grad_plan.bytes);
  BackwardParams bp;
  bp.buf = s.grad_plan.buffers(gbase);
  bp.grad = s.grad_plan.gradients(gbase);
  bp.grad_loss = grad_indexer_loss;
  bp.sparse_loss = c.sparse_loss;
  bp.deterministic = s.deterministic;
  const std::vector<std::uint16_t> dy =
      to_bf16_bits(grad_output.to_f32().data(), static_cast<std::size_t>(grad_output.numel()));
  if (s.poison)  // every activation-gradient buffer NaN: a value no kernel wrote shows up
    CSATTN_CUDA_CHECK(cudaMemsetAsync(gbase, 0xFF, s.grad_plan.grads_offset, s.stream));
  CSATTN_CUDA_CHECK(cudaMemcpyAsync(bp.buf.dy, dy.data(), dy.size() * 2, cudaMemcpyHostToDevice, s.stream));
  CSATTN_CUDA_CHECK(cudaMemsetAsync(gbase + s.grad_plan.grads_offset, 0, s.grad_plan.grads_bytes, s.stream));
  run_backward(f, bp, s.blas, s.stream);
  s.last_backward = bp;
  s.has_backward = true;

  LayerGradients out;
  out.grad_input = Tensor(DType::f32, {T, c.d_model});
  CSATTN_CUDA_CHECK(cudaMemcpyAsync(out.grad_input.data(), bp.buf.dx, out.grad_input.nbytes(),
                                    cudaMemcpyDeviceToHost, s.stream));
  out.grad = gradients_to_host(c, s.grad_plan, gbase, s.stream);
  return out;
}

namespace {

// Runs `run(timer)` `iters` times after `warmup` untimed runs (timer null) and takes the
// median of the total and of each stage.
template <class Run>
StageProfile profile_stages(Run&& run, cudaStream_t stream, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) run(nullptr);
  std::vector<double> totals;
  std::vector<std::vector<double>> per_stage;
  std::vector<std::string> names;
  for (int i = 0; i < iters; ++i) {
    StageTimer timer;
    run(&timer);
    CSATTN_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (names.empty()) {
      for (const char* n : timer.names) names.emplace_back(n);
      per_stage.resize(names.size());
    }
    for (std::size_t k = 0; k + 1 < timer.events.size(); ++k) {
      float ms = 0.0f;
      CSATTN_CUDA_CHECK(cudaEventElapsedTime(&ms, timer.events[k], timer.events[k + 1]));
      per_stage[k].push_back(ms);
    }
    float total = 0.0f;
    CSATTN_CUDA_CHECK(cudaEventElapsedTime(&total, timer.events.front(), timer.events.back()));
    totals.push_back(total);
    for (cudaEvent_t e : timer.events) cudaEventDestroy(e);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  StageProfile prof;
  prof.total_ms = median(totals);
  for (std::size_t k = 0; k < names.size(); ++k) prof.stages.push_back({names[k], median(per_stage[k])});
  return prof;
}

}  // namespace

StageProfile CudaLayer::profile(int warmup, int iters) {
  CudaLayerImpl& s = *impl_;
  require(s.has_last, ErrorKind::InvalidArgument, "profile() needs a forward() first");
  StageProfile prof = profile_stages(
      [&](StageTimer* timer) {
        run_forward(s.last, s.blas, s.stream, timer);
        if (s.forward_has_loss()) {  // part of the forward (forward() runs it)
          s.forward_loss(s.last, s.stream);
          Stages{timer, s.stream}.mark("indexer loss");
        }
      },
      s.stream, warmup, iters);
  prof.workspace_bytes = s.workspace.capacity;
  return prof;
}

std::vector<Tensor> CudaLayer::replay_forward_graph(const std::vector<SeqLayout>& layouts) {
  CudaLayerImpl& s = *impl_;
  require(s.has_last, ErrorKind::InvalidArgument, "replay_forward_graph() needs a forward() first");
  const ForwardParams p = s.last;
  const LayerDims& d = p.dims;
  require(!p.forced_topk, ErrorKind::InvalidArgument,
          "replay_forward_graph: the last forward used a caller-given top-k, which a replay "
          "with other boundaries could not reuse");
  for (const SeqLayout& l : layouts)
    require(l.total_rows() == d.rows && l.num_segments() == d.segments && l.max_seg_len() <= d.max_seg_len,
            ErrorKind::InvalidArgument,
            "replay_forward_graph: a layout with " + std::to_string(l.total_rows()) + " rows, " +
                std::to_string(l.num_segments()) + " segments and longest segment " +
                std::to_string(l.max_seg_len()) + " does not fit the captured forward (" +
                std::to_string(d.rows) + " rows, " + std::to_string(d.segments) + " segments, longest " +
                std::to_string(d.max_seg_len) + ")");
  CSATTN_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  cudaGraph_t graph = nullptr;
  CSATTN_CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeGlobal));
  try {
    run_forward(p, s.blas, s.stream);
  } catch (...) {
    cudaStreamEndCapture(s.stream, &graph);  // leave the stream usable
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  CSATTN_CUDA_CHECK(cudaStreamEndCapture(s.stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CSATTN_CUDA_CHECK(inst);
  std::vector<Tensor> outs;
  try {
    std::vector<std::uint16_t> yb(static_cast<std::size_t>(d.rows) * d.d_model);
    for (const SeqLayout& l : layouts) {
      // The per-call metadata: only the cu_seqlens arrays; the graph's first kernels derive
      // everything else from them on every replay.
      const std::vector<std::int32_t>& cu = l.cu_seqlens();
      const std::vector<std::int32_t>& cup = l.cu_seqlens_padded();
      CSATTN_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::int32_t*>(p.meta.cu_real), cu.data(), cu.size() * 4,
                                        cudaMemcpyHostToDevice, s.stream));
      CSATTN_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::int32_t*>(p.meta.cu_padded), cup.data(), cup.size() * 4,
                                        cudaMemcpyHostToDevice, s.stream));
      CSATTN_CUDA_CHECK(cudaGraphLaunch(exec, s.stream));
      CSATTN_CUDA_CHECK(cudaMemcpyAsync(yb.data(), p.act.y, yb.size() * 2, cudaMemcpyDeviceToHost, s.stream));
      CSATTN_CUDA_CHECK(cudaStreamSynchronize(s.stream));
      Tensor y(DType::f32, {d.rows, d.d_model});
      float* yp = y.ptr<float>();
      for (std::size_t i = 0; i < yb.size(); ++i) yp[i] = bf16_bits_to_float(yb[i]);
      outs.push_back(std::move(y));
    }
  } catch (...) {
    cudaGraphExecDestroy(exec);
    throw;
  }
  cudaGraphExecDestroy(exec);
  // The workspace now holds the last replayed layout's activations, not the last forward's.
  ++s.generation;
  s.has_last = false;
  s.has_backward = false;
  return outs;
}

StageProfile CudaLayer::profile_backward(int warmup, int iters) {
  CudaLayerImpl& s = *impl_;
  require(s.has_backward, ErrorKind::InvalidArgument, "profile_backward() needs a backward() first");
  StageProfile prof = profile_stages(
      [&](StageTimer* timer) { run_backward(s.last, s.last_backward, s.blas, s.stream, timer); },
      s.stream, warmup, iters);
  prof.workspace_bytes = s.workspace.capacity;
  return prof;
}

// ---- device-memory entry points (csattn::DeviceLayer) ----

namespace {

// The backward reads x from the forward workspace (the forward copied it there), so only the
// forward needs batch.x.
void check_batch(const AttentionConfig& c, const DeviceBatch& b, bool needs_x) {
  require(b.rows >= 0 && b.segments >= 1 && b.max_seqlen >= 0, ErrorKind::InvalidArgument,
          "DeviceBatch: rows = " + std::to_string(b.rows) + ", segments = " + std::to_string(b.segments) +
              ", max_seqlen = " + std::to_string(b.max_seqlen) + " (need rows >= 0, segments >= 1)");
  require(b.cu_seqlens && b.cu_seqlens_padded, ErrorKind::InvalidArgument,
          "DeviceBatch: cu_seqlens and cu_seqlens_padded are required (device arrays)");
  require(!needs_x || b.rows == 0 || b.x, ErrorKind::InvalidArgument, "DeviceBatch: x is null");
  require(b.real_rows >= 0 && b.real_rows <= b.rows, ErrorKind::InvalidArgument,
          "DeviceBatch: real_rows = " + std::to_string(b.real_rows) + " outside [0, rows = " +
              std::to_string(b.rows) + "]");
  require(!b.forced_topk || c.has_indexer(), ErrorKind::InvalidArgument,
          "DeviceBatch: forced_topk is only for CSA layers");
}

void check_workspace(const void* ws, std::size_t have, std::size_t need, const char* what) {
  require(ws != nullptr && have >= need, ErrorKind::InvalidArgument,
          std::string(what) + ": " + std::to_string(have) + " bytes given, " + std::to_string(need) +
              " needed");
  require(reinterpret_cast<std::uintptr_t>(ws) % 256 == 0, ErrorKind::InvalidArgument,
          std::string(what) + " must be 256-byte aligned");
}

}  // namespace

std::size_t CudaLayer::device_forward_bytes(int rows, int segments, int max_seqlen) const {
  return plan_forward(impl_->cfg, rows, segments, max_seqlen).bytes;
}

std::size_t CudaLayer::device_backward_bytes(int rows, int segments, int max_seqlen) const {
  const WorkspacePlan plan = plan_forward(impl_->cfg, rows, segments, max_seqlen);
  return plan_backward(impl_->cfg, plan.dims, impl_->deterministic).bytes;
}

std::map<std::string, std::size_t> CudaLayer::device_gradient_offsets(int rows, int segments,
                                                                     int max_seqlen) const {
  const WorkspacePlan plan = plan_forward(impl_->cfg, rows, segments, max_seqlen);
  const BackwardPlan gp = plan_backward(impl_->cfg, plan.dims, impl_->deterministic);
  // In layer_params order, each 256-byte aligned (plan_backward), as backward() reads them.
  std::map<std::string, std::size_t> out;
  std::size_t at = gp.grads_offset;
  for (const ParamInfo& p : layer_params(impl_->cfg)) {
    out[p.name] = at;
    at += (static_cast<std::size_t>(shape_numel(p.shape)) * sizeof(float) + 255) / 256 * 256;
  }
  return out;
}

void CudaLayer::forward_device(const DeviceBatch& b, void* workspace, std::size_t bytes,
                               const DeviceForwardOutputs& out, void* stream_ptr) const {
  const CudaLayerImpl& s = *impl_;
  const AttentionConfig& c = s.cfg;
  check_batch(c, b, true);
  require(b.rows == 0 || out.y, ErrorKind::InvalidArgument, "DeviceForwardOutputs: y is null");
  const WorkspacePlan plan = plan_forward(c, b.rows, b.segments, b.max_seqlen);
  check_workspace(workspace, bytes, plan.bytes, "the forward workspace");
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  auto* base = static_cast<unsigned char*>(workspace);
  if (s.poison) poison_forward(c, plan, workspace, b.rows, stream);
  ForwardParams p = params_on(plan, workspace, s.w);
  const std::size_t cu_bytes = static_cast<std::size_t>(b.segments + 1) * 4;
  CSATTN_CUDA_CHECK(cudaMemcpyAsync(base + plan.cu_real, b.cu_seqlens, cu_bytes, cudaMemcpyDeviceToDevice, stream));
  CSATTN_CUDA_CHECK(cudaMemcpyAsync(base + plan.cu_padded, b.cu_seqlens_padded, cu_bytes, cudaMemcpyDeviceToDevice, stream));
  const std::size_t x_bytes = static_cast<std::size_t>(b.rows) * c.d_model * 2;
  if (x_bytes) CSATTN_CUDA_CHECK(cudaMemcpyAsync(p.act.x, b.x, x_bytes, cudaMemcpyDeviceToDevice, stream));
  const std::size_t topk_bytes = c.has_indexer() ? static_cast<std::size_t>(b.rows) * c.index_topk * 4 : 0;
  if (b.forced_topk) {
    if (topk_bytes)
      CSATTN_CUDA_CHECK(cudaMemcpyAsync(p.act.topk, b.forced_topk, topk_bytes, cudaMemcpyDeviceToDevice, stream));
    p.forced_topk = true;
  }
  run_forward(p, s.blas, stream);
  const bool with_loss = s.forward_has_loss();
  if (with_loss) s.forward_loss(p, stream);
  if (x_bytes) CSATTN_CUDA_CHECK(cudaMemcpyAsync(out.y, p.act.y, x_bytes, cudaMemcpyDeviceToDevice, stream));
  if (out.topk && topk_bytes)
    CSATTN_CUDA_CHECK(cudaMemcpyAsync(out.topk, p.act.topk, topk_bytes, cudaMemcpyDeviceToDevice, stream));
  if (out.indexer_loss) {
    if (with_loss)
      CSATTN_CUDA_CHECK(cudaMemcpyAsync(out.indexer_loss, p.act.loss, sizeof(float), cudaMemcpyDeviceToDevice, stream));
    else
      CSATTN_CUDA_CHECK(cudaMemsetAsync(out.indexer_loss, 0, sizeof(float), stream));
  }
}

void CudaLayer::backward_device(const DeviceBatch& b, void* forward_workspace, void* backward_workspace,
                                std::size_t bytes, const void* dy, float grad_indexer_loss, float* dx,
                                void* stream_ptr, const float* grad_indexer_loss_on_device) const {
  const CudaLayerImpl& s = *impl_;
  const AttentionConfig& c = s.cfg;
  check_batch(c, b, false);
  require(b.rows == 0 || (dy && dx), ErrorKind::InvalidArgument, "backward: dy and dx are required");
  const WorkspacePlan plan = plan_forward(c, b.rows, b.segments, b.max_seqlen);
  require(forward_workspace != nullptr, ErrorKind::InvalidArgument,
          "backward: the forward workspace (of this batch's forward) is required");
  ForwardParams f = params_on(plan, forward_workspace, s.w);
  f.forced_topk = b.forced_topk != nullptr;
  // A gradient on the device may be anything: checked as if nonzero.
  check_backward_supported(c, f, s.deterministic,
                           grad_indexer_loss_on_device != nullptr ? 1.0f : grad_indexer_loss);
  const BackwardPlan gp = plan_backward(c, f.dims, s.deterministic);
  check_workspace(backward_workspace, bytes, gp.bytes, "the backward workspace");
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  auto* gbase = static_cast<unsigned char*>(backward_workspace);
  BackwardParams bp;
  bp.buf = gp.buffers(backward_workspace);
  bp.grad = gp.gradients(backward_workspace);
  bp.grad_loss = grad_indexer_loss;
  bp.grad_loss_on_device = grad_indexer_loss_on_device;
  bp.sparse_loss = c.sparse_loss;
  bp.deterministic = s.deterministic;
  if (s.poison) CSATTN_CUDA_CHECK(cudaMemsetAsync(gbase, 0xFF, gp.grads_offset, stream));
  const std::size_t rows_bytes = static_cast<std::size_t>(b.rows) * c.d_model;
  if (rows_bytes) CSATTN_CUDA_CHECK(cudaMemcpyAsync(bp.buf.dy, dy, rows_bytes * 2, cudaMemcpyDeviceToDevice, stream));
  CSATTN_CUDA_CHECK(cudaMemsetAsync(gbase + gp.grads_offset, 0, gp.grads_bytes, stream));
  run_backward(f, bp, s.blas, stream);
  if (rows_bytes) CSATTN_CUDA_CHECK(cudaMemcpyAsync(dx, bp.buf.dx, rows_bytes * 4, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace csattn::cuda
