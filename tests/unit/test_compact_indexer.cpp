// The compact indexer forward + top-k + softmax (spec 03 §2-§3) through the public operator:
// equality with a dense reference (exact-arithmetic inputs: bitwise, ties included), the
// output contract (slot order, padding, n <= K, softmax), causal offsets, BSHD == THD, the
// chunked variant, the compact K layout, workspace reuse with changed boundaries (no state
// survives a call), memory, and argument validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "compact_indexer_util.hpp"
#include "core/compact_layout.hpp"
#include "cpu/topk_select.hpp"
#include "csattn/error.hpp"
#include "csattn/ops.hpp"
#include "csattn/plan.hpp"

namespace csattn {
namespace {

using namespace testing_util;

// Segments: longer than K candidates, shorter than r (no candidates), empty, a tail.
const std::vector<int> kLenQ = {70, 3, 0, 45, 1, 130};

IndexerProblem exact_problem(std::uint32_t seed, int H = 3, int K = 5) {
  std::vector<int> len_k;
  for (int L : kLenQ) len_k.push_back(L / 4);
  return make_problem(kLenQ, len_k, H, 32, K, seed, exact_value);
}

// Exact arithmetic: the compact path and the dense reference compute identical fp32 scores,
// so selection (with its many exact ties) and logits must agree bit for bit.
TEST(CompactIndexer, ExactInputsMatchDenseReferenceBitwise) {
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    const IndexerProblem p = exact_problem(seed);
    const IndexerResult r = run_compact(p);
    int rows_with_boundary_ties = 0;
    for (std::int64_t t = 0; t < p.rows(); ++t) {
      const DenseRow ref = dense_reference_row(p, t);
      const std::size_t o = static_cast<std::size_t>(t * p.K);
      for (int s = 0; s < p.K; ++s) {
        const bool valid = s < static_cast<int>(ref.topk.size());
        ASSERT_EQ(r.idx[o + s], valid ? ref.topk[s] : -1) << "row " << t << " slot " << s;
        if (valid)
          ASSERT_EQ(r.logits[o + s], ref.scores[static_cast<std::size_t>(ref.topk[s])]);
        else
          ASSERT_EQ(r.logits[o + s], -INFINITY);
      }
      // Count rows where the k-th best score is tied with an unselected key: the tie rule
      // decided them.
      if (static_cast<int>(ref.topk.size()) == p.K) {
        float kth = INFINITY;
        for (int j : ref.topk) kth = std::min(kth, ref.scores[static_cast<std::size_t>(j)]);
        const std::set<int> sel(ref.topk.begin(), ref.topk.end());
        for (int j = 0; j < static_cast<int>(ref.scores.size()); ++j)
          if (!sel.count(j) && ref.scores[static_cast<std::size_t>(j)] == kth) {
            ++rows_with_boundary_ties;
            break;
          }
      }
    }
    EXPECT_GT(rows_with_boundary_ties, 10) << "the test must exercise ties at the boundary";
  }
}

// bf16-valued random operands: the compact scores equal the dense fp32 reference up to the
// accumulation order, and the sets agree except where the k-th and (k+1)-th scores are
// within that rounding.
TEST(CompactIndexer, RandomBf16MatchesDenseReference) {
  std::vector<int> len_k;
  for (int L : kLenQ) len_k.push_back(L / 4);
  const IndexerProblem p = make_problem(kLenQ, len_k, 8, 64, 7, 9, bf16_normal);
  const IndexerResult r = run_compact(p);
  int near_ties = 0;
  for (std::int64_t t = 0; t < p.rows(); ++t) {
    const DenseRow ref = dense_reference_row(p, t);
    const std::size_t o = static_cast<std::size_t>(t * p.K);
    std::vector<float> sorted(ref.scores);
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const int n = static_cast<int>(ref.topk.size());
    const bool near_tie = n == p.K && static_cast<int>(sorted.size()) > p.K &&
                          std::isfinite(sorted[p.K]) &&
                          sorted[p.K - 1] - sorted[p.K] <= 1e-5f * (1.0f + std::fabs(sorted[p.K]));
    near_ties += near_tie;
    for (int s = 0; s < n; ++s) {
      const std::int32_t id = r.idx[o + s];
      ASSERT_GE(id, 0) << "row " << t;
      EXPECT_NEAR(r.logits[o + s], ref.scores[static_cast<std::size_t>(id)],
                  1e-5f * (1.0f + std::fabs(ref.scores[static_cast<std::size_t>(id)])));
      if (!near_tie) {
        EXPECT_EQ(id, ref.topk[s]) << "row " << t << " slot " << s;
      }
    }
    for (int s = n; s < p.K; ++s) EXPECT_EQ(r.idx[o + s], -1);
  }
  EXPECT_LT(near_ties, p.rows() / 10);
}

// n(t) <= K: every visible key, in index order, then -1 / -inf / 0; no candidates: all-zero
// softmax.
TEST(CompactIndexer, FewerCandidatesThanKCopiesAll) {
  const IndexerProblem p = make_problem({40, 2}, {10, 0}, 2, 32, 64, 4, bf16_normal);
  const IndexerResult r = run_compact(p);
  for (std::int64_t t = 0; t < p.rows(); ++t) {
    const int n = visible(p, t);
    const std::size_t o = static_cast<std::size_t>(t * p.K);
    for (int s = 0; s < p.K; ++s) {
      EXPECT_EQ(r.idx[o + s], s < n ? s : -1) << "row " << t;
      if (s >= n) {
        EXPECT_EQ(r.logits[o + s], -INFINITY);
        EXPECT_EQ(r.softmax[o + s], 0.0f);
      }
    }
    float sum = 0.0f;
    for (int s = 0; s < n; ++s) sum += r.softmax[o + s];
    EXPECT_NEAR(sum, n > 0 ? 1.0f : 0.0f, 1e-6f) << "row " << t;
  }
}

TEST(CompactIndexer, SoftmaxOverTheSelectedLogits) {
  std::vector<int> len_k;
  for (int L : kLenQ) len_k.push_back(L / 4);
  IndexerProblem p = make_problem(kLenQ, len_k, 4, 32, 6, 21, bf16_normal);
  for (float& v : p.w) v *= 30.0f;  // spread logits so the softmax is far from uniform
  const IndexerResult r = run_compact(p);
  for (std::int64_t t = 0; t < p.rows(); ++t) {
    const std::size_t o = static_cast<std::size_t>(t * p.K);
    double mx = -INFINITY, sum = 0.0;
    int n = 0;
    while (n < p.K && r.idx[o + n] >= 0) mx = std::max(mx, static_cast<double>(r.logits[o + n++]));
    for (int s = 0; s < n; ++s) sum += std::exp(r.logits[o + s] - mx);
    for (int s = 0; s < n; ++s)
      EXPECT_NEAR(r.softmax[o + s], std::exp(r.logits[o + s] - mx) / sum, 2e-7) << "row " << t;
  }
  // Without a softmax output the other outputs are unchanged.
  const CompactIndexerPlan plan = CompactIndexerPlan::make(thd_geometry(p, IndexerPrecision::bf16));
  std::vector<std::int32_t> idx(r.idx.size());
  std::vector<float> logits(r.logits.size());
  ops::CompactIndexerInputs in;
  in.q = {p.q.data(), DType::f32, {p.rows(), p.H, p.D}};
  in.k = {p.k.data(), DType::f32, {p.key_rows(), p.D}};
  in.weights = {p.w.data(), DType::f32, {p.rows(), p.H}};
  const auto n1 = static_cast<std::int64_t>(p.cu_q.size());
  in.cu_seqlens_q = {p.cu_q.data(), DType::i32, {n1}};
  in.cu_seqlens_k = {p.cu_k.data(), DType::i32, {n1}};
  ops::CompactIndexerOutputs out;
  out.indices = {idx.data(), DType::i32, {p.rows(), p.K}};
  out.logits = {logits.data(), DType::f32, {p.rows(), p.K}};
  HostWorkspace ws(workspace_bytes(plan));
  ops::compact_indexer_topk(plan, in, out, ws.view());
  EXPECT_EQ(idx, r.idx);
  EXPECT_EQ(logits, r.logits);
}

TEST(CompactIndexer, OrderKeyIsATotalOrder) {
  using cpu::topk_order_key;
  EXPECT_GT(topk_order_key(0.0f), topk_order_key(-0.0f));
  EXPECT_GT(topk_order_key(std::numeric_limits<float>::quiet_NaN()), topk_order_key(INFINITY));
  EXPECT_LT(topk_order_key(-std::numeric_limits<float>::quiet_NaN()), topk_order_key(-INFINITY));
  std::vector<float> v = {-INFINITY, -3e38f, -1.0f, -1e-45f, -0.0f, 0.0f, 1e-45f, 1.0f, 3e38f, INFINITY};
  for (std::size_t i = 1; i < v.size(); ++i) EXPECT_LT(topk_order_key(v[i - 1]), topk_order_key(v[i]));
  // Ties go to the smallest index, and +0 beats -0.
  const float s[] = {1.0f, 2.0f, 2.0f, -0.0f, 2.0f, 0.0f, 2.0f};
  std::int32_t out[4];
  std::vector<std::uint64_t> scratch;
  EXPECT_EQ(cpu::select_topk(s, 7, 3, out, scratch), 3);
  EXPECT_EQ(std::vector<std::int32_t>(out, out + 3), (std::vector<std::int32_t>{1, 2, 4}));
  const float z[] = {-0.0f, 0.0f, -0.0f};
  EXPECT_EQ(cpu::select_topk(z, 3, 1, out, scratch), 1);
  EXPECT_EQ(out[0], 1);
}

// Context parallelism: a sequence's query rows split into pieces, each a segment with its
// causal offset and the whole sequence's keys, give the rows of the unsplit sequence.
TEST(CompactIndexer, CausalOffsetsSplitEqualsWhole) {
  const IndexerProblem whole = make_problem({150}, {37}, 3, 32, 6, 5, exact_value);
  IndexerProblem split = whole;
  split.cu_q = {0, 20, 61, 61, 150};  // pieces of 20, 41, 0 and 89 rows
  split.offsets = {0, 20, 61, 61};
  split.cu_k = {0, 37, 74, 111, 148};
  split.k.clear();
  for (int piece = 0; piece < 4; ++piece) split.k.insert(split.k.end(), whole.k.begin(), whole.k.end());
  const IndexerResult a = run_compact(whole), b = run_compact(split);
  EXPECT_EQ(a.idx, b.idx);
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.softmax, b.softmax);
  // And offsets with a short K segment clamp the visible count.
  IndexerProblem clamp = split;
  clamp.cu_k = {0, 37, 74, 80, 90};  // the last piece sees at most 10 keys
  const IndexerResult c = run_compact(clamp);
  for (std::int64_t t = 61; t < 150; ++t) {
    const DenseRow ref = dense_reference_row(clamp, t);
    for (int s = 0; s < clamp.K; ++s)
      ASSERT_EQ(c.idx[static_cast<std::size_t>(t * clamp.K + s)],
                s < static_cast<int>(ref.topk.size()) ? ref.topk[s] : -1);
  }
}

