// MXFP8 scale-factor packing into the 128x4 layout (spec 03 §5.5): the byte formula, row and
// group padding, Q rows token*H + head, THD padded prefixes recomputed per call, the
// worst-case capacity, padding bytes written as zero.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/mxfp8_layout.hpp"
#include "csattn/error.hpp"
#include "csattn/ops.hpp"
#include "csattn/plan.hpp"

namespace csattn {
namespace {

using mxfp8::scale_byte_offset;

TEST(Mxfp8Layout, ByteFormula) {
  EXPECT_EQ(scale_byte_offset(130, 2, 4), 546);  // spec example: 512 + 32 + 0 + 2
  EXPECT_EQ(scale_byte_offset(0, 0, 4), 0);
  EXPECT_EQ(scale_byte_offset(1, 0, 4), 16);    // data paths stride 16 bytes
  EXPECT_EQ(scale_byte_offset(31, 0, 4), 496);
  EXPECT_EQ(scale_byte_offset(32, 0, 4), 4);    // 32-row sub-blocks stride 4 bytes
  EXPECT_EQ(scale_byte_offset(96, 3, 4), 15);
  EXPECT_EQ(scale_byte_offset(127, 3, 4), 511);
  EXPECT_EQ(scale_byte_offset(128, 0, 4), 512);  // next row tile
  EXPECT_EQ(scale_byte_offset(0, 4, 8), 512);    // G_pad 8: group tile before row tile
  EXPECT_EQ(scale_byte_offset(128, 0, 8), 1024);
  EXPECT_EQ(scale_byte_offset(130, 5, 8), 1024 + 512 + 32 + 1);
}

// The formula is a bijection of [rows_padded] x [G_pad] onto [0, rows_padded * G_pad).
TEST(Mxfp8Layout, ByteFormulaIsABijection) {
  for (int gp : {4, 8, 12}) {
    const int rows = 384;
    std::vector<int> hits(static_cast<std::size_t>(rows * gp), 0);
    for (int m = 0; m < rows; ++m)
      for (int g = 0; g < gp; ++g) ++hits[static_cast<std::size_t>(scale_byte_offset(m, g, gp))];
    for (int h : hits) ASSERT_EQ(h, 1) << "G_pad " << gp;
  }
}

TEST(Mxfp8Layout, TokenAlignment) {
  EXPECT_EQ(mxfp8::thd_token_alignment(64), 2);   // Q with 64 heads: 2 tokens per atom
  EXPECT_EQ(mxfp8::thd_token_alignment(32), 4);
  EXPECT_EQ(mxfp8::thd_token_alignment(48), 8);   // gcd(128, 48) = 16
  EXPECT_EQ(mxfp8::thd_token_alignment(3), 128);
  EXPECT_EQ(mxfp8::thd_token_alignment(1), 128);  // K
  EXPECT_EQ(mxfp8::thd_token_alignment(256), 1);
}

std::vector<std::int32_t> prefixes(const std::vector<std::int32_t>& cu, int rpt) {
  std::vector<std::int32_t> out(cu.size());
  mxfp8::thd_scale_prefixes(cu, rpt, out);
  return out;
}

// The spec's examples.
TEST(Mxfp8Layout, SpecPrefixExamples) {
  EXPECT_EQ(prefixes({0, 1, 3, 6, 10, 15}, 64), (std::vector<std::int32_t>{0, 2, 4, 8, 12, 18}));
  EXPECT_EQ(prefixes({0, 64, 160}, 64), (std::vector<std::int32_t>{0, 64, 160}));
  EXPECT_EQ(mxfp8::thd_scale_capacity_tokens(160, 2, 64), 162);
  const Mxfp8ScalePlan q = Mxfp8ScalePlan::thd(160, 2, 64, 128);
  EXPECT_EQ(q.capacity_tokens, 162);
  EXPECT_EQ(q.packed_shape(), (Shape{1, 162 * 64, 4}));
  EXPECT_EQ(prefixes({0, 16, 40}, 1), (std::vector<std::int32_t>{0, 128, 256}));
  const Mxfp8ScalePlan k = Mxfp8ScalePlan::thd(40, 2, 1, 128);
  EXPECT_EQ(k.packed_shape(), (Shape{1, 256, 4}));
  // Replay with other boundaries: the prefixes change and reach the capacity exactly.
  EXPECT_EQ(prefixes({0, 65, 160}, 64), (std::vector<std::int32_t>{0, 66, 162}));
  // BSHD shapes: rows S*H rounded up to 128, groups to 4.
  const Mxfp8ScalePlan b = Mxfp8ScalePlan::bshd(3, 5, 64, 128);
  EXPECT_EQ(b.packed_shape(), (Shape{3, 384, 4}));
  EXPECT_EQ(Mxfp8ScalePlan::bshd(2, 7, 1, 64).packed_shape(), (Shape{2, 128, 4}));
  EXPECT_EQ(Mxfp8ScalePlan::bshd(2, 7, 1, 160).packed_shape(), (Shape{2, 128, 8}));
}

// The capacity bounds the padded total of every split of T tokens into N sequences, and some
// split reaches it (it is the tight bound, not a loose one).
TEST(Mxfp8Layout, CapacityBoundsEverySplitAndIsTight) {
  std::mt19937 rng(7);
  for (int rpt : {64, 32, 1, 3}) {
    for (int T : {0, 1, 5, 160, 300}) {
      for (int N : {1, 2, 3, 7}) {
        const std::int64_t cap = mxfp8::thd_scale_capacity_tokens(T, N, rpt);
        const int a = mxfp8::thd_token_alignment(rpt);
        EXPECT_EQ((cap * rpt) % 128, 0) << "rows must fill whole atoms";
        std::int64_t best = 0;
        for (int trial = 0; trial < 300; ++trial) {
          // Random cut points (empty sequences allowed); every few trials the worst-case
          // shape: N-1 sequences of length 1 (or as many as there are tokens).
          std::vector<int> cuts;
          if (trial % 3 == 0) {
            for (int b = 1; b < N; ++b) cuts.push_back(std::min(b, T));
          } else {
            for (int b = 1; b < N; ++b) cuts.push_back(std::uniform_int_distribution<int>(0, T)(rng));
          }
          std::sort(cuts.begin(), cuts.end());
          std::vector<std::int32_t> cu = {0};
          for (int c : cuts) cu.push_back(c);
          cu.push_back(T);
          const std::int64_t total = prefixes(cu, rpt).back();
          ASSERT_LE(total, cap) << "rpt " << rpt << " T " << T << " N " << N;
          best = std::max(best, total);
        }
        // Reached when min(T, N) sequences each waste a - 1 tokens or the total rounds up.
        if (a > 1 && T >= N) {
          EXPECT_EQ(best, cap) << "rpt " << rpt << " T " << T << " N " << N;
        }
      }
    }
  }
}

std::vector<std::uint8_t> random_scales(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(1, 255);  // never 0: padding is told apart by 0
  std::vector<std::uint8_t> v(n);
  for (auto& b : v) b = static_cast<std::uint8_t>(dist(rng));
  return v;
}

TEST(Mxfp8Pack, BshdPlacesEveryByteAndZeroesPadding) {
  // S*H = 5*48 = 240 rows: not a multiple of 128; D = 64: 2 groups padded to 4.
  const int B = 2, S = 5, H = 48, D = 64;
  const Mxfp8ScalePlan plan = Mxfp8ScalePlan::bshd(B, S, H, D);
  ASSERT_EQ(plan.packed_shape(), (Shape{B, 256, 4}));
  std::vector<std::uint8_t> logical = random_scales(static_cast<std::size_t>(B * S * H * 2), 1);
  Tensor packed(DType::e8m0, plan.packed_shape());
  std::fill(packed.ptr<std::uint8_t>(), packed.ptr<std::uint8_t>() + packed.numel(), 0xAA);
  ops::pack_mxfp8_scales(plan, ConstTensorView(logical.data(), DType::e8m0, {B, S, H, 2}),
                         packed.view());
  // Expected bytes: logical row of (b, token s, head h) is (b*S + s)*H + h; in slice b it is
  // row m = s*H + h.
  std::vector<std::uint8_t> expected(static_cast<std::size_t>(packed.numel()), 0);
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h)
        for (int g = 0; g < 2; ++g)
          expected[static_cast<std::size_t>(b * 256 * 4 + scale_byte_offset(s * H + h, g, 4))] =
              logical[static_cast<std::size_t>(((b * S + s) * H + h) * 2 + g)];
  const auto* got = packed.ptr<std::uint8_t>();
  for (std::size_t i = 0; i < expected.size(); ++i) ASSERT_EQ(got[i], expected[i]) << "byte " << i;
}

// Packs THD scales the way the spec describes them, independently of the library.
std::vector<std::uint8_t> expected_thd(const std::vector<std::uint8_t>& logical,
                                       const std::vector<std::int32_t>& cu, int H, int G,
                                       std::int64_t bytes) {
  const int a = mxfp8::thd_token_alignment(H);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(bytes), 0);
  std::int64_t start = 0;  // padded token prefix of the sequence
  for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
    for (int t = cu[b]; t < cu[b + 1]; ++t)
      for (int h = 0; h < H; ++h)
        for (int g = 0; g < G; ++g) {
          const std::int64_t m = start * H + (t - cu[b]) * H + h;
          out[static_cast<std::size_t>(scale_byte_offset(m, g, 4))] =
              logical[static_cast<std::size_t>((t * H + h) * G + g)];
        }
    start += (cu[b + 1] - cu[b] + a - 1) / a * a;
  }
  return out;
}

