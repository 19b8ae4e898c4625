// The multi-row CUDA indexers - the wgmma kernel (indexer_topk_wgmma.cu, the default) and its
// mma.sync reference, the tiled kernel (indexer_topk_tiled.cu) - against each other and the
// one-row kernels, on the same device inputs: random inputs (vs mma1: ids exactly equal, the two sum each score in
// the same tree; vs baseline: same sets up to one boundary id, its CUDA-core dots round
// differently), exact-arithmetic inputs (every sum exact in fp32, so all kernels and the host
// reference must agree id for id, ties included), all-equal keys (pure ties), rows with
// n <= K, n = K + 1, padding rows, several segments whose boundaries cut the CTAs' row blocks,
// and a 200K-token segment that the one-row kernels refuse. Outputs are poisoned before every
// run (0x5A bytes: an id no row has; not 0xFF, which reads as the -1 padding) and the scratch
// is filled with NaN. Skips without a GPU.
#ifdef CSATTN_HAVE_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "csattn/error.hpp"
#include "csattn/layer.hpp"
#include "cuda/indexer_topk_plan.hpp"
#include "cuda/indexer_topk_tiled.hpp"
#include "cuda/kernels.hpp"
#include "cuda_test_util.hpp"
#include "test_util.hpp"

namespace csattn {
namespace {

using testing_util::DeviceArray;

#define CU(call) ASSERT_EQ((call), cudaSuccess) << #call

std::uint16_t bf16_bits(float x) {  // round to nearest even (inputs are finite)
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float bf16_value(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// one_bin: every visible entry's score in [1, 1.25) - one first radix digit - yet mostly
// distinct below it (see Problem), so the top-k threshold falls in the later digits.
enum class Values { random, exact, equal_keys, one_bin };

// One indexer problem: segments (real, padded lengths), shapes, host copies of the inputs.
struct Problem {
  int HI = 64, DI = 128, K = 512;
  std::vector<int> real, padded;
  std::vector<std::int32_t> cu_real, cu_padded, comp_start;
  int T = 0, Nc = 0, max_seg = 0;
  std::vector<float> q, w, k;  // bf16 values: [T, HI, DI], [T, HI], [Nc, DI]

  Problem(int hi, int di, int k_top, std::vector<int> real_len, std::vector<int> padded_len,
          Values values, std::uint64_t seed)
      : HI(hi), DI(di), K(k_top), real(std::move(real_len)), padded(std::move(padded_len)) {
    cu_real = {0};
    cu_padded = {0};
    comp_start = {0};
    for (std::size_t b = 0; b < real.size(); ++b) {
      cu_real.push_back(cu_real.back() + real[b]);
      cu_padded.push_back(cu_padded.back() + padded[b]);
      comp_start.push_back(comp_start.back() + padded[b] / 4);
      max_seg = std::max(max_seg, padded[b]);
    }
    T = cu_padded.back();
    Nc = comp_start.back();
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> small(-2, 2);
    const float weights[5] = {-1.0f, -0.5f, 0.5f, 1.0f, 2.0f};
    std::uniform_int_distribution<int> pick(0, 4);
    auto fill = [&](std::vector<float>& v, std::size_t n, bool weight) {
      v.resize(n);
      for (float& x : v) {
        if (values == Values::random) x = weight ? 0.1f * normal(rng) : normal(rng);
        else x = weight ? weights[pick(rng)] : static_cast<float>(small(rng));
        x = bf16_value(bf16_bits(x));
      }
    };
    fill(q, static_cast<std::size_t>(T) * HI * DI, false);
    fill(w, static_cast<std::size_t>(T) * HI, true);
    fill(k, static_cast<std::size_t>(Nc) * DI, false);
    if (values == Values::equal_keys)  // every key the same vector: every score ties
      for (int j = 1; j < Nc; ++j) std::copy(k.begin(), k.begin() + DI, k.begin() + static_cast<long>(j) * DI);
    if (values == Values::one_bin) {
      // Head 0 alone weighs (w 1, the others 0), q_0 = (1, 2^-8, 0, ..) and key j = (1 + a / 128,
      // 1 + b / 128, 0, ..) with a < 31, b < 128: score 1 + a / 128 + (1 + b / 128) / 256,
      // exact in fp32, in [1, 1.25) - the same sign, exponent and top two mantissa bits, one
      // first digit - with a and b in the second and third digits (4K values: some ties).
      std::uniform_int_distribution<int> a_of(0, 30), b_of(0, 127);
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < HI; ++h) {
          w[static_cast<std::size_t>(t) * HI + h] = h == 0 ? 1.0f : 0.0f;
          if (h == 0) {
            float* qh = &q[static_cast<std::size_t>(t) * HI * DI];
            std::fill(qh, qh + DI, 0.0f);
            qh[0] = 1.0f;
            qh[1] = 1.0f / 256.0f;
          }
        }
      for (int j = 0; j < Nc; ++j) {
        float* kj = &k[static_cast<std::size_t>(j) * DI];
        std::fill(kj, kj + DI, 0.0f);
        kj[0] = 1.0f + static_cast<float>(a_of(rng)) / 128.0f;
        kj[1] = 1.0f + static_cast<float>(b_of(rng)) / 128.0f;
      }
    }
  }

  cuda::LayerDims dims() const {
    cuda::LayerDims d;
    d.rows = T;
    d.segments = static_cast<int>(real.size());
    d.max_seg_len = max_seg;
    d.ratio = 4;
    d.coff = 2;
    d.comp_capacity = T / 4;
    d.index_heads = HI;
    d.index_dim = DI;
    d.topk = K;
    return d;
  }
  int segment_of(int t) const {
    int b = 0;
    while (cu_padded[b + 1] <= t) ++b;
    return b;
  }
  int visible(int t) const {
    const int b = segment_of(t), pos = t - cu_padded[b];
    if (pos >= real[b]) return 0;  // padding row
    return std::min((pos + 1) / 4, padded[b] / 4);
  }
  // Row t's index score of its visible entry j, in double (exact for Values::exact).
  double score(int t, int j) const {
    const int base = comp_start[segment_of(t)];
    double acc = 0.0;
    for (int h = 0; h < HI; ++h) {
      double dot = 0.0;
      const float* qh = &q[(static_cast<std::size_t>(t) * HI + h) * DI];
      const float* kj = &k[static_cast<std::size_t>(base + j) * DI];
      for (int c = 0; c < DI; ++c) dot += static_cast<double>(qh[c]) * kj[c];
      acc += w[static_cast<std::size_t>(t) * HI + h] * std::max(dot, 0.0);
    }
    return acc == 0.0 ? 0.0 : acc;  // -0 ties with +0
  }
  // Host reference of row t (exact for Values::exact / equal_keys): ties to the smallest id.
  std::vector<std::int32_t> reference_row(int t) const {
    const int n = visible(t);
    std::vector<double> s(n);
    for (int j = 0; j < n; ++j) s[j] = score(t, j);
    std::vector<std::int32_t> ids(n);
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return s[a] > s[b]; });
    ids.resize(std::min(n, K));
    std::sort(ids.begin(), ids.end());
    ids.resize(K, -1);
    return ids;
  }
};

// Device copies of a problem and one launcher per kernel (a failed allocation throws).
class DeviceProblem {
 public:
  explicit DeviceProblem(const Problem& p)
      : p_(p), d_(p.dims()), q_(p.q.size()), w_(p.w.size()),
        k_(std::max<std::size_t>(static_cast<std::size_t>(d_.comp_capacity) * p.DI, 1)),
        topk_(static_cast<std::size_t>(p.T) * p.K),
        scratch_(std::max<std::size_t>(cuda::indexer_topk_scratch_bytes(d_), 1)) {}