// BSHD is THD with equal lengths, in both precisions (MXFP8: per-batch scale slices vs THD
// prefixes must address the same scales) and with causal offsets (per-batch slabs).
TEST(CompactIndexer, BshdEqualsThd) {
  const int B = 3, S = 53, Sk = 13;
  for (IndexerPrecision prec : {IndexerPrecision::bf16, IndexerPrecision::mxfp8})
    for (bool with_offsets : {false, true}) {
      SCOPED_TRACE(std::string(indexer_precision_name(prec)) + (with_offsets ? " offsets" : ""));
      IndexerProblem p = make_problem({S, S, S}, {Sk, Sk, Sk}, 4, 64, 5, 6, bf16_normal);
      if (with_offsets) p.offsets = {0, 9, 30};
      const IndexerResult thd = run_compact(p, prec);
      CompactIndexerGeometry g;
      g.format = QkvFormat::bshd;
      g.batch = B;
      g.max_seqlen_q = S;
      g.max_seqlen_k = Sk;
      g.heads = p.H;
      g.head_dim = p.D;
      g.topk = p.K;
      g.precision = prec;
      g.causal_offsets = with_offsets;
      const CompactIndexerPlan plan = CompactIndexerPlan::make(g);
      if (!with_offsets) {
        EXPECT_EQ(plan.cand_capacity, B * compact::prefix_count(S, 4));  // b * PBF
      }
      IndexerResult r;
      r.idx.resize(thd.idx.size());
      r.logits.resize(thd.logits.size());
      r.softmax.resize(thd.softmax.size());
      ops::CompactIndexerInputs in;
      in.q = {p.q.data(), DType::f32, {B, S, p.H, p.D}};
      in.k = {p.k.data(), DType::f32, {B, Sk, 1, p.D}};
      in.weights = {p.w.data(), DType::f32, {B, S, p.H}};
      if (with_offsets) in.q_causal_offsets = {p.offsets.data(), DType::i32, {B}};
      ops::CompactIndexerOutputs out;
      out.indices = {r.idx.data(), DType::i32, {B, S, p.K}};
      out.logits = {r.logits.data(), DType::f32, {B, S, p.K}};
      out.softmax = {r.softmax.data(), DType::f32, {B, S, p.K}};
      HostWorkspace ws(workspace_bytes(plan));
      ops::compact_indexer_topk(plan, in, out, ws.view());
      EXPECT_EQ(r.idx, thd.idx);
      EXPECT_EQ(r.logits, thd.logits);
      EXPECT_EQ(r.softmax, thd.softmax);
    }
  // A BSHD plan refuses THD-shaped inputs.
  IndexerProblem p = make_problem({S}, {Sk}, 4, 64, 5, 6, bf16_normal);
  CompactIndexerGeometry g;
  g.format = QkvFormat::bshd;
  g.batch = 1;
  g.max_seqlen_q = S;
  g.max_seqlen_k = Sk;
  g.heads = p.H;
  g.head_dim = p.D;
  g.topk = p.K;
  EXPECT_THROW(run_compact(p, CompactIndexerPlan::make(g)), Error);
}