// Capture-like reuse: one plan and one packed buffer, boundaries [64, 96] then [65, 95]. Each
// call must place the scales by ITS prefixes (the stale-prefix bug of the review would leave
// [0, 64, 160] and put sequence 1 two rows off), and overwrite the padding the previous call
// left.
TEST(Mxfp8Pack, ThdPrefixesFollowEveryCall) {
  const int H = 64, G = 4, T = 160;
  const Mxfp8ScalePlan plan = Mxfp8ScalePlan::thd(T, 2, H, 128);
  const std::vector<std::uint8_t> logical = random_scales(static_cast<std::size_t>(T * H * G), 2);
  Tensor packed(DType::e8m0, plan.packed_shape());
  Tensor prefix(DType::i32, {3});
  std::fill(packed.ptr<std::uint8_t>(), packed.ptr<std::uint8_t>() + packed.numel(), 0xAA);
  for (const auto& cu : {std::vector<std::int32_t>{0, 64, 160}, std::vector<std::int32_t>{0, 65, 160},
                         std::vector<std::int32_t>{0, 1, 160}, std::vector<std::int32_t>{0, 160, 160}}) {
    ops::pack_mxfp8_scales(plan, ConstTensorView(logical.data(), DType::e8m0, {T * H, G}),
                           ConstTensorView(cu.data(), DType::i32, {3}), packed.view(),
                           prefix.view());
    const std::vector<std::int32_t> want = prefixes(cu, H);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), prefix.ptr<std::int32_t>()))
        << "cu [" << cu[0] << "," << cu[1] << "," << cu[2] << "]";
    const std::vector<std::uint8_t> expected = expected_thd(logical, cu, H, G, packed.numel());
    const auto* got = packed.ptr<std::uint8_t>();
    for (std::size_t i = 0; i < expected.size(); ++i)
      ASSERT_EQ(got[i], expected[i]) << "byte " << i << " cu[1] = " << cu[1];
  }
  // The first two layouts' prefixes, as the spec lists them.
  EXPECT_EQ(prefixes({0, 64, 160}, H), (std::vector<std::int32_t>{0, 64, 160}));
  EXPECT_EQ(prefixes({0, 65, 160}, H), (std::vector<std::int32_t>{0, 66, 162}));
}

