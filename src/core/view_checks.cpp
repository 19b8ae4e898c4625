#include "core/view_checks.hpp"

#include <cstdint>

#include "csattn/error.hpp"

namespace csattn::checks {

namespace {

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : " or ") + std::string(dtype_name(d));
  return s;
}

void common(const ConstTensorView& v, const std::string& name,
            std::initializer_list<DType> dtypes) {
  require(v.device == Device::cpu, ErrorKind::Unsupported,
          name + " is a cuda view: this build has only the CPU backend");
  bool ok = false;
  for (DType d : dtypes) ok = ok || d == v.dtype;
  require(ok, ErrorKind::DTypeMismatch,
          name + " has dtype " + dtype_name(v.dtype) + ", expected " + dtype_list(dtypes));
}

}  // namespace

void view(const ConstTensorView& v, const std::string& name, std::initializer_list<DType> dtypes,
          const Shape& shape) {
  view_any_shape(v, name, dtypes, {shape});
}

int view_any_shape(const ConstTensorView& v, const std::string& name,
                   std::initializer_list<DType> dtypes, std::initializer_list<Shape> shapes) {
  common(v, name, dtypes);
  int match = -1, i = 0;
  std::string expected;
  for (const Shape& s : shapes) {
    if (match < 0 && v.shape == s) match = i;
    expected += (expected.empty() ? "" : " or ") + shape_str(s);
    ++i;
  }
  require(match >= 0, ErrorKind::ShapeMismatch,
          name + " has shape " + shape_str(v.shape) + ", expected " + expected);
  require(v.data != nullptr || v.numel() == 0, ErrorKind::InvalidArgument,
          name + " is missing (null data pointer)");
  return match;
}

std::span<const std::int32_t> cu_seqlens(const ConstTensorView& v, const std::string& name,
                                         std::int64_t count) {
  view(v, name, {DType::i32}, {count});
  std::span<const std::int32_t> cu(v.ptr<std::int32_t>(), static_cast<std::size_t>(count));
  require(cu[0] == 0, ErrorKind::InvalidArgument,
          name + "[0] = " + std::to_string(cu[0]) + ", expected 0");
  for (std::size_t i = 1; i < cu.size(); ++i)
    require(cu[i] >= cu[i - 1], ErrorKind::InvalidArgument,
            name + " must be non-decreasing: " + name + "[" + std::to_string(i) + "] = " +
                std::to_string(cu[i]) + " < " + std::to_string(cu[i - 1]));
  return cu;
}

void no_overlap(const ConstTensorView& a, const std::string& a_name, const ConstTensorView& b,
                const std::string& b_name) {
  if (a.data == nullptr || b.data == nullptr) return;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data), a1 = a0 + a.nbytes();
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data), b1 = b0 + b.nbytes();
  require(a1 <= b0 || b1 <= a0, ErrorKind::InvalidArgument,
          a_name + " and " + b_name + " overlap in memory");
}

}  // namespace csattn::checks