TEST(CompactIndexer, Bf16TensorsEqualF32Values) {
  std::vector<int> len_k;
  for (int L : kLenQ) len_k.push_back(L / 4);
  const IndexerProblem p = make_problem(kLenQ, len_k, 4, 64, 5, 8, bf16_normal);
  const CompactIndexerPlan plan = CompactIndexerPlan::make(thd_geometry(p, IndexerPrecision::bf16));
  const IndexerResult a = run_compact(p, plan), b = run_compact(p, plan, nullptr, true);
  EXPECT_EQ(a.idx, b.idx);
  EXPECT_EQ(a.logits, b.logits);
}

// The chunked variant reuses one buffer of rows_per_pass rows and gives the same results.
TEST(CompactIndexer, ChunkedEqualsOnePass) {
  const IndexerProblem p = exact_problem(12, 2, 4);
  const CompactIndexerPlan one = CompactIndexerPlan::make(thd_geometry(p, IndexerPrecision::bf16));
  const IndexerResult ref = run_compact(p, one);
  for (int R : {1, 5, 31, 32, 33, 100}) {
    const CompactIndexerPlan plan = CompactIndexerPlan::make(thd_geometry(p, IndexerPrecision::bf16, R));
    // Memory formula: R * min(max_seqlen_k, max_seqlen_q div r) floats (no offsets).
    EXPECT_EQ(plan.cand_capacity, std::min<std::int64_t>(one.cand_capacity, R * std::min(32, 130 / 4)));
    EXPECT_LT(plan.cand_capacity, one.cand_capacity);
    const IndexerResult r = run_compact(p, plan);
    EXPECT_EQ(r.idx, ref.idx) << "rows_per_pass " << R;
    EXPECT_EQ(r.logits, ref.logits) << "rows_per_pass " << R;
    EXPECT_EQ(r.softmax, ref.softmax) << "rows_per_pass " << R;
  }
  // With causal offsets the bound is R * max_seqlen_k.
  IndexerProblem off = p;
  off.offsets.assign(kLenQ.size(), 7);
  EXPECT_EQ(CompactIndexerPlan::make(thd_geometry(off, IndexerPrecision::bf16, 10)).cand_capacity,
            10 * 32);
}

