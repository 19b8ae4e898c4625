// Host tensors: a dtype, a shape and owned bytes. Used at the API boundary (files, CLI,
// Python); backends work on raw arrays.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace csattn {

enum class DType { f32, bf16, f16, e4m3, e8m0, i32, i64, f64 };
enum class Device { cpu, cuda };

std::size_t dtype_size(DType dt);
const char* dtype_name(DType dt);  // "f32", "bf16", ...

using Shape = std::vector<std::int64_t>;
std::int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[3, 4]"

// Non-owning views: a pointer, a dtype, a shape (row-major, contiguous) and a device. The
// operators of ops.hpp take views so that the caller owns every buffer (inputs, outputs and
// workspace), which is what the CUDA kernels need for graph capture. A view with a null
// pointer is "absent" (an optional argument left out).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  Device device = Device::cpu;

  bool absent() const { return data == nullptr; }
  std::int64_t numel() const { return shape_numel(shape); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  template <class T> T* ptr() const { return static_cast<T*>(data); }
};

struct ConstTensorView {
  const void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  Device device = Device::cpu;

  ConstTensorView() = default;
  ConstTensorView(const void* d, DType dt, Shape s, Device dev = Device::cpu)
      : data(d), dtype(dt), shape(std::move(s)), device(dev) {}
  ConstTensorView(const TensorView& v)  // NOLINT: a mutable view is also a read-only one
      : data(v.data), dtype(v.dtype), shape(v.shape), device(v.device) {}

  bool absent() const { return data == nullptr; }
  std::int64_t numel() const { return shape_numel(shape); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  template <class T> const T* ptr() const { return static_cast<const T*>(data); }
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);  // zero-filled

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  // A default-constructed tensor holds nothing: numel 0, empty() true. A scalar has shape {}
  // and one element.
  std::int64_t numel() const { return bytes_.empty() ? 0 : shape_numel(shape_); }
  std::int64_t dim(int i) const { return shape_.at(static_cast<std::size_t>(i)); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  bool empty() const { return bytes_.empty(); }
  std::size_t nbytes() const { return bytes_.size(); }

  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  template <class T> T* ptr() { return reinterpret_cast<T*>(bytes_.data()); }
  template <class T> const T* ptr() const { return reinterpret_cast<const T*>(bytes_.data()); }

  // Values converted to float / double (from f32, f64, bf16, f16, i32, i64).
  std::vector<float> to_f32() const;
  std::vector<double> to_f64() const;

  // Views of the whole tensor (absent for a tensor that holds nothing).
  TensorView view() { return {empty() ? nullptr : data(), dtype_, shape_, Device::cpu}; }
  ConstTensorView view() const { return {empty() ? nullptr : data(), dtype_, shape_}; }

  static Tensor from_f32(const std::vector<float>& values, Shape shape);
  static Tensor from_i32(const std::vector<std::int32_t>& values, Shape shape);
  static Tensor scalar_f32(float v);

 private:
  DType dtype_ = DType::f32;
  Shape shape_;
  std::vector<unsigned char> bytes_;
};

// bf16 <-> float conversion with round-to-nearest-even (NaN kept quiet).
std::uint16_t float_to_bf16_bits(float x);
float bf16_bits_to_float(std::uint16_t b);
inline float round_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }
float f16_bits_to_float(std::uint16_t h);

// OCP FP8 E4M3 ("e4m3fn": bias 7, max 448, no infinities, S.1111.111 is NaN).
// float -> e4m3: round to nearest even, saturating to +-448 (Inf too); NaN -> 0x7F.
std::uint8_t float_to_e4m3_bits(float x);
float e4m3_bits_to_float(std::uint8_t v);
// E8M0 (an MX block scale): byte e is 2^(e - 127); 0xFF is NaN.
float e8m0_bits_to_float(std::uint8_t v);

}  // namespace csattn
