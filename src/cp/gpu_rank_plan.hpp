// The host side of a context-parallel rank on the GPU (cuda/cp_layer.cpp): everything its
// device metadata and index lists hold, built from the layer plan - the runs of its halo +
// own rows, the per-run copies of the gathered compressed rows and the lists that sum their
// gradients back in a fixed order, the owned-entry slot table, the halo index lists. Host
// code, so the CPU tests hold it to the CPU layer's index lists
// (tests/unit/test_cp_device_view.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "core/geometry.hpp"
#include "cp/layer_plan.hpp"

namespace csattn::cp {

using i32 = std::int32_t;

struct GpuRankPlan {
  int P = 1, R = 0, Te = 0, n = 0, C = 0, ndup = 0, max_pos = 1;
  std::vector<i32> cu;             // [R+1] run starts in ext rows
  std::vector<i32> seg_pos0;       // [R]
  std::vector<i32> row_segment;    // [Te]
  std::vector<i32> row_position;   // [Te] global positions
  std::vector<std::uint8_t> row_pad;  // [Te] padding or halo
  std::vector<i32> comp_start;     // [R+1] per-run copies of the compressed rows
  std::vector<i32> dup_src;        // [ndup] rank-major row of each copy
  std::vector<i32> sum_off, sum_rows;  // [P*C+1], [ndup]: the copies of each rank-major row
  std::vector<i32> entry_row0, entry_pos;  // [C] owned groups by slot (-1: unused)
  std::vector<i32> local_ext;      // [n]
  std::vector<i32> send_idx, recv_idx;   // halo: local rows sent, ext rows received
  std::vector<int> send_off, recv_off;   // per transfer, into send_idx / recv_idx
  std::vector<int> send_peer, recv_peer;
};

// The plan of `plan`'s rank (geo: the global geometry, this layer's ratio). Run r's copies
// are the first E_r = min(floor(end position / m), N_s) compressed rows of its sequence,
// every row its queries can see; copy comp_start[r] + j is sequence entry j, gathered from
// rank-major row dup_src[comp_start[r] + j].
GpuRankPlan build_gpu_rank_plan(const BatchGeometry& geo, const LayerPlan& plan);

}  // namespace csattn::cp
