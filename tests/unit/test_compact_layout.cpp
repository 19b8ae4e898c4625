// The compact candidate layout (spec 03 §2.2) and the THD compact K layout (§2.5): closed
// forms against brute force, the spec's worked examples, 64-bit offsets, static capacity
// bounds, source_row_map, the "+2" bound and local -> logical / physical row mapping.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/compact_layout.hpp"
#include "csattn/error.hpp"
#include "csattn/ops.hpp"
#include "csattn/plan.hpp"

namespace csattn {
namespace {

using compact::prefix_count;
using compact::row_candidates;
using compact::rows_candidates_before;

// Sum of n(t') for t' < t, by brute force.
std::int64_t brute_before(std::int64_t o, std::int64_t t, int r, std::int64_t len_k) {
  std::int64_t s = 0;
  for (std::int64_t u = 0; u < t; ++u) s += std::clamp<std::int64_t>((o + u + 1) / r, 0, len_k);
  return s;
}

TEST(CompactLayout, SpecWorkedExample) {
  // r = 4, offset 0: n(t) = 0,0,0,1,1,1,1,2; row starts Gfun(t) = 0,0,0,0,1,2,3,4; PBF = 6.
  const std::int64_t n[] = {0, 0, 0, 1, 1, 1, 1, 2};
  const std::int64_t start[] = {0, 0, 0, 0, 1, 2, 3, 4};
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(row_candidates(0, t, 4, 1000), n[t]) << t;
    EXPECT_EQ(prefix_count(t, 4), start[t]) << t;
    EXPECT_EQ(rows_candidates_before(0, t, 4, 1000), start[t]) << t;
  }
  EXPECT_EQ(prefix_count(8, 4), 6);
  // BSHD with S_q = 8, S_k = 2: the plan's buffer is B * PBF.
  CompactIndexerGeometry g;
  g.format = QkvFormat::bshd;
  g.batch = 3;
  g.max_seqlen_q = 8;
  g.max_seqlen_k = 2;
  g.heads = 2;
  g.head_dim = 32;
  g.topk = 1;
  EXPECT_EQ(CompactIndexerPlan::make(g).cand_capacity, 3 * 6);
}

TEST(CompactLayout, ClosedFormsMatchBruteForce) {
  for (int r : {1, 2, 3, 4, 7, 128})
    for (int n = 0; n <= 300; ++n) {
      std::int64_t s = 0;
      for (int m = 0; m <= n; ++m) s += m / r;
      ASSERT_EQ(prefix_count(n, r), s) << "n " << n << " r " << r;
    }
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    const int r = std::uniform_int_distribution<int>(1, 9)(rng);
    const std::int64_t o = std::uniform_int_distribution<int>(0, 60)(rng);
    const std::int64_t t = std::uniform_int_distribution<int>(0, 80)(rng);
    const std::int64_t len_k = std::uniform_int_distribution<int>(0, 25)(rng);
    ASSERT_EQ(rows_candidates_before(o, t, r, len_k), brute_before(o, t, r, len_k))
        << "o " << o << " t " << t << " r " << r << " len_k " << len_k;
    // Without clamping it is the spec's Gfun(o + t) - Gfun(o).
    if ((o + t) / r <= len_k) {
      ASSERT_EQ(rows_candidates_before(o, t, r, len_k), prefix_count(o + t, r) - prefix_count(o, r));
    }
  }
}

TEST(CompactLayout, OffsetsAreSixtyFourBit) {
  // A 2^31 - 1 row sequence has ~2^59 candidates; 32-bit arithmetic would wrap.
  const std::int64_t n = (std::int64_t{1} << 31) - 1;
  const std::int64_t q = n / 4, s = n % 4;
  const __int128 exact = static_cast<__int128>(4) * q * (q - 1) / 2 + static_cast<__int128>(q) * (s + 1);
  EXPECT_EQ(static_cast<__int128>(prefix_count(n, 4)), exact);
  EXPECT_GT(prefix_count(n, 4), std::int64_t{1} << 57);
  EXPECT_EQ(rows_candidates_before(0, n, 4, n), prefix_count(n, 4));
}

TEST(CompactLayout, CandBatchOffsets) {
  // THD: lengths 8 and 5 with causal offsets 0 and 6, K lengths 2 and 100.
  const std::vector<std::int32_t> cu_q = {0, 8, 13}, cu_k = {0, 2, 102}, off = {0, 6};
  std::vector<std::int64_t> out(3);
  compact::cand_batch_offsets(cu_q, cu_k, off, 4, out);
  // Segment 1 rows see (6 + t + 1) div 4 = 1, 2, 2, 2, 2 keys.
  EXPECT_EQ(out, (std::vector<std::int64_t>{0, 6, 6 + 9}));
  // BSHD slabs: b * PBF + Gfun(t) is the THD formula with equal lengths.
  const std::vector<std::int32_t> bq = {0, 37, 74, 111}, bk = {0, 9, 18, 27};
  compact::cand_batch_offsets(bq, bk, {}, 4, out = std::vector<std::int64_t>(4));
  for (int b = 0; b < 4; ++b) EXPECT_EQ(out[b], b * prefix_count(37, 4));
}

