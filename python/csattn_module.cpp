// The compiled part of the Python package `csattn` (module `csattn._csattn`, nanobind): the
// layer, its configuration and weights, and the fp64 oracle (the operators of ops.hpp are
// bound in csattn_ops.cpp, context parallelism in csattn_cp.cpp). The pure-Python package
// (python/csattn/__init__.py) converts user arrays (NumPy, anything with __dlpack__ or
// __array__) to what these functions take: C-contiguous float32 / float64 / int32 arrays on
// the host, and lists of int for cu_seqlens. Results are NumPy arrays that own a copy.
// csattn::Error surfaces as csattn.Error (a ValueError) with the library's message; the
// compute runs without the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "csattn/build_info.hpp"
#include "csattn/checkpoint.hpp"
#include "csattn/config.hpp"
#include "csattn/error.hpp"
#include "csattn/host_memory.hpp"
#include "csattn/layer.hpp"
#include "csattn/layout.hpp"
#include "csattn/tensor.hpp"
#include "csattn/weights.hpp"
#include "bind_util.hpp"
#include "oracle.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace csattn {
namespace {

using namespace py;

// The result of Layer.forward: the outputs as arrays, and the state its backward needs.
struct Forward {
  LayerOutputs outputs;
  bool indexer = false;  // CSA: topk is an array (possibly with 0 rows)
  int topk = 0;
};

// The bound layer: calls on one Layer run one at a time (they release the GIL, and the GPU
// layer keeps its last forward's activations for the backward); use one Layer per thread
// for concurrency.
struct Layer {
  HybridAttentionLayer impl;
  std::unique_ptr<std::mutex> busy = std::make_unique<std::mutex>();
  Layer(const AttentionConfig& cfg, const LayerWeights& w, const RunOptions& o) : impl(cfg, w, o) {}
};

nb::dict gradients_to_dict(const LayerGradients& g) {
  nb::dict out;
  out["input"] = to_numpy(g.grad_input);
  for (const auto& [name, t] : g.grad) out[name.c_str()] = to_numpy(t);
  return out;
}

}  // namespace

void bind_ops(nb::module_& m);  // csattn_ops.cpp
void bind_cp(nb::module_& m);   // csattn_cp.cpp
void bind_device(nb::module_& m);  // csattn_device.cpp

}  // namespace csattn

