// The individual operators of <csattn/ops.hpp> for Python (part of csattn._csattn): MXFP8
// quantization and dequantization, the 128x4 scale packing (BSHD and THD), and the compact
// indexer forward + top-k + softmax. Plans and workspaces are made here per call from the
// arrays' shapes; inputs arrive C-contiguous with their exact dtypes (python/csattn/ops.py
// converts), outputs are new NumPy arrays.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "csattn/config.hpp"
#include "csattn/error.hpp"
#include "csattn/ops.hpp"
#include "csattn/plan.hpp"
#include "csattn/tensor.hpp"
#include "bind_util.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace csattn {
namespace {

using namespace py;

// A NumPy array of `shape` owning zero-filled storage, and a view of it for an operator.
template <class T>
struct Out {
  std::vector<T>* data;
  Shape shape;
  explicit Out(const Shape& s) : data(new std::vector<T>(static_cast<std::size_t>(shape_numel(s)))), shape(s) {}
  Out(const Out&) = delete;
  Out& operator=(const Out&) = delete;
  TensorView view(DType dt) const { return {data->data(), dt, shape, Device::cpu}; }
  nb::ndarray<nb::numpy, T> release() {  // the storage moves into the array (no copy)
    std::vector<T> values = std::move(*data);
    return numpy_array(std::move(values), dims_of(shape));
  }
  ~Out() { delete data; }
};

ConstTensorView cview(const F32Array& a) { return {a.data(), DType::f32, shape_of(a)}; }
ConstTensorView cview(const U8Array& a, DType dt) { return {a.data(), dt, shape_of(a)}; }
ConstTensorView cview(const std::vector<std::int32_t>& v) {
  return {v.data(), DType::i32, Shape{static_cast<std::int64_t>(v.size())}};
}

int max_segment(const std::vector<std::int32_t>& cu) {
  int m = 0;
  for (std::size_t i = 0; i + 1 < cu.size(); ++i) m = std::max(m, cu[i + 1] - cu[i]);
  return m;
}

}  // namespace

