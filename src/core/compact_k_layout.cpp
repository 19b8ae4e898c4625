// The THD compact K layout (spec 03 §2.5): host metadata, recomputed from the live prefixes
// on every call.
#include <algorithm>
#include <string>

#include "csattn/error.hpp"
#include "csattn/ops.hpp"

namespace csattn::ops {

namespace {

void check_prefixes(std::span<const std::int32_t> cu, const char* name) {
  require(cu.size() >= 2, ErrorKind::ShapeMismatch,
          std::string(name) + " has " + std::to_string(cu.size()) +
              " entries, expected at least 2 (B+1)");
  require(cu[0] == 0, ErrorKind::InvalidArgument,
          std::string(name) + "[0] = " + std::to_string(cu[0]) + ", expected 0");
  for (std::size_t i = 1; i < cu.size(); ++i)
    require(cu[i] >= cu[i - 1], ErrorKind::InvalidArgument,
            std::string(name) + " must be non-decreasing: entry " + std::to_string(i) + " = " +
                std::to_string(cu[i]) + " < " + std::to_string(cu[i - 1]));
}

}  // namespace

namespace {

// prefixes[segment] + local, for a segment of the layout and a local id inside it.
std::int64_t row_of(const std::vector<std::int32_t>& prefixes, int segment, std::int32_t local,
                    const char* what) {
  require(segment >= 0 && segment + 1 < static_cast<int>(prefixes.size()),
          ErrorKind::InvalidArgument,
          std::string(what) + ": segment " + std::to_string(segment) + " is not in [0, " +
              std::to_string(static_cast<int>(prefixes.size()) - 1) + ")");
  const std::int32_t len = prefixes[segment + 1] - prefixes[segment];
  require(local >= 0 && local < len, ErrorKind::InvalidArgument,
          std::string(what) + ": local id " + std::to_string(local) + " is not in [0, " +
              std::to_string(len) + ") for segment " + std::to_string(segment));
  return std::int64_t{prefixes[segment]} + local;
}

}  // namespace

std::int64_t ThdCompactKLayout::logical_row(int segment, std::int32_t local) const {
  return row_of(logical_cu_seqlens_k, segment, local, "logical_row");
}

std::int64_t ThdCompactKLayout::physical_row(int segment, std::int32_t local) const {
  return row_of(cu_seqlens_k, segment, local, "physical_row");
}

ThdCompactKLayout build_thd_compact_k_layout(std::span<const std::int32_t> cu_seqlens_q,
                                             std::span<const std::int32_t> cu_seqlens_k,
                                             std::int64_t k_rows, int ratio) {
  check_prefixes(cu_seqlens_q, "cu_seqlens_q");
  check_prefixes(cu_seqlens_k, "cu_seqlens_k");
  require(ratio >= 1, ErrorKind::InvalidArgument,
          "ratio = " + std::to_string(ratio) + " must be >= 1");
  const int N = static_cast<int>(cu_seqlens_k.size()) - 1;
  const int nq = static_cast<int>(cu_seqlens_q.size()) - 1;
  require(nq == N || nq == N + 1, ErrorKind::ShapeMismatch,
          "cu_seqlens_q has " + std::to_string(nq) + " segments, expected " + std::to_string(N) +
              " (one per cu_seqlens_k segment) or " + std::to_string(N + 1) +
              " (plus a synthetic padding segment)");
  const std::int64_t logical_total = cu_seqlens_k[N];
  require(k_rows >= logical_total, ErrorKind::InvalidArgument,
          "k_rows = " + std::to_string(k_rows) + " is smaller than cu_seqlens_k[-1] = " +
              std::to_string(logical_total));

  ThdCompactKLayout L;
  L.real_segments = N;
  L.synthetic_segment = nq == N + 1;
  L.k_rows = k_rows;
  const std::int64_t padding_q = L.synthetic_segment ? cu_seqlens_q[nq] - cu_seqlens_q[N] : 0;
  const std::int64_t padding_k = (padding_q + ratio - 1) / ratio;
  const std::int64_t gap = k_rows - logical_total;
  require(gap >= padding_k, ErrorKind::InvalidArgument,
          "k_rows = " + std::to_string(k_rows) + " leaves " + std::to_string(gap) +
              " capacity rows after cu_seqlens_k[-1], fewer than the " +
              std::to_string(padding_k) + " the synthetic padding segment of " +
              std::to_string(padding_q) + " query rows needs (ceil(padding_q / r))");
  // The capacity tail beyond the synthetic segment's rows, spread over the real segments.
  const std::int64_t remaining = gap - padding_k;
  const std::int64_t each = remaining / N, first_extra = remaining % N;

  std::vector<std::int64_t> lengths;
  for (int b = 0; b < N; ++b)
    lengths.push_back(cu_seqlens_k[b + 1] - cu_seqlens_k[b] + 1 + each + (b < first_extra));
  if (L.synthetic_segment) lengths.push_back(padding_k);
  L.cu_seqlens_k.assign(lengths.size() + 1, 0);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    L.cu_seqlens_k[b + 1] = static_cast<std::int32_t>(L.cu_seqlens_k[b] + lengths[b]);
    L.max_seqlen_k = std::max(L.max_seqlen_k, static_cast<int>(lengths[b]));
  }
  // Physical rows: R + N (each real segment's mandatory zero row on top of the R rows).
  const auto sentinel = static_cast<std::int32_t>(k_rows);
  L.source_row_map.assign(static_cast<std::size_t>(L.physical_rows()), sentinel);
  for (int b = 0; b < N; ++b) {
    const std::int32_t valid = cu_seqlens_k[b + 1] - cu_seqlens_k[b];
    for (std::int32_t pos = 0; pos < valid; ++pos)
      L.source_row_map[static_cast<std::size_t>(L.cu_seqlens_k[b] + pos)] = cu_seqlens_k[b] + pos;
  }
  L.logical_cu_seqlens_k.assign(cu_seqlens_k.begin(), cu_seqlens_k.end());
  if (L.synthetic_segment) L.logical_cu_seqlens_k.push_back(sentinel);
  return L;
}

}  // namespace csattn::ops
