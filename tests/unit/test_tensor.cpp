// Tensor basics, shape helpers and the bf16 / f16 conversions on hand-computed values.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "csattn/error.hpp"
#include "csattn/tensor.hpp"

using namespace csattn;

namespace {

float f_from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }
std::uint16_t to_bf16(std::uint32_t float_bits) { return float_to_bf16_bits(f_from_bits(float_bits)); }

}  // namespace

TEST(ErrorKindNames, AllDistinct) {
  EXPECT_STREQ(to_string(ErrorKind::InvalidArgument), "InvalidArgument");
  EXPECT_STREQ(to_string(ErrorKind::ShapeMismatch), "ShapeMismatch");
  EXPECT_STREQ(to_string(ErrorKind::DTypeMismatch), "DTypeMismatch");
  EXPECT_STREQ(to_string(ErrorKind::Io), "Io");
  EXPECT_STREQ(to_string(ErrorKind::Unsupported), "Unsupported");
  EXPECT_STREQ(to_string(ErrorKind::Internal), "Internal");
}

TEST(TensorUnit, DTypeSizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::e4m3), 1u);
  EXPECT_EQ(dtype_size(DType::e8m0), 1u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_STREQ(dtype_name(DType::f32), "f32");
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_STREQ(dtype_name(DType::e8m0), "e8m0");
}

TEST(TensorUnit, ShapeHelpers) {
  EXPECT_EQ(shape_numel({}), 1);  // a scalar
  EXPECT_EQ(shape_numel({3, 4}), 12);
  EXPECT_EQ(shape_numel({2, 0, 5}), 0);
  EXPECT_EQ(shape_str({}), "[]");
  EXPECT_EQ(shape_str({3, 4}), "[3, 4]");
  EXPECT_EQ(shape_str({7}), "[7]");
  try {
    shape_numel({3, -1});
    FAIL() << "negative dimension accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("[3, -1]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(shape_numel({1LL << 40, 1LL << 40}), Error);  // overflow
}

TEST(TensorUnit, ZeroFilledConstructor) {
  Tensor t(DType::bf16, {2, 3});
  EXPECT_EQ(t.dtype(), DType::bf16);
  EXPECT_EQ(t.ndim(), 2);
  EXPECT_EQ(t.dim(1), 3);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 12u);
  EXPECT_FALSE(t.empty());
  for (float v : t.to_f32()) EXPECT_EQ(v, 0.0f);
  EXPECT_THROW(Tensor(DType::f32, {-2}), Error);
}

TEST(TensorUnit, DefaultIsNoTensorScalarHasOneElement) {
  Tensor none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.nbytes(), 0u);
  EXPECT_TRUE(none.to_f32().empty());

  Tensor s = Tensor::scalar_f32(2.5f);
  EXPECT_EQ(s.ndim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.nbytes(), 4u);
  EXPECT_EQ(s.to_f32(), std::vector<float>{2.5f});
}

TEST(TensorUnit, FromValuesAndConversions) {
  Tensor f = Tensor::from_f32({1.5f, -2.0f, 3.25f, 0.0f}, {2, 2});
  EXPECT_EQ(f.to_f32(), (std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f}));
  EXPECT_EQ(f.to_f64(), (std::vector<double>{1.5, -2.0, 3.25, 0.0}));
  EXPECT_EQ(f.ptr<float>()[2], 3.25f);

  Tensor i = Tensor::from_i32({-7, 0, 42}, {3});
  EXPECT_EQ(i.dtype(), DType::i32);
  EXPECT_EQ(i.to_f32(), (std::vector<float>{-7.0f, 0.0f, 42.0f}));

  try {
    Tensor::from_f32({1.0f, 2.0f}, {3});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::ShapeMismatch);
  }
  EXPECT_THROW(Tensor::from_i32({1}, {2, 2}), Error);

  Tensor d(DType::f64, {2});
  d.ptr<double>()[0] = 1e300;
  d.ptr<double>()[1] = -0.125;
  EXPECT_EQ(d.to_f64(), (std::vector<double>{1e300, -0.125}));
  EXPECT_TRUE(std::isinf(d.to_f32()[0]));

  Tensor l(DType::i64, {2});
  l.ptr<std::int64_t>()[0] = (1LL << 40) + 1;
  l.ptr<std::int64_t>()[1] = -3;
  EXPECT_EQ(l.to_f64(), (std::vector<double>{1099511627777.0, -3.0}));

  Tensor b(DType::bf16, {2});
  b.ptr<std::uint16_t>()[0] = 0x4049;  // 3.140625
  b.ptr<std::uint16_t>()[1] = 0xBF80;  // -1
  EXPECT_EQ(b.to_f32(), (std::vector<float>{3.140625f, -1.0f}));

  Tensor h(DType::f16, {1});
  h.ptr<std::uint16_t>()[0] = 0x3555;  // 0.333251953125
  EXPECT_EQ(h.to_f64()[0], 0.333251953125);
}