  void upload() {
    metadata_.build(d_, p_.cu_real, p_.cu_padded);
    auto bits = [](const std::vector<float>& v) {
      std::vector<std::uint16_t> b(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) b[i] = bf16_bits(v[i]);
      return b;
    };
    const auto qb = bits(p_.q);
    // The kernels' contract: keys hold comp_capacity rows (more than the real count when
    // segments are not multiples of the ratio); the rows past it are NaN, never selected.
    auto kb = bits(p_.k);
    kb.resize(k_.size(), 0x7FC0);
    q_.upload(qb);
    k_.upload(kb);
    w_.upload(p_.w);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  const cuda::DeviceMetadata& meta() const { return metadata_.meta(); }

  // Runs one kernel on poisoned outputs and NaN scratch; the [T, K] ids.
  std::vector<std::int32_t> run(cuda::IndexerKernel which, const cuda::SelectedScores& scores = {}) {
    return launched([&](const cuda::bf16* q, const cuda::bf16* k) {
      cuda::launch_indexer_topk(d_, meta(), q, w_.get(), k, topk_.get(), scratch_.get(), nullptr, which, scores);
    });
  }
  // The wgmma kernel's measurement instance (phase stamps into `stamps`, zeroed here).
  std::vector<std::int32_t> run_wgmma_stamped(DeviceArray<unsigned>& stamps) {
    stamps.fill_bytes(0);
    return launched([&](const cuda::bf16* q, const cuda::bf16* k) {
      cuda::launch_indexer_topk_wgmma(d_, meta(), q, w_.get(), k, topk_.get(), scratch_.get(), nullptr, stamps.get());
    });
  }
  // The overlapped kernel's measurement instance (clock64 totals into `totals`, zeroed here).
  std::vector<std::int32_t> run_overlap_totals(DeviceArray<unsigned long long>& totals) {
    totals.fill_bytes(0);
    return launched([&](const cuda::bf16* q, const cuda::bf16* k) {
      cuda::launch_indexer_topk_wgmma_overlap(d_, meta(), q, w_.get(), k, topk_.get(), scratch_.get(), nullptr, {},
                                              totals.get());
    });
  }

 private:
  // launch(q, k) on poisoned ids and NaN scratch, then the [T, K] ids.
  template <class Launch>
  std::vector<std::int32_t> launched(Launch&& launch) {
    topk_.fill_bytes(0x5A);
    scratch_.fill_bytes(0xFF);
    launch(reinterpret_cast<const cuda::bf16*>(q_.get()), reinterpret_cast<const cuda::bf16*>(k_.get()));
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return topk_.download();
  }

  const Problem& p_;
  cuda::LayerDims d_;
  testing_util::DeviceMetadataArrays metadata_;
  DeviceArray<std::uint16_t> q_;
  DeviceArray<float> w_;
  DeviceArray<std::uint16_t> k_;
  DeviceArray<std::int32_t> topk_;
  DeviceArray<unsigned char> scratch_;
};

// The output contract of every row: min(n, K) distinct ids in [0, n) ascending, then -1; rows
// with n <= K hold exactly 0..n-1.
void expect_contract(const Problem& p, const std::vector<std::int32_t>& ids, const std::string& what) {
  int bad = 0;
  for (int t = 0; t < p.T && bad < 5; ++t) {
    const int n = p.visible(t), take = std::min(n, p.K);
    const std::int32_t* r = &ids[static_cast<std::size_t>(t) * p.K];
    bool good = true;
    for (int i = 0; i < p.K; ++i) {
      if (i < take) good &= r[i] >= 0 && r[i] < n && (i == 0 || r[i] > r[i - 1]) && (n > p.K || r[i] == i);
      else good &= r[i] == -1;
    }
    if (!good) {
      ++bad;
      ADD_FAILURE() << what << ": row " << t << " (n = " << n << ") breaks the output contract";
    }
  }
}

void expect_equal_rows(const Problem& p, const std::vector<std::int32_t>& a,
                       const std::vector<std::int32_t>& b, const std::string& what) {
  int bad = 0;
  for (int t = 0; t < p.T; ++t) {
    const auto* ra = &a[static_cast<std::size_t>(t) * p.K];
    const auto* rb = &b[static_cast<std::size_t>(t) * p.K];
    if (!std::equal(ra, ra + p.K, rb) && ++bad <= 5)
      ADD_FAILURE() << what << ": row " << t << " (n = " << p.visible(t) << ") differs";
  }
  EXPECT_EQ(bad, 0) << what << ": rows differing";
}

// expect_topk_close of test_util.hpp: per row the same count and at least
// max(1, n - 1) common ids; at most 1 row in 20 differs at all.
void expect_close_rows(const Problem& p, const std::vector<std::int32_t>& a,
                       const std::vector<std::int32_t>& b, const std::string& what) {
  int differing = 0;
  for (int t = 0; t < p.T; ++t) {
    std::set<int> sa, sb;
    for (int i = 0; i < p.K; ++i) {
      if (a[static_cast<std::size_t>(t) * p.K + i] >= 0) sa.insert(a[static_cast<std::size_t>(t) * p.K + i]);
      if (b[static_cast<std::size_t>(t) * p.K + i] >= 0) sb.insert(b[static_cast<std::size_t>(t) * p.K + i]);
    }
    ASSERT_EQ(sa.size(), sb.size()) << what << ": row " << t;
    int common = 0;
    for (int id : sa) common += sb.count(id) ? 1 : 0;
    const int n = static_cast<int>(sb.size());
    EXPECT_GE(common, std::max(n == 0 ? 0 : 1, n - 1)) << what << ": row " << t;
    differing += common != n;
  }
  EXPECT_LE(differing, std::max(1, p.T / 20)) << what;
}

void expect_reference_rows(const Problem& p, const std::vector<std::int32_t>& ids,
                           const std::vector<int>& rows, const std::string& what) {
  for (int t : rows) {
    const auto ref = p.reference_row(t);
    const auto* r = &ids[static_cast<std::size_t>(t) * p.K];
    EXPECT_TRUE(std::equal(ref.begin(), ref.end(), r))
        << what << ": row " << t << " (n = " << p.visible(t) << ") differs from the host reference";
  }
}

// Segment lengths (real, padded) around K: a tail past n = K + 1 with padding rows, a
// 3-token segment, a long one, a 1-token one, one shorter than 4K (every n <= K), and odd
// lengths so that the CTAs' 4-row blocks straddle segment boundaries.
struct Shape {
  int HI, DI, K;
};
Problem make_problem(const Shape& s, Values v, std::uint64_t seed) {
  const int K = s.K;
  return Problem(s.HI, s.DI, K, {4 * K + 5, 3, 9 * K + 13, 1, 4 * K - 1, 2 * K + 3},
                 {4 * K + 8, 4, 9 * K + 17, 1, 4 * K + 1, 2 * K + 3}, v, seed);
}

// Sampled rows for the host reference: around n = K and n = K + 1, segment ends, padding.
std::vector<int> sample_rows(const Problem& p) {
  std::set<int> rows;
  for (std::size_t b = 0; b + 1 < p.cu_padded.size(); ++b) {
    const int s = p.cu_padded[b], e = p.cu_padded[b + 1];
    for (int t : {s, s + 4 * p.K - 1, s + 4 * p.K + 3, s + 4 * p.K + 4, s + 4 * p.K + 7, e - 5, e - 2, e - 1})
      if (t >= s && t < e) rows.insert(t);
  }
  return {rows.begin(), rows.end()};
}

class CudaIndexer : public ::testing::TestWithParam<Shape> {};

// Random inputs: tiled == mma1 id for id (same score tree); tiled ~ baseline; wgmma == tiled
// id for id (same tree; wgmma and mma.sync give the same per-head dots, first seen on the
// H200 on 2026-12-04) and bitwise repeatable.
TEST_P(CudaIndexer, TiledMatchesOneRowKernelsRandom) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(GetParam(), Values::random, 11);
  DeviceProblem dev(p);
  dev.upload();
  const auto tiled = dev.run(cuda::IndexerKernel::tiled);
  expect_contract(p, tiled, "tiled");
  const auto base = dev.run(cuda::IndexerKernel::baseline);
  expect_contract(p, base, "baseline");
  expect_close_rows(p, tiled, base, "tiled vs baseline");
  if (p.DI % 64 == 0) {
    const auto mma1 = dev.run(cuda::IndexerKernel::mma1);
    expect_equal_rows(p, tiled, mma1, "tiled vs mma1");
  }
  const auto again = dev.run(cuda::IndexerKernel::tiled);
  expect_equal_rows(p, tiled, again, "tiled run twice");
  const auto wg = dev.run(cuda::IndexerKernel::wgmma);
  expect_contract(p, wg, "wgmma");
  expect_equal_rows(p, wg, tiled, "wgmma vs tiled");
  expect_equal_rows(p, wg, dev.run(cuda::IndexerKernel::wgmma), "wgmma run twice");
  // The overlapped kernel (the default): the same scores, so the same ids, run after run.
  const auto ov = dev.run(cuda::IndexerKernel::wgmma_overlap);
  expect_contract(p, ov, "wgmma_overlap");
  expect_equal_rows(p, ov, wg, "wgmma_overlap vs wgmma");
  expect_equal_rows(p, ov, dev.run(cuda::IndexerKernel::wgmma_overlap), "wgmma_overlap run twice");
}

// Exact-arithmetic inputs (small integers, weights in {-1, -1/2, 1/2, 1, 2}): every kernel
// and the host reference agree id for id, the many ties included.
TEST_P(CudaIndexer, TiledMatchesOneRowKernelsExact) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(GetParam(), Values::exact, 12);
  DeviceProblem dev(p);
  dev.upload();
  const auto tiled = dev.run(cuda::IndexerKernel::tiled);
  expect_contract(p, tiled, "tiled");
  expect_equal_rows(p, tiled, dev.run(cuda::IndexerKernel::baseline), "tiled vs baseline");
  expect_equal_rows(p, tiled, dev.run(cuda::IndexerKernel::mma1), "tiled vs mma1");
  expect_reference_rows(p, tiled, sample_rows(p), "tiled");
  const auto wg = dev.run(cuda::IndexerKernel::wgmma);
  expect_contract(p, wg, "wgmma");
  expect_equal_rows(p, wg, tiled, "wgmma vs tiled");
  expect_reference_rows(p, wg, sample_rows(p), "wgmma");
  const auto ov = dev.run(cuda::IndexerKernel::wgmma_overlap);
  expect_contract(p, ov, "wgmma_overlap");
  expect_equal_rows(p, ov, tiled, "wgmma_overlap vs tiled");
  expect_reference_rows(p, ov, sample_rows(p), "wgmma_overlap");
}