// Memory: the one-pass buffer holds exactly the valid pairs (about half of dense); nothing of
// [rows, keys] size exists.
TEST(CompactIndexer, CandidateBufferIsCompact) {
  CompactIndexerGeometry g;
  g.format = QkvFormat::bshd;
  g.batch = 2;
  g.max_seqlen_q = 4096;
  g.max_seqlen_k = 1024;
  g.heads = 64;
  g.head_dim = 128;
  g.topk = 512;
  const CompactIndexerPlan plan = CompactIndexerPlan::make(g);
  const double dense = 2.0 * 4096 * 1024;
  EXPECT_EQ(plan.cand_capacity, 2 * compact::prefix_count(4096, 4));
  EXPECT_LT(plan.cand_capacity, 0.501 * dense);
  EXPECT_LT(plan.workspace_bytes, 0.501 * dense * 4 + 4096);
  g.precision = IndexerPrecision::mxfp8;  // + E4M3 copies of q and k and their scales
  const CompactIndexerPlan mx = CompactIndexerPlan::make(g);
  EXPECT_EQ(mx.q_scale.packed_shape(), (Shape{2, 4096 * 64, 4}));
  EXPECT_EQ(mx.k_scale.packed_shape(), (Shape{2, 1024, 4}));
  EXPECT_GE(mx.workspace_bytes, plan.workspace_bytes + 2 * 4096 * 64 * 128 + 2 * 1024 * 128);
}

