// The device view of a context-parallel rank (device_view.hpp).
#include "cp/device_view.hpp"

#include <algorithm>
#include <string>

#include "csattn/error.hpp"

namespace csattn::cp {

CpDeviceView build_device_view(const BatchGeometry& geo, const LayerPlan& plan) {
  CpDeviceView v;
  const int n = static_cast<int>(plan.ext_rows.size());
  v.ext_run.resize(static_cast<std::size_t>(n));
  v.ext_position.resize(static_cast<std::size_t>(n));
  v.run_start.push_back(0);
  for (int e = 0; e < n; ++e) {
    const int g = plan.ext_rows[static_cast<std::size_t>(e)];
    const int s = geo.row_segment[static_cast<std::size_t>(g)], p = geo.row_position[static_cast<std::size_t>(g)];
    // A new run where the sequence changes or a position is skipped (two_chunk pieces of one
    // sequence with a gap between them).
    const bool starts = e == 0 || v.run_sequence.back() != s || v.ext_position[static_cast<std::size_t>(e - 1)] + 1 != p;
    if (starts) {
      if (e > 0) v.run_start.push_back(e);
      v.run_pos0.push_back(p);
      v.run_sequence.push_back(s);
    }
    v.ext_run[static_cast<std::size_t>(e)] = v.runs() - 1;
    v.ext_position[static_cast<std::size_t>(e)] = p;
  }
  v.run_start.push_back(n);
  if (n == 0) v.run_start.assign(1, 0);
  v.seq_comp_start.assign(geo.comp_start.begin(), geo.comp_start.end());
  if (plan.ratio > 1) v.comp_map = plan.seq_to_rank_row;
  return v;
}

std::vector<std::int32_t> device_key_list(const CpDeviceView& v, int ext_row, int window,
                                          int ratio, const std::int32_t* topk_row, int topk,
                                          int compressed_base) {
  const int r = v.ext_run[static_cast<std::size_t>(ext_row)];
  const int pos = v.ext_position[static_cast<std::size_t>(ext_row)];
  const int s = v.run_sequence[static_cast<std::size_t>(r)];
  const int pos0 = v.run_pos0[static_cast<std::size_t>(r)];
  const int w0 = std::max(0, pos - window + 1);
  require(w0 >= pos0, ErrorKind::Internal,
          "device view: the window of position " + std::to_string(pos) + " starts at " + std::to_string(w0) +
              " but its run starts at position " + std::to_string(pos0) + " (halo too short)");
  std::vector<std::int32_t> keys;
  for (int p = w0; p <= pos; ++p) keys.push_back(v.run_start[static_cast<std::size_t>(r)] + p - pos0);
  if (ratio <= 1) return keys;
  const int base = v.seq_comp_start[static_cast<std::size_t>(s)];
  const int entries = v.seq_comp_start[static_cast<std::size_t>(s) + 1] - base;
  const int S = static_cast<int>(v.comp_map.size());
  auto add = [&](int c) {
    if (c < 0 || c >= entries || base + c >= S) return;
    const int m = v.comp_map[static_cast<std::size_t>(base + c)];
    if (m >= 0) keys.push_back(compressed_base + m);
  };
  if (topk_row) {
    for (int k = 0; k < topk; ++k) add(topk_row[k]);
  } else {
    const int visible = std::min((pos + 1) / ratio, entries);
    for (int c = 0; c < visible; ++c) add(c);
  }
  return keys;
}

std::vector<DeviceEntry> device_entries(const CpDeviceView& v, const BatchGeometry& geo, const LayerPlan& plan) {
  std::vector<DeviceEntry> out;
  for (std::size_t k = 0; k < plan.entries.size(); ++k) {
    const CompactSlot& sl = plan.compact[static_cast<std::size_t>(plan.entry_slot[k])];
    const int first_global = geo.seg_start[static_cast<std::size_t>(sl.segment)] + sl.group * plan.ratio;
    // The run holding the block's first row: the run of its ext row.
    const auto it = std::lower_bound(plan.ext_rows.begin(), plan.ext_rows.end(), first_global);
    require(it != plan.ext_rows.end() && *it == first_global, ErrorKind::Internal,
            "device view: an owned compressed group starts outside the ext rows");
    const int ext = static_cast<int>(it - plan.ext_rows.begin());
    out.push_back({v.ext_run[static_cast<std::size_t>(ext)], sl.group, plan.entry_slot[k]});
  }
  return out;
}

int entry_first_row(const CpDeviceView& v, const DeviceEntry& e, int ratio) {
  const std::size_t r = static_cast<std::size_t>(e.run);
  return v.run_start[r] + e.group * ratio - v.run_pos0[r];
}

int entry_prev_row(const CpDeviceView& v, const DeviceEntry& e, int ratio) {
  return ratio == 4 && e.group > 0 ? entry_first_row(v, e, ratio) - ratio : -1;
}

}  // namespace csattn::cp
