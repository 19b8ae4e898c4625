// What the three binding files (csattn_module.cpp, csattn_ops.cpp, csattn_cp.cpp) share:
// the host array types they accept, NumPy arrays that own their data, conversions between
// those and csattn::Tensor, and the parsing of the string options.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "csattn/error.hpp"
#include "csattn/layer.hpp"
#include "csattn/layout.hpp"
#include "csattn/tensor.hpp"

namespace csattn::py {

namespace nb = nanobind;

using F32Array = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using F64Array = nb::ndarray<const double, nb::c_contig, nb::device::cpu>;
using I32Array = nb::ndarray<const std::int32_t, nb::c_contig, nb::device::cpu>;
using U8Array = nb::ndarray<const std::uint8_t, nb::c_contig, nb::device::cpu>;

// A NumPy array owning `values` (moved into the capsule that frees them). Returned from a
// property, wrap it in nb::cast: the default reference_internal policy cannot apply.
template <class T>
nb::ndarray<nb::numpy, T> numpy_array(std::vector<T> values, const std::vector<std::size_t>& shape) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.data(), owner);
}

inline std::vector<std::size_t> dims_of(const Shape& s) { return {s.begin(), s.end()}; }

template <class Array>
Shape shape_of(const Array& a) {
  Shape s;
  for (std::size_t i = 0; i < a.ndim(); ++i) s.push_back(static_cast<std::int64_t>(a.shape(i)));
  return s;
}

// An f32 or i32 tensor as a NumPy array (a copy).
inline nb::object to_numpy(const Tensor& t) {
  if (t.dtype() == DType::i32) {
    const std::int32_t* p = t.empty() ? nullptr : t.ptr<std::int32_t>();
    return nb::cast(numpy_array(std::vector<std::int32_t>(p, p + t.numel()), dims_of(t.shape())));
  }
  require(t.dtype() == DType::f32, ErrorKind::Internal, "expected an f32 or i32 tensor");
  const float* p = t.empty() ? nullptr : t.ptr<float>();
  return nb::cast(numpy_array(std::vector<float>(p, p + t.numel()), dims_of(t.shape())));
}

inline Tensor f32_tensor(const F32Array& a) {
  return Tensor::from_f32(std::vector<float>(a.data(), a.data() + a.size()), shape_of(a));
}

inline SeqLayout make_layout(const std::vector<std::int32_t>& cu,
                             const std::optional<std::vector<std::int32_t>>& cu_padded) {
  return SeqLayout::thd(cu, cu_padded ? *cu_padded : std::vector<std::int32_t>{});
}

inline Device parse_device(const std::string& v) {
  if (v == "cpu") return Device::cpu;
  if (v == "cuda") return Device::cuda;
  if (v == "auto") return cuda_available() ? Device::cuda : Device::cpu;
  throw Error(ErrorKind::InvalidArgument, "device '" + v + "': expected 'cpu', 'cuda' or 'auto'");
}

inline Precision parse_precision(const std::string& v) {
  if (v == "bf16") return Precision::bf16;
  if (v == "fp32") return Precision::fp32;
  throw Error(ErrorKind::InvalidArgument, "precision '" + v + "': expected 'bf16' or 'fp32'");
}

}  // namespace csattn::py