// The selected ids' scores (SelectedScores; the layer's forward takes them as the sparse
// loss's predictor logits): each wgmma kernel writes, for every row it
// selects by radix (n > K), the score of each selected id beside it at the given stride -
// exactly the host's on exact inputs - and nothing else (NaN-poisoned entries of the other
// rows and of the stride's gaps stay NaN); its ids are the same as without them.
TEST_P(CudaIndexer, SelectedScoresAreTheIdsScores) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(GetParam(), Values::exact, 15);
  DeviceProblem dev(p);
  dev.upload();
  const auto plain = dev.run(cuda::IndexerKernel::wgmma);
  const std::size_t entries = static_cast<std::size_t>(p.T) * p.K;
  for (auto which : {cuda::IndexerKernel::wgmma, cuda::IndexerKernel::wgmma_overlap}) {
    SCOPED_TRACE(which == cuda::IndexerKernel::wgmma ? "wgmma" : "wgmma_overlap");
    DeviceArray<float> out(2 * entries);
    out.fill_bytes(0xFF);
    const auto ids = dev.run(which, cuda::SelectedScores{out.get(), 2});
    expect_equal_rows(p, ids, plain, "with scores vs without");
    const std::vector<float> got = out.download();
    int checked = 0;
    for (int t = 0; t < p.T; ++t)
      for (int k = 0; k < p.K; ++k) {
        const std::size_t e = static_cast<std::size_t>(t) * p.K + k;
        ASSERT_TRUE(std::isnan(got[2 * e + 1])) << "row " << t << ": the stride's gap written";
        if (p.visible(t) > p.K) {
          ASSERT_EQ(static_cast<double>(got[2 * e]), p.score(t, ids[e])) << "row " << t << " k " << k;
          ++checked;
        } else {
          ASSERT_TRUE(std::isnan(got[2 * e])) << "row " << t << " (n <= K) got a score";
        }
      }
    EXPECT_GT(checked, 0);
  }
}

