// Partition plans, compaction, the sequence-major map and the lowered attention indices,
// against the spec's examples and brute-force references.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "core/attention_index.hpp"
#include "cp/layer_plan.hpp"
#include "cp_test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

std::vector<int> rows_of(const CpPartition& p, int r) { return p.rows(r); }

TEST(CpPartition, TwoChunkSpecExample) {
  // spec 02 §2.1: cu = [0, 4, 16], P = 2, rank 0 gets rows [0, 3, 4, 5, 6, 13, 14, 15].
  const CpPartition p = CpPartition::build(SeqLayout::thd({0, 4, 16}), CpMode::two_chunk, 2);
  EXPECT_EQ(rows_of(p, 0), (std::vector<int>{0, 3, 4, 5, 6, 13, 14, 15}));
  EXPECT_EQ(rows_of(p, 1), (std::vector<int>{1, 2, 7, 8, 9, 10, 11, 12}));
  // Touching chunks merge: rank 1 holds chunks 1 and 2 of sequence 0 as one piece.
  ASSERT_EQ(p.pieces(1).size(), 2u);  // [1, 3) and [7, 13)
  EXPECT_EQ(p.pieces(1)[0].begin, 1);
  EXPECT_EQ(p.pieces(1)[0].end, 3);
  EXPECT_EQ(p.owner(13), 0);
  EXPECT_EQ(p.local_index(13), 5);
}

TEST(CpPartition, ContiguousSlicesAndEveryRowOnce) {
  const CpPartition p = CpPartition::build(SeqLayout::from_lengths({5, 20, 0, 11}), CpMode::contiguous, 4);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(p.pieces(r).size(), 1u);
    EXPECT_EQ(p.pieces(r)[0].begin, 9 * r);
    EXPECT_EQ(p.local_rows(r), 9);
  }
  const CpPartition q = CpPartition::build(SeqLayout::from_lengths({8, 0, 24, 16}), CpMode::two_chunk, 4);
  std::vector<int> seen(48, 0);
  for (int r = 0; r < 4; ++r)
    for (int g : q.rows(r)) ++seen[static_cast<std::size_t>(g)];
  EXPECT_EQ(seen, std::vector<int>(48, 1));
}

