// The device view of a context-parallel rank (src/cp/device_view.*): the key lists the CUDA
// kernels will derive from runs, global positions and the compressed-row map must equal the
// CPU layer's index lists (build_attention_index over the same plan), and the owned
// compressed groups addressed through runs must reach the CPU compressor's rows, for both
// partition modes, several rank counts, every layer type and ragged padded batches - so the
// GPU context-parallel layer can take this addressing as its contract. The GPU layer's own
// host plan (per-run copies of the compressed rows, their sum lists, the slot table) is held
// to the same index lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/attention_index.hpp"
#include "cp/device_view.hpp"
#include "cp/gpu_rank_plan.hpp"
#include "cp/layer_plan.hpp"
#include "csattn/cp.hpp"
#include "csattn/error.hpp"

namespace csattn {
namespace {

struct ViewCase {
  CpMode mode;
  int ranks;
  int ratio;
  int window;
};
void PrintTo(const ViewCase& c, std::ostream* os) {
  *os << (c.mode == CpMode::contiguous ? "contiguous" : "two_chunk") << " P " << c.ranks << " m " << c.ratio
      << " W " << c.window;
}

// The GPU layer's host plan (cp/gpu_rank_plan.hpp) held to the CPU index lists: the keys of
// every local query derived the way the GPU kernels derive them - window rows from (run,
// position) as query_window does, compressed rows as the run's copy comp_start[r] + id and
// its gathered source dup_src - equal build_attention_index's; the fixed-order sum lists
// hold exactly each rank-major row's copies; the slot table is the plan's owned entries.
void check_gpu_plan(const BatchGeometry& geo, const cp::LayerPlan& plan, const cp::CpDeviceView& view,
                    const ViewCase& c, const QueryRows& q, const KvLowering& low, std::mt19937& rng) {
  const cp::GpuRankPlan g = cp::build_gpu_rank_plan(geo, plan);
  ASSERT_EQ(g.cu, view.run_start);
  ASSERT_EQ(g.seg_pos0, view.run_pos0);
  for (std::size_t e = 0; e < plan.ext_rows.size(); ++e)
    ASSERT_EQ(g.row_pad[e] != 0,
              plan.ext_local[e] < 0 || geo.row_is_padding[static_cast<std::size_t>(plan.ext_rows[e])] != 0)
        << "ext row " << e;
  // The sum lists: each rank-major row's copies, ascending.
  const int rank_major = g.P * g.C;
  if (c.ratio > 1) {
    ASSERT_EQ(static_cast<int>(g.sum_off.size()), rank_major + 1);
    for (int row = 0; row < rank_major; ++row) {
      std::vector<int> want;
      for (int k = 0; k < g.ndup; ++k)
        if (g.dup_src[static_cast<std::size_t>(k)] == row) want.push_back(k);
      const std::vector<int> got(g.sum_rows.begin() + g.sum_off[static_cast<std::size_t>(row)],
                                 g.sum_rows.begin() + g.sum_off[static_cast<std::size_t>(row) + 1]);
      ASSERT_EQ(got, want) << "rank-major row " << row;
    }
    int used = 0;
    for (std::size_t k = 0; k < plan.entries.size(); ++k) {
      const std::size_t slot = static_cast<std::size_t>(plan.entry_slot[k]);
      EXPECT_EQ(g.entry_row0[slot], plan.entries[k].first_row);
      EXPECT_EQ(g.entry_pos[slot], plan.entries[k].position);
    }
    for (std::int32_t r0 : g.entry_row0) used += r0 >= 0;
    EXPECT_EQ(used, static_cast<int>(plan.entries.size()));
  }
  // Top-k rows as the GPU selection writes them: valid ids below the visible count, or -1.
  const int K = 5;
  std::vector<std::int32_t> topk(static_cast<std::size_t>(q.count) * K, -1);
  for (int i = 0; i < q.count; ++i) {
    const int vis = geo.visible_compressed(q.row(i));
    for (int k = 0; k < K; ++k)
      if (vis > 0 && rng() % 3 != 0) topk[static_cast<std::size_t>(i) * K + k] = static_cast<int>(rng() % vis);
  }
  const bool selected = c.ratio == 4;
  const int cw = selected ? K : c.ratio > 1 ? geo.rows / c.ratio + 1 : 0;
  const AttentionIndex idx = build_attention_index(q, selected ? IndexMode::selected : IndexMode::all_visible,
                                                   c.window, cw, selected ? topk.data() : nullptr, low);
  for (int i = 0; i < q.count; ++i) {
    const int e = plan.local_ext[static_cast<std::size_t>(i)];
    const std::size_t r = static_cast<std::size_t>(g.row_segment[static_cast<std::size_t>(e)]);
    const int pos = g.row_position[static_cast<std::size_t>(e)];
    std::vector<std::int32_t> keys;
    const int w0 = std::max(g.seg_pos0[r], pos - c.window + 1);
    for (int p = w0; p <= pos; ++p) keys.push_back(g.cu[r] + p - g.seg_pos0[r]);
    const int copies = g.comp_start[r + 1] - g.comp_start[r];
    auto add = [&](int id) {
      ASSERT_LT(id, copies) << "a visible entry beyond the run's copies";
      keys.push_back(low.compressed_base + g.dup_src[static_cast<std::size_t>(g.comp_start[r] + id)]);
    };
    if (selected) {
      for (int k = 0; k < K; ++k)
        if (topk[static_cast<std::size_t>(i) * K + k] >= 0) add(topk[static_cast<std::size_t>(i) * K + k]);
    } else if (c.ratio > 1) {
      for (int j = 0; j < std::min((pos + 1) / c.ratio, copies); ++j) add(j);
    }
    const std::int32_t* row = idx.index.data() + static_cast<std::size_t>(i) * idx.width();
    const std::vector<std::int32_t> want(row, row + idx.length[static_cast<std::size_t>(i)]);
    ASSERT_EQ(keys, want) << "GPU addressing, local query " << i << " (global row " << q.row(i) << ")";
  }
}

void check_view(const SeqLayout& raw_layout, const ViewCase& c, std::uint64_t seed) {
  const int d_w = cp::halo_width(c.window, c.ratio);
  const SeqLayout layout = pad_for_context_parallel(raw_layout, c.mode, c.ranks, d_w);
  const CpPartition part = CpPartition::build(layout, c.mode, c.ranks);
  const BatchGeometry geo = BatchGeometry::build(layout, c.ratio);
  const int K = 5;  // top-k width of the selected mode
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (int r = 0; r < c.ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const cp::LayerPlan plan = cp::build_layer_plan(geo, part, r, c.window);
    const cp::CpDeviceView view = cp::build_device_view(geo, plan);
    // Runs tile the ext rows and hold consecutive positions of one sequence.
    ASSERT_EQ(view.run_start.back(), static_cast<int>(plan.ext_rows.size()));
    for (int e = 0; e < static_cast<int>(plan.ext_rows.size()); ++e) {
      const int run = view.ext_run[static_cast<std::size_t>(e)];
      const int g = plan.ext_rows[static_cast<std::size_t>(e)];
      ASSERT_GE(e, view.run_start[static_cast<std::size_t>(run)]);
      ASSERT_LT(e, view.run_start[static_cast<std::size_t>(run) + 1]);
      ASSERT_EQ(view.run_sequence[static_cast<std::size_t>(run)], geo.row_segment[static_cast<std::size_t>(g)]);
      ASSERT_EQ(view.run_pos0[static_cast<std::size_t>(run)] + e - view.run_start[static_cast<std::size_t>(run)],
                geo.row_position[static_cast<std::size_t>(g)]);
    }

    // Owned compressed groups: the addressing through runs reaches the plan's entry rows
    // (the rows the CPU compressor pools) and keeps the previous block inside the run.
    if (c.ratio > 1) {
      const std::vector<cp::DeviceEntry> entries = cp::device_entries(view, geo, plan);
      ASSERT_EQ(entries.size(), plan.entries.size());
      for (std::size_t k = 0; k < entries.size(); ++k) {
        const cp::DeviceEntry& e = entries[k];
        EXPECT_EQ(cp::entry_first_row(view, e, c.ratio), plan.entries[k].first_row) << "entry " << k;
        EXPECT_EQ(cp::entry_prev_row(view, e, c.ratio), plan.entries[k].prev_row) << "entry " << k;
        EXPECT_EQ(e.slot, plan.entry_slot[k]);
        const int last = cp::entry_first_row(view, e, c.ratio) + c.ratio - 1;
        EXPECT_LT(last, view.run_start[static_cast<std::size_t>(e.run) + 1]) << "entry " << k << " leaves its run";
        const int prev = cp::entry_prev_row(view, e, c.ratio);
        if (prev >= 0) {
          EXPECT_GE(prev, view.run_start[static_cast<std::size_t>(e.run)]) << "entry " << k;
        }
      }
    }

    const QueryRows q{&geo, static_cast<int>(plan.local_rows.size()), plan.local_rows.data(), plan.local_ext.data()};
    KvLowering low;
    low.compressed_base = static_cast<int>(plan.ext_rows.size());
    low.seq_to_rank_row = c.ratio > 1 ? plan.seq_to_rank_row.data() : nullptr;
    low.seq_major_rows = plan.seq_major_rows;
    // Top-k rows with valid ids, -1 and out-of-range ids, in no particular order.
    std::vector<std::int32_t> topk(static_cast<std::size_t>(q.count) * K);
    for (int i = 0; i < q.count; ++i) {
      const int vis = geo.visible_compressed(q.row(i));
      for (int k = 0; k < K; ++k) {
        const int pick = static_cast<int>(rng() % 4);
        topk[static_cast<std::size_t>(i) * K + k] =
            pick == 0 ? -1 : pick == 1 ? vis + static_cast<int>(rng() % 3) : (vis > 0 ? static_cast<int>(rng() % vis) : -1);
      }
    }
    const bool selected = c.ratio == 4;
    const int cw = selected ? K : c.ratio > 1 ? layout.max_seg_len() / c.ratio : 0;
    const AttentionIndex idx = build_attention_index(q, selected ? IndexMode::selected : IndexMode::all_visible,
                                                     c.window, cw, selected ? topk.data() : nullptr, low);
    for (int i = 0; i < q.count; ++i) {
      const std::vector<std::int32_t> keys =
          cp::device_key_list(view, plan.local_ext[static_cast<std::size_t>(i)], c.window, c.ratio,
                              selected ? topk.data() + static_cast<std::size_t>(i) * K : nullptr, K, low.compressed_base);
      const std::int32_t* row = idx.index.data() + static_cast<std::size_t>(i) * idx.width();
      const std::vector<std::int32_t> want(row, row + idx.length[static_cast<std::size_t>(i)]);
      ASSERT_EQ(keys, want) << "local query " << i << " (global row " << q.row(i) << ")";
    }
    check_gpu_plan(geo, plan, view, c, q, low, rng);
  }
}

class CpDeviceView : public ::testing::TestWithParam<ViewCase> {};

TEST_P(CpDeviceView, KeyListsEqualTheCpuIndexLists) {
  const ViewCase c = GetParam();
  // Ragged sequences: shorter than the window and the ratio, tails, padding, one long one.
  check_view(SeqLayout::from_lengths({3, 70, 1, 300, 45}, {4, 72, 1, 310, 45}), c, 1);
  check_view(SeqLayout::from_lengths({520}), c, 2);
}

std::string view_case_name(const ::testing::TestParamInfo<ViewCase>& info) {
  const ViewCase& c = info.param;
  return std::string(c.mode == CpMode::contiguous ? "contiguous" : "two_chunk") + "_P" + std::to_string(c.ranks) +
         "_m" + std::to_string(c.ratio) + "_W" + std::to_string(c.window);
}

INSTANTIATE_TEST_SUITE_P(
    Partitions, CpDeviceView,
    ::testing::Values(ViewCase{CpMode::contiguous, 2, 0, 16}, ViewCase{CpMode::contiguous, 3, 4, 16},
                      ViewCase{CpMode::contiguous, 4, 128, 16}, ViewCase{CpMode::two_chunk, 2, 4, 16},
                      ViewCase{CpMode::two_chunk, 3, 128, 8}, ViewCase{CpMode::two_chunk, 4, 0, 32},
                      ViewCase{CpMode::two_chunk, 4, 4, 128}),
    view_case_name);

TEST(CpDeviceView, OneRankIsTheSingleGpuBatch) {
  // P = 1: one run per sequence starting at position 0, the map the identity on entries.
  const SeqLayout layout = SeqLayout::from_lengths({10, 33}, {12, 33});
  const BatchGeometry geo = BatchGeometry::build(layout, 4);
  const CpPartition part = CpPartition::build(layout, CpMode::contiguous, 1);
  const cp::CpDeviceView v = cp::build_device_view(geo, cp::build_layer_plan(geo, part, 0, 8));
  EXPECT_EQ(v.run_start, (std::vector<std::int32_t>{0, 12, 45}));
  EXPECT_EQ(v.run_pos0, (std::vector<std::int32_t>{0, 0}));
  for (int j = 0; j < geo.compressed_rows(); ++j) EXPECT_EQ(v.comp_map[static_cast<std::size_t>(j)], j);
}

TEST(CpDeviceView, AWindowLongerThanTheHaloIsAnError) {
  // Rank 1 of a contiguous split holds a halo of D_w = 8 rows; a 64-row window cannot be
  // served from its ext rows, and the view says so instead of reading the wrong rows.
  const SeqLayout layout = SeqLayout::from_lengths({64});
  const BatchGeometry geo = BatchGeometry::build(layout, 0);
  const CpPartition part = CpPartition::build(layout, CpMode::contiguous, 2);
  const cp::LayerPlan plan = cp::build_layer_plan(geo, part, 1, 8);
  const cp::CpDeviceView v = cp::build_device_view(geo, plan);
  const int last = static_cast<int>(plan.ext_rows.size()) - 1;
  EXPECT_EQ(cp::device_key_list(v, last, 8, 0, nullptr, 0, 0).size(), 8u);
  try {
    cp::device_key_list(v, last, 64, 0, nullptr, 0, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("halo too short"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace csattn