// A batch of fewer rows than the ratio (a CSA layer's smallest input, or a CP rank's share):
// no compressed row exists (comp_capacity 0), so every row's ids are -1. The wgmma kernel
// takes its key tiles through a TMA map over comp_capacity rows, which it must skip here.
TEST(CudaIndexerTiny, NoCompressedRowsGiveEmptyRows) {
  SKIP_WITHOUT_GPU();
  const Problem p(64, 128, 32, {2, 1}, {2, 1}, Values::random, 14);
  ASSERT_EQ(p.dims().comp_capacity, 0);
  DeviceProblem dev(p);
  dev.upload();
  for (auto [name, which] : {std::pair{"wgmma", cuda::IndexerKernel::wgmma},
                             std::pair{"wgmma_overlap", cuda::IndexerKernel::wgmma_overlap},
                             std::pair{"tiled", cuda::IndexerKernel::tiled},
                             std::pair{"automatic", cuda::IndexerKernel::automatic}}) {
    const auto ids = dev.run(which);
    expect_contract(p, ids, name);
    for (std::int32_t id : ids) ASSERT_EQ(id, -1) << name;
  }
}

// Every key equal: every row's scores tie, so the top K must be ids 0..K-1.
TEST_P(CudaIndexer, AllTiesTakeTheSmallestIds) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(GetParam(), Values::equal_keys, 13);
  DeviceProblem dev(p);
  dev.upload();
  const auto tiled = dev.run(cuda::IndexerKernel::tiled);
  expect_contract(p, tiled, "tiled");
  for (int t = 0; t < p.T; ++t) {
    const int take = std::min(p.visible(t), p.K);
    for (int i = 0; i < take; ++i)
      ASSERT_EQ(tiled[static_cast<std::size_t>(t) * p.K + i], i) << "row " << t;
  }
  expect_equal_rows(p, tiled, dev.run(cuda::IndexerKernel::mma1), "tiled vs mma1");
  expect_equal_rows(p, dev.run(cuda::IndexerKernel::wgmma), tiled, "wgmma vs tiled");
  expect_equal_rows(p, dev.run(cuda::IndexerKernel::wgmma_overlap), tiled, "wgmma_overlap vs tiled");
}

