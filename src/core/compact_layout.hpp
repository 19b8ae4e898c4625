// The pure index math of the compact indexer (spec 03 §2.2), shared by every backend: how
// many candidates a query row has, where its slab starts in the compact candidate buffer
// (closed form, 64-bit), the per-segment cand_batch_offsets, and the static capacity bounds
// a plan sizes the buffer with.
//
// Every function is stateless: offsets are derived from the live cu_seqlens (and causal
// offsets) on every call, so a changed packing can never be read through stale offsets.
#pragma once
#include <cstdint>
#include <span>

namespace csattn::compact {

// Gfun(n) = sum_{m=0}^{n} floor(m / r) = r Q (Q - 1) / 2 + Q (S + 1), with n = r Q + S.
// Rows [0, t) of an unclamped segment at causal offset o hold Gfun(o + t) - Gfun(o)
// candidates.
std::int64_t prefix_count(std::int64_t n, int ratio);

// n(t) = clamp((o + t + 1) div r, 0, len_k): the compressed entries visible to local row t of
// a segment whose first row sits at uncompressed position o (the causal offset).
std::int64_t row_candidates(std::int64_t offset, std::int64_t t, int ratio, std::int64_t len_k);

// Candidates of rows [0, t) of a segment: sum of n(t') for t' < t, in closed form. Rows up to
// t* = max(0, len_k r - o - 1) are unclamped (Gfun(o + min(t, t*)) - Gfun(o)); each later row
// holds exactly len_k. When no row is clamped (the cuDNN contract len_q <= len_k r - o) this is
// the spec's Gfun(o + t) - Gfun(o).
std::int64_t rows_candidates_before(std::int64_t offset, std::int64_t t, int ratio,
                                    std::int64_t len_k);

// cand_batch_offsets (B+1, int64): exclusive prefix sum of the segments' candidate counts.
// cu_q, cu_k: B+1 entries; offsets: B entries or empty (all 0). Row t of segment b starts at
// out[b] + rows_candidates_before(o_b, t, r, len_k(b)).
void cand_batch_offsets(std::span<const std::int32_t> cu_q, std::span<const std::int32_t> cu_k,
                        std::span<const std::int32_t> offsets, int ratio,
                        std::span<std::int64_t> out);

// Static upper bound of the candidate floats of one call, for any packing with these static
// shapes: `rows` query rows in at most `segments` segments of at most max_len_q rows, each
// with at most max_len_k keys.
//  - without causal offsets: Gfun-like row counts are convex in the segment length, so the
//    worst split is as many full-length segments as fit plus one remainder;
//  - with causal offsets a row can see up to max_len_k keys: rows * max_len_k.
std::int64_t cand_capacity(std::int64_t rows, std::int64_t segments, std::int64_t max_len_q,
                           std::int64_t max_len_k, int ratio, bool causal_offsets);

// The same for any `rows_per_pass` consecutive rows (the chunked variant): each row holds at
// most min(max_len_k, max_len_q div r) candidates without offsets, max_len_k with them.
std::int64_t cand_capacity_per_pass(std::int64_t rows_per_pass, std::int64_t max_len_q,
                                    std::int64_t max_len_k, int ratio, bool causal_offsets);

}  // namespace csattn::compact
