// Host tensors: a dtype, a shape and owned bytes. Used at the API boundary (files, CLI,
// Python); backends work on raw arrays.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace csattn {

enum class DType { f32, bf16, f16, e4m3, e8m0, i32, i64, f64 };
enum class Device { cpu, cuda };

std::size_t dtype_size(DType dt);
const char* dtype_name(DType dt);  // "f32", "bf16", ...

using Shape = std::vector<std::int64_t>;
std::int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[3, 4]"

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

}  // namespace csattn
