// csattn.DeviceLayer (part of csattn._csattn): the C++ DeviceLayer (device_layer.hpp) on
// CUDA arrays passed through DLPack (torch CUDA tensors, CuPy arrays): bf16 x / y / dy,
// int32 cu_seqlens and top-k, fp32 dx and loss, uint8 workspaces, and the stream as an
// integer (torch.cuda.current_stream().cuda_stream). Nothing is copied to the host.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bind_util.hpp"
#include "csattn/cp.hpp"
#include "csattn/device_layer.hpp"
#include "csattn/device_memory.hpp"
#include "csattn/error.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace csattn {
namespace {

using CudaArray = nb::ndarray<nb::device::cuda, nb::c_contig>;

constexpr nb::dlpack::dtype kBf16{static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};

// The array's data after checking its dtype and, where given, its element count.
void* checked(const CudaArray& a, nb::dlpack::dtype dt, const char* dt_name, const char* what,
              std::int64_t numel = -1) {
  require(a.dtype() == dt, ErrorKind::DTypeMismatch, std::string(what) + " must be " + dt_name);
  require(numel < 0 || static_cast<std::int64_t>(a.size()) == numel, ErrorKind::ShapeMismatch,
          std::string(what) + " has " + std::to_string(a.size()) + " elements, expected " + std::to_string(numel));
  return a.data();
}

DeviceBatch batch_of(const AttentionConfig& c, const CudaArray* x, int rows, const CudaArray& cu,
                     const CudaArray& cu_padded, int max_seqlen, std::int64_t real_rows,
                     const std::optional<CudaArray>& forced) {
  DeviceBatch b;
  b.rows = rows;
  b.segments = static_cast<int>(cu.size()) - 1;
  require(b.segments >= 1 && cu_padded.size() == cu.size(), ErrorKind::ShapeMismatch,
          "cu_seqlens and cu_seqlens_padded need the same length B+1 >= 2");
  b.cu_seqlens = static_cast<const std::int32_t*>(checked(cu, nb::dtype<std::int32_t>(), "int32", "cu_seqlens"));
  b.cu_seqlens_padded =
      static_cast<const std::int32_t*>(checked(cu_padded, nb::dtype<std::int32_t>(), "int32", "cu_seqlens_padded"));
  b.max_seqlen = max_seqlen;
  b.real_rows = real_rows;
  if (x) b.x = checked(*x, kBf16, "bfloat16", "x", static_cast<std::int64_t>(rows) * c.d_model);
  if (forced)
    b.forced_topk = static_cast<const std::int32_t*>(checked(*forced, nb::dtype<std::int32_t>(), "int32", "forced_topk",
                                                             static_cast<std::int64_t>(rows) * c.index_topk));
  return b;
}

int rows_of(const CudaArray& x, const AttentionConfig& c) {
  require(x.ndim() == 2 && static_cast<int>(x.shape(1)) == c.d_model, ErrorKind::ShapeMismatch,
          "x must be [T, " + std::to_string(c.d_model) + "]");
  return static_cast<int>(x.shape(0));
}

// A memory plan as the dict the Python functions return (bytes).
std::map<std::string, std::size_t> memory_dict(const DeviceMemoryPlan& p) {
  std::map<std::string, std::size_t> out;
  for (const auto& [name, bytes] : p.fields()) out[name] = bytes;
  return out;
}

}  // namespace