// The static capacity bounds the candidates of every layout with the static shapes.
TEST(CompactLayout, CapacityBoundsRandomLayouts) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 3000; ++trial) {
    const int r = std::uniform_int_distribution<int>(1, 5)(rng);
    const int B = std::uniform_int_distribution<int>(1, 6)(rng);
    const int L = std::uniform_int_distribution<int>(1, 40)(rng);
    const int Lk = std::uniform_int_distribution<int>(0, 15)(rng);
    const bool offsets = trial % 2;
    std::vector<std::int32_t> cu_q = {0}, cu_k = {0}, off;
    for (int b = 0; b < B; ++b) {
      cu_q.push_back(cu_q.back() + std::uniform_int_distribution<int>(0, L)(rng));
      cu_k.push_back(cu_k.back() + std::uniform_int_distribution<int>(0, Lk)(rng));
      off.push_back(offsets ? std::uniform_int_distribution<int>(0, 50)(rng) : 0);
    }
    std::vector<std::int64_t> cbo(static_cast<std::size_t>(B) + 1);
    compact::cand_batch_offsets(cu_q, cu_k, off, r, cbo);
    const std::int64_t T = cu_q.back();
    const std::int64_t cap = compact::cand_capacity(T, B, L, Lk, r, offsets);
    ASSERT_LE(cbo.back(), cap) << "trial " << trial;
    // Every window of R consecutive rows fits the per-pass bound.
    const int R = std::uniform_int_distribution<int>(1, 10)(rng);
    const std::int64_t per_pass = compact::cand_capacity_per_pass(R, L, Lk, r, offsets);
    std::vector<std::int64_t> row_n;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < cu_q[b + 1] - cu_q[b]; ++t)
        row_n.push_back(row_candidates(off[b], t, r, cu_k[b + 1] - cu_k[b]));
    for (std::size_t i = 0; i < row_n.size(); ++i) {
      std::int64_t s = 0;
      for (std::size_t j = i; j < std::min(row_n.size(), i + R); ++j) s += row_n[j];
      ASSERT_LE(s, per_pass) << "trial " << trial;
    }
  }
  // Tight without offsets: full-length segments reach it.
  EXPECT_EQ(compact::cand_capacity(3 * 40 + 10, 4, 40, 10, 4, false),
            3 * prefix_count(40, 4) + prefix_count(10, 4));
  // About half the dense footprint.
  EXPECT_LT(2 * compact::cand_capacity(4096, 1, 4096, 1024, 4, false), 4096 * 1024 + 4096);
}

// ---- THD compact K layout ---------------------------------------------------------------------

TEST(CompactKLayout, SpecExample) {
  // r = 4, logical cu_k = [0,1,3,4], R = 5 rows, Q cu = [0,0,6,8,8] (last: synthetic, empty).
  const std::vector<std::int32_t> cu_q = {0, 0, 6, 8, 8}, cu_k = {0, 1, 3, 4};
  const ops::ThdCompactKLayout L = ops::build_thd_compact_k_layout(cu_q, cu_k, 5, 4);
  EXPECT_TRUE(L.synthetic_segment);
  EXPECT_EQ(L.real_segments, 3);
  EXPECT_EQ(L.cu_seqlens_k, (std::vector<std::int32_t>{0, 3, 6, 8, 8}));
  EXPECT_EQ(L.source_row_map, (std::vector<std::int32_t>{0, 5, 5, 1, 2, 5, 3, 5}));
  EXPECT_EQ(L.logical_cu_seqlens_k, (std::vector<std::int32_t>{0, 1, 3, 4, 5}));
  EXPECT_EQ(L.physical_rows(), 5 + 3);
  EXPECT_EQ(L.logical_row(1, 1), 2);
  EXPECT_EQ(L.physical_row(1, 1), 4);
  EXPECT_EQ(L.max_seqlen_k, 3);

  // Packed K rows = [K0, 0, 0 | K1, K2, 0 | K3, 0].
  const int D = 2;
  std::vector<float> k = {1, 1, 2, 2, 3, 3, 4, 4, 9, 9};  // rows K0..K3 and the capacity row
  Tensor out(DType::f32, {8, D});
  std::fill(out.ptr<float>(), out.ptr<float>() + out.numel(), -7.0f);
  ops::pack_thd_compact_k(ConstTensorView(k.data(), DType::f32, {5, D}), L, out.view());
  EXPECT_EQ(out.to_f32(), (std::vector<float>{1, 1, 0, 0, 0, 0, 2, 2, 3, 3, 0, 0, 4, 4, 0, 0}));
}

TEST(CompactKLayout, SingleSegmentIdentity) {
  const std::vector<std::int32_t> cu_q = {0, 128}, cu_k = {0, 512};
  const ops::ThdCompactKLayout L = ops::build_thd_compact_k_layout(cu_q, cu_k, 512, 4);
  EXPECT_FALSE(L.synthetic_segment);
  EXPECT_EQ(L.cu_seqlens_k, (std::vector<std::int32_t>{0, 513}));
  std::vector<std::int32_t> identity(513);
  for (int i = 0; i < 513; ++i) identity[i] = i;  // row 512 is the sentinel R = 512: zeros
  EXPECT_EQ(L.source_row_map, identity);
  EXPECT_EQ(L.logical_cu_seqlens_k, cu_k);
}

