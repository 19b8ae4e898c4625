#include "cpu/topk_select.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

namespace csattn::cpu {

std::uint32_t topk_order_key(float v) {
  const auto bits = std::bit_cast<std::uint32_t>(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

int select_topk(const float* scores, int n, int k, std::int32_t* out,
                std::vector<std::uint64_t>& scratch) {
  if (n <= k) {
    for (int j = 0; j < n; ++j) out[j] = j;
    for (int j = std::max(n, 0); j < k; ++j) out[j] = -1;
    return std::max(n, 0);
  }
  // One 64-bit sort key per candidate: the score key high, the inverted index low, so that
  // "larger composite" is "larger score, then smaller index" - a strict total order.
  scratch.resize(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j)
    scratch[j] = (std::uint64_t{topk_order_key(scores[j])} << 32) |
                 (0xFFFFFFFFu - static_cast<std::uint32_t>(j));
  std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(),
                   std::greater<std::uint64_t>());
  for (int j = 0; j < k; ++j)
    out[j] = static_cast<std::int32_t>(0xFFFFFFFFu - static_cast<std::uint32_t>(scratch[j]));
  std::sort(out, out + k);
  return k;
}

void softmax_selected(const float* logits, int count, int k, float* out) {
  float mx = -INFINITY;
  for (int j = 0; j < count; ++j) mx = std::max(mx, logits[j]);
  float sum = 0.0f;
  for (int j = 0; j < count; ++j) {
    out[j] = std::exp(logits[j] - mx);
    sum += out[j];
  }
  for (int j = 0; j < count; ++j) out[j] /= sum;
  for (int j = count; j < k; ++j) out[j] = 0.0f;
}

}  // namespace csattn::cpu
