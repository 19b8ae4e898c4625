// Deterministic scatter-add of per-(row, slot) gradient contributions (the backward's
// deterministic mode). A kernel that would add a contribution vector into a shared key row
// with atomics writes it instead to scratch[(r - r0) * slots + slot] for the rows of one chunk
// [r0, r0 + rows); this pass then adds, for every key row, the contributions of the chunk in
// ascending row order into the fp32 destination. Chunks run in stream order, so every key
// row's sum has one fixed order: bitwise-repeatable gradients, whatever the scheduling.
//
// The slot layout is the one the producing kernel used, rebuilt from the same metadata:
//   attention     window rows first (slot i = raw row seg_start + w0 + i), then compressed
//                 rows: CSA the valid ids of the top-k row in order, HCA all visible entries
//                 (exactly build_key_list in attention_keys.cuh);
//   loss_sparse   slot k = position of the id in the top-k row (valid ids first, ascending);
//   loss_dense    slot j = segment-local compressed id j, for j < the visible count.
// Loss layouts skip padding rows (the loss gives them nothing). Top-k rows must hold their
// valid ids first and in ascending order (the compact top-k contract), which lets a key row
// find its slot in a row by binary search.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/params.hpp"

namespace csattn::cuda {

enum class SlotLayout { attention, loss_sparse, loss_dense };

struct OrderedScatter {
  SlotLayout layout = SlotLayout::attention;
  int slots = 0;   // slots per row in the scratch (its row stride / width)
  int width = 0;   // floats per contribution: a multiple of 32, at most 1024
  float* dst_window = nullptr;  // [T, width] raw key rows (attention only)
  float* dst_comp = nullptr;    // [Nc, width] compressed rows (null: none - the attention's
                                // window-only chunks, GradChunk::window_only)
  int copies = 1;  // contributions per (row, slot), summed in order: scratch rows
                   // ((r - r0) * copies + c) * slots + slot (the attention's head blocks)
};

// Rows per chunk so that the scratch ([rows, slots, width] fp32) stays within `budget_bytes`
// (at least 1).
int scatter_chunk_rows(int rows, int slots, int width, std::size_t budget_bytes);

// Adds the contributions of rows [r0, r0 + rows) (scratch as described above).
void launch_ordered_scatter(const LayerDims& d, const DeviceMetadata& meta,
                            const std::int32_t* topk, const OrderedScatter& s, int r0, int rows,
                            const float* scratch, cudaStream_t stream);

}  // namespace csattn::cuda