TEST(CpPartition, LengthRulesSayWhatToPad) {
  try {
    CpPartition::build(SeqLayout::from_lengths({5, 8}), CpMode::contiguous, 3);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("to 15 rows"), std::string::npos) << e.what();
  }
  try {
    CpPartition::build(SeqLayout::from_lengths({16, 13}), CpMode::two_chunk, 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 1 has padded length 13; pad it to 16"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(CpPartition::build(SeqLayout::from_lengths({4}), CpMode::two_chunk, 0), Error);
  EXPECT_THROW(parse_cp_mode("zigzag"), Error);
}

TEST(CpPartition, PaddingKeepsRealLengths) {
  const SeqLayout l = SeqLayout::from_lengths({5, 13}, {6, 13});
  const SeqLayout t = pad_for_context_parallel(l, CpMode::two_chunk, 2);
  EXPECT_EQ(t.cu_seqlens(), l.cu_seqlens());
  EXPECT_EQ(t.cu_seqlens_padded(), (std::vector<std::int32_t>{0, 8, 24}));
  const SeqLayout c = pad_for_context_parallel(l, CpMode::contiguous, 4, 8);
  EXPECT_EQ(c.total_rows(), 32);
  EXPECT_EQ(c.seg_len(0), 6);
  EXPECT_EQ(c.real_len(1), 13);
  EXPECT_NO_THROW(CpPartition::build(t, CpMode::two_chunk, 2));
}

TEST(CpMap, SpecExample) {
  // spec 02 §5.3: P = 2, R = 4, one sequence of 32 rows, L = 16, C = 8: rank 0 owns groups
  // 0..3, rank 1's slots start with the unowned groups 2, 3, then 4..7.
  const SeqLayout layout = SeqLayout::from_lengths({32});
  const CpPartition part = CpPartition::build(layout, CpMode::contiguous, 2);
  const BatchGeometry geo = BatchGeometry::build(layout, 4);
  const int C = cp::slots_per_rank(geo, part, 8);
  EXPECT_EQ(C, 8);
  EXPECT_EQ(cp::seq_to_rank_row(geo, part, 8, C),
            (std::vector<std::int32_t>{0, 1, 2, 3, 10, 11, 12, 13}));
  const std::vector<cp::CompactSlot> s1 = cp::compact_slots(geo, part.pieces(1), 8);
  ASSERT_EQ(s1.size(), 6u);
  EXPECT_EQ(s1[0].group, 2);
  EXPECT_FALSE(s1[0].owned);
  EXPECT_FALSE(s1[1].owned);
  EXPECT_TRUE(s1[2].owned);
}

// Brute force: the slots of a piece list are, piece by piece, segment by segment, the groups
// whose rows all lie in [piece start - D_c, piece end); owned iff the last row is in the piece.
std::vector<std::tuple<int, int, bool>> brute_slots(const BatchGeometry& geo,
                                                    const std::vector<RowPiece>& pieces, int d_c) {
  std::vector<std::tuple<int, int, bool>> out;
  const int R = geo.ratio;
  for (const RowPiece& p : pieces)
    for (int s = 0; s < geo.segments; ++s)
      for (int c = 0; c < geo.seg_compressed(s); ++c) {
        const int first = geo.seg_start[s] + c * R, last = first + R - 1;
        const bool intersects = geo.seg_start[s] < p.end && geo.seg_start[s] + geo.seg_len[s] > p.begin;
        if (intersects && first >= p.begin - d_c && last < p.end)
          out.emplace_back(s, c, last >= p.begin);
      }
  return out;
}

// spec 02 §12 composed test: lengths (3,10,20,5,33,10,27,20) at R = 4 and
// (3,130,170,5,260,129,200,127) at R = 128, W = 4, P in {2, 4}, both modes. On every rank the
// slots equal the brute force, the map gives every compressed row its owner's slot, and every
// lowered index of every mode reaches the right token.
class CpComposed : public ::testing::TestWithParam<std::tuple<int, int, CpMode>> {};

TEST_P(CpComposed, MapAndIndicesReachTheRightTokens) {
  const auto [R, P, mode] = GetParam();
  const std::vector<int> lens = R == 4 ? std::vector<int>{3, 10, 20, 5, 33, 10, 27, 20}
                                       : std::vector<int>{3, 130, 170, 5, 260, 129, 200, 127};
  const int W = 4;
  const SeqLayout layout = pad_for_context_parallel(SeqLayout::from_lengths(lens), mode, P);
  const CpPartition part = CpPartition::build(layout, mode, P);
  const BatchGeometry geo = BatchGeometry::build(layout, R);
  const int d_c = cp::compressor_context(R);
  const int C = cp::slots_per_rank(geo, part, d_c);
  const std::vector<std::int32_t> map = cp::seq_to_rank_row(geo, part, d_c, C);

  // The rank-major buffer as "identities": slot o*C + k holds (segment, group) of rank o's
  // owned slot k.
  std::vector<std::pair<int, int>> rank_major(static_cast<std::size_t>(P) * C, {-1, -1});
  for (int o = 0; o < P; ++o) {
    const auto slots = cp::compact_slots(geo, part.pieces(o), d_c);
    const auto brute = brute_slots(geo, part.pieces(o), d_c);
    ASSERT_EQ(slots.size(), brute.size()) << "rank " << o;
    for (std::size_t k = 0; k < slots.size(); ++k) {
      EXPECT_EQ(std::make_tuple(slots[k].segment, slots[k].group, slots[k].owned), brute[k]);
      if (slots[k].owned) rank_major[static_cast<std::size_t>(o) * C + k] = {slots[k].segment, slots[k].group};
    }
  }
  for (int s = 0; s < geo.segments; ++s)
    for (int c = 0; c < geo.seg_compressed(s); ++c) {
      const int m = map[static_cast<std::size_t>(geo.comp_start[s] + c)];
      ASSERT_GE(m, 0);
      EXPECT_EQ(rank_major[static_cast<std::size_t>(m)], std::make_pair(s, c));
      // owner = rank holding the group's last row
      EXPECT_EQ(m / C, part.owner(geo.seg_start[s] + (c + 1) * R - 1));
    }
  for (std::size_t j = static_cast<std::size_t>(geo.compressed_rows()); j < map.size(); ++j)
    EXPECT_EQ(map[j], -1);

  const int cw_all = layout.max_seg_len() / R;
  const int K = 3;
  for (int r = 0; r < P; ++r) {
    const cp::LayerPlan plan = cp::build_layer_plan(geo, part, r, W);
    EXPECT_EQ(plan.slots, C);
    // Entries of owned slots point at their group's rows.
    for (std::size_t k = 0; k < plan.entries.size(); ++k) {
      const cp::CompactSlot& sl = plan.compact[static_cast<std::size_t>(plan.entry_slot[k])];
      EXPECT_EQ(plan.ext_rows[static_cast<std::size_t>(plan.entries[k].first_row)],
                geo.seg_start[sl.segment] + sl.group * R);
      if (R == 4 && sl.group > 0) {
        EXPECT_EQ(plan.ext_rows[static_cast<std::size_t>(plan.entries[k].prev_row)],
                  geo.seg_start[sl.segment] + (sl.group - 1) * R);
      }
    }
    const QueryRows q{&geo, static_cast<int>(plan.local_rows.size()), plan.local_rows.data(),
                      plan.local_ext.data()};
    KvLowering low;
    low.compressed_base = static_cast<int>(plan.ext_rows.size());
    low.seq_to_rank_row = plan.seq_to_rank_row.data();
    low.seq_major_rows = plan.seq_major_rows;
    // A top-k with valid, repeated-invalid and out-of-range ids.
    std::vector<std::int32_t> topk(static_cast<std::size_t>(q.count) * K, -1);
    for (int i = 0; i < q.count; ++i) {
      const int g = q.row(i), vis = geo.visible_compressed(g);
      for (int k = 0; k < K; ++k) topk[static_cast<std::size_t>(i) * K + k] = k < vis ? vis - 1 - k : (k % 2 ? -1 : 1000);
    }
    // Decodes a kv_full row into ("raw", global row) or ("comp", segment, group).
    auto decode = [&](int v) -> std::tuple<int, int, int> {
      if (v < low.compressed_base) return {0, plan.ext_rows[static_cast<std::size_t>(v)], 0};
      const auto sg = rank_major[static_cast<std::size_t>(v - low.compressed_base)];
      return {1, sg.first, sg.second};
    };
    for (IndexMode mode_i : {IndexMode::selected, IndexMode::all_visible, IndexMode::indexer_loss}) {
      const int cw = mode_i == IndexMode::all_visible ? cw_all : K;
      const AttentionIndex idx = build_attention_index(
          q, mode_i, W, cw, mode_i == IndexMode::all_visible ? nullptr : topk.data(), low);
      for (int i = 0; i < q.count; ++i) {
        const int g = q.row(i), s = geo.row_segment[g], pos = geo.row_position[g];
        const int w0 = std::max(pos - W + 1, 0);
        std::vector<std::tuple<int, int, int>> expect_window, expect_comp;
        for (int p = w0; p <= pos; ++p) expect_window.emplace_back(0, geo.seg_start[s] + p, 0);
        const std::int32_t* row = idx.index.data() + static_cast<std::size_t>(i) * idx.width();
        const std::int32_t* sel = topk.data() + static_cast<std::size_t>(i) * K;
        if (mode_i == IndexMode::indexer_loss) {
          for (int k = 0; k < K; ++k) {
            const bool valid = sel[k] >= 0 && sel[k] < geo.seg_compressed(s);
            if (valid) { EXPECT_EQ(decode(row[k]), std::make_tuple(1, s, sel[k])); }
            else { EXPECT_EQ(row[k], -1); }
            EXPECT_EQ(idx.indexer_rank_major[static_cast<std::size_t>(i) * K + k],
                      valid ? row[k] - low.compressed_base : -1);
          }
          for (int w = 0; w < W; ++w) {
            if (w < static_cast<int>(expect_window.size())) { EXPECT_EQ(decode(row[K + w]), expect_window[w]); }
            else { EXPECT_EQ(row[K + w], -1); }
          }
          continue;
        }
        if (mode_i == IndexMode::selected) {
          for (int k = 0; k < K; ++k)
            if (sel[k] >= 0 && sel[k] < geo.seg_compressed(s)) expect_comp.emplace_back(1, s, sel[k]);
        } else {
          for (int c = 0; c < geo.visible_compressed(g); ++c) expect_comp.emplace_back(1, s, c);
        }
        std::vector<std::tuple<int, int, int>> got;
        for (int k = 0; k < idx.length[static_cast<std::size_t>(i)]; ++k) got.push_back(decode(row[k]));
        for (int k = idx.length[static_cast<std::size_t>(i)]; k < idx.width(); ++k) EXPECT_EQ(row[k], -1);
        std::vector<std::tuple<int, int, int>> expect = expect_window;
        expect.insert(expect.end(), expect_comp.begin(), expect_comp.end());
        EXPECT_EQ(got, expect) << "rank " << r << " row " << g;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Spec, CpComposed,
    ::testing::Combine(::testing::Values(4, 128), ::testing::Values(2, 4),
                       ::testing::Values(CpMode::contiguous, CpMode::two_chunk)),
    [](const auto& i) {
      return "R" + std::to_string(std::get<0>(i.param)) + "_P" + std::to_string(std::get<1>(i.param)) +
             "_" + cp_mode_name(std::get<2>(i.param));
    });

// The halo plan: every rank receives exactly the rows [piece start - D_w, piece start) of the
// piece's first sequence that it does not own, each from its owner, and the senders send the
// same rows in the same order.
TEST(CpHalo, ReceivesMatchSendsAcrossRanks) {
  const SeqLayout layout = pad_for_context_parallel(SeqLayout::from_lengths({3, 130, 170, 5, 60}), CpMode::two_chunk, 4);
  const CpPartition part = CpPartition::build(layout, CpMode::two_chunk, 4);
  const BatchGeometry geo = BatchGeometry::build(layout, 128);
  std::vector<cp::LayerPlan> plans;
  for (int r = 0; r < 4; ++r) plans.push_back(cp::build_layer_plan(geo, part, r, 8));
  int multi_source = 0;
  for (int r = 0; r < 4; ++r) {
    std::set<int> expect;
    for (const RowPiece& p : part.pieces(r)) {
      const int a = static_cast<int>(p.begin), s = geo.row_segment[a];
      for (int g = std::max(a - 128, geo.seg_start[s]); g < a; ++g)
        if (part.owner(g) != r) expect.insert(g);
    }
    std::set<int> got;
    multi_source += plans[r].halo_receive.size() > 1;
    for (const cp::HaloTransfer& t : plans[r].halo_receive) {
      const cp::LayerPlan& src = plans[static_cast<std::size_t>(t.peer)];
      const cp::HaloTransfer* back = nullptr;
      for (const cp::HaloTransfer& u : src.halo_send)
        if (u.peer == r) back = &u;
      ASSERT_NE(back, nullptr);
      ASSERT_EQ(back->rows.size(), t.rows.size());
      for (std::size_t i = 0; i < t.rows.size(); ++i) {
        const int g = plans[r].ext_rows[static_cast<std::size_t>(t.rows[i])];
        EXPECT_EQ(src.local_rows[static_cast<std::size_t>(back->rows[i])], g);
        EXPECT_EQ(part.owner(g), t.peer);
        got.insert(g);
      }
    }
    EXPECT_EQ(got, expect) << "rank " << r;
  }
  EXPECT_GT(multi_source, 0) << "the layout should make some halo come from several ranks";
}

// The worked example of docs/design.md: P = 2, two_chunk, cu = [0, 8, 24], m = 4, W = 4
// (D_c = 8, D_w = 8).
TEST(CpDesignDoc, TwoChunkWorkedExample) {
  const SeqLayout layout = SeqLayout::thd({0, 8, 24});
  const CpPartition part = CpPartition::build(layout, CpMode::two_chunk, 2);
  auto pieces = [&](int r) {
    std::vector<std::pair<int, int>> v;
    for (const RowPiece& p : part.pieces(r)) v.emplace_back(p.begin, p.end);
    return v;
  };
  EXPECT_EQ(pieces(0), (std::vector<std::pair<int, int>>{{0, 2}, {6, 12}, {20, 24}}));
  EXPECT_EQ(pieces(1), (std::vector<std::pair<int, int>>{{2, 6}, {12, 20}}));
  const BatchGeometry geo = BatchGeometry::build(layout, 4);
  const cp::LayerPlan p0 = cp::build_layer_plan(geo, part, 0, 4);
  const cp::LayerPlan p1 = cp::build_layer_plan(geo, part, 1, 4);
  auto halo = [](const cp::LayerPlan& p) {
    std::vector<int> rows;
    for (std::size_t e = 0; e < p.ext_rows.size(); ++e)
      if (p.ext_local[e] < 0) rows.push_back(p.ext_rows[e]);
    return rows;
  };
  EXPECT_EQ(halo(p0), (std::vector<int>{2, 3, 4, 5, 12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(halo(p1), (std::vector<int>{0, 1, 8, 9, 10, 11}));
  auto slots = [](const cp::LayerPlan& p) {
    std::vector<std::tuple<int, int, bool>> v;
    for (const cp::CompactSlot& s : p.compact) v.emplace_back(s.segment, s.group, s.owned);
    return v;
  };
  EXPECT_EQ(slots(p0), (std::vector<std::tuple<int, int, bool>>{
                           {0, 0, false}, {0, 1, true}, {1, 0, true}, {1, 1, false}, {1, 2, false}, {1, 3, true}}));
  EXPECT_EQ(slots(p1), (std::vector<std::tuple<int, int, bool>>{
                           {0, 0, true}, {1, 0, false}, {1, 1, true}, {1, 2, true}}));
  EXPECT_EQ(p0.slots, 8);
  EXPECT_EQ(p0.seq_to_rank_row, (std::vector<std::int32_t>{8, 1, 2, 10, 11, 5}));
  // Rank 1's query at row 13 (sequence 1, position 5): window rows 10..13 (ext rows: halo
  // 10, 11 then local 12, 13), visible compressed entry 0 -> rank-major row 2 (rank 0's slot 2).
  const int i = 5;  // local index of row 13 on rank 1: rows 2,3,4,5,12,13
  ASSERT_EQ(p1.local_rows[i], 13);
  const QueryRows q{&geo, 1, &p1.local_rows[i], &p1.local_ext[i]};
  KvLowering low{static_cast<int>(p1.ext_rows.size()), p1.seq_to_rank_row.data(), p1.seq_major_rows};
  const AttentionIndex idx = build_attention_index(q, IndexMode::all_visible, 4, 24 / 4, nullptr, low);
  ASSERT_EQ(idx.length[0], 5);
  std::vector<int> rows;
  for (int k = 0; k < 4; ++k) rows.push_back(p1.ext_rows[static_cast<std::size_t>(idx.index[k])]);
  EXPECT_EQ(rows, (std::vector<int>{10, 11, 12, 13}));
  EXPECT_EQ(idx.index[4], static_cast<int>(p1.ext_rows.size()) + 2);
}

}  // namespace
}  // namespace csattn