// The overlapped kernel keeps the first digit's bin in shared memory (1920 keys a row) where it
// fits: with every key equal, a row's bin holds all its n visible entries, so the rows
// of up to 1920 entries keep them and the longer ones (up to 1925 here) take the passes over
// the row - both sides of the boundary, in one launch, must give ids 0..K-1, as tiled does.
// Two segments whose rows reach 1925 and 1920 visible entries: rows on both sides of the kept
// bin's 1920 keys, at top-k 64.
Problem around_kept_capacity(Values values, unsigned seed) {
  return Problem(8, 64, 64, {4 * 1925 + 3, 4 * 1920}, {4 * 1925 + 3, 4 * 1920}, values, seed);
}

TEST(CudaIndexerCompact, RowsAroundTheKeptCapacity) {
  SKIP_WITHOUT_GPU();
  const Problem p = around_kept_capacity(Values::equal_keys, 18);
  const int K = p.K;
  DeviceProblem dev(p);
  dev.upload();
  int kept = 0, passed = 0;
  for (int t = 0; t < p.T; ++t) {
    kept += p.visible(t) > K && p.visible(t) <= 1920;
    passed += p.visible(t) > 1920;
  }
  ASSERT_GT(kept, 0);
  ASSERT_GT(passed, 0);
  const auto ids = dev.run(cuda::IndexerKernel::wgmma_overlap);
  expect_contract(p, ids, "wgmma_overlap");
  for (int t = 0; t < p.T; ++t) {
    const int take = std::min(p.visible(t), p.K);
    for (int i = 0; i < take; ++i) ASSERT_EQ(ids[static_cast<std::size_t>(t) * p.K + i], i) << "row " << t;
  }
  expect_equal_rows(p, ids, dev.run(cuda::IndexerKernel::tiled), "wgmma_overlap vs tiled");
}

