// The deterministic backward's fixed-order scatter-add (src/cuda/ordered_scatter.cu) against
// a host emulation written from its contract: every key row receives, per chunk, the fp32 sum
// of the contributions of the rows that reference it, added in ascending row order, then
// added to the destination. The host builds each row's key list straight from the layer's
// definitions (window rows, then the selected / visible compressed rows), so the result must
// match bit for bit. Destinations start random (the add must accumulate) and rows no chunk
// references must stay untouched. Skips where no GPU is present.
#ifdef CSATTN_HAVE_CUDA
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <ostream>
#include <string>
#include <vector>

#include "csattn/layer.hpp"
#include "cuda/ordered_scatter.hpp"
#include "cuda/kernels.hpp"
#include "cuda_test_util.hpp"

namespace csattn {
namespace {

using cuda::SlotLayout;
using testing_util::DeviceArray;

struct Case {
  std::string name;
  SlotLayout layout;
  int ratio;   // 0: SWA
  int window;
  int topk;
  int width;
  // No compressed destination (the deterministic HCA chunks, whose compressed rows the
  // key-stationary pass sums): only the window rows are written, whatever the rows reference.
  bool window_only = false;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class OrderedScatter : public ::testing::TestWithParam<Case> {};

TEST_P(OrderedScatter, MatchesTheFixedOrderHostSumBitwise) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const Case c = GetParam();
  // Ragged, padded segments; one shorter than the ratio, one empty of compressed entries.
  const std::vector<int> real = {5, 1, 77, 203, 130}, padded = {8, 1, 77, 210, 130};
  const int B = static_cast<int>(real.size());
  std::vector<int> cu_real(B + 1, 0), cu_padded(B + 1, 0), comp_start(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    cu_real[b + 1] = cu_real[b] + real[b];
    cu_padded[b + 1] = cu_padded[b] + padded[b];
    comp_start[b + 1] = comp_start[b] + (c.ratio > 1 ? padded[b] / c.ratio : 0);
  }
  const int T = cu_padded[B];
  cuda::LayerDims d;
  d.rows = T;
  d.segments = B;
  d.max_seg_len = *std::max_element(padded.begin(), padded.end());
  d.window = c.window;
  d.ratio = c.ratio;
  d.comp_capacity = c.ratio > 1 ? T / c.ratio : 0;
  d.topk = c.topk;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);

  // Per row: the host key list (targets: >= 0 raw rows, < 0 compressed rows -(c+1)).
  std::vector<std::int32_t> topk(static_cast<std::size_t>(T) * std::max(c.topk, 1), -1);
  std::vector<std::vector<long>> keys(T);
  int slots = 0;
  for (int b = 0; b < B; ++b)
    for (int pos = 0; pos < padded[b]; ++pos) {
      const int r = cu_padded[b] + pos;
      const bool pad = pos >= real[b];
      const int entries = comp_start[b + 1] - comp_start[b];
      const int vis = c.ratio > 1 ? std::min((pos + 1) / c.ratio, entries) : 0;
      std::vector<int> sel;
      if (c.topk > 0) {  // random ascending subset of the visible entries
        std::vector<int> all(vis);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(std::min(vis, c.topk));
        std::sort(all.begin(), all.end());
        for (std::size_t k = 0; k < all.size(); ++k) topk[static_cast<std::size_t>(r) * c.topk + k] = all[k];
        sel = all;
      }
      std::vector<long>& list = keys[r];
      if (c.layout == SlotLayout::attention) {
        for (int u = cu_padded[b] + std::max(0, pos - c.window + 1); u <= r; ++u) list.push_back(u);
        if (c.ratio == 4) {
          for (int j : sel) list.push_back(-(comp_start[b] + j) - 1);
        } else {
          for (int j = 0; j < vis; ++j) list.push_back(-(comp_start[b] + j) - 1);
        }
      } else if (!pad) {
        if (c.layout == SlotLayout::loss_sparse) {
          for (int j : sel) list.push_back(-(comp_start[b] + j) - 1);
        } else {
          for (int j = 0; j < vis; ++j) list.push_back(-(comp_start[b] + j) - 1);
        }
      }
      slots = std::max(slots, static_cast<int>(list.size()));
    }
  slots = std::max(slots, 1) + 2;  // a stride larger than any row needs
  const int Nc = std::max(d.comp_capacity, 1);
  std::vector<float> dst_w(static_cast<std::size_t>(T) * c.width), dst_c(static_cast<std::size_t>(Nc) * c.width);
  for (float& v : dst_w) v = uni(rng);
  for (float& v : dst_c) v = uni(rng);

