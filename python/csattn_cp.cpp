// Context parallelism for Python (part of csattn._csattn): the MPI communicator, the row
// partitions (contiguous, two_chunk) and ContextParallelLayer. Each process of `mpirun -np P
// python ...` is one rank; forward and backward are collective, as in C++ (cp.hpp). Local
// arrays are the rank's rows in local order (CpPartition.rows(rank) gives their global
// indices).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "csattn/comm.hpp"
#include "csattn/cp.hpp"
#include "csattn/error.hpp"
#include "csattn/layer.hpp"
#include "csattn/layout.hpp"
#include "csattn/tensor.hpp"
#include "csattn/weights.hpp"
#include "bind_util.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace csattn {
namespace {

using namespace py;

nb::dict work_dict(const CpWork& w) {
  nb::dict d;
  d["local_rows"] = w.local_rows;
  d["halo_rows"] = w.halo_rows;
  d["owned_compressed"] = w.owned_compressed;
  d["compressed_slots"] = w.compressed_slots;
  d["attention_pairs"] = w.attention_pairs;
  d["attention_flops"] = w.attention_flops;
  d["indexer_pairs"] = w.indexer_pairs;
  return d;
}

}  // namespace

void bind_cp(nb::module_& m) {
  nb::class_<Communicator>(m, "Communicator", "A group of ranks (MPI here; NCCL and threads in C++).")
      .def_prop_ro("rank", &Communicator::rank)
      .def_prop_ro("size", &Communicator::size)
      .def_prop_ro("backend", &Communicator::backend)
      .def("barrier", [](Communicator& c) {
        nb::gil_scoped_release unlocked;
        c.barrier();
      })
      .def(
          "all_reduce_sum",
          [](Communicator& c, const std::map<std::string, F32Array>& arrays) {
            std::map<std::string, Tensor> t;
            for (const auto& [k, a] : arrays) t[k] = f32_tensor(a);
            {
              nb::gil_scoped_release unlocked;
              all_reduce_sum(c, t);
            }
            nb::dict out;
            for (const auto& [k, v] : t) out[k.c_str()] = to_numpy(v);
            return out;
          },
          "arrays"_a, "Collective: every float32 array summed over the ranks (in name order).");
  m.def("mpi_available", &mpi_available, "This build has the MPI communicator.");
  m.def("nccl_available", &nccl_available, "This build has the NCCL communicator.");
  m.def(
      "nccl_communicator",
      [](Communicator& bootstrap, int device) {
        nb::gil_scoped_release unlocked;
        return nccl_communicator(bootstrap, device);
      },
      "bootstrap"_a, "device"_a, nb::keep_alive<0, 1>(),
      "Collective over `bootstrap` (e.g. mpi_world()): an NCCL communicator with this rank on GPU "
      "`device` (made current), for ContextParallelLayer(device='cuda'). NVLink multicast stays off.");
  m.def("launcher_local_rank", &launcher_local_rank,
        "This process's rank on its node as mpirun reports it (-1 if none): the GPU to take.");
  m.def("mpi_world", &mpi_world,
        "The communicator over MPI_COMM_WORLD (MPI is initialised on first use, finalised at exit).");

  nb::class_<CpPartition>(m, "CpPartition", "Which rows each rank owns (contiguous or two_chunk).")
      .def_static(
          "build",
          [](const std::vector<std::int32_t>& cu, const std::optional<std::vector<std::int32_t>>& padded,
             const std::string& mode, int ranks) { return CpPartition::build(make_layout(cu, padded), parse_cp_mode(mode), ranks); },
          "cu_seqlens"_a, "cu_seqlens_padded"_a.none(), "mode"_a, "ranks"_a)
      .def_prop_ro("mode", [](const CpPartition& p) { return std::string(cp_mode_name(p.mode())); })
      .def_prop_ro("ranks", &CpPartition::ranks)
      .def_prop_ro("total_rows", &CpPartition::total_rows)
      .def("local_rows", &CpPartition::local_rows, "rank"_a)
      .def("rows", &CpPartition::rows, "rank"_a, "The global rows of a rank, in its local order.");
  m.def(
      "pad_for_context_parallel",
      [](const std::vector<std::int32_t>& cu, const std::optional<std::vector<std::int32_t>>& padded,
         const std::string& mode, int ranks, int min_local_rows) {
        return pad_for_context_parallel(make_layout(cu, padded), parse_cp_mode(mode), ranks, min_local_rows)
            .cu_seqlens_padded();
      },
      "cu_seqlens"_a, "cu_seqlens_padded"_a.none(), "mode"_a, "ranks"_a, "min_local_rows"_a = 0,
      "The smallest padded cu_seqlens the mode accepts on `ranks` ranks (real lengths kept).");

  nb::class_<CpLayerOutputs>(m, "CpForward", "A rank's forward: its rows' outputs and the state of its backward.")
      .def_prop_ro("output", [](const CpLayerOutputs& o) { return to_numpy(o.output); })
      .def_prop_ro("topk", [](const CpLayerOutputs& o) -> nb::object {
        return o.topk_indices.empty() ? nb::none() : to_numpy(o.topk_indices);
      })
      .def_prop_ro("indexer_loss", [](const CpLayerOutputs& o) { return o.indexer_loss; },
                   "This rank's share: the sum over ranks is the single-rank loss.")
      .def_prop_ro("work", [](const CpLayerOutputs& o) { return work_dict(o.work); });

  nb::class_<ContextParallelLayer>(m, "ContextParallelLayer", "One attention layer over the ranks of a communicator.")
      .def(
          "__init__",
          [](ContextParallelLayer* self, const AttentionConfig& cfg, const LayerWeights& w, const std::string& precision,
             const std::string& device, int threads) {
            RunOptions o;
            o.precision = parse_precision(precision);
            o.device = parse_device(device);
            o.threads = threads;
            new (self) ContextParallelLayer(cfg, w, o);
          },
          "config"_a, "weights"_a, "precision"_a = "bf16", "device"_a = "cpu", "threads"_a = 0,
          "device 'cuda': this rank's layer on the current CUDA device (select it first, e.g. with "
          "nccl_communicator); the communicator must take device buffers (nccl_communicator).")
      .def(
          "forward",
          [](const ContextParallelLayer& l, Communicator& comm, const CpPartition& part, const F32Array& x_local) {
            const Tensor x = f32_tensor(x_local);
            nb::gil_scoped_release unlocked;
            return l.forward(comm, part, x);
          },
          "comm"_a, "partition"_a, "x_local"_a, "Collective.")
      .def(
          "backward",
          [](const ContextParallelLayer& l, Communicator& comm, const CpLayerOutputs& fwd, const F32Array& dy,
             float grad_indexer_loss) {
            const Tensor g = f32_tensor(dy);
            CpLayerGradients grads;
            {
              nb::gil_scoped_release unlocked;
              grads = l.backward(comm, fwd, g, grad_indexer_loss);
            }
            nb::dict out;
            out["input"] = to_numpy(grads.grad_input);
            for (const auto& [k, v] : grads.grad) out[k.c_str()] = to_numpy(v);
            return out;
          },
          "comm"_a, "forward"_a, "grad_output_local"_a, "grad_indexer_loss"_a = 1.0f,
          "Collective. 'input': the local rows' gradients; parameters: this rank's share (sum over ranks).")
      .def("halo_rows", &ContextParallelLayer::halo_rows);
}

}  // namespace csattn