// The same boundary where it can fail: every visible score in one first digit (the bin holds
// all n entries) but mostly distinct below it, so the threshold is found by the later digits
// - from the kept keys for n <= 1920, by passes over the row above. A key lost or doubled in
// the kept copy, or one row's keys spilling into the next row's room, moves the threshold:
// the ids then differ from the exact host reference on the rows around n = 1920 and from
// the tiled kernel's on some row.
TEST(CudaIndexerCompact, DistinctScoresAroundTheKeptCapacity) {
  SKIP_WITHOUT_GPU();
  const Problem p = around_kept_capacity(Values::one_bin, 19);
  DeviceProblem dev(p);
  dev.upload();
  std::vector<int> rows;  // every row with 1916 .. 1925 visible entries, in both segments
  for (int t = 0; t < p.T; ++t)
    if (p.visible(t) >= 1916) rows.push_back(t);
  ASSERT_GT(rows.size(), 8u);
  const auto ids = dev.run(cuda::IndexerKernel::wgmma_overlap);
  expect_contract(p, ids, "wgmma_overlap");
  expect_reference_rows(p, ids, rows, "wgmma_overlap");
  expect_equal_rows(p, ids, dev.run(cuda::IndexerKernel::tiled), "wgmma_overlap vs tiled");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaIndexer,
                         ::testing::Values(Shape{64, 128, 512}, Shape{64, 128, 64}, Shape{40, 128, 100},
                                           Shape{8, 64, 32}),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           return "H" + std::to_string(i.param.HI) + "_D" + std::to_string(i.param.DI) +
                                  "_K" + std::to_string(i.param.K);
                         });

// A 200K-token segment (50K compressed keys: more than one row's scores fit in shared
// memory, so the one-row kernels refuse it) then a short one; exact inputs, host reference
// on sampled rows.
TEST(CudaIndexerLong, SegmentOf200KTokens) {
  SKIP_WITHOUT_GPU();
  const int K = 512;
  const Problem p(8, 64, K, {200003, 3001}, {200004, 3004}, Values::exact, 14);
  DeviceProblem dev(p);
  dev.upload();
  EXPECT_THROW(dev.run(cuda::IndexerKernel::mma1), Error);
  const auto tiled = dev.run(cuda::IndexerKernel::tiled);
  expect_contract(p, tiled, "tiled");
  std::vector<int> rows = {0, 4 * K + 3, 4 * K + 4, 100000, 163839, 163840, 199999, 200000,
                           200001, 200002, 200003, 200004, 200004 + 4 * K + 3, p.T - 4, p.T - 1};
  expect_reference_rows(p, tiled, rows, "tiled");
  expect_equal_rows(p, tiled, dev.run(cuda::IndexerKernel::tiled), "tiled run twice");
  const auto wg = dev.run(cuda::IndexerKernel::wgmma);
  expect_contract(p, wg, "wgmma");
  expect_reference_rows(p, wg, rows, "wgmma");
  expect_equal_rows(p, wg, tiled, "wgmma vs tiled");
  expect_equal_rows(p, dev.run(cuda::IndexerKernel::wgmma_overlap), tiled, "wgmma_overlap vs tiled");
}


