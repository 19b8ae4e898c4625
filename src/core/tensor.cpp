// Host tensors and the scalar conversions (bf16, f16, fp8) they need.
//
// Shapes: shape_numel({}) is 1, so a Tensor of shape {} (scalar_f32) is a scalar holding
// one element. A default-constructed Tensor also has shape {} but owns no bytes: it means
// "no tensor". Code that must tell the two apart should test nbytes() == 0 (the conversions
// below count elements as nbytes() / dtype_size(), so a default Tensor converts to an empty
// vector).
#include "csattn/tensor.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "csattn/error.hpp"

namespace csattn {

static_assert(std::endian::native == std::endian::little,
              "csattn stores tensor bytes little-endian and assumes a little-endian host");

std::size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::e4m3: return 1;
    case DType::e8m0: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::f64: return 8;
  }
  throw Error(ErrorKind::Internal, "dtype_size: invalid DType value");
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::e4m3: return "e4m3";
    case DType::e8m0: return "e8m0";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::f64: return "f64";
  }
  throw Error(ErrorKind::Internal, "dtype_name: invalid DType value");
}

// Shapes come from files too, so negative dims and overflow are reported, not assumed away.
std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    require(d >= 0, ErrorKind::InvalidArgument,
            "shape " + shape_str(shape) + " has a negative dimension");
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d) {
      throw Error(ErrorKind::InvalidArgument,
                  "shape " + shape_str(shape) + " has more elements than fit in int64");
    }
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// ---- scalar conversions -------------------------------------------------------------------

std::uint16_t float_to_bf16_bits(float x) {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  if (std::isnan(x)) {
    // Truncating could clear every mantissa bit and turn the NaN into an infinity; set
    // the quiet bit so it stays a (quiet) NaN with its sign.
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even: add 0x7FFF plus the lowest kept bit, then truncate. A carry
  // into the exponent is correct (it rounds up to the next binade, or to infinity).
  const std::uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

float bf16_bits_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

float f16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) {  // inf / NaN: keep the payload
    return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  }
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

// OCP FP8 E4M3 ("fn"): bias 7, no infinities, S.1111.111 is NaN.
float e4m3_bits_to_float(std::uint8_t v) {
  const bool neg = v & 0x80u;
  const int exp = (v >> 3) & 0xF;
  const int mant = v & 0x7;
  float r;
  if (exp == 0xF && mant == 0x7) {
    r = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    r = std::ldexp(static_cast<float>(mant), -9);  // (mant / 8) * 2^-6
  } else {
    r = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  }
  return neg ? -r : r;
}

namespace {

// Round half to even of a non-negative double (independent of the FPU rounding mode).
double round_half_even(double v) {
  const double fl = std::floor(v);
  const double frac = v - fl;
  if (frac > 0.5) return fl + 1.0;
  if (frac < 0.5) return fl;
  return std::fmod(fl, 2.0) == 0.0 ? fl : fl + 1.0;
}

}  // namespace

// Normals round on the fp32 bits (keep 3 of 23 mantissa bits, round half to even: the bf16
// trick with a 20-bit shift; a carry moves into the exponent correctly); subnormals (below
// 2^-6, multiples of 2^-9) round an exactly scaled value. No FPU rounding mode is involved.
std::uint8_t float_to_e4m3_bits(float x) {
  if (std::isnan(x)) return 0x7F;
  const auto bits = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t a = bits & 0x7FFFFFFFu;
  // 448 is the largest finite value; anything at or above it (Inf included) saturates.
  // (Values in (448, 464) would round to 448 anyway; from 464 up to the missing 480.)
  if (a >= 0x43E00000u) return sign | 0x7E;
  if (a < 0x3C800000u) {  // below 2^-6
    const double v = static_cast<double>(std::bit_cast<float>(a)) * 512.0;  // exact
    return sign | static_cast<std::uint8_t>(round_half_even(v));  // 8 is the smallest normal
  }
  const std::uint32_t rounded = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;  // (E << 3) | m
  return sign | static_cast<std::uint8_t>(rounded - (120u << 3));          // E - 127 + 7
}

// E8M0 (an MX scale): 2^(e - 127), 0xFF is NaN.
float e8m0_bits_to_float(std::uint8_t v) {
  if (v == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(v) - 127);
}

namespace {

template <class Src>
Src load_at(const unsigned char* bytes, std::size_t i) {
  Src v;
  std::memcpy(&v, bytes + i * sizeof(Src), sizeof(Src));
  return v;
}

// The switch sits outside the loop so each dtype converts in a tight loop.
template <class Out>
std::vector<Out> convert_all(DType dt, const unsigned char* bytes, std::size_t n) {
  std::vector<Out> out(n);
  auto each = [&](auto f) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<Out>(f(i));
  };
  switch (dt) {
    case DType::f32: each([&](std::size_t i) { return load_at<float>(bytes, i); }); break;
    case DType::f64: each([&](std::size_t i) { return load_at<double>(bytes, i); }); break;
    case DType::bf16:
      each([&](std::size_t i) { return bf16_bits_to_float(load_at<std::uint16_t>(bytes, i)); });
      break;
    case DType::f16:
      each([&](std::size_t i) { return f16_bits_to_float(load_at<std::uint16_t>(bytes, i)); });
      break;
    case DType::e4m3: each([&](std::size_t i) { return e4m3_bits_to_float(bytes[i]); }); break;
    case DType::e8m0: each([&](std::size_t i) { return e8m0_bits_to_float(bytes[i]); }); break;
    case DType::i32:
      each([&](std::size_t i) { return load_at<std::int32_t>(bytes, i); });
      break;
    case DType::i64:
      each([&](std::size_t i) { return load_at<std::int64_t>(bytes, i); });
      break;
  }
  return out;
}

}  // namespace

// ---- Tensor -------------------------------------------------------------------------------

Tensor::Tensor(DType dtype, Shape shape)
    : dtype_(dtype),
      shape_(std::move(shape)),
      bytes_(static_cast<std::size_t>(shape_numel(shape_)) * dtype_size(dtype), 0) {}

std::vector<float> Tensor::to_f32() const {
  return convert_all<float>(dtype_, bytes_.data(), bytes_.size() / dtype_size(dtype_));
}

std::vector<double> Tensor::to_f64() const {
  return convert_all<double>(dtype_, bytes_.data(), bytes_.size() / dtype_size(dtype_));
}

Tensor Tensor::from_f32(const std::vector<float>& values, Shape shape) {
  Tensor t(DType::f32, std::move(shape));
  require(static_cast<std::int64_t>(values.size()) == t.numel(), ErrorKind::ShapeMismatch,
          "Tensor::from_f32: " + std::to_string(values.size()) + " values for shape " +
              shape_str(t.shape()) + " (" + std::to_string(t.numel()) + " elements)");
  if (!values.empty()) std::memcpy(t.data(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::from_i32(const std::vector<std::int32_t>& values, Shape shape) {
  Tensor t(DType::i32, std::move(shape));
  require(static_cast<std::int64_t>(values.size()) == t.numel(), ErrorKind::ShapeMismatch,
          "Tensor::from_i32: " + std::to_string(values.size()) + " values for shape " +
              shape_str(t.shape()) + " (" + std::to_string(t.numel()) + " elements)");
  if (!values.empty()) std::memcpy(t.data(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::scalar_f32(float v) { return from_f32({v}, {}); }

}  // namespace csattn
