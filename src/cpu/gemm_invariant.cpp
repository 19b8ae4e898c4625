// The batch-invariant GEMM (see blas.hpp): every element of C is
//   acc = 0; for k = 0..K-1: acc = acc + a[i,k] * b[k,j]   (fp32, multiply then add)
//   C[i,j] = alpha * acc (+ beta * C[i,j])
// whatever the shape of the call. The kernel packs op(A) in blocks of kMr rows and op(B) in
// panels of kNr columns (zero-padded at the edges, so edge elements take the same code path
// as inner ones) and accumulates kMr x kNr tiles over k in order. This file is compiled with
// -ffp-contract=off, so no multiply-add is ever fused, in the vectorised or in the scalar
// code, on any target.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "cpu/blas.hpp"

namespace csattn::cpu {

namespace {

thread_local bool t_batch_invariant = false;

constexpr int kMr = 4;   // rows of a tile
constexpr int kNr = 16;  // columns of a tile

// acc[kMr][kNr] = sum_k a[k][r] * b[k][c] in k order. a: packed [K][kMr], b: packed [K][kNr].
// Eight-float vectors (GCC vector extension): one AVX register on the avx2 clone, two SSE
// registers otherwise; lane c of a vector only ever meets lane c, so vectorisation never
// changes the per-element arithmetic.
typedef float vec8 __attribute__((vector_size(32)));
static_assert(kNr == 16, "the tile kernel holds two 8-float vectors per row");

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void tile_kernel(int K, const float* a, const float* b, float* out) {
  vec8 acc[kMr][2];
  for (int r = 0; r < kMr; ++r) acc[r][0] = acc[r][1] = vec8{};
  for (int k = 0; k < K; ++k) {
    vec8 b0, b1;
    __builtin_memcpy(&b0, b + static_cast<long>(k) * kNr, sizeof(vec8));
    __builtin_memcpy(&b1, b + static_cast<long>(k) * kNr + 8, sizeof(vec8));
    const float* ak = a + static_cast<long>(k) * kMr;
    for (int r = 0; r < kMr; ++r) {
      const vec8 av = vec8{} + ak[r];
      acc[r][0] = acc[r][0] + av * b0;
      acc[r][1] = acc[r][1] + av * b1;
    }
  }
  for (int r = 0; r < kMr; ++r) {
    __builtin_memcpy(out + r * kNr, &acc[r][0], sizeof(vec8));
    __builtin_memcpy(out + r * kNr + 8, &acc[r][1], sizeof(vec8));
  }
}

}  // namespace

bool batch_invariant() { return t_batch_invariant; }

BatchInvariantScope::BatchInvariantScope(bool on) : saved_(t_batch_invariant) {
  t_batch_invariant = on;
}
BatchInvariantScope::~BatchInvariantScope() { t_batch_invariant = saved_; }

void gemm_batch_invariant(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const float* A, int lda, const float* B, int ldb, float beta,
                          float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  const int row_blocks = (M + kMr - 1) / kMr;
  const int panels = (N + kNr - 1) / kNr;
  const int kk = std::max(K, 0);
  // op(B) packed panel by panel: bp[p][k][c] = op(B)[k][p*kNr + c], zero past N.
  std::vector<float> bp(static_cast<std::size_t>(panels) * kk * kNr, 0.0f);
  for (int p = 0; p < panels; ++p)
    for (int k = 0; k < kk; ++k)
      for (int c = 0; c < kNr; ++c) {
        const int j = p * kNr + c;
        if (j >= N) break;
        bp[(static_cast<std::size_t>(p) * kk + k) * kNr + c] =
            trans_b ? B[static_cast<long>(j) * ldb + k] : B[static_cast<long>(k) * ldb + j];
      }
  // op(A) packed block by block: ap[blk][k][r] = op(A)[blk*kMr + r][k], zero past M.
  std::vector<float> ap(static_cast<std::size_t>(row_blocks) * kk * kMr, 0.0f);
  for (int blk = 0; blk < row_blocks; ++blk)
    for (int r = 0; r < kMr; ++r) {
      const int i = blk * kMr + r;
      if (i >= M) break;
      for (int k = 0; k < kk; ++k)
        ap[(static_cast<std::size_t>(blk) * kk + k) * kMr + r] =
            trans_a ? A[static_cast<long>(k) * lda + i] : A[static_cast<long>(i) * lda + k];
    }
  const long tiles = static_cast<long>(panels) * row_blocks;
  // Threads only change which thread computes a tile, never how.
  const bool parallel = !omp_in_parallel() && static_cast<double>(M) * N * kk > 1e6;
#pragma omp parallel for schedule(static) if (parallel)
  for (long t = 0; t < tiles; ++t) {
    const int p = static_cast<int>(t / row_blocks), blk = static_cast<int>(t % row_blocks);
    float out[kMr * kNr];
    tile_kernel(kk, ap.data() + static_cast<std::size_t>(blk) * kk * kMr,
                bp.data() + static_cast<std::size_t>(p) * kk * kNr, out);
    for (int r = 0; r < kMr; ++r) {
      const int i = blk * kMr + r;
      if (i >= M) break;
      for (int c = 0; c < kNr; ++c) {
        const int j = p * kNr + c;
        if (j >= N) break;
        float& dst = C[static_cast<long>(i) * ldc + j];
        const float v = alpha * out[r * kNr + c];
        dst = beta == 0.0f ? v : v + beta * dst;
      }
    }
  }
}

}  // namespace csattn::cpu