// The measurement instance (phase stamps, IndexerStamps in indexer_topk_tiled.hpp) selects
// the same ids as the plain kernel, and on every CTA each warpgroup writes its stamped block's
// four stamps and, per key tile of the block's first run, six stamps in time order (32-bit
// clock, never 0). 4000 tokens in blocks of 4 rows: with tickets shared evenly every CTA
// takes 3+ blocks, the third among the long rows (600+ visible keys against top-256: scored,
// ~5 tiles a warpgroup); tickets are dynamic, so 90% of the CTAs are required, not all.
TEST(CudaIndexerStamps, SameIdsAndStampsInOrder) {
  SKIP_WITHOUT_GPU();
  using Stamps = cuda::IndexerStamps;
  const Problem p(8, 64, 256, {4000}, {4000}, Values::random, 16);
  DeviceProblem dev(p);
  dev.upload();
  DeviceArray<unsigned> stamps(static_cast<std::size_t>(Stamps::count()));
  const auto plain = dev.run(cuda::IndexerKernel::wgmma);
  const auto stamped = dev.run_wgmma_stamped(stamps);
  expect_equal_rows(p, stamped, plain, "stamped vs plain wgmma");
  const std::vector<unsigned> h = stamps.download();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int ctas = std::min(Stamps::ctas, sms);
  ASSERT_GT(p.T / 4, (Stamps::block + 1) * ctas) << "the CTAs must reach the stamped block";
  int stamped_wgs = 0;
  for (int cta = 0; cta < ctas; ++cta)
    for (int wg = 0; wg < 2; ++wg) {
      SCOPED_TRACE("CTA " + std::to_string(cta) + " warpgroup " + std::to_string(wg));
      const unsigned* base = h.data() + static_cast<std::size_t>(cta * 2 + wg) * (Stamps::tiles + 1) * Stamps::phases;
      const unsigned* block = base + static_cast<std::size_t>(Stamps::tiles) * Stamps::phases;
      if (block[0] == 0u) continue;  // this CTA took fewer blocks
      ++stamped_wgs;
      for (int k = 0; k < 4; ++k) ASSERT_NE(block[k], 0u) << "block stamp " << k;
      for (int k = 1; k < 4; ++k) ASSERT_LT(block[k] - block[k - 1], 1u << 31) << "block stamp " << k;
      int tiles = 0;
      for (int u = 0; u < Stamps::tiles && base[u * Stamps::phases + 5] != 0u; ++u, ++tiles) {
        const unsigned* r = base + u * Stamps::phases;
        for (int k = 1; k < 6; ++k) ASSERT_LT(r[k] - r[k - 1], 1u << 31) << "tile " << u << " stamp " << k;
        ASSERT_LT(r[0] - block[1], 1u << 31) << "tile " << u << " before the queries were ready";
        ASSERT_LT(block[2] - r[5], 1u << 31) << "tile " << u << " after the scoring ended";
      }
      EXPECT_GE(tiles, 2);
    }
  EXPECT_GE(stamped_wgs, 2 * ctas * 9 / 10) << "warpgroups with a stamped block";
}

// The overlapped kernel's measurement instance (IndexerOverlapTotals) selects the same ids as
// the plain kernel, and its totals account for every block: the scoring side's block counts
// add up to the blocks of 4 rows, and selecting warp r's selected blocks to the blocks whose
// row r has more visible entries than top-k (the rows it selects; the others come from the
// scoring threads). Every CTA that scored a block spent cycles scoring it. Ragged segments
// so that rows of a block differ in which side writes them.
TEST(CudaIndexerStamps, OverlapTotalsAccountForEveryBlock) {
  SKIP_WITHOUT_GPU();
  using Totals = cuda::IndexerOverlapTotals;
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  if (2 * sms > cuda::kIdxTiledMaxCtas) GTEST_SKIP() << "more SMs than the overlapped kernel's slots";
  const Problem p(8, 64, 256, {3001, 1203, 2999}, {3004, 1204, 3000}, Values::random, 17);
  DeviceProblem dev(p);
  dev.upload();
  const auto plain = dev.run(cuda::IndexerKernel::wgmma_overlap);
  const int blocks = (p.T + 3) / 4;
  long want[Totals::rows] = {};
  for (int b = 0; b < blocks; ++b)
    for (int r = 0; r < Totals::rows; ++r)
      if (4 * b + r < p.T && p.visible(4 * b + r) > p.K) ++want[r];
  for (int r = 0; r < Totals::rows; ++r)
    ASSERT_GT(want[r], 0) << "row " << r << ": the problem must give the selecting warp work";
  DeviceArray<unsigned long long> totals(static_cast<std::size_t>(Totals::size()));
  const auto measured = dev.run_overlap_totals(totals);
  expect_equal_rows(p, measured, plain, "overlap totals vs plain overlap");
  const std::vector<unsigned long long> t = totals.download();
  long scored = 0, selected[Totals::rows] = {};
  for (int c = 0; c < Totals::ctas; ++c) {
    const unsigned long long* x = t.data() + static_cast<std::size_t>(c) * Totals::slots;
    scored += static_cast<long>(x[Totals::blocks]);
    if (x[Totals::blocks] > 0) {
      EXPECT_GT(x[Totals::scoring], 0u) << "CTA " << c;
    }
    for (int r = 0; r < Totals::rows; ++r) {
      selected[r] += static_cast<long>(x[Totals::row_slot(r, Totals::selected)]);
      if (x[Totals::row_slot(r, Totals::selected)] > 0) {
        EXPECT_GT(x[Totals::row_slot(r, Totals::count)], 0u) << "CTA " << c << " row " << r;
        EXPECT_GT(x[Totals::row_slot(r, Totals::write)], 0u) << "CTA " << c << " row " << r;
      }
    }
  }
  EXPECT_EQ(scored, blocks);
  for (int r = 0; r < Totals::rows; ++r) EXPECT_EQ(selected[r], want[r]) << "row " << r;
}