TEST(CompactKLayout, SyntheticSegmentGetsItsPaddingRows) {
  // 9 synthetic query rows need ceil(9/4) = 3 zero key rows; the remaining capacity (2) is
  // spread over the 2 real segments.
  const std::vector<std::int32_t> cu_q = {0, 8, 12, 21}, cu_k = {0, 2, 3};
  const ops::ThdCompactKLayout L = ops::build_thd_compact_k_layout(cu_q, cu_k, 8, 4);
  EXPECT_EQ(L.cu_seqlens_k, (std::vector<std::int32_t>{0, 4, 7, 10}));
  EXPECT_EQ(L.physical_rows(), 8 + 2);
  EXPECT_EQ(L.source_row_map, (std::vector<std::int32_t>{0, 1, 8, 8, 2, 8, 8, 8, 8, 8}));
  // Not enough capacity for the synthetic segment: a clear error.
  try {
    (void)ops::build_thd_compact_k_layout(cu_q, cu_k, 5, 4);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k_rows"), std::string::npos) << e.what();
  }
}

// With the static capacity min(T div r, N (max_len div r)) every compact segment is at most
// the logical one + 2; every segment keeps its invisible zero row; local ids map back.
TEST(CompactKLayout, PlusTwoBoundAndInvisibleRows) {
  std::mt19937 rng(4);
  const int r = 4;
  for (int trial = 0; trial < 2000; ++trial) {
    const int N = std::uniform_int_distribution<int>(1, 8)(rng);
    std::vector<std::int32_t> cu_q = {0}, cu_k = {0};
    int max_len = 0;
    for (int b = 0; b < N; ++b) {
      const int len = std::uniform_int_distribution<int>(0, 70)(rng);
      max_len = std::max(max_len, len);
      cu_q.push_back(cu_q.back() + len);
      cu_k.push_back(cu_k.back() + len / r);
    }
    const std::int64_t T = cu_q.back();
    const std::int64_t R = std::min<std::int64_t>(T / r, std::int64_t{N} * (max_len / r));
    const ops::ThdCompactKLayout L = ops::build_thd_compact_k_layout(cu_q, cu_k, R, r);
    int logical_max = 0;
    for (int b = 0; b < N; ++b) logical_max = std::max(logical_max, cu_k[b + 1] - cu_k[b]);
    ASSERT_LE(L.max_seqlen_k, ops::thd_compact_max_seqlen_k(logical_max)) << "trial " << trial;
    ASSERT_EQ(L.physical_rows(), R + N);
    for (int b = 0; b < N; ++b) {
      const int valid = cu_k[b + 1] - cu_k[b];
      const int len = L.cu_seqlens_k[b + 1] - L.cu_seqlens_k[b];
      ASSERT_GE(len, valid + 1);
      // Queries of the segment see at most floor(len_q / r) = valid keys: never the padding.
      ASSERT_LE((cu_q[b + 1] - cu_q[b]) / r, valid);
      for (int j = 0; j < len; ++j) {
        const std::int32_t src = L.source_row_map[static_cast<std::size_t>(L.physical_row(b, j))];
        ASSERT_EQ(src, j < valid ? L.logical_row(b, j) : R);
      }
    }
  }
}

TEST(CompactKLayout, BadInputsNameTheArgument) {
  auto expect_error = [](auto f, const std::string& word) {
    try {
      f();
      ADD_FAILURE() << "no error, expected one naming " << word;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  const std::vector<std::int32_t> cu_k = {0, 1, 3};
  expect_error([&] { (void)ops::build_thd_compact_k_layout(std::vector<std::int32_t>{0, 4, 8, 9, 10}, cu_k, 5, 4); },
               "cu_seqlens_q");
  expect_error([&] { (void)ops::build_thd_compact_k_layout(std::vector<std::int32_t>{0, 4, 8}, cu_k, 2, 4); },
               "k_rows");
  expect_error([&] { (void)ops::build_thd_compact_k_layout(std::vector<std::int32_t>{0, 4, 8}, std::vector<std::int32_t>{1, 3, 4}, 5, 4); },
               "cu_seqlens_k");
  const ops::ThdCompactKLayout L = ops::build_thd_compact_k_layout(std::vector<std::int32_t>{0, 4, 8}, cu_k, 3, 4);
  Tensor k(DType::f32, {4, 2}), out(DType::f32, {5, 2});
  expect_error([&] { ops::pack_thd_compact_k(k.view(), L, out.view()); }, "k has shape");
  Tensor k3(DType::f32, {3, 2}), out_bad(DType::f32, {4, 2});
  expect_error([&] { ops::pack_thd_compact_k(k3.view(), L, out_bad.view()); }, "out has shape");
}

}  // namespace
}  // namespace csattn
