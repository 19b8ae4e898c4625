// A context-parallel rank's rows as the CUDA kernels will address them (groundwork of the GPU
// context-parallel layer, issue 7; design.md "What comes next"). The kernels of the
// single-GPU layer find a query's keys from per-row metadata: its segment, its position, the
// segment's first row and its compressed rows' offset. A rank's ext rows (halo + own rows,
// ascending) become such a batch of *runs* - maximal groups of ext rows holding consecutive
// positions of one sequence - with two additions: the global position of each run's first
// row (`run_pos0`, so positions stay global and "the ext row of position p" is
// run_start[r] + p - run_pos0[r]) and the sequence-major -> rank-major map of the gathered
// compressed rows (`comp_map`, identity on one GPU). `device_key_list` is that derivation
// written once on the host: the tests hold it equal to the CPU layer's index lists
// (build_attention_index), so the kernels can adopt it as their contract.
#pragma once
#include <cstdint>
#include <vector>

#include "core/geometry.hpp"
#include "cp/layer_plan.hpp"

namespace csattn::cp {

struct CpDeviceView {
  std::vector<std::int32_t> run_start;     // [R + 1] ext-row offsets of the runs
  std::vector<std::int32_t> run_pos0;      // [R] global position of each run's first row
  std::vector<std::int32_t> run_sequence;  // [R] sequence (segment of the batch) of each run
  std::vector<std::int32_t> ext_run;       // [ext rows] run of each ext row
  std::vector<std::int32_t> ext_position;  // [ext rows] global position of each ext row
  std::vector<std::int32_t> seq_comp_start;  // [B + 1] sequence-major compressed offsets
  std::vector<std::int32_t> comp_map;        // [S] sequence-major -> rank-major row (m > 1)
  int runs() const { return static_cast<int>(run_pos0.size()); }
};

// The view of `plan`'s ext rows (geometry of the whole batch, this layer's ratio).
CpDeviceView build_device_view(const BatchGeometry& geo, const LayerPlan& plan);

// The keys of the query at ext row `ext_row` as the kernels derive them from the view: its
// window as ext rows, then compressed rows as compressed_base + rank-major row - the top-k's
// valid ids in column order (`topk_row` non-null, `topk` columns) or every visible entry
// (HCA: min((pos + 1) / m, the sequence's entries)). Throws csattn::Error(Internal) where the
// view cannot serve the query (a window row missing from its run).
std::vector<std::int32_t> device_key_list(const CpDeviceView& v, int ext_row, int window,
                                          int ratio, const std::int32_t* topk_row, int topk,
                                          int compressed_base);

// One compressed group this rank computes (an owned slot), as the compressor kernel will
// address it: group `group` of the sequence held by run `run`, pooled into row `slot` of the
// rank's block of the all-gather.
struct DeviceEntry {
  int run = 0;
  int group = 0;
  int slot = 0;
};

// The owned groups of `plan` in its entry order. Every owned group lies in one run (its rows
// and, for m = 4, the previous block's rows are consecutive ext rows).
std::vector<DeviceEntry> device_entries(const CpDeviceView& v, const BatchGeometry& geo, const LayerPlan& plan);

// First ext row of an entry's block, and of the previous block (m = 4, group > 0; else -1):
// run_start + group * m - run_pos0.
int entry_first_row(const CpDeviceView& v, const DeviceEntry& e, int ratio);
int entry_prev_row(const CpDeviceView& v, const DeviceEntry& e, int ratio);

}  // namespace csattn::cp
