// MXFP8 quantization (spec 03 §5.2): E4M3 rounding, the E8M0 scale rule, hand-computed
// blocks (zeros, denormals, 448, NaN and Inf, amax a power of two), random data against an
// independent reference, dequantization, and argument validation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cpu/mxfp8.hpp"
#include "csattn/error.hpp"
#include "csattn/ops.hpp"
#include "csattn/tensor.hpp"
#include "mxfp8_reference.hpp"

namespace csattn {
namespace {

using testing_util::ref_e4m3;
using testing_util::ref_quantize_block;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- E4M3 -----------------------------------------------------------------------------------

TEST(Mxfp8E4m3, HandVectors) {
  struct Case { float x; std::uint8_t code; };
  const Case cases[] = {
      {0.0f, 0x00},    {-0.0f, 0x80},   {1.0f, 0x38},     {-1.0f, 0xB8},
      {448.0f, 0x7E},  {-448.0f, 0xFE}, {447.0f, 0x7E},   {500.0f, 0x7E},  // saturation
      {1e30f, 0x7E},   {kInf, 0x7E},    {-kInf, 0xFE},    {kNaN, 0x7F},
      {0x1p-6f, 0x08},                                    // smallest normal
      {0x1p-9f, 0x01},                                    // smallest subnormal
      {0x1p-10f, 0x00},                                   // tie 0 / 2^-9 -> even (0)
      {0x3p-10f, 0x02},                                   // tie 2^-9 / 2^-8 -> even (2^-8)
      {1.0625f, 0x38},                                    // tie 1 / 1.125 -> even (1)
      {1.1875f, 0x3A},                                    // tie 1.125 / 1.25 -> even (1.25)
      {400.0f, 0x7C},                                     // tie 384 / 416 -> even (384)
      {432.0f, 0x7E},                                     // tie 416 / 448 -> even (448)
      {0x1.fffffep-7f, 0x08},                             // rounds up into the normals
      {240.0f, 0x77},
  };
  for (const Case& c : cases)
    EXPECT_EQ(float_to_e4m3_bits(c.x), c.code) << "x = " << c.x;
}

// Every finite code decodes and re-encodes to itself; every float between two codes goes to
// the nearer (the even one on ties), as an exhaustive search says.
TEST(Mxfp8E4m3, RoundTripAndNearestAgainstSearch) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN codes
    const auto code = static_cast<std::uint8_t>(c);
    EXPECT_EQ(float_to_e4m3_bits(e4m3_bits_to_float(code)), code) << c;
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-14, 10);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(mant(rng), expo(rng)) * (i % 2 ? -1.0f : 1.0f);
    ASSERT_EQ(float_to_e4m3_bits(x), ref_e4m3(x)) << "x = " << x;
  }
  // Exact midpoints between neighbouring codes (ties) across the whole range.
  for (int c = 0; c < 126; ++c) {
    const double mid = (testing_util::e4m3_grid(c) + testing_util::e4m3_grid(c + 1)) / 2;
    ASSERT_EQ(float_to_e4m3_bits(static_cast<float>(mid)), ref_e4m3(mid)) << "mid " << mid;
  }
}

// ---- the E8M0 scale rule ---------------------------------------------------------------------