TEST(Mxfp8Pack, ThdKeysOneRowPerToken) {
  const int G = 2, T = 40;  // D = 64
  const Mxfp8ScalePlan plan = Mxfp8ScalePlan::thd(T, 2, 1, 64);
  ASSERT_EQ(plan.packed_shape(), (Shape{1, 256, 4}));
  const std::vector<std::uint8_t> logical = random_scales(static_cast<std::size_t>(T * G), 3);
  const std::vector<std::int32_t> cu = {0, 16, 40};
  Tensor packed(DType::e8m0, plan.packed_shape());
  std::fill(packed.ptr<std::uint8_t>(), packed.ptr<std::uint8_t>() + packed.numel(), 0x55);
  Tensor prefix(DType::i32, {3});
  ops::pack_mxfp8_scales(plan, ConstTensorView(logical.data(), DType::e8m0, {T, G}),
                         ConstTensorView(cu.data(), DType::i32, {3}), packed.view(),
                         prefix.view());
  EXPECT_EQ(std::vector<std::int32_t>(prefix.ptr<std::int32_t>(), prefix.ptr<std::int32_t>() + 3),
            (std::vector<std::int32_t>{0, 128, 256}));
  // Token 16 (the first of sequence 1) sits at row 128.
  EXPECT_EQ(packed.ptr<std::uint8_t>()[scale_byte_offset(128, 1, 4)], logical[16 * G + 1]);
  const std::vector<std::uint8_t> expected = expected_thd(logical, cu, 1, G, packed.numel());
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), packed.ptr<std::uint8_t>()));
}