// Timing, not a check (disabled by default; run with --gtest_also_run_disabled_tests
// --gtest_filter=CudaIndexerTiming.*): the Flash indexer (64 heads x 128, top-512) on one
// sequence of 32K / 64K / 128K tokens, every kernel that takes the length, median of 5 after
// a warm-up. FLOPs = 2 * 64 * 128 per causally valid (query, key) pair, as in cuda_bench.
TEST(CudaIndexerTiming, DISABLED_Flash) {
  SKIP_WITHOUT_GPU();
  const int HI = 64, DI = 128, K = 512;
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next_bits = [&]() {  // sign, exponent 2^-6..2^1, random mantissa: a bf16 in +-[1/64, 4)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const std::uint32_t r = static_cast<std::uint32_t>(state >> 33);
    return static_cast<std::uint16_t>(((r & 1u) << 15) | ((121u + (r >> 1) % 8u) << 7) | ((r >> 4) & 0x7fu));
  };
  for (int tokens : {32768, 65536, 131072}) {
    cuda::LayerDims d;
    d.rows = tokens; d.segments = 1; d.max_seg_len = tokens; d.ratio = 4; d.coff = 2;
    d.comp_capacity = tokens / 4; d.index_heads = HI; d.index_dim = DI; d.topk = K;
    const int Nc = tokens / 4;
    std::vector<std::int32_t> cu = {0, tokens};
    DeviceArray<std::int32_t> topk(static_cast<std::size_t>(tokens) * K);
    DeviceArray<std::uint16_t> q(static_cast<std::size_t>(tokens) * HI * DI), k(static_cast<std::size_t>(Nc) * DI);
    DeviceArray<float> w(static_cast<std::size_t>(tokens) * HI);
    DeviceArray<unsigned char> scratch(cuda::indexer_topk_scratch_bytes(d));
    std::vector<std::uint16_t> hq(q.size()), hk(k.size());
    for (auto& x : hq) x = next_bits();
    for (auto& x : hk) x = next_bits();
    std::vector<float> hw(w.size());
    for (auto& x : hw) x = bf16_value(next_bits()) * 0.125f;
    q.upload(hq);
    k.upload(hk);
    w.upload(hw);
    testing_util::DeviceMetadataArrays metadata;
    const cuda::DeviceMetadata m = metadata.build(d, cu, cu);
    double pairs = 0;
    for (int t = 0; t < tokens; ++t) pairs += std::min((t + 1) / 4, Nc);
    std::vector<std::pair<const char*, cuda::IndexerKernel>> kernels = {
        {"wgmma", cuda::IndexerKernel::wgmma},
        {"overlap", cuda::IndexerKernel::wgmma_overlap},
        {"tiled", cuda::IndexerKernel::tiled}};
    kernels.push_back({"mma1", cuda::IndexerKernel::mma1});
    std::vector<std::int32_t> first;
    for (auto [name, which] : kernels) {
      cudaEvent_t a, b;
      CU(cudaEventCreate(&a));
      CU(cudaEventCreate(&b));
      std::vector<float> ms;
      for (int i = 0; i < 6; ++i) {
        CU(cudaEventRecord(a));
        cuda::launch_indexer_topk(d, m, reinterpret_cast<const cuda::bf16*>(q.get()), w.get(),
                                  reinterpret_cast<const cuda::bf16*>(k.get()), topk.get(), scratch.get(), nullptr, which);
        CU(cudaEventRecord(b));
        CU(cudaEventSynchronize(b));
        float x = 0;
        CU(cudaEventElapsedTime(&x, a, b));
        if (i > 0) ms.push_back(x);
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      std::printf("indexer %-6s tokens %7d pairs %12.0f ms %9.3f TFLOPS %7.1f scratch %.1f MB\n", name, tokens,
                  pairs, med, 2.0 * HI * DI * pairs / (med * 1e-3) / 1e12, scratch.size() / 1e6);
      const std::vector<std::int32_t> ids = topk.download();
      if (first.empty()) first = ids;
      else EXPECT_TRUE(first == ids) << name << " selects differently from wgmma at " << tokens;
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
}

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