void bind_device(nb::module_& m) {
  nb::class_<DeviceLayer>(m, "DeviceLayer",
                          "The GPU layer on device arrays (DLPack), caller workspaces and stream.")
      .def(nb::init<AttentionConfig, const LayerWeights&, bool>(), "config"_a, "weights"_a,
           "deterministic"_a = false)
      .def("forward_workspace_bytes", &DeviceLayer::forward_workspace_bytes, "rows"_a, "segments"_a,
           "max_seqlen"_a)
      .def("backward_workspace_bytes", &DeviceLayer::backward_workspace_bytes, "rows"_a, "segments"_a,
           "max_seqlen"_a)
      .def("weight_gradient_offsets", &DeviceLayer::weight_gradient_offsets, "rows"_a, "segments"_a,
           "max_seqlen"_a, "Byte offsets of the fp32 weight gradients in the backward workspace.")
      .def(
          "forward",
          [](const DeviceLayer& l, const CudaArray& x, const CudaArray& cu, const CudaArray& cu_padded,
             int max_seqlen, std::int64_t real_rows, const CudaArray& workspace, const CudaArray& y,
             const std::optional<CudaArray>& topk, const std::optional<CudaArray>& loss,
             const std::optional<CudaArray>& forced_topk, std::uintptr_t stream) {
            const AttentionConfig& c = l.config();
            const int rows = rows_of(x, c);
            const DeviceBatch b = batch_of(c, &x, rows, cu, cu_padded, max_seqlen, real_rows, forced_topk);
            DeviceForwardOutputs out;
            out.y = checked(y, kBf16, "bfloat16", "y", static_cast<std::int64_t>(rows) * c.d_model);
            if (topk)
              out.topk = static_cast<std::int32_t*>(checked(*topk, nb::dtype<std::int32_t>(), "int32", "topk",
                                                            static_cast<std::int64_t>(rows) * c.index_topk));
            if (loss) out.indexer_loss = static_cast<float*>(checked(*loss, nb::dtype<float>(), "float32", "loss", 1));
            void* ws = checked(workspace, nb::dtype<std::uint8_t>(), "uint8", "workspace");
            nb::gil_scoped_release unlocked;
            l.forward(b, ws, workspace.size(), out, reinterpret_cast<void*>(stream));
          },
          "x"_a, "cu_seqlens"_a, "cu_seqlens_padded"_a, "max_seqlen"_a, "real_rows"_a, "workspace"_a, "y"_a,
          "topk"_a = nb::none(), "loss"_a = nb::none(), "forced_topk"_a = nb::none(), "stream"_a = 0,
          "Enqueues the forward on `stream`; y, topk and loss are written there.")
      .def(
          "backward",
          [](const DeviceLayer& l, const CudaArray& dy, const CudaArray& cu, const CudaArray& cu_padded,
             int max_seqlen, std::int64_t real_rows, const CudaArray& forward_workspace,
             const CudaArray& backward_workspace, const CudaArray& dx, float grad_indexer_loss,
             const std::optional<CudaArray>& forced_topk, std::uintptr_t stream,
             const std::optional<CudaArray>& grad_indexer_loss_device) {
            const AttentionConfig& c = l.config();
            const int rows = rows_of(dy, c);
            const DeviceBatch b = batch_of(c, nullptr, rows, cu, cu_padded, max_seqlen, real_rows, forced_topk);
            const void* g = checked(dy, kBf16, "bfloat16", "dy", static_cast<std::int64_t>(rows) * c.d_model);
            auto* gx = static_cast<float*>(checked(dx, nb::dtype<float>(), "float32", "dx",
                                                   static_cast<std::int64_t>(rows) * c.d_model));
            void* fws = checked(forward_workspace, nb::dtype<std::uint8_t>(), "uint8", "forward_workspace");
            void* bws = checked(backward_workspace, nb::dtype<std::uint8_t>(), "uint8", "backward_workspace");
            const float* gl_dev =
                grad_indexer_loss_device
                    ? static_cast<const float*>(checked(*grad_indexer_loss_device, nb::dtype<float>(), "float32",
                                                        "grad_indexer_loss_device", 1))
                    : nullptr;
            nb::gil_scoped_release unlocked;
            l.backward(b, fws, bws, backward_workspace.size(), g, grad_indexer_loss, gx, reinterpret_cast<void*>(stream),
                       gl_dev);
          },
          "dy"_a, "cu_seqlens"_a, "cu_seqlens_padded"_a, "max_seqlen"_a, "real_rows"_a, "forward_workspace"_a,
          "backward_workspace"_a, "dx"_a, "grad_indexer_loss"_a = 1.0f, "forced_topk"_a = nb::none(),
          "stream"_a = 0, "grad_indexer_loss_device"_a = nb::none(),
          "Enqueues the backward of the forward that used forward_workspace; dx (fp32) and the weight "
          "gradients (backward_workspace at weight_gradient_offsets) are written on `stream`. "
          "grad_indexer_loss_device: a CUDA float32 array of one element holding the loss's upstream "
          "gradient, read on the device instead of grad_indexer_loss.")
      .def_prop_ro("config", &DeviceLayer::config);

  m.def(
      "plan_device_memory",
      [](const AttentionConfig& c, int rows, int segments, int max_seqlen, bool deterministic) {
        return memory_dict(plan_device_memory(c, rows, segments, max_seqlen, deterministic));
      },
      "config"_a, "rows"_a, "segments"_a, "max_seqlen"_a, "deterministic"_a = false,
      "The GPU layer's device memory in bytes, planned on the host (no GPU needed): weights, the "
      "forward workspace (activations kept for the backward), the backward's (weight gradients "
      "included), forward_only and training_step totals. Raises csattn.Error without the CUDA "
      "backend.");
  m.def(
      "plan_cp_device_memory",
      [](const AttentionConfig& c, const CpPartition& part, bool deterministic) {
        std::vector<std::map<std::string, std::size_t>> out;
        for (const DeviceMemoryPlan& p : plan_cp_device_memory(c, part, deterministic))
          out.push_back(memory_dict(p));
        return out;
      },
      "config"_a, "partition"_a, "deterministic"_a = false,
      "plan_device_memory for the GPU context-parallel layer: one dict per rank of the "
      "partition, with its context_parallel buffers (NCCL's own not counted).");
}

}  // namespace csattn
