// The one top-k selection rule of csattn (spec 03 §3.1, §3.3), used wherever a row's top-k is
// taken: rank by the order-preserving uint32 key of the fp32 score (what the radix select of
// the GPU compares), keep the smallest index among equal keys at the k-th boundary, write
// the selection in ascending index order, pad with -1. And the softmax over the selected
// slots.
#pragma once
#include <cstdint>
#include <vector>

namespace csattn::cpu {

// Larger float -> larger key: negative values have every bit inverted, non-negative ones the
// sign bit set. So +0 ranks above -0, +NaN above +Inf and -NaN below -Inf: a total order, and
// "tied" means bitwise-equal fp32.
std::uint32_t topk_order_key(float v);

// Selects min(k, n) of scores[0..n): largest key first, the smaller index among equal keys.
// out[0..k): the selected indices in ascending order, then -1. n <= k copies 0..n-1.
// Returns the number selected. `scratch` is reused between calls.
int select_topk(const float* scores, int n, int k, std::int32_t* out,
                std::vector<std::uint64_t>& scratch);

// The softmax over the first `count` selected logits (fp32: max, exp, sum in slot order,
// divide); slots count..k-1 get 0. count = 0 gives an all-zero row.
void softmax_selected(const float* logits, int count, int k, float* out);

}  // namespace csattn::cpu
