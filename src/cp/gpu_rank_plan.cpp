#include "cp/gpu_rank_plan.hpp"

#include <algorithm>

#include "cp/device_view.hpp"
#include "csattn/error.hpp"

namespace csattn::cp {

GpuRankPlan build_gpu_rank_plan(const BatchGeometry& geo, const LayerPlan& plan) {
  const CpDeviceView v = build_device_view(geo, plan);
  GpuRankPlan h;
  const int m = geo.ratio;
  h.P = plan.ranks;
  h.R = v.runs();
  h.Te = static_cast<int>(plan.ext_rows.size());
  h.n = static_cast<int>(plan.local_rows.size());
  h.C = m > 1 ? plan.slots : 0;
  h.cu = v.run_start;
  h.seg_pos0 = v.run_pos0;
  h.row_segment = v.ext_run;
  h.row_position = v.ext_position;
  h.row_pad.resize(static_cast<std::size_t>(h.Te));
  for (int e = 0; e < h.Te; ++e) {
    const std::size_t ue = static_cast<std::size_t>(e);
    h.row_pad[ue] = plan.ext_local[ue] < 0 || geo.row_is_padding[static_cast<std::size_t>(plan.ext_rows[ue])];
  }
  h.comp_start.assign(1, 0);
  for (int r = 0; r < h.R; ++r) {
    const std::size_t ur = static_cast<std::size_t>(r);
    const int len = h.cu[ur + 1] - h.cu[ur];
    h.max_pos = std::max(h.max_pos, h.seg_pos0[ur] + len);
    int copies = 0;
    if (m > 1) {
      // The sequence's rows the run's last (so every) query can see: E_r >= min((pos+1)/m,
      // N_s) for each of its positions, so min((pos+1)/m, E_r) is the one-GPU count.
      const int s = v.run_sequence[ur];
      const int base = v.seq_comp_start[static_cast<std::size_t>(s)];
      const int entries = v.seq_comp_start[static_cast<std::size_t>(s) + 1] - base;
      copies = std::min((h.seg_pos0[ur] + len) / m, entries);
      for (int j = 0; j < copies; ++j) {
        const i32 src = plan.seq_to_rank_row[static_cast<std::size_t>(base + j)];
        require(src >= 0, ErrorKind::Internal, "context parallelism: a visible compressed row has no owner");
        h.dup_src.push_back(src);
      }
    }
    h.comp_start.push_back(h.comp_start.back() + copies);
  }
  h.ndup = h.comp_start.back();
  if (m > 1) {
    // The copies of each rank-major row in copy order (a CSR), for the fixed-order sum.
    const int rm = h.P * h.C;
    std::vector<int> count(static_cast<std::size_t>(rm) + 1, 0);
    for (i32 q : h.dup_src) ++count[static_cast<std::size_t>(q) + 1];
    h.sum_off.assign(count.begin(), count.end());
    for (int q = 0; q < rm; ++q) h.sum_off[static_cast<std::size_t>(q) + 1] += h.sum_off[static_cast<std::size_t>(q)];
    std::vector<int> fill(h.sum_off.begin(), h.sum_off.end() - 1);
    h.sum_rows.resize(static_cast<std::size_t>(h.ndup));
    for (int k = 0; k < h.ndup; ++k)
      h.sum_rows[static_cast<std::size_t>(fill[static_cast<std::size_t>(h.dup_src[static_cast<std::size_t>(k)])]++)] = k;
    h.entry_row0.assign(static_cast<std::size_t>(h.C), -1);
    h.entry_pos.assign(static_cast<std::size_t>(h.C), -1);
    for (std::size_t k = 0; k < plan.entries.size(); ++k) {
      const cpu::CompressorEntry& e = plan.entries[k];
      require(m != 4 || e.position == 0 || e.prev_row == e.first_row - m, ErrorKind::Internal,
              "context parallelism: a group's previous block is not just before it");
      const std::size_t slot = static_cast<std::size_t>(plan.entry_slot[k]);
      h.entry_row0[slot] = e.first_row;
      h.entry_pos[slot] = e.position;
    }
  }
  h.local_ext = plan.local_ext;
  for (const HaloTransfer& t : plan.halo_send) {
    h.send_peer.push_back(t.peer);
    h.send_off.push_back(static_cast<int>(h.send_idx.size()));
    h.send_idx.insert(h.send_idx.end(), t.rows.begin(), t.rows.end());
  }
  h.send_off.push_back(static_cast<int>(h.send_idx.size()));
  for (const HaloTransfer& t : plan.halo_receive) {
    h.recv_peer.push_back(t.peer);
    h.recv_off.push_back(static_cast<int>(h.recv_idx.size()));
    h.recv_idx.insert(h.recv_idx.end(), t.rows.begin(), t.rows.end());
  }
  h.recv_off.push_back(static_cast<int>(h.recv_idx.size()));
  return h;
}

}  // namespace csattn::cp
