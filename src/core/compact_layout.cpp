#include "core/compact_layout.hpp"

#include <algorithm>

namespace csattn::compact {

std::int64_t prefix_count(std::int64_t n, int ratio) {
  if (n <= 0) return 0;
  const std::int64_t r = ratio, q = n / r, s = n % r;
  return r * q * (q - 1) / 2 + q * (s + 1);
}

std::int64_t row_candidates(std::int64_t offset, std::int64_t t, int ratio, std::int64_t len_k) {
  return std::clamp<std::int64_t>((offset + t + 1) / ratio, 0, std::max<std::int64_t>(len_k, 0));
}

std::int64_t rows_candidates_before(std::int64_t offset, std::int64_t t, int ratio,
                                    std::int64_t len_k) {
  if (t <= 0 || len_k <= 0) return 0;
  const std::int64_t unclamped = std::max<std::int64_t>(0, len_k * ratio - offset - 1);
  const std::int64_t m = std::min(t, unclamped);
  return prefix_count(offset + m, ratio) - prefix_count(offset, ratio) + len_k * (t - m);
}

void cand_batch_offsets(std::span<const std::int32_t> cu_q, std::span<const std::int32_t> cu_k,
                        std::span<const std::int32_t> offsets, int ratio,
                        std::span<std::int64_t> out) {
  out[0] = 0;
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const std::int64_t o = offsets.empty() ? 0 : offsets[b];
    out[b + 1] = out[b] + rows_candidates_before(o, cu_q[b + 1] - cu_q[b], ratio,
                                                 cu_k[b + 1] - cu_k[b]);
  }
}

std::int64_t cand_capacity(std::int64_t rows, std::int64_t segments, std::int64_t max_len_q,
                           std::int64_t max_len_k, int ratio, bool causal_offsets) {
  const std::int64_t dense = rows * max_len_k;
  if (causal_offsets || max_len_q <= 0) return causal_offsets ? dense : 0;
  auto seg = [&](std::int64_t len) { return rows_candidates_before(0, len, ratio, max_len_k); };
  const std::int64_t full = std::min(segments, rows / max_len_q);
  const std::int64_t rest = rows - full * max_len_q;
  const std::int64_t bound = full * seg(max_len_q) + (full < segments ? seg(std::min(rest, max_len_q)) : 0);
  return std::min(bound, dense);
}

std::int64_t cand_capacity_per_pass(std::int64_t rows_per_pass, std::int64_t max_len_q,
                                    std::int64_t max_len_k, int ratio, bool causal_offsets) {
  const std::int64_t per_row =
      causal_offsets ? max_len_k : std::min(max_len_k, max_len_q / ratio);
  return rows_per_pass * std::max<std::int64_t>(per_row, 0);
}

}  // namespace csattn::compact