TEST(Mxfp8Scale, HandVectors) {
  using cpu::mxfp8::e8m0_from_amax;
  EXPECT_EQ(e8m0_from_amax(0.0f), 0x00);
  EXPECT_EQ(e8m0_from_amax(kNaN), 0xFF);
  EXPECT_EQ(e8m0_from_amax(kInf), 0xFE);
  EXPECT_EQ(e8m0_from_amax(448.0f), 127);          // amax / 448 = 1 exactly
  EXPECT_EQ(e8m0_from_amax(896.0f), 128);          // = 2
  EXPECT_EQ(e8m0_from_amax(224.0f), 126);          // = 1/2
  EXPECT_EQ(e8m0_from_amax(448.0f * 1.0000001f), 128);  // just above: rounds up
  EXPECT_EQ(e8m0_from_amax(447.99997f), 127);      // just below: 2^0 still covers it
  EXPECT_EQ(e8m0_from_amax(1.0f), 119);            // 1/448 = 2^-8.8 -> 2^-8
  EXPECT_EQ(e8m0_from_amax(256.0f), 127);          // amax a power of two: 0.57 -> 2^0
  EXPECT_EQ(e8m0_from_amax(0x1p-20f), 127 - 28);   // 2^-20 / 448 = 2^-28.8 -> 2^-28
  EXPECT_EQ(e8m0_from_amax(std::numeric_limits<float>::max()), 127 + 120);
  // Tiny blocks: amax / 448 <= 2^-127 is covered by byte 0 (2^-127) ...
  EXPECT_EQ(e8m0_from_amax(448.0f * 0x1p-127f), 0);
  EXPECT_EQ(e8m0_from_amax(1e-40f), 0);
  // ... and just above it needs 2^-126.
  EXPECT_EQ(e8m0_from_amax(448.0f * 0x1p-127f * 1.5f), 1);
  EXPECT_EQ(cpu::mxfp8::quant_multiplier(0), 1.0f);  // TE's exp2f_rcp: 1, not 2^127
  EXPECT_EQ(cpu::mxfp8::quant_multiplier(127), 1.0f);
  EXPECT_EQ(cpu::mxfp8::quant_multiplier(119), 256.0f);
  EXPECT_EQ(cpu::mxfp8::quant_multiplier(254), 0x1p-127f);
}

// ---- whole blocks through the public operator -------------------------------------------------

struct Quantized {
  std::vector<std::uint8_t> data, scales;
};

Quantized quantize(const std::vector<float>& x, int cols) {
  const auto rows = static_cast<std::int64_t>(x.size()) / cols;
  Tensor in = Tensor::from_f32(x, {rows, cols});
  Tensor data(DType::e4m3, {rows, cols}), scales(DType::e8m0, {rows, cols / 32});
  ops::quantize_mxfp8(in.view(), data.view(), scales.view());
  const auto* d = data.ptr<std::uint8_t>();
  const auto* s = scales.ptr<std::uint8_t>();
  return {{d, d + data.numel()}, {s, s + scales.numel()}};
}

std::vector<float> dequantize(const Quantized& q, int cols) {
  const auto rows = static_cast<std::int64_t>(q.data.size()) / cols;
  Tensor data(DType::e4m3, {rows, cols}), scales(DType::e8m0, {rows, cols / 32});
  std::copy(q.data.begin(), q.data.end(), data.ptr<std::uint8_t>());
  std::copy(q.scales.begin(), q.scales.end(), scales.ptr<std::uint8_t>());
  Tensor out(DType::f32, {rows, cols});
  ops::dequantize_mxfp8(data.view(), scales.view(), out.view());
  return out.to_f32();
}

TEST(Mxfp8Quantize, ZerosGiveScaleZeroAndZeroData) {
  const Quantized q = quantize(std::vector<float>(64, 0.0f), 64);
  EXPECT_EQ(q.scales, (std::vector<std::uint8_t>{0, 0}));
  for (std::uint8_t d : q.data) EXPECT_EQ(d, 0);
  for (float v : dequantize(q, 64)) EXPECT_EQ(v, 0.0f);
}

TEST(Mxfp8Quantize, AmaxAt448KeepsValues) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * testing_util::e4m3_grid(4 * i % 127);
  x[7] = 448.0f;  // amax exactly 448: scale 2^0, every value is on the E4M3 grid
  const Quantized q = quantize(x, 32);
  EXPECT_EQ(q.scales[0], 127);
  EXPECT_EQ(q.data[7], 0x7E);
  EXPECT_EQ(dequantize(q, 32), x);
}

