#include "core/mxfp8_layout.hpp"

#include <algorithm>
#include <numeric>

namespace csattn::mxfp8 {

int thd_token_alignment(int rows_per_token) {
  return kAtomRows / std::gcd(kAtomRows, rows_per_token);
}

void thd_scale_prefixes(std::span<const std::int32_t> cu_seqlens, int rows_per_token,
                        std::span<std::int32_t> out) {
  const int a = thd_token_alignment(rows_per_token);
  out[0] = 0;
  for (std::size_t b = 0; b + 1 < cu_seqlens.size(); ++b) {
    const std::int64_t len = cu_seqlens[b + 1] - cu_seqlens[b];
    out[b + 1] = static_cast<std::int32_t>(out[b] + round_up(len, a));
  }
}

std::int64_t thd_scale_capacity_tokens(std::int64_t tokens, std::int64_t sequences,
                                       int rows_per_token) {
  const std::int64_t a = thd_token_alignment(rows_per_token);
  const std::int64_t n = std::min(tokens, sequences);
  return (tokens + n * (a - 1)) / a * a;
}

}  // namespace csattn::mxfp8