// One plan and one workspace for two packings (as under CUDA-graph replay): each call uses
// the metadata of its own inputs. The workspace is poisoned between calls; results equal a
// fresh workspace's, and the MXFP8 scale prefixes in the workspace are this call's.
TEST(CompactIndexer, WorkspaceReuseWithNewBoundariesKeepsNoState) {
  for (IndexerPrecision prec : {IndexerPrecision::bf16, IndexerPrecision::mxfp8}) {
    IndexerProblem a = make_problem({64, 96}, {16, 24}, 64, 64, 8, 31, bf16_normal);
    IndexerProblem b = a;  // same shapes, other boundaries
    b.cu_q = {0, 65, 160};
    b.cu_k = {0, 17, 40};
    CompactIndexerGeometry g = thd_geometry(a, prec);
    g.max_seqlen_q = 96;
    g.max_seqlen_k = 24;
    const CompactIndexerPlan plan = CompactIndexerPlan::make(g);
    HostWorkspace ws(workspace_bytes(plan));
    for (const IndexerProblem* p : {&a, &b, &a}) {
      std::memset(ws.data(), 0xFF, ws.bytes());
      const IndexerResult reused = run_compact(*p, plan, &ws);
      const IndexerResult fresh = run_compact(*p, plan);
      EXPECT_EQ(reused.idx, fresh.idx) << indexer_precision_name(prec);
      EXPECT_EQ(reused.logits, fresh.logits) << indexer_precision_name(prec);
      EXPECT_EQ(reused.softmax, fresh.softmax) << indexer_precision_name(prec);
      if (prec == IndexerPrecision::mxfp8) {
        const auto* qp = reinterpret_cast<const std::int32_t*>(ws.data() + plan.q_scale_cu_seqlens.offset);
        const auto* kp = reinterpret_cast<const std::int32_t*>(ws.data() + plan.k_scale_cu_seqlens.offset);
        const std::vector<std::int32_t> want_q =
            p == &b ? std::vector<std::int32_t>{0, 66, 162} : std::vector<std::int32_t>{0, 64, 160};
        EXPECT_EQ(std::vector<std::int32_t>(qp, qp + 3), want_q);
        EXPECT_EQ(std::vector<std::int32_t>(kp, kp + 3), (std::vector<std::int32_t>{0, 128, 256}));
        // The MXFP8 path read its scales correctly: it equals the BF16 path on the
        // dequantized operands, bit for bit.
        IndexerProblem deq = *p;
        for (auto* v : {&deq.q, &deq.k}) {
          const int D = deq.D;
          const auto rows = static_cast<std::int64_t>(v->size()) / D;
          Tensor x = Tensor::from_f32(*v, {rows, D});
          Tensor data(DType::e4m3, {rows, D}), sc(DType::e8m0, {rows, D / 32}), back(DType::f32, {rows, D});
          ops::quantize_mxfp8(x.view(), data.view(), sc.view());
          ops::dequantize_mxfp8(data.view(), sc.view(), back.view());
          *v = back.to_f32();
        }
        const IndexerResult on_deq = run_compact(deq, CompactIndexerPlan::make(
                                                          [&] { auto g2 = g; g2.precision = IndexerPrecision::bf16; return g2; }()));
        EXPECT_EQ(reused.idx, on_deq.idx);
        EXPECT_EQ(reused.logits, on_deq.logits);
      }
    }
  }
}