TEST(Bf16Rounding, ExactAndNearest) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(to_bf16(0x3F808001), 0x3F81);  // just above half an ulp: up
  EXPECT_EQ(to_bf16(0x3F807FFF), 0x3F80);  // just below: down
  EXPECT_EQ(float_to_bf16_bits(0.1f), 0x3DCD);  // 0x3DCCCCCD, low half 0xCCCD > 0x8000
  EXPECT_EQ(bf16_bits_to_float(0x4049), 3.140625f);
  EXPECT_EQ(round_bf16(3.14159265f), 3.140625f);
}

TEST(Bf16Rounding, TiesToEven) {
  EXPECT_EQ(to_bf16(0x3F808000), 0x3F80);  // 1 + 2^-8: tie, 0x3F80 even: stays
  EXPECT_EQ(to_bf16(0x3F818000), 0x3F82);  // 1 + 3*2^-8: tie, 0x3F81 odd: up
  EXPECT_EQ(to_bf16(0xBF818000), 0xBF82);  // sign symmetric
  EXPECT_EQ(to_bf16(0x3FFF8000), 0x4000);  // tie with carry into the exponent
  EXPECT_EQ(to_bf16(0x00008000), 0x0000);  // subnormal tie, even
  EXPECT_EQ(to_bf16(0x00018000), 0x0002);  // subnormal tie, odd
  EXPECT_EQ(round_bf16(1.0f + 0x1.0p-8f), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3 * 0x1.0p-8f), 1.0f + 0x1.0p-6f);
}

TEST(Bf16Rounding, InfMaxAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_bf16_bits(inf), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(-inf), 0xFF80);
  EXPECT_EQ(to_bf16(0x7F7F0000), 0x7F7F);  // bf16 max is kept
  EXPECT_EQ(bf16_bits_to_float(0x7F7F), 0x1.FEp127f);
  EXPECT_EQ(to_bf16(0x7F7F7FFF), 0x7F7F);  // below the tie: bf16 max
  EXPECT_EQ(to_bf16(0x7F7F8000), 0x7F80);  // tie, odd: overflows to inf
  EXPECT_EQ(to_bf16(0x7F7E8000), 0x7F7E);  // tie, even
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::max()), 0xFF80);

  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  // A NaN whose payload sits only in the dropped bits must not truncate to inf.
  EXPECT_EQ(to_bf16(0x7F800001), 0x7FC0);
  EXPECT_EQ(to_bf16(0xFF800001), 0xFFC0);
  // Payload bits in the kept half are kept (and rounding must not carry into the sign).
  EXPECT_EQ(to_bf16(0x7FFFFFFF), 0x7FFF);
  EXPECT_TRUE(std::isnan(round_bf16(f_from_bits(0x7FA00000))));
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(0x7FC0)));
}

TEST(F16Decode, HandValues) {
  EXPECT_EQ(f16_bits_to_float(0x3C00), 1.0f);
  EXPECT_EQ(f16_bits_to_float(0xC000), -2.0f);
  EXPECT_EQ(f16_bits_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_bits_to_float(0x0001), 0x1.0p-24f);  // smallest subnormal
  EXPECT_EQ(f16_bits_to_float(0x03FF), 1023 * 0x1.0p-24f);  // largest subnormal
  EXPECT_EQ(f16_bits_to_float(0x0400), 0x1.0p-14f);  // smallest normal
  EXPECT_EQ(f16_bits_to_float(0x8001), -0x1.0p-24f);
  EXPECT_TRUE(std::signbit(f16_bits_to_float(0x8000)));
  EXPECT_EQ(f16_bits_to_float(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_bits_to_float(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0x7C01)));
}

TEST(TensorUnit, Fp8Decode) {
  Tensor e(DType::e4m3, {5});
  const unsigned char e4[] = {0x38, 0xC0, 0x7E, 0x01, 0x7F};  // 1, -2, 448, 2^-9, NaN
  std::memcpy(e.data(), e4, 5);
  const auto ev = e.to_f32();
  EXPECT_EQ(ev[0], 1.0f);
  EXPECT_EQ(ev[1], -2.0f);
  EXPECT_EQ(ev[2], 448.0f);
  EXPECT_EQ(ev[3], 0x1.0p-9f);
  EXPECT_TRUE(std::isnan(ev[4]));

  Tensor s(DType::e8m0, {3});
  const unsigned char e8[] = {127, 130, 0xFF};  // 1, 8, NaN
  std::memcpy(s.data(), e8, 3);
  const auto sv = s.to_f32();
  EXPECT_EQ(sv[0], 1.0f);
  EXPECT_EQ(sv[1], 8.0f);
  EXPECT_TRUE(std::isnan(sv[2]));
}