NB_MODULE(_csattn, m) {
  using namespace csattn;
  m.doc() = "csattn: the DeepSeek-V4 hybrid attention layer (SWA / CSA / HCA), forward and backward";
  nb::exception<Error>(m, "Error", PyExc_ValueError);

  nb::class_<AttentionConfig>(m, "AttentionConfig",
                              "One layer's configuration (field names as in csattn/config.hpp).")
      .def(nb::init<>())
      .def_rw("d_model", &AttentionConfig::d_model)
      .def_rw("n_heads", &AttentionConfig::n_heads)
      .def_rw("head_dim", &AttentionConfig::head_dim)
      .def_rw("rope_dim", &AttentionConfig::rope_dim)
      .def_rw("q_lora_rank", &AttentionConfig::q_lora_rank)
      .def_rw("o_groups", &AttentionConfig::o_groups)
      .def_rw("o_lora_rank", &AttentionConfig::o_lora_rank)
      .def_rw("window", &AttentionConfig::window)
      .def_rw("compress_ratio", &AttentionConfig::compress_ratio)
      .def_rw("index_n_heads", &AttentionConfig::index_n_heads)
      .def_rw("index_head_dim", &AttentionConfig::index_head_dim)
      .def_rw("index_topk", &AttentionConfig::index_topk)
      .def_prop_rw(
          "indexer_precision",
          [](const AttentionConfig& c) { return std::string(indexer_precision_name(c.indexer_precision)); },
          [](AttentionConfig& c, const std::string& v) {
            c.indexer_precision = parse_indexer_precision(v, "indexer_precision");
          })
      .def_rw("rope_theta", &AttentionConfig::rope_theta)
      .def_rw("compress_rope_theta", &AttentionConfig::compress_rope_theta)
      .def_rw("yarn_factor", &AttentionConfig::yarn_factor)
      .def_rw("yarn_original_max_pos", &AttentionConfig::yarn_original_max_pos)
      .def_rw("yarn_beta_fast", &AttentionConfig::yarn_beta_fast)
      .def_rw("yarn_beta_slow", &AttentionConfig::yarn_beta_slow)
      .def_rw("norm_eps", &AttentionConfig::norm_eps)
      .def_rw("loss_coeff", &AttentionConfig::loss_coeff)
      .def_rw("sparse_loss", &AttentionConfig::sparse_loss)
      .def_rw("per_token_loss", &AttentionConfig::per_token_loss)
      .def_prop_ro("kind", [](const AttentionConfig& c) { return std::string(layer_kind_name(c.kind())); },
                   "'SWA', 'CSA' or 'HCA' (from compress_ratio 0, 4, 128)")
      .def("validate", &AttentionConfig::validate, "Raises csattn.Error naming the first inconsistent field.")
      .def("__repr__", [](const AttentionConfig& c) {
        return "AttentionConfig(" + std::string(layer_kind_name(c.kind())) + ", d_model=" + std::to_string(c.d_model) +
               ", n_heads=" + std::to_string(c.n_heads) + ", head_dim=" + std::to_string(c.head_dim) +
               ", window=" + std::to_string(c.window) + ", compress_ratio=" + std::to_string(c.compress_ratio) + ")";
      });

  m.def("preset_names", &ModelConfig::preset_names, "The built-in model presets: tiny, small, flash, pro.");
  m.def(
      "preset_layers",
      [](const std::string& name) {
        const ModelConfig mc = ModelConfig::preset(name);
        std::vector<AttentionConfig> out;
        for (std::size_t i = 0; i < mc.compress_ratios.size(); ++i) out.push_back(mc.layer(static_cast<int>(i)));
        return out;
      },
      "name"_a, "The layer configurations of a preset, one per layer.");
  m.def(
      "hf_config_layers",
      [](const std::string& path) {
        const ModelConfig mc = ModelConfig::from_hf_json_file(path, ModelConfig::preset("flash"));
        std::vector<AttentionConfig> out;
        for (std::size_t i = 0; i < mc.compress_ratios.size(); ++i) out.push_back(mc.layer(static_cast<int>(i)));
        return out;
      },
      "path"_a, "The layer configurations of a DeepSeek-V4 config.json (missing keys: the flash preset's).");
  m.def(
      "hf_config_layer_names",
      [](const std::string& path) {
        const ModelConfig mc = ModelConfig::from_hf_json_file(path, ModelConfig::preset("flash"));
        std::vector<std::string> out;
        for (std::size_t i = 0; i < mc.compress_ratios.size(); ++i)
          out.push_back(checkpoint_layer_of(mc, static_cast<int>(i)).prefix());
        return out;
      },
      "path"_a,
      "The checkpoint name of each layer of hf_config_layers(path): 'layers.N', or 'mtp.K' for the "
      "entries after num_hidden_layers (the MTP modules'); LayerWeights.load takes it as layer.");

  nb::class_<LayerWeights>(m, "LayerWeights", "One layer's parameters by release name (float32 in memory).")
      .def_static("random", &LayerWeights::random, "config"_a, "seed"_a,
                  "Random weights (rounded to the file dtypes, so save / load is exact).")
      .def_static("zeros", &LayerWeights::zeros, "config"_a)
      .def_static("load",
                  [](const std::string& path, const AttentionConfig& cfg, const nb::object& layer) {
                    // None, an integer N (numpy's too: anything with __index__, but not a
                    // bool) for layers.N, or a str "N" / "layers.N" / "mtp.K".
                    std::optional<CheckpointLayer> l;
                    long long n = 0;
                    if (nb::isinstance<nb::str>(layer)) {
                      l = CheckpointLayer::parse(nb::cast<std::string>(layer), "layer");
                    } else if (!layer.is_none() && !nb::isinstance<nb::bool_>(layer) &&
                               PyIndex_Check(layer.ptr()) && nb::try_cast<long long>(layer, n)) {
                      require(n >= 0 && n < (1 << 20), ErrorKind::InvalidArgument,
                              "layer = " + std::to_string(n) + ": expected 0 <= N < 2^20");
                      l = CheckpointLayer(static_cast<int>(n));
                    } else if (!layer.is_none()) {
                      throw Error(ErrorKind::InvalidArgument,
                                  "layer: expected None, an int N or a str ('layers.N', 'mtp.K'), got " +
                                      std::string(nb::type_name(layer.type()).c_str()));
                    }
                    return LayerWeights::load(path, cfg, l);
                  },
                  "path"_a, "config"_a, "layer"_a = nb::none(),
                  "One layer from a safetensors file ('attn.*' names, or 'layers.N.attn.*' with layer=N, "
                  "'mtp.K.attn.*' with layer='mtp.K') "
                  "or a sharded checkpoint directory / its model.safetensors.index.json (the "
                  "DeepSeek-V4 release: only the layer's tensors are read, F8_E4M3 weights are "
                  "dequantized with their F8_E8M0 scale per 128 x 128 block).")
      .def("save", &LayerWeights::save, "path"_a)
      .def("names",
           [](const LayerWeights& w) {
             std::vector<std::string> names;
             for (const ParamInfo& p : w.params()) names.push_back(p.name);
             return names;
           })
      .def("__getitem__", [](const LayerWeights& w, const std::string& name) { return to_numpy(w.get(name)); })
      .def("__setitem__",
           [](LayerWeights& w, const std::string& name, const F32Array& a) {
             Tensor& t = w.get(name);
             require(shape_of(a) == t.shape(), ErrorKind::ShapeMismatch,
                     "weight '" + name + "' has shape " + shape_str(t.shape()) + ", got " + shape_str(shape_of(a)));
             std::memcpy(t.data(), a.data(), t.nbytes());
           })
      .def_prop_ro("config", &LayerWeights::config);

  nb::class_<Forward>(m, "Forward", "A forward pass: its outputs and the state its backward needs.")
      // Properties return through nb::cast: their default policy (reference_internal) cannot
      // apply to arrays that own their data.
      .def_prop_ro("output", [](const Forward& f) { return to_numpy(f.outputs.output); },
                   "[T, d_model] float32 (bf16-valued in bf16 mode)")
      .def_prop_ro(
          "topk",
          [](const Forward& f) -> nb::object {
            if (!f.indexer) return nb::none();
            const Tensor& t = f.outputs.topk_indices;
            const std::int32_t* p = t.empty() ? nullptr : t.ptr<std::int32_t>();
            const std::size_t rows = static_cast<std::size_t>(f.outputs.output.dim(0));
            return nb::cast(numpy_array(std::vector<std::int32_t>(p, p + t.numel()),
                                        {rows, static_cast<std::size_t>(f.topk)}));
          },
          "CSA: [T, index_topk] int32 segment-local compressed ids, ascending, -1 padded; else None")
      .def_prop_ro("indexer_loss", [](const Forward& f) { return f.outputs.indexer_loss; },
                   "lambda * KL (CSA), 0 otherwise");

  nb::class_<Layer>(m, "Layer", "One DeepSeek-V4 attention layer (SWA, CSA or HCA).")
      .def(
          "__init__",
          [](Layer* self, const AttentionConfig& cfg, const LayerWeights& w, const std::string& precision,
             const std::string& device, int threads, bool deterministic) {
            RunOptions o;
            o.precision = parse_precision(precision);
            o.device = parse_device(device);
            o.threads = threads;
            o.deterministic = deterministic;
            new (self) Layer(cfg, w, o);
          },
          "config"_a, "weights"_a, "precision"_a = "bf16", "device"_a = "cpu", "threads"_a = 0,
          "deterministic"_a = false)
      .def(
          "forward",
          [](Layer& layer, const F32Array& x, const std::vector<std::int32_t>& cu,
             const std::optional<std::vector<std::int32_t>>& cu_padded, const std::optional<I32Array>& topk) {
            const Tensor xt = f32_tensor(x);
            const SeqLayout layout = make_layout(cu, cu_padded);
            Tensor forced;
            if (topk) {
              const std::int32_t* p = topk->data();
              forced = Tensor::from_i32(std::vector<std::int32_t>(p, p + topk->size()), shape_of(*topk));
            }
            Forward f;
            f.indexer = layer.impl.config().has_indexer();
            f.topk = layer.impl.config().index_topk;
            {
              nb::gil_scoped_release unlocked;  // first, then the layer's lock: no deadlock
              std::lock_guard<std::mutex> one_call(*layer.busy);
              f.outputs = topk ? layer.impl.forward(xt, layout, forced) : layer.impl.forward(xt, layout);
            }
            return f;
          },
          "x"_a, "cu_seqlens"_a, "cu_seqlens_padded"_a = nb::none(), "topk"_a = nb::none())
      .def(
          "backward",
          [](Layer& layer, const Forward& f, const F32Array& grad_output, float grad_indexer_loss) {
            const Tensor g = f32_tensor(grad_output);
            LayerGradients grads;
            {
              nb::gil_scoped_release unlocked;
              std::lock_guard<std::mutex> one_call(*layer.busy);
              grads = layer.impl.backward(f.outputs, g, grad_indexer_loss);
            }
            return gradients_to_dict(grads);
          },
          "forward"_a, "grad_output"_a, "grad_indexer_loss"_a = 1.0f,
          "Gradients: 'input' and one per parameter name, float32 arrays.")
      .def_prop_ro("config", [](const Layer& l) { return l.impl.config(); })
      .def_prop_ro("precision", [](const Layer& l) { return std::string(precision_name(l.impl.options().precision)); })
      .def_prop_ro("device", [](const Layer& l) {
        return std::string(l.impl.options().device == Device::cuda ? "cuda" : "cpu");
      });

  m.def(
      "oracle_forward",
      [](const AttentionConfig& cfg, const LayerWeights& w, const F64Array& x, const std::vector<std::int32_t>& cu,
         const std::optional<std::vector<std::int32_t>>& cu_padded, const std::optional<std::vector<std::int32_t>>& topk,
         const std::optional<std::vector<int>>& rows) {
        const SeqLayout layout = make_layout(cu, cu_padded);
        require(x.ndim() == 2 && static_cast<int>(x.shape(1)) == cfg.d_model, ErrorKind::ShapeMismatch,
                "x must be [T, " + std::to_string(cfg.d_model) + "], got " + shape_str(shape_of(x)));
        layout.check_rows(static_cast<std::int64_t>(x.shape(0)));
        const std::vector<double> xv(x.data(), x.data() + x.size());
        const oracle::Weights64 w64 = oracle::weights64(w);
        oracle::Options opt;
        if (topk) opt.forced_topk = &*topk;
        if (rows) opt.query_rows = &*rows;
        oracle::Result r;
        {
          nb::gil_scoped_release unlocked;
          r = oracle::forward(cfg, layout, w64, xv, opt);
        }
        nb::dict out;
        const std::size_t T = x.shape(0);
        out["output"] = numpy_array(std::move(r.output), {T, static_cast<std::size_t>(cfg.d_model)});
        if (cfg.has_indexer())
          out["topk"] = numpy_array(std::move(r.topk), {T, static_cast<std::size_t>(cfg.index_topk)});
        else
          out["topk"] = nb::none();
        out["indexer_loss"] = r.indexer_loss;
        return out;
      },
      "config"_a, "weights"_a, "x"_a, "cu_seqlens"_a, "cu_seqlens_padded"_a = nb::none(), "topk"_a = nb::none(),
      "rows"_a = nb::none(),
      "The layer forward in fp64 written straight from the equations (the reference the backends are tested "
      "against). rows: compute only these query rows (others NaN, loss NaN).");

  bind_ops(m);
  bind_cp(m);
  bind_device(m);

  m.def("retain_freed_host_memory", &retain_freed_host_memory,
        "Keep large freed host blocks in the heap for reuse (process-wide: glibc serves blocks up to "
        "1 GiB from the heap and stops trimming it): the CPU layer's activations then stop coming back "
        "as fresh zero-filled pages on every call, 25-43% of a CPU training step at the Flash "
        "shape, for a resident set that stays at its peak. True when the allocator took it (glibc).");
  m.attr("__version__") = version();
  m.def("build_info_json", []() { return to_json(build_info()); },
        "The version, this build's backends and communicators and the visible GPUs, as JSON "
        "(csattn.build_info() parses it).");
  m.def("cuda_available", []() {
    std::string why;
    const bool ok = cuda_available(&why);
    return nb::make_tuple(ok, why);
  }, "(True, '') when this build has the CUDA backend and a GPU is usable, else (False, why).");
}