// The THD compact K layout (zero rows, capacity tail, synthetic Q segment) changes no local
// id and no logit; ids map back to logical rows.
TEST(CompactIndexer, CompactKLayoutKeepsLocalIds) {
  // Logical: 3 sequences (lengths 37, 52, 11 -> 9, 13, 2 keys), a K buffer with 3 capacity
  // rows, and a synthetic Q padding segment of 6 rows.
  IndexerProblem logical = make_problem({37, 52, 11, 6}, {9, 13, 2, 0}, 4, 32, 4, 17, bf16_normal);
  logical.k_rows = 24 + 3;
  logical.k.resize(static_cast<std::size_t>(logical.k_rows) * logical.D, 5.0f);  // capacity rows
  const std::vector<std::int32_t> cu_k_real = {0, 9, 22, 24};
  const ops::ThdCompactKLayout L = ops::build_thd_compact_k_layout(logical.cu_q, cu_k_real, logical.k_rows, 4);
  IndexerProblem padded = logical;
  padded.cu_k = L.cu_seqlens_k;
  padded.k_rows = L.physical_rows();
  padded.k.assign(static_cast<std::size_t>(padded.k_rows) * padded.D, 0.0f);
  ops::pack_thd_compact_k(ConstTensorView(logical.k.data(), DType::f32, {logical.k_rows, logical.D}), L,
                          TensorView{padded.k.data(), DType::f32, {padded.k_rows, padded.D}});
  const IndexerResult a = run_compact(logical), b = run_compact(padded);
  // Real segments: identical ids and logits. The synthetic segment's rows (padding, masked by
  // the caller) can only reach its zero rows.
  const std::size_t real = static_cast<std::size_t>(logical.cu_q[3] * logical.K);
  EXPECT_TRUE(std::equal(a.idx.begin(), a.idx.begin() + real, b.idx.begin()));
  EXPECT_TRUE(std::equal(a.logits.begin(), a.logits.begin() + real, b.logits.begin()));
  for (std::int64_t t = 0; t < logical.rows(); ++t) {
    int seg = 0;
    visible(logical, t, &seg);
    for (int s = 0; s < logical.K; ++s) {
      const std::int32_t id = b.idx[static_cast<std::size_t>(t * logical.K + s)];
      if (id < 0) continue;
      const std::int64_t prow = L.physical_row(seg, id);
      if (seg == 3) {
        ASSERT_EQ(L.source_row_map[static_cast<std::size_t>(prow)], logical.k_rows);
        continue;
      }
      const std::int64_t lrow = L.logical_row(seg, id);
      ASSERT_EQ(L.source_row_map[static_cast<std::size_t>(prow)], lrow);
      ASSERT_EQ(padded.k[static_cast<std::size_t>(prow * padded.D)],
                logical.k[static_cast<std::size_t>(lrow * logical.D)]);
    }
  }
}

TEST(CompactIndexer, NanStaysInItsRow) {
  IndexerProblem p = exact_problem(3);
  const IndexerResult clean = run_compact(p);
  const std::int64_t bad = 60;  // a row of the first segment with candidates
  p.q[static_cast<std::size_t>(bad * p.H * p.D + 5)] = std::numeric_limits<float>::quiet_NaN();
  const IndexerResult r = run_compact(p);
  for (std::int64_t t = 0; t < p.rows(); ++t)
    for (int s = 0; s < p.K; ++s) {
      const std::size_t i = static_cast<std::size_t>(t * p.K + s);
      if (t == bad) continue;
      ASSERT_EQ(r.idx[i], clean.idx[i]) << "row " << t;
      ASSERT_EQ(r.logits[i], clean.logits[i]) << "row " << t;
    }
}

