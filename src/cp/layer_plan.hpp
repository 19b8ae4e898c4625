// The per-layer, per-rank plan of context parallelism: which halo rows a rank receives and
// from whom, which rows it sends, its compressor-input compaction (slots), the owned
// compressed entries and the sequence-major -> rank-major map. Built from global metadata
// only (the geometry, the partition, the layer's window and ratio), so every rank computes
// the same plans without communication; a rank also derives what every other rank needs
// from it.
#pragma once
#include <cstdint>
#include <vector>

#include "core/geometry.hpp"
#include "cpu/compressor.hpp"
#include "csattn/cp.hpp"

namespace csattn::cp {

// D_c: the left context the compressor of ratio m may need (spec 02 §1): 8 for m = 4 (the
// overlapping previous block), m for m = 128, 0 for SWA.
int compressor_context(int ratio);
// D_w = max(window, D_c): the halo rows exchanged before every piece.
int halo_width(int window, int ratio);

// One slot of a rank's compressor-input compaction (spec 02 §5.1, per piece): group c of
// segment s. Unowned slots are groups that lie entirely before the piece (they exist so the
// slot layout and the map follow the spec; the CPU computes only owned slots).
struct CompactSlot {
  int segment = 0;
  int group = 0;
  bool owned = false;
};

// The slots of a rank with these pieces, piece by piece, sequence by sequence, group by group.
std::vector<CompactSlot> compact_slots(const BatchGeometry& geo,
                                       const std::vector<RowPiece>& pieces, int d_c);
// C: slots per rank, the same on every rank: roundup(max(1, max over ranks of
// sum over pieces floor((len + D_c) / m)), A) with A = 32 / gcd(32, m). For a contiguous
// partition this is spec 02 §1's roundup(max(1, floor((L + D_c)/m)), A).
int slots_per_rank(const BatchGeometry& geo, const CpPartition& part, int d_c);
// seq_to_rank_row: [S = floor(T / m)]: sequence-major compressed row -> owner * C + slot of
// the owner's owned slot, -1 past the last compressed row (spec 02 §5.3).
std::vector<std::int32_t> seq_to_rank_row(const BatchGeometry& geo, const CpPartition& part,
                                          int d_c, int slots);

// The rows one peer sends to or receives from this rank in the halo exchange.
struct HaloTransfer {
  int peer = 0;
  std::vector<int> rows;  // send: this rank's local indices; receive: ext indices
};

struct LayerPlan {
  int rank = 0, ranks = 1;
  int ratio = 0, window = 0, d_c = 0, d_w = 0;

  std::vector<int> local_rows;  // global ids in local order
  // ext rows: the halo rows and the local rows, ascending. Raw K=V and the compressor
  // projections are computed over them; a query's window is the ext rows right before it.
  std::vector<int> ext_rows;
  std::vector<int> ext_local;  // per ext row: local index, or -1 for a halo row
  std::vector<int> local_ext;  // per local row: its ext index
  std::vector<HaloTransfer> halo_receive;  // by ascending peer
  std::vector<HaloTransfer> halo_send;     // by ascending peer

  // Compressed rows (m > 1).
  int slots = 0;                        // C
  std::vector<CompactSlot> compact;     // this rank's slots (<= C; the rest is capacity)
  std::vector<cpu::CompressorEntry> entries;  // the owned slots, rows in ext
  std::vector<int> entry_slot;          // slot of each entry
  std::vector<std::int32_t> seq_to_rank_row;  // [S]
  int seq_major_rows = 0;               // S
};

LayerPlan build_layer_plan(const BatchGeometry& geo, const CpPartition& part, int rank,
                           int window);

}  // namespace csattn::cp