TEST(Mxfp8Quantize, AmaxPowerOfTwo) {
  // amax = 2^3: 8/448 -> scale 2^-5 (byte 122); x * 32: 8 -> 256 (0x78), 1 -> 32 (0x60),
  // -0.3 -> -9.6, between the grid values 9 and 10 (step 1 in [8, 16)) -> -10 (0xD2).
  std::vector<float> x(32, 0.0f);
  x[0] = 8.0f;
  x[1] = 1.0f;
  x[2] = -0.3f;
  const Quantized q = quantize(x, 32);
  EXPECT_EQ(q.scales[0], 122);
  EXPECT_EQ(q.data[0], 0x78);
  EXPECT_EQ(q.data[1], 0x60);
  EXPECT_EQ(q.data[2], 0xD2);
  const std::vector<float> back = dequantize(q, 32);
  EXPECT_EQ(back[0], 8.0f);
  EXPECT_EQ(back[1], 1.0f);
  EXPECT_EQ(back[2], -10.0f / 32.0f);
}

TEST(Mxfp8Quantize, DenormalInputs) {
  // An fp32-denormal block: amax / 448 is below 2^-127, scale byte 0, multiplier 1, every
  // value rounds to 0.
  std::vector<float> x(64, 0.0f);
  for (int i = 0; i < 32; ++i) x[i] = 1e-40f * static_cast<float>(i - 16);
  // A normal block whose small members become E4M3 subnormals after scaling: amax 1 ->
  // multiplier 2^8; 2^-17 -> 2^-9 (code 0x01), 2^-14 -> 2^-6 (0x08), 2^-18 -> tie -> 0.
  x[32] = 1.0f;
  x[33] = 0x1p-17f;
  x[34] = 0x1p-14f;
  x[35] = 0x1p-18f;
  x[36] = 0x3p-18f;  // 1.5 * 2^-9 after scaling: tie 1/2 -> even (2)
  const Quantized q = quantize(x, 64);
  EXPECT_EQ(q.scales[0], 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q.data[i] & 0x7F, 0) << i;
  EXPECT_EQ(q.scales[1], 119);
  EXPECT_EQ(q.data[33], 0x01);
  EXPECT_EQ(q.data[34], 0x08);
  EXPECT_EQ(q.data[35], 0x00);
  EXPECT_EQ(q.data[36], 0x02);
}

TEST(Mxfp8Quantize, NanInBlockPoisonsOnlyThatBlock) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = 0.25f * static_cast<float>(i - 30);
  x[5] = kNaN;
  x[40] = kInf;  // second block: Inf but no NaN
  const Quantized q = quantize(x, 64);
  EXPECT_EQ(q.scales[0], 0xFF);  // NaN amax
  EXPECT_EQ(q.data[5], 0x7F);
  EXPECT_EQ(q.scales[1], 0xFE);  // Inf amax
  EXPECT_EQ(q.data[40], 0x7E);   // Inf saturates to 448
  const std::vector<float> back = dequantize(q, 64);
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
  for (int i = 32; i < 64; ++i) EXPECT_FALSE(std::isnan(back[i])) << i;
  // The Inf block's finite values are tiny next to 2^127 * 448: they quantize to 0.
  EXPECT_EQ(back[33], 0.0f);

  // A block holding both NaN and Inf is a NaN block.
  std::vector<float> y(32, 1.0f);
  y[0] = kInf;
  y[1] = kNaN;
  EXPECT_EQ(quantize(y, 32).scales[0], 0xFF);
}