TEST(CompactIndexer, BadArgumentsNameTheArgument) {
  IndexerProblem p = make_problem({20, 12}, {5, 3}, 2, 32, 3, 1, bf16_normal);
  const CompactIndexerPlan plan = CompactIndexerPlan::make(thd_geometry(p, IndexerPrecision::bf16));
  const std::int64_t T = p.rows();
  std::vector<std::int32_t> idx(static_cast<std::size_t>(T * p.K));
  std::vector<float> logits(idx.size()), soft(idx.size());
  HostWorkspace ws(workspace_bytes(plan));
  auto inputs = [&] {
    ops::CompactIndexerInputs in;
    in.q = {p.q.data(), DType::f32, {T, p.H, p.D}};
    in.k = {p.k.data(), DType::f32, {p.key_rows(), p.D}};
    in.weights = {p.w.data(), DType::f32, {T, p.H}};
    in.cu_seqlens_q = {p.cu_q.data(), DType::i32, {3}};
    in.cu_seqlens_k = {p.cu_k.data(), DType::i32, {3}};
    return in;
  };
  auto outputs = [&] {
    ops::CompactIndexerOutputs out;
    out.indices = {idx.data(), DType::i32, {T, p.K}};
    out.logits = {logits.data(), DType::f32, {T, p.K}};
    out.softmax = {soft.data(), DType::f32, {T, p.K}};
    return out;
  };
  ops::compact_indexer_topk(plan, inputs(), outputs(), ws.view());  // the good call works
  auto expect_error = [&](auto mutate, const std::string& word) {
    ops::CompactIndexerInputs in = inputs();
    ops::CompactIndexerOutputs out = outputs();
    TensorView w = ws.view();
    mutate(in, out, w);
    try {
      ops::compact_indexer_topk(plan, in, out, w);
      ADD_FAILURE() << "no error, expected one naming " << word;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  using In = ops::CompactIndexerInputs;
  using Out = ops::CompactIndexerOutputs;
  expect_error([](In& in, Out&, TensorView&) { in.q.shape = {32, 2, 64}; }, "q has shape");
  expect_error([](In& in, Out&, TensorView&) { in.k.dtype = DType::i32; }, "k has dtype");
  expect_error([](In& in, Out&, TensorView&) { in.weights.shape = {32, 3}; }, "weights");
  expect_error([](In& in, Out&, TensorView&) { in.q.device = Device::cuda; }, "cuda");
  expect_error([&](In&, Out& out, TensorView&) { out.indices.dtype = DType::i64; }, "indices");
  expect_error([&](In&, Out& out, TensorView&) { out.logits.shape = {T, 4}; }, "logits");
  expect_error([&](In&, Out& out, TensorView&) { out.softmax.data = logits.data(); }, "overlap");
  expect_error([&](In& in, Out& out, TensorView&) { out.logits.data = const_cast<float*>(p.q.data()); (void)in; }, "overlap");
  expect_error([&](In&, Out&, TensorView& w) { w.shape = {16}; }, "workspace");
  std::vector<std::int32_t> bad_last = {0, 20, 31}, too_long = {0, 0, 32}, bad_k = {0, 5, 99},
                            desc = {0, 25, 20};
  expect_error([&](In& in, Out&, TensorView&) { in.cu_seqlens_q.data = bad_last.data(); }, "cu_seqlens_q[-1]");
  expect_error([&](In& in, Out&, TensorView&) { in.cu_seqlens_q.data = too_long.data(); }, "max_seqlen_q");
  expect_error([&](In& in, Out&, TensorView&) { in.cu_seqlens_q.data = desc.data(); }, "non-decreasing");
  expect_error([&](In& in, Out&, TensorView&) { in.cu_seqlens_k.data = bad_k.data(); }, "cu_seqlens_k");
  expect_error([&](In& in, Out&, TensorView&) { in.cu_seqlens_k.shape = {4}; }, "cu_seqlens_k");
  std::vector<std::int32_t> off = {0, 3};
  expect_error([&](In& in, Out&, TensorView&) { in.q_causal_offsets = {off.data(), DType::i32, {2}}; }, "q_causal_offsets");
  expect_error([](In& in, Out&, TensorView&) { in.sm_scale = NAN; }, "sm_scale");
  // Offsets required by the plan, and negative offsets.
  IndexerProblem po = p;
  po.offsets = {0, -1};
  const CompactIndexerPlan plan_off = CompactIndexerPlan::make(thd_geometry(po, IndexerPrecision::bf16));
  try {
    run_compact(po, plan_off);
    ADD_FAILURE() << "negative offset accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q_causal_offsets[1]"), std::string::npos) << e.what();
  }
  try {
    run_compact(p, plan_off);
    ADD_FAILURE() << "missing offsets accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q_causal_offsets"), std::string::npos) << e.what();
  }
  // Plans: MXFP8 needs a head dim that is a multiple of 32; any head count is fine.
  CompactIndexerGeometry g = thd_geometry(p, IndexerPrecision::mxfp8);
  g.head_dim = 48;
  try {
    (void)CompactIndexerPlan::make(g);
    ADD_FAILURE() << "head_dim 48 accepted for mxfp8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
  g.head_dim = 96;
  g.heads = 5;
  EXPECT_NO_THROW((void)CompactIndexerPlan::make(g));
  g.topk = 0;
  EXPECT_THROW((void)CompactIndexerPlan::make(g), Error);
}

}  // namespace
}  // namespace csattn
