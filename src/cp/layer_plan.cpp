#include "cp/layer_plan.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "csattn/error.hpp"

namespace csattn::cp {

int compressor_context(int ratio) { return ratio == 4 ? 8 : (ratio > 1 ? ratio : 0); }

int halo_width(int window, int ratio) { return std::max(window, compressor_context(ratio)); }

namespace {

int ceil_div_nonneg(int a, int b) { return a <= 0 ? 0 : (a + b - 1) / b; }

// The halo rows of a rank: for every piece, the rows [piece start - D_w, piece start) of the
// sequence the piece starts in (rows of other sequences are never read), minus the rank's own
// rows. Ascending, unique.
std::vector<int> halo_rows(const BatchGeometry& geo, const CpPartition& part, int rank,
                           int d_w) {
  std::vector<int> rows;
  for (const RowPiece& piece : part.pieces(rank)) {
    const int a = static_cast<int>(piece.begin);
    const int s = geo.row_segment[a];
    for (int g = std::max(a - d_w, geo.seg_start[s]); g < a; ++g)
      if (part.owner(g) != rank) rows.push_back(g);
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

}  // namespace

std::vector<CompactSlot> compact_slots(const BatchGeometry& geo,
                                       const std::vector<RowPiece>& pieces, int d_c) {
  std::vector<CompactSlot> slots;
  const int R = geo.ratio;
  if (R <= 1) return slots;
  for (const RowPiece& piece : pieces) {
    const int a = static_cast<int>(piece.begin), b = static_cast<int>(piece.end);
    // Sequences intersecting [a, b), in order (empty sequences own no row and are skipped).
    for (int s = geo.row_segment[a]; s < geo.segments && geo.seg_start[s] < b; ++s) {
      const int cu = geo.seg_start[s], cu_next = cu + geo.seg_len[s];
      if (cu_next <= a || cu_next == cu) continue;
      const int first = ceil_div_nonneg(a - d_c - cu, R);
      const int stop = (std::min(cu_next, b) - cu) / R;
      for (int c = first; c < stop; ++c)
        slots.push_back({s, c, cu + (c + 1) * R - 1 >= a});
    }
  }
  return slots;
}

int slots_per_rank(const BatchGeometry& geo, const CpPartition& part, int d_c) {
  const int R = geo.ratio;
  if (R <= 1) return 0;
  std::int64_t most = 1;
  for (int o = 0; o < part.ranks(); ++o) {
    std::int64_t bound = 0;
    for (const RowPiece& piece : part.pieces(o)) bound += (piece.size() + d_c) / R;
    most = std::max(most, bound);
  }
  const int align = 32 / std::gcd(32, R);
  return static_cast<int>((most + align - 1) / align * align);
}

std::vector<std::int32_t> seq_to_rank_row(const BatchGeometry& geo, const CpPartition& part,
                                          int d_c, int slots) {
  const int R = geo.ratio;
  if (R <= 1) return {};
  const int S = static_cast<int>(part.total_rows() / R);
  std::vector<std::int32_t> map(static_cast<std::size_t>(S), -1);
  for (int o = 0; o < part.ranks(); ++o) {
    const std::vector<CompactSlot> sl = compact_slots(geo, part.pieces(o), d_c);
    require(static_cast<int>(sl.size()) <= slots, ErrorKind::Internal,
            "rank " + std::to_string(o) + " has " + std::to_string(sl.size()) +
                " compressed slots, more than the capacity " + std::to_string(slots));
    for (std::size_t k = 0; k < sl.size(); ++k)
      if (sl[k].owned)
        map[static_cast<std::size_t>(geo.comp_start[sl[k].segment] + sl[k].group)] =
            o * slots + static_cast<int>(k);
  }
  for (int j = 0; j < geo.compressed_rows(); ++j)
    require(map[static_cast<std::size_t>(j)] >= 0, ErrorKind::Internal,
            "compressed row " + std::to_string(j) + " has no owner");
  return map;
}

LayerPlan build_layer_plan(const BatchGeometry& geo, const CpPartition& part, int rank,
                           int window) {
  LayerPlan p;
  p.rank = rank;
  p.ranks = part.ranks();
  p.ratio = geo.ratio;
  p.window = window;
  p.d_c = compressor_context(geo.ratio);
  p.d_w = halo_width(window, geo.ratio);

  p.local_rows = part.rows(rank);
  const std::vector<int> mine = halo_rows(geo, part, rank, p.d_w);
  p.ext_rows.resize(p.local_rows.size() + mine.size());
  std::merge(p.local_rows.begin(), p.local_rows.end(), mine.begin(), mine.end(),
             p.ext_rows.begin());
  p.ext_local.assign(p.ext_rows.size(), -1);
  p.local_ext.assign(p.local_rows.size(), -1);
  for (std::size_t e = 0; e < p.ext_rows.size(); ++e) {
    const int g = p.ext_rows[e];
    if (part.owner(g) == rank) {
      p.ext_local[e] = part.local_index(g);
      p.local_ext[static_cast<std::size_t>(part.local_index(g))] = static_cast<int>(e);
    }
  }
  auto ext_index = [&](int g) {
    const auto it = std::lower_bound(p.ext_rows.begin(), p.ext_rows.end(), g);
    require(it != p.ext_rows.end() && *it == g, ErrorKind::Internal,
            "row " + std::to_string(g) + " is missing from rank " + std::to_string(rank) +
                "'s halo + local rows");
    return static_cast<int>(it - p.ext_rows.begin());
  };

  // Receives: my halo rows grouped by owner. Sends: the rows of every other rank's halo that
  // I own. Both sides list a pair's rows in ascending order.
  for (int peer = 0; peer < p.ranks; ++peer) {
    if (peer == rank) continue;
    HaloTransfer recv{peer, {}};
    for (int g : mine)
      if (part.owner(g) == peer) recv.rows.push_back(ext_index(g));
    if (!recv.rows.empty()) p.halo_receive.push_back(std::move(recv));
    HaloTransfer send{peer, {}};
    for (int g : halo_rows(geo, part, peer, p.d_w))
      if (part.owner(g) == rank) send.rows.push_back(part.local_index(g));
    if (!send.rows.empty()) p.halo_send.push_back(std::move(send));
  }

  if (geo.ratio > 1) {
    const int R = geo.ratio;
    p.slots = slots_per_rank(geo, part, p.d_c);
    p.compact = compact_slots(geo, part.pieces(rank), p.d_c);
    for (std::size_t k = 0; k < p.compact.size(); ++k) {
      const CompactSlot& sl = p.compact[k];
      if (!sl.owned) continue;
      const int first = geo.seg_start[sl.segment] + sl.group * R;
      cpu::CompressorEntry e;
      e.first_row = ext_index(first);
      e.prev_row = (R == 4 && sl.group > 0) ? ext_index(first - R) : -1;
      e.position = sl.group * R;
      // The block's rows must be consecutive ext rows (they are consecutive global rows).
      require(ext_index(first + R - 1) == e.first_row + R - 1, ErrorKind::Internal,
              "compressed group rows are not contiguous in the halo + local rows");
      p.entries.push_back(e);
      p.entry_slot.push_back(static_cast<int>(k));
    }
    p.seq_to_rank_row = seq_to_rank_row(geo, part, p.d_c, p.slots);
    p.seq_major_rows = static_cast<int>(p.seq_to_rank_row.size());
  }
  return p;
}

}  // namespace csattn::cp