// Random data of several magnitudes, f32 and bf16 inputs: bitwise equal to the independent
// reference, and the dequantized values within half an E4M3 step of the input.
TEST(Mxfp8Quantize, RandomMatchesReferenceBitwise) {
  std::mt19937 rng(11);
  for (float magnitude : {1.0f, 1e-3f, 3e2f, 1e-30f, 1e30f}) {
    std::normal_distribution<float> dist(0.0f, magnitude);
    const int rows = 37, cols = 128;
    std::vector<float> x(static_cast<std::size_t>(rows) * cols);
    for (float& v : x) v = dist(rng);
    for (bool bf16 : {false, true}) {
      if (bf16)
        for (float& v : x) v = round_bf16(v);
      Tensor in(bf16 ? DType::bf16 : DType::f32, {rows, cols});
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (bf16)
          in.ptr<std::uint16_t>()[i] = float_to_bf16_bits(x[i]);
        else
          in.ptr<float>()[i] = x[i];
      }
      Tensor data(DType::e4m3, {rows, cols}), scales(DType::e8m0, {rows, cols / 32});
      ops::quantize_mxfp8(in.view(), data.view(), scales.view());
      for (int r = 0; r < rows; ++r)
        for (int g = 0; g < cols / 32; ++g) {
          std::uint8_t ref_data[32], ref_scale = 0;
          const std::size_t off = static_cast<std::size_t>(r) * cols + g * 32;
          ref_quantize_block(x.data() + off, ref_data, &ref_scale);
          ASSERT_EQ(scales.ptr<std::uint8_t>()[r * (cols / 32) + g], ref_scale)
              << "magnitude " << magnitude << " row " << r << " group " << g;
          for (int i = 0; i < 32; ++i)
            ASSERT_EQ(data.ptr<std::uint8_t>()[off + i], ref_data[i])
                << "magnitude " << magnitude << " element " << off + i;
        }
      Tensor out(DType::f32, {rows, cols});
      ops::dequantize_mxfp8(data.view(), scales.view(), out.view());
      const std::vector<float> back = out.to_f32();
      for (std::size_t i = 0; i < x.size(); ++i) {
        const std::size_t blk = i / 32;
        const float scale = e8m0_bits_to_float(scales.ptr<std::uint8_t>()[blk]);
        // Normals: relative error <= 2^-4; subnormals: absolute <= 2^-10 * scale.
        EXPECT_LE(std::fabs(back[i] - x[i]),
                  std::max(std::fabs(x[i]) * 0.0625f, std::ldexp(scale, -10)))
            << i;
      }
    }
  }
}

TEST(Mxfp8Quantize, LeadingDimensionsAreRows) {
  // q [T, H, D] quantizes as T*H rows of D: the same bytes as the flat [T*H, D] matrix.
  std::vector<float> x(3 * 4 * 64);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  for (float& v : x) v = dist(rng);
  Tensor in = Tensor::from_f32(x, {3, 4, 64});
  Tensor data(DType::e4m3, {3, 4, 64}), scales(DType::e8m0, {3, 4, 2});
  ops::quantize_mxfp8(in.view(), data.view(), scales.view());
  const Quantized flat = quantize(x, 64);
  EXPECT_TRUE(std::equal(flat.scales.begin(), flat.scales.end(), scales.ptr<std::uint8_t>()));
  EXPECT_TRUE(std::equal(flat.data.begin(), flat.data.end(), data.ptr<std::uint8_t>()));
}

TEST(Mxfp8Quantize, BadArgumentsNameTheArgument) {
  auto expect_error = [](auto f, const std::string& word) {
    try {
      f();
      ADD_FAILURE() << "no error, expected one naming " << word;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  Tensor x(DType::f32, {4, 48}), d48(DType::e4m3, {4, 48}), s48(DType::e8m0, {4, 1});
  expect_error([&] { ops::quantize_mxfp8(x.view(), d48.view(), s48.view()); }, "x");
  Tensor x64(DType::f32, {4, 64}), d64(DType::e4m3, {4, 64}), s64(DType::e8m0, {4, 2});
  Tensor wrong_dtype(DType::bf16, {4, 64}), wrong_scales(DType::e8m0, {4, 4});
  expect_error([&] { ops::quantize_mxfp8(x64.view(), wrong_dtype.view(), s64.view()); }, "data");
  expect_error([&] { ops::quantize_mxfp8(x64.view(), d64.view(), wrong_scales.view()); },
               "scales");
  Tensor i32(DType::i32, {4, 64});
  expect_error([&] { ops::quantize_mxfp8(i32.view(), d64.view(), s64.view()); }, "x");
  TensorView missing = d64.view();
  missing.data = nullptr;
  expect_error([&] { ops::quantize_mxfp8(x64.view(), missing, s64.view()); }, "data");
  Tensor out_bad(DType::f32, {4, 32});
  expect_error([&] { ops::dequantize_mxfp8(d64.view(), s64.view(), out_bad.view()); }, "out");
}

}  // namespace
}  // namespace csattn