TEST(Mxfp8Pack, BadArgumentsNameTheArgument) {
  auto expect_error = [](auto f, const std::string& word) {
    try {
      f();
      ADD_FAILURE() << "no error, expected one naming " << word;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  const Mxfp8ScalePlan thd = Mxfp8ScalePlan::thd(10, 2, 1, 32);
  const Mxfp8ScalePlan bshd = Mxfp8ScalePlan::bshd(2, 5, 1, 32);
  std::vector<std::uint8_t> logical(10, 1);
  Tensor packed_thd(DType::e8m0, thd.packed_shape()), packed_bshd(DType::e8m0, bshd.packed_shape());
  Tensor prefix(DType::i32, {3});
  const std::vector<std::int32_t> cu = {0, 4, 10}, bad_cu = {0, 4, 9}, desc = {0, 6, 4};
  const ConstTensorView lv(logical.data(), DType::e8m0, {10, 1});
  expect_error([&] { ops::pack_mxfp8_scales(thd, lv, packed_thd.view()); }, "THD");
  expect_error([&] {
    ops::pack_mxfp8_scales(bshd, lv, ConstTensorView(cu.data(), DType::i32, {3}),
                           packed_bshd.view(), prefix.view());
  }, "BSHD");
  expect_error([&] {
    ops::pack_mxfp8_scales(thd, lv, ConstTensorView(bad_cu.data(), DType::i32, {3}),
                           packed_thd.view(), prefix.view());
  }, "cu_seqlens");
  expect_error([&] {
    ops::pack_mxfp8_scales(thd, lv, ConstTensorView(desc.data(), DType::i32, {3}),
                           packed_thd.view(), prefix.view());
  }, "non-decreasing");
  expect_error([&] {
    ops::pack_mxfp8_scales(thd, lv, ConstTensorView(cu.data(), DType::i32, {3}),
                           packed_bshd.view(), prefix.view());
  }, "packed_scales");
  expect_error([&] {
    ops::pack_mxfp8_scales(thd, ConstTensorView(logical.data(), DType::e8m0, {5, 1}),
                           ConstTensorView(cu.data(), DType::i32, {3}), packed_thd.view(),
                           prefix.view());
  }, "logical_scales");
  expect_error([] { (void)Mxfp8ScalePlan::thd(10, 2, 1, 48); }, "cols");
}

}  // namespace
}  // namespace csattn
