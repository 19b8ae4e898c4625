// The forward's launch sequence under CUDA-graph capture (CudaLayer::replay_forward_graph):
// captured in global mode, so any allocation or host synchronisation inside a run fails the
// test; replayed with the captured layout it must give the eager forward's output bit for
// bit, and replayed after only the cu_seqlens changed (same rows and segments, other
// boundaries) it must give the eager forward of the new layout - the metadata is rebuilt
// on the device at every replay, nothing of the captured batch is baked into the graph.
// Skips where no GPU is present.
#ifdef CSATTN_HAVE_CUDA
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_layer.hpp"
#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

void expect_bitwise(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  const std::vector<float> va = a.to_f32(), vb = b.to_f32();
  std::size_t differ = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    ASSERT_TRUE(std::isfinite(va[i])) << what << " element " << i;
    if (std::memcmp(&va[i], &vb[i], sizeof(float)) != 0) ++differ;
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << va.size() << " elements differ";
}

class CudaGraph : public ::testing::TestWithParam<int> {};

TEST_P(CudaGraph, ReplaysRefreshTheMetadata) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  cfg.compress_ratio = GetParam();
  const LayerWeights w = LayerWeights::random(cfg, 61);
  // Same rows (1040) and segments (3); B's longest segment is no longer than A's.
  const SeqLayout a = SeqLayout::from_lengths({300, 600, 130}, {304, 600, 136});
  const SeqLayout b = SeqLayout::from_lengths({590, 17, 433}, {590, 17, 433});
  ASSERT_EQ(a.total_rows(), b.total_rows());
  const Tensor x = random_tensor(static_cast<int>(a.total_rows()), cfg.d_model, 62, true);

  cuda::CudaLayer eager_b(cfg, w);
  const Tensor yb = eager_b.forward(x, b, Tensor()).output;
  cuda::CudaLayer layer(cfg, w);
  const Tensor ya = layer.forward(x, a, Tensor()).output;
  const std::vector<Tensor> replays = layer.replay_forward_graph({a, b, a});
  ASSERT_EQ(replays.size(), 3u);
  expect_bitwise(replays[0], ya, "replay of the captured layout");
  expect_bitwise(replays[1], yb, "replay with the second layout's cu_seqlens");
  expect_bitwise(replays[2], ya, "replay with the first layout again");
  // The workspace holds the last replay now: a backward must refuse.
  EXPECT_THROW(layer.backward(random_tensor(static_cast<int>(a.total_rows()), cfg.d_model, 63), 1.0f), Error);
}

INSTANTIATE_TEST_SUITE_P(Layers, CudaGraph, ::testing::Values(0, 4, 128),
                         [](const auto& param_info) { return layer_kind_name(layer_kind(param_info.param)); });

TEST(CudaGraph, ALayoutThatDoesNotFitIsRefused) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("small").base;
  cfg.compress_ratio = 4;
  cuda::CudaLayer layer(cfg, LayerWeights::random(cfg, 64));
  const SeqLayout a = SeqLayout::from_lengths({50, 50});
  layer.forward(random_tensor(100, cfg.d_model, 65), a, Tensor());
  try {
    layer.replay_forward_graph({SeqLayout::from_lengths({90, 10})});  // longer segment than captured
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit the captured forward"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