  DeviceArray<std::int32_t> d_topk(topk);
  testing_util::DeviceMetadataArrays metadata;
  const cuda::DeviceMetadata meta = metadata.build(d, cu_real, cu_padded);
  // The device's comp_start must equal the host's (this test's layout assumption).
  const std::vector<std::int32_t> dev_cs = metadata.comp_start();
  ASSERT_EQ(dev_cs, std::vector<std::int32_t>(comp_start.begin(), comp_start.end()));

  // Reset before every chunk size by an upload of the same size: same allocation, so s keeps
  // pointing at it.
  DeviceArray<float> d_dst_w(dst_w), d_dst_c(dst_c);
  cuda::OrderedScatter s;
  s.layout = c.layout;
  s.slots = slots;
  s.width = c.width;
  s.dst_window = d_dst_w.get();
  s.dst_comp = c.window_only ? nullptr : d_dst_c.get();

  for (int chunk : {1, 7, 64, T}) {
    SCOPED_TRACE("chunk rows " + std::to_string(chunk));
    std::vector<float> ew = dst_w, ec = dst_c;
    d_dst_w.upload(dst_w);
    d_dst_c.upload(dst_c);
    const std::size_t per_chunk = static_cast<std::size_t>(chunk) * slots * c.width;
    DeviceArray<float> d_scratch(per_chunk);
    std::vector<float> scratch(per_chunk);
    for (int r0 = 0; r0 < T; r0 += chunk) {
      const int rows = std::min(chunk, T - r0);
      // Unused slots hold NaN: reading one would poison the result.
      std::fill(scratch.begin(), scratch.end(), std::nanf(""));
      for (int r = r0; r < r0 + rows; ++r)
        for (std::size_t k = 0; k < keys[r].size(); ++k)
          for (int i = 0; i < c.width; ++i)
            scratch[((static_cast<std::size_t>(r - r0) * slots) + k) * c.width + i] = uni(rng);
      d_scratch.upload(scratch);
      cuda::launch_ordered_scatter(d, meta, d_topk.get(), s, r0, rows, d_scratch.get(), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "cudaDeviceSynchronize()";
      // Host: per target, sum in ascending row order, then add to the destination.
      std::vector<std::vector<float>> acc_w(T), acc_c(Nc);
      for (int r = r0; r < r0 + rows; ++r)
        for (std::size_t k = 0; k < keys[r].size(); ++k) {
          const long id = keys[r][k];
          if (id < 0 && c.window_only) continue;
          std::vector<float>& a = id >= 0 ? acc_w[id] : acc_c[-id - 1];
          if (a.empty()) a.assign(c.width, 0.0f);
          for (int i = 0; i < c.width; ++i)
            a[i] += scratch[((static_cast<std::size_t>(r - r0) * slots) + k) * c.width + i];
        }
      for (int u = 0; u < T; ++u)
        if (!acc_w[u].empty())
          for (int i = 0; i < c.width; ++i) ew[static_cast<std::size_t>(u) * c.width + i] += acc_w[u][i];
      for (int e = 0; e < Nc; ++e)
        if (!acc_c[e].empty())
          for (int i = 0; i < c.width; ++i) ec[static_cast<std::size_t>(e) * c.width + i] += acc_c[e][i];
    }
    const std::vector<float> gw = d_dst_w.download(), gc = d_dst_c.download();
    EXPECT_EQ(std::memcmp(gw.data(), ew.data(), ew.size() * 4), 0) << "raw key rows differ";
    EXPECT_EQ(std::memcmp(gc.data(), ec.data(), ec.size() * 4), 0) << "compressed rows differ";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, OrderedScatter,
    ::testing::Values(Case{"attention_swa", SlotLayout::attention, 0, 16, 0, 512},
                      Case{"attention_csa", SlotLayout::attention, 4, 16, 8, 512},
                      Case{"attention_hca", SlotLayout::attention, 8, 16, 0, 128},
                      Case{"loss_sparse", SlotLayout::loss_sparse, 4, 16, 8, 128},
                      Case{"loss_dense", SlotLayout::loss_dense, 4, 16, 0, 256},
                      // widths off the float4 path: scalar lanes, guarded tails
                      Case{"attention_hca_width64", SlotLayout::attention, 8, 16, 0, 64},
                      Case{"attention_csa_width96", SlotLayout::attention, 4, 16, 8, 96},
                      Case{"loss_dense_width640", SlotLayout::loss_dense, 4, 16, 0, 640},
                      Case{"attention_hca_window_only", SlotLayout::attention, 8, 16, 0, 512, true}),
    [](const auto& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace csattn
#endif