void bind_ops(nb::module_& m) {
  m.def(
      "quantize_mxfp8",
      [](const F32Array& x) {
        const Shape s = shape_of(x);
        require(!s.empty() && s.back() % 32 == 0, ErrorKind::ShapeMismatch,
                "x: the last dimension must be a multiple of 32, got shape " + shape_str(s));
        Shape gs = s;
        gs.back() /= 32;
        Out<std::uint8_t> data(s), scales(gs);
        {
          nb::gil_scoped_release unlocked;
          ops::quantize_mxfp8(cview(x), data.view(DType::e4m3), scales.view(DType::e8m0));
        }
        return nb::make_tuple(data.release(), scales.release());
      },
      "x"_a);
  m.def(
      "dequantize_mxfp8",
      [](const U8Array& data, const U8Array& scales) {
        Out<float> out(shape_of(data));
        ops::dequantize_mxfp8(cview(data, DType::e4m3), cview(scales, DType::e8m0), out.view(DType::f32));
        return out.release();
      },
      "data"_a, "scales"_a);
  m.def(
      "pack_mxfp8_scales_bshd",
      [](const U8Array& logical, std::int64_t batch, std::int64_t seqlen, int rows_per_token) {
        require(logical.ndim() == 2, ErrorKind::ShapeMismatch, "scales must be 2-D [rows, groups]");
        const Mxfp8ScalePlan plan =
            Mxfp8ScalePlan::bshd(batch, seqlen, rows_per_token, static_cast<int>(logical.shape(1)) * 32);
        Out<std::uint8_t> packed(plan.packed_shape());
        ops::pack_mxfp8_scales(plan, cview(logical, DType::e8m0), packed.view(DType::e8m0));
        return packed.release();
      },
      "scales"_a, "batch"_a, "seqlen"_a, "rows_per_token"_a);
  m.def(
      "pack_mxfp8_scales_thd",
      [](const U8Array& logical, const std::vector<std::int32_t>& cu, int rows_per_token) {
        require(logical.ndim() == 2, ErrorKind::ShapeMismatch, "scales must be 2-D [rows, groups]");
        require(cu.size() >= 2, ErrorKind::InvalidArgument, "cu_seqlens needs at least 2 entries");
        const Mxfp8ScalePlan plan = Mxfp8ScalePlan::thd(cu.back(), static_cast<std::int64_t>(cu.size()) - 1,
                                                        rows_per_token, static_cast<int>(logical.shape(1)) * 32);
        Out<std::uint8_t> packed(plan.packed_shape());
        Out<std::int32_t> prefixes(Shape{static_cast<std::int64_t>(cu.size())});
        ops::pack_mxfp8_scales(plan, cview(logical, DType::e8m0), cview(cu), packed.view(DType::e8m0),
                               prefixes.view(DType::i32));
        return nb::make_tuple(packed.release(), prefixes.release());
      },
      "scales"_a, "cu_seqlens"_a, "rows_per_token"_a);
  m.def(
      "compact_indexer_topk",
      [](const F32Array& q, const F32Array& k, const F32Array& w, int topk, int ratio, const std::string& precision,
         float sm_scale, const std::optional<std::vector<std::int32_t>>& cu_q,
         const std::optional<std::vector<std::int32_t>>& cu_k, const std::optional<std::vector<std::int32_t>>& offsets,
         int rows_per_pass) {
        const bool thd = cu_q.has_value();
        require(thd == cu_k.has_value(), ErrorKind::InvalidArgument,
                "cu_seqlens_q and cu_seqlens_k: give both (THD) or neither (BSHD)");
        require(thd ? q.ndim() == 3 : q.ndim() == 4, ErrorKind::ShapeMismatch,
                std::string("q must be ") + (thd ? "[T_q, H, D] (THD)" : "[B, S_q, H, D] (BSHD)") + ", got " +
                    shape_str(shape_of(q)));
        require(k.ndim() >= 2, ErrorKind::ShapeMismatch, "k must be [.., D], got " + shape_str(shape_of(k)));
        CompactIndexerGeometry g;
        g.format = thd ? QkvFormat::thd : QkvFormat::bshd;
        g.heads = static_cast<int>(q.shape(q.ndim() - 2));
        g.head_dim = static_cast<int>(q.shape(q.ndim() - 1));
        g.topk = topk;
        g.ratio = ratio;
        g.precision = parse_indexer_precision(precision, "precision");
        g.causal_offsets = offsets.has_value();
        g.rows_per_pass = rows_per_pass;
        if (thd) {
          require(cu_q->size() >= 2 && cu_q->size() == cu_k->size(), ErrorKind::InvalidArgument,
                  "cu_seqlens_q and cu_seqlens_k need the same length B+1 >= 2");
          g.batch = static_cast<int>(cu_q->size()) - 1;
          g.q_rows = static_cast<std::int64_t>(q.shape(0));
          g.k_rows = static_cast<std::int64_t>(k.shape(0));
          g.max_seqlen_q = std::max(1, max_segment(*cu_q));
          g.max_seqlen_k = std::max(1, max_segment(*cu_k));
        } else {
          g.batch = static_cast<int>(q.shape(0));
          g.max_seqlen_q = static_cast<int>(q.shape(1));
          g.max_seqlen_k = static_cast<int>(k.shape(1));
        }
        const CompactIndexerPlan plan = CompactIndexerPlan::make(g);
        Shape out_shape = shape_of(q);
        out_shape.pop_back();
        out_shape.back() = topk;  // [.., S_q or T_q, K]
        Out<std::int32_t> indices(out_shape);
        Out<float> logits(out_shape), softmax(out_shape);
        ops::CompactIndexerInputs in;
        in.q = cview(q);
        in.k = cview(k);
        in.weights = cview(w);
        if (thd) {
          in.cu_seqlens_q = cview(*cu_q);
          in.cu_seqlens_k = cview(*cu_k);
        }
        if (offsets) in.q_causal_offsets = cview(*offsets);
        in.sm_scale = sm_scale;
        ops::CompactIndexerOutputs out{indices.view(DType::i32), logits.view(DType::f32), softmax.view(DType::f32)};
        HostWorkspace ws(workspace_bytes(plan));
        {
          nb::gil_scoped_release unlocked;
          ops::compact_indexer_topk(plan, in, out, ws.view());
        }
        return nb::make_tuple(indices.release(), logits.release(), softmax.release());
      },
      "q"_a, "k"_a, "weights"_a, "topk"_a, "ratio"_a, "precision"_a, "sm_scale"_a, "cu_seqlens_q"_a = nb::none(),
      "cu_seqlens_k"_a = nb::none(), "q_causal_offsets"_a = nb::none(), "rows_per_pass"_a = 0);
}

}  // namespace csattn
