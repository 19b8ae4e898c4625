// launch_gather_ceiling (src/cuda/gather_ceiling.hpp), the `gathers` benchmark's kernels: bad
// arguments are refused before the device is touched; on a GPU the word sum of either copy
// path (16-byte cp.async, or eight 128-byte TMA boxes a row) equals the host's over the rows it
// was given (with repeated rows, an odd tail of items past the grid, and the Q / O streams),
// and the streams write O. A dropped copy or a wrong row changes the sum. The tile probe
// checks where each path puts a row's bytes: the forward's swizzled layout, byte for byte.
#ifdef CSATTN_HAVE_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "csattn/error.hpp"
#include "cuda/gather_ceiling.hpp"
#include "cuda_test_util.hpp"
#include "test_util.hpp"

namespace csattn {
namespace {

using cuda::bf16;
using testing_util::DeviceArray;

// `rows` random 1 KB rows (256 words each), drawn from `rng`.
std::vector<std::uint32_t> random_table(int rows, std::mt19937& rng) {
  std::vector<std::uint32_t> table(static_cast<std::size_t>(rows) * 256);
  for (std::uint32_t& w : table) w = rng();
  return table;
}

TEST(GatherCeiling, BadArgumentsAreRefusedBeforeTheDevice) {
  for (int per_item : {0, -64, 100}) {
    try {
      cuda::launch_gather_ceiling(nullptr, nullptr, 4, per_item, nullptr, nullptr, false, nullptr, nullptr);
      ADD_FAILURE() << "keys_per_item " << per_item << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("multiple of 64"), std::string::npos) << e.what();
    }
  }
  try {
    cuda::launch_gather_ceiling(nullptr, nullptr, 4, 64, nullptr, nullptr, true, nullptr, nullptr);
    ADD_FAILURE() << "streams without q / out were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
  }
  try {
    cuda::launch_gather_ceiling(nullptr, nullptr, 4, 64, nullptr, nullptr, false, nullptr, nullptr,
                                cuda::GatherCopy::tma_boxes, 0);
    ADD_FAILURE() << "TMA boxes without the table's row count were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("row count"), std::string::npos) << e.what();
  }
}

TEST(GatherCeiling, WordSumMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  // 64 MB of rows, more than L2 holds: a wait too weak for the copies' latency shows.
  constexpr int kRows = 65536;
  std::mt19937 rng(20261207u);
  const std::vector<std::uint32_t> table = random_table(kRows, rng);
  std::uniform_int_distribution<int> pick(0, kRows - 1);
  DeviceArray<std::uint32_t> table_dev(table);
  // Items of 1 tile (fewer tiles than the ring's stages: the prologue's empty groups) and of 5
  // (neither the stage count nor a multiple of it: a mix-up of the two moduli shows).
  for (cuda::GatherCopy copy : {cuda::GatherCopy::cp_async, cuda::GatherCopy::tma_boxes}) {
    for (int per_item : {64, 320}) {
      for (int items : {1, 7, 301}) {  // 301: more items than multiprocessors, an uneven tail
        for (bool streams : {false, true}) {
          std::vector<std::int32_t> ids(static_cast<std::size_t>(items) * per_item);
          for (std::int32_t& id : ids) id = pick(rng);
          ids[1] = ids[0];  // a row twice in one tile
          std::uint32_t want = 0;
          for (std::int32_t id : ids)
            for (int k = 0; k < 256; ++k) want += table[static_cast<std::size_t>(id) * 256 + k];
          const std::size_t stream_words = static_cast<std::size_t>(items) * 64 * 512 / 2;
          std::vector<std::uint32_t> q_host(streams ? stream_words : 1);
          for (std::uint32_t& w : q_host) w = rng();
          if (streams)
            for (std::uint32_t w : q_host) want += w;
          DeviceArray<std::uint32_t> q_dev(q_host), out_dev(streams ? stream_words : 1),
              sum_dev(std::vector<std::uint32_t>{0u});
          DeviceArray<std::int32_t> ids_dev(ids);
          out_dev.fill_bytes(0xFF);
          cuda::launch_gather_ceiling(reinterpret_cast<const bf16*>(table_dev.get()), ids_dev.get(), items,
                                      per_item, reinterpret_cast<const bf16*>(q_dev.get()),
                                      reinterpret_cast<bf16*>(out_dev.get()), streams, sum_dev.get(), nullptr, copy,
                                      kRows);
          testing_util::cuda_ok(cudaDeviceSynchronize(), "gather ceiling");
          const char* how = cuda::gather_copy_name(copy);
          EXPECT_EQ(sum_dev.download()[0], want)
              << how << ", " << items << " items of " << per_item << " rows, streams " << streams;
          if (streams) {
            const std::vector<std::uint32_t> out = out_dev.download();
            std::size_t written = 0;
            for (std::uint32_t w : out) written += w == 0u;
            EXPECT_EQ(written, out.size()) << how << ": O not written everywhere, " << items << " items";
          }
        }
      }
    }
  }
}

// The forward's key-buffer layout from the host: row r's 16-byte chunk c of 64-dim block b at
// b * 8 KB + r * 128 + (c ^ (r % 8)) * 16. The cp.async path writes it explicitly (a check of
// this expectation); the TMA path must land its 1-row boxes there by itself - what a forward
// fed by such boxes (the TMA-multicast cluster candidate) relies on.
TEST(GatherCeiling, TileProbeLandsInTheForwardsSwizzledLayout) {
  SKIP_WITHOUT_GPU();
  constexpr int kRows = 1000;
  std::mt19937 rng(20261208u);
  const std::vector<std::uint32_t> table = random_table(kRows, rng);
  std::vector<std::int32_t> ids(64);
  std::uniform_int_distribution<int> pick(0, kRows - 1);
  for (std::int32_t& id : ids) id = pick(rng);
  ids[5] = ids[4];  // a row twice
  std::vector<std::uint32_t> want(64 * 256);
  for (int r = 0; r < 64; ++r)
    for (int b = 0; b < 8; ++b)
      for (int c = 0; c < 8; ++c)
        for (int w = 0; w < 4; ++w)
          want[static_cast<std::size_t>((b * 8192 + r * 128 + ((c ^ (r & 7)) * 16)) / 4 + w)] =
              table[static_cast<std::size_t>(ids[r]) * 256 + b * 32 + c * 4 + w];
  DeviceArray<std::uint32_t> table_dev(table);
  DeviceArray<std::int32_t> ids_dev(ids);
  for (cuda::GatherCopy copy : {cuda::GatherCopy::cp_async, cuda::GatherCopy::tma_boxes}) {
    const char* how = cuda::gather_copy_name(copy);
    DeviceArray<std::uint32_t> tile(want.size());
    tile.fill_bytes(0xFF);
    cuda::launch_gather_tile_probe(reinterpret_cast<const bf16*>(table_dev.get()), kRows, ids_dev.get(), copy,
                                   tile.get(), nullptr);
    testing_util::cuda_ok(cudaDeviceSynchronize(), "gather tile probe");
    const std::vector<std::uint32_t> got = tile.download();
    std::size_t wrong = 0, first = got.size();
    for (std::size_t k = 0; k < got.size(); ++k)
      if (got[k] != want[k]) {
        ++wrong;
        first = std::min(first, k);
      }
    EXPECT_EQ(wrong, 0u) << how << ": " << wrong << " words off the forward's layout, first at byte " << 4 * first
                         << " (block " << 4 * first / 8192 << ", row " << 4 * first % 8192 / 128 << ")";
  }
}

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
