// Attention index lists (spec 02 §7): for every query row, the rows of `kv_full` it attends
// to. kv_full is the concatenation of raw K=V rows (the query's window lives there) and
// compressed rows starting at `compressed_base`. A single rank's kv_full is all T raw rows
// followed by the segment-major compressed rows; a context-parallel rank's is its halo and
// local raw rows followed by the rank-major all-gathered compressed rows. The same builder
// serves both, so the CPU attention, the CP path and later the CUDA kernels consume one
// index format. Invalid slots are -1.
#pragma once
#include <cstdint>
#include <vector>

#include "core/geometry.hpp"
#include "csattn/config.hpp"

namespace csattn {

enum class IndexMode {
  selected = 0,      // window, then the top-k's compressed ids in column order (invalid skipped)
  all_visible = 1,   // window, then every visible compressed entry (SWA, HCA, no top-k)
  indexer_loss = 2,  // top-k columns kept aligned (lowered or -1), then the window columns
};

// Logical keys -> kv_full rows.
struct KvLowering {
  // Compressed entry c of sequence s is sequence-major row j = comp_start[s] + c; its
  // kv_full row is compressed_base + seq_to_rank_row[j] (identity when null). j >= S or a
  // negative map entry means "no such row".
  int compressed_base = 0;
  const std::int32_t* seq_to_rank_row = nullptr;
  int seq_major_rows = 0;  // S (the map's length; with a null map, the compressed row count)
};

struct AttentionIndex {
  int window = 0;              // W
  int compressed_width = 0;    // cw
  int width() const { return window + compressed_width; }
  std::vector<std::int32_t> index;               // [count, W + cw]
  std::vector<std::int32_t> length;              // [count] valid entries (modes 0, 1)
  std::vector<std::int32_t> indexer_rank_major;  // [count, cw] map value or -1 (mode 2)
};

// The compressed width of a layer: the top-k width when a top-k exists, otherwise
// floor(max_seqlen / m) for m > 1 and 0 for SWA. max_seqlen is the global padded maximum.
int compressed_width(const AttentionConfig& cfg, int max_seqlen, bool has_topk);

// topk: [count, topk_width] logical, sequence-local compressed ids or -1 (modes 0 and 2;
// topk_width must equal compressed_width there).
AttentionIndex build_attention_index(const QueryRows& queries, IndexMode mode, int window,
                                     int compressed_width, const std::int32_t* topk,
                                     const KvLowering& lowering);

}  // namespace csattn
