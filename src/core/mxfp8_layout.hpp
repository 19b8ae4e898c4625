// The pure index math of MXFP8 scale factors (spec 03 §5.5), shared by every backend: the
// 128x4 physical layout of E8M0 scales ("Blackwell 128x4" atoms), row and group padding, THD
// per-sequence padded prefixes and the worst-case capacity of static scale storage.
//
// Nothing here keeps state: THD prefixes are recomputed from the live cu_seqlens on every
// call (spec 03 §6.5: prefixes cached from an earlier layout placed scales at stale rows).
#pragma once
#include <cstdint>
#include <span>

namespace csattn::mxfp8 {

constexpr int kBlock = 32;        // elements per E8M0 scale (sf_vec_size)
constexpr int kAtomRows = 128;    // rows of one 512-byte atom
constexpr int kAtomGroups = 4;    // scale groups of one atom
constexpr int kAtomBytes = kAtomRows * kAtomGroups;

constexpr std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

// Groups of a row of `cols` elements (cols must be a multiple of 32), and padded to 4.
constexpr int scale_groups(int cols) { return cols / kBlock; }
constexpr int padded_groups(int groups) {
  return static_cast<int>(round_up(groups, kAtomGroups));
}

// Byte offset of logical scale (row m, group g) inside one L slice:
//   512 * ((m div 128) * (G_pad / 4) + (g div 4)) + 16 * (m mod 32) + 4 * ((m mod 128) div 32)
//   + (g mod 4).
// 512-byte atoms of 128 rows x 4 groups, row-tile-major then group-tile; inside an atom the 32
// "data paths" (m mod 32) stride 16 bytes, the four 32-row sub-blocks 4 bytes.
constexpr std::int64_t scale_byte_offset(std::int64_t m, int g, int groups_padded) {
  return std::int64_t{kAtomBytes} * ((m / kAtomRows) * (groups_padded / kAtomGroups) +
                                     g / kAtomGroups) +
         16 * (m % 32) + 4 * ((m % kAtomRows) / 32) + g % kAtomGroups;
}

// THD: a sequence's scale span starts at a multiple of a = 128 / gcd(128, rows_per_token)
// tokens, so span * rows_per_token is a whole number of 128-row atoms (Q with 64 heads: 2;
// K: 128).
int thd_token_alignment(int rows_per_token);

// THD padded prefixes, in tokens: out[0] = 0, out[b+1] = out[b] + ceil(len_b / a) * a with
// len_b = cu_seqlens[b+1] - cu_seqlens[b]. out.size() == cu_seqlens.size().
void thd_scale_prefixes(std::span<const std::int32_t> cu_seqlens, int rows_per_token,
                        std::span<std::int32_t> out);

// Worst case of the padded total over every split of `tokens` rows into `sequences`
// sequences (static storage): n = min(T, N); floor((T + n (a - 1)) / a) * a. Each non-empty
// sequence wastes at most a - 1 tokens and the total is a multiple of a.
std::int64_t thd_scale_capacity_tokens(std::int64_t tokens, std::int64_t sequences,
                                       int rows_per_token);

}  // namespace csattn::mxfp8
