// csattn::DeviceLayer (device memory, caller workspaces and stream) against the host-tensor
// GPU layer over the same kernels: forward outputs, top-k and loss bitwise equal, gradients
// (fp32 atomics in both) within 1e-6 in cosine, the weight gradients read at their offsets
// in the backward workspace; the forward captured in a CUDA graph in global mode (no
// allocation or host sync inside) replays bitwise; bad workspaces are errors (passed on the
// H200 2026-12-04; the loss gradient given on the device, added 2026-12-05, not yet run).
// CudaDeviceLayerGraph (2026-12-05, not yet run on a GPU): a whole training step in one
// graph, replayed with another packing and another device loss gradient. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "csattn/device_layer.hpp"
#include "test_util.hpp"

#ifdef CSATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda_test_util.hpp"
#endif

namespace csattn {
namespace {

using namespace testing_util;

// Without a usable GPU (or without the CUDA backend) the constructor says why.
TEST(DeviceLayer, WithoutGpuTheErrorSaysWhy) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a GPU is present";
  const AttentionConfig cfg = ModelConfig::preset("tiny").layer(0);
  try {
    DeviceLayer layer(cfg, LayerWeights::random(cfg, 1));
    ADD_FAILURE() << "a DeviceLayer without a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    ASSERT_FALSE(why.empty());
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << "message: " << e.what();
  }
}

#ifdef CSATTN_HAVE_CUDA

#define CU(call) ASSERT_EQ((call), cudaSuccess) << #call

std::vector<std::uint16_t> bf16_bits_of(const Tensor& t) {
  const std::vector<float> v = t.to_f32();
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16_bits(v[i]);
  return out;
}

// The DeviceBatch of a packed layout whose x and cu_seqlens arrays are on the device.
csattn::DeviceBatch device_batch(const void* x, const std::int32_t* cu, const std::int32_t* cu_padded,
                                 const SeqLayout& layout) {
  csattn::DeviceBatch b;
  b.x = x;
  b.cu_seqlens = cu;
  b.cu_seqlens_padded = cu_padded;
  b.rows = static_cast<int>(layout.total_rows());
  b.segments = layout.num_segments();
  b.max_seqlen = layout.max_seg_len();
  b.real_rows = layout.real_rows();
  return b;
}

class CudaDeviceLayer : public ::testing::TestWithParam<int> {};

TEST_P(CudaDeviceLayer, MatchesTheHostTensorLayer) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("small").base;
  cfg.compress_ratio = GetParam();
  cfg.loss_coeff = 0.5;
  const SeqLayout layout = cfg.compress_ratio == 128 ? SeqLayout::from_lengths({70, 300, 521}, {72, 300, 530})
                                                     : SeqLayout::from_lengths({5, 1, 77, 203, 130}, {8, 1, 77, 210, 130});
  const int T = static_cast<int>(layout.total_rows()), B = layout.num_segments(), L = layout.max_seg_len();
  const LayerWeights w = LayerWeights::random(cfg, 91);
  const Tensor x = random_tensor(T, cfg.d_model, 92, true);
  const Tensor dy = random_tensor(T, cfg.d_model, 93, true);

  HybridAttentionLayer host(cfg, w, RunOptions{Precision::bf16, Device::cuda});
  const LayerOutputs ho = host.forward(x, layout);
  const LayerGradients hg = host.backward(ho, dy);

  DeviceLayer dev(cfg, w);
  DeviceArray<std::uint16_t> dx_in(bf16_bits_of(x)), ddy(bf16_bits_of(dy)), dyout(static_cast<std::size_t>(T) * cfg.d_model);
  DeviceArray<std::int32_t> cu(layout.cu_seqlens()), cup(layout.cu_seqlens_padded());
  const int K = cfg.has_indexer() ? cfg.index_topk : 1;
  DeviceArray<std::int32_t> topk(static_cast<std::size_t>(T) * K);
  DeviceArray<float> loss(1), dxo(static_cast<std::size_t>(T) * cfg.d_model);
  const std::size_t fbytes = dev.forward_workspace_bytes(T, B, L), bbytes = dev.backward_workspace_bytes(T, B, L);
  DeviceArray<unsigned char> fws(fbytes), bws(bbytes);
  fws.fill_bytes(0xFF);  // any contents on entry
  bws.fill_bytes(0xFF);
  csattn::DeviceBatch batch = device_batch(dx_in.get(), cu.get(), cup.get(), layout);
  DeviceForwardOutputs out{dyout.get(), cfg.has_indexer() ? topk.get() : nullptr, loss.get()};
  cudaStream_t stream = nullptr;
  CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  dev.forward(batch, fws.get(), fbytes, out, stream);
  CU(cudaStreamSynchronize(stream));

  const std::vector<std::uint16_t> y = dyout.download();
  const std::vector<float> hy = ho.output.to_f32();
  for (std::size_t i = 0; i < y.size(); ++i)
    ASSERT_EQ(bf16_bits_to_float(y[i]), hy[i]) << "output element " << i;
  if (cfg.has_indexer()) {
    EXPECT_EQ(topk.download(), topk_vector(ho));
    EXPECT_EQ(loss.download()[0], ho.indexer_loss);
  } else {
    EXPECT_EQ(loss.download()[0], 0.0f);
  }

  csattn::DeviceBatch backward_batch = batch;
  backward_batch.x = nullptr;  // the backward reads the forward workspace's copy of x
  dev.backward(backward_batch, fws.get(), bws.get(), bbytes, ddy.get(), 1.0f, dxo.get(), stream);
  CU(cudaStreamSynchronize(stream));
  const Similarity sx = similarity(dxo.download(), to_double(hg.grad_input.to_f32()));
  EXPECT_GT(sx.cosine, 1.0 - 1e-6);
  const std::vector<unsigned char> raw = bws.download();
  for (const auto& [name, offset] : dev.weight_gradient_offsets(T, B, L)) {
    const Tensor& ref = hg.grad.at(name);
    std::vector<float> got(static_cast<std::size_t>(ref.numel()));
    ASSERT_LE(offset + got.size() * 4, raw.size()) << name;
    std::memcpy(got.data(), raw.data() + offset, got.size() * 4);
    double rmax = 0.0;
    for (float v : ref.to_f32()) rmax = std::max(rmax, static_cast<double>(std::fabs(v)));
    if (rmax == 0.0) {
      for (float v : got) ASSERT_EQ(v, 0.0f) << name;
      continue;
    }
    EXPECT_GT(similarity(got, to_double(ref.to_f32())).cosine, 1.0 - 1e-6) << name;
  }

  // The loss gradient given on the device (an autograd tensor) instead of the host float,
  // which is then ignored: 1 gives the gradients above, 2 twice them, 0 zero indexer gradients.
  if (cfg.has_indexer()) {
    for (float on_device : {1.0f, 2.0f, 0.0f}) {
      DeviceArray<float> gl(std::vector<float>{on_device});
      dev.backward(backward_batch, fws.get(), bws.get(), bbytes, ddy.get(), 7.0f, dxo.get(), stream, gl.get());
      CU(cudaStreamSynchronize(stream));
      const std::vector<unsigned char> raw2 = bws.download();
      for (const auto& [name, offset] : dev.weight_gradient_offsets(T, B, L)) {
        if (name.rfind("attn.indexer.", 0) != 0) continue;  // the loss's parameters only
        const Tensor& ref = hg.grad.at(name);
        std::vector<float> got(static_cast<std::size_t>(ref.numel()));
        std::memcpy(got.data(), raw2.data() + offset, got.size() * 4);
        if (on_device == 0.0f) {
          for (float v : got) ASSERT_EQ(v, 0.0f) << name;
        } else {
          std::vector<double> want = to_double(ref.to_f32());
          for (double& v : want) v *= on_device;
          EXPECT_GT(similarity(got, want).cosine, 1.0 - 1e-6) << name << " (device gradient " << on_device << ")";
          double ng = 0.0, nw = 0.0;  // the size too: cosine alone would pass a wrong factor
          for (float v : got) ng += static_cast<double>(v) * v;
          for (double v : want) nw += v * v;
          EXPECT_NEAR(std::sqrt(ng / nw), 1.0, 1e-4) << name << " (device gradient " << on_device << ")";
        }
      }
    }
  }

  // The forward in a CUDA graph (global capture mode: an allocation or a host sync inside
  // would fail the capture), replayed: bitwise the eager output.
  dyout.fill_bytes(0x5A);
  cudaGraph_t graph = nullptr;
  CU(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  dev.forward(batch, fws.get(), fbytes, out, stream);
  CU(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CU(cudaGraphInstantiate(&exec, graph, 0));
  CU(cudaGraphLaunch(exec, stream));
  CU(cudaStreamSynchronize(stream));
  EXPECT_EQ(dyout.download(), y);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  EXPECT_THROW(dev.forward(batch, fws.get(), fbytes - 1, out, stream), Error);
  EXPECT_THROW(dev.forward(batch, fws.get() + 16, fbytes - 16, out, stream), Error);
  EXPECT_THROW(dev.backward(batch, fws.get(), bws.get(), bbytes - 1, ddy.get(), 1.0f, dxo.get(), stream), Error);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Layers, CudaDeviceLayer, ::testing::Values(0, 4, 128),
                         [](const auto& i) { return std::string(layer_kind_name(layer_kind(i.param))); });

// A whole training step - forward, indexer loss, backward - captured in one CUDA graph with
// one packing, replayed after writing only another packing's cu_seqlens into the captured
// arrays (same rows and segments, a longest segment within the captured bound, a different
// number of real rows): every output and gradient bitwise equal to the eager step of that
// packing. Nothing of the captured batch may be baked into the graph, the indexer loss's
// scale (lambda over the real rows) included, nor its upstream gradient (given on the device:
// a replay with 2 instead of 1 doubles the indexer's gradients exactly). Deterministic mode,
// so gradients are bitwise repeatable; the Flash shape, so the CSA loss gradient has its
// deterministic kernel.
class CudaDeviceLayerGraph : public ::testing::TestWithParam<int> {};

TEST_P(CudaDeviceLayerGraph, TrainingStepReplaysWithAnotherPacking) {
  SKIP_WITHOUT_GPU();
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  cfg.compress_ratio = GetParam();
  cfg.loss_coeff = 0.5;
  // 708 rows, 3 segments, longest padded segment at most 500; 700 and 680 real rows.
  const SeqLayout a = SeqLayout::from_lengths({200, 3, 497}, {200, 8, 500});
  const SeqLayout b = SeqLayout::from_lengths({100, 300, 280}, {104, 304, 300});
  ASSERT_EQ(a.total_rows(), b.total_rows());
  ASSERT_NE(a.real_rows(), b.real_rows());
  const int T = static_cast<int>(a.total_rows()), B = a.num_segments(), L = a.max_seg_len();
  const LayerWeights w = LayerWeights::random(cfg, 71);
  DeviceLayer dev(cfg, w, /*deterministic=*/true);
  DeviceArray<std::uint16_t> x(bf16_bits_of(random_tensor(T, cfg.d_model, 72, true))),
      dy(bf16_bits_of(random_tensor(T, cfg.d_model, 73, true))), y(static_cast<std::size_t>(T) * cfg.d_model);
  const int K = cfg.has_indexer() ? cfg.index_topk : 1;
  DeviceArray<std::int32_t> cu(a.cu_seqlens()), cup(a.cu_seqlens_padded()), topk(static_cast<std::size_t>(T) * K);
  DeviceArray<float> loss(1), dx(static_cast<std::size_t>(T) * cfg.d_model);
  DeviceArray<float> grad_loss(std::vector<float>{1.0f});  // the loss's upstream gradient, on the device
  const std::size_t fbytes = dev.forward_workspace_bytes(T, B, L), bbytes = dev.backward_workspace_bytes(T, B, L);
  DeviceArray<unsigned char> fws(fbytes), bws(bbytes);
  csattn::DeviceBatch batch = device_batch(x.get(), cu.get(), cup.get(), a);
  const DeviceForwardOutputs out{y.get(), cfg.has_indexer() ? topk.get() : nullptr, loss.get()};
  cudaStream_t stream = nullptr;
  CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto step = [&] {
    dev.forward(batch, fws.get(), fbytes, out, stream);
    csattn::DeviceBatch bb = batch;
    bb.x = nullptr;
    dev.backward(bb, fws.get(), bws.get(), bbytes, dy.get(), 0.0f, dx.get(), stream, grad_loss.get());
  };
  struct Result {
    std::vector<std::uint16_t> y;
    std::vector<std::int32_t> topk;
    std::vector<float> loss, dx;
    std::vector<unsigned char> grads;
  };
  const std::map<std::string, std::size_t> offsets = dev.weight_gradient_offsets(T, B, L);
  std::size_t grads_from = bbytes;  // the weight gradients: from the first one to the end
  for (const auto& [name, off] : offsets) grads_from = std::min(grads_from, off);
  auto result = [&] {
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    Result r{y.download(), cfg.has_indexer() ? topk.download() : std::vector<std::int32_t>{}, loss.download(),
             dx.download(), {}};
    const std::vector<unsigned char> raw = bws.download();
    r.grads.assign(raw.begin() + static_cast<long>(grads_from), raw.end());
    return r;
  };
  auto use = [&](const SeqLayout& l) {  // the packing's boundaries into the captured arrays
    CU(cudaMemcpyAsync(cu.get(), l.cu_seqlens().data(), (B + 1) * 4, cudaMemcpyHostToDevice, stream));
    CU(cudaMemcpyAsync(cup.get(), l.cu_seqlens_padded().data(), (B + 1) * 4, cudaMemcpyHostToDevice, stream));
    batch.real_rows = l.real_rows();  // what a framework passes; the captured step must not need it
  };
  auto expect_same = [](const Result& got, const Result& want, const std::string& what) {
    EXPECT_EQ(got.y, want.y) << what << ": output";
    EXPECT_EQ(got.topk, want.topk) << what << ": top-k";
    EXPECT_EQ(got.loss, want.loss) << what << ": indexer loss";
    EXPECT_EQ(got.dx, want.dx) << what << ": dx";
    EXPECT_TRUE(got.grads == want.grads) << what << ": weight gradients";
  };

  use(b);  // eager B, then eager A (the eager call before a capture sets the kernels' attributes)
  step();
  const Result eager_b = result();
  use(a);
  step();
  const Result eager_a = result();
  if (cfg.has_indexer()) {
    EXPECT_NE(eager_a.loss, eager_b.loss);
  }

  cudaGraph_t graph = nullptr;
  CU(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  step();
  CU(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CU(cudaGraphInstantiate(&exec, graph, 0));
  for (const auto& [layout, want, what] :
       {std::tuple{&b, &eager_b, "replay with the other packing"}, std::tuple{&a, &eager_a, "replay with the captured one"},
        std::tuple{&b, &eager_b, "the other packing again"}}) {
    y.fill_bytes(0x5A);  // the replay must write them again
    dx.fill_bytes(0x5A);
    loss.fill_bytes(0x5A);
    topk.fill_bytes(0x5A);
    CU(cudaDeviceSynchronize());  // the fills (legacy stream) before the non-blocking stream's work
    use(*layout);
    CU(cudaGraphLaunch(exec, stream));
    expect_same(result(), *want, what);
  }
  if (cfg.has_indexer()) {
    // The loss gradient is read at replay too: 2 doubles the indexer's weight gradients
    // exactly (a power of two), everything else stays bitwise the eager step's.
    const std::vector<float> two{2.0f};
    CU(cudaMemcpy(grad_loss.get(), two.data(), sizeof(float), cudaMemcpyHostToDevice));
    use(a);
    CU(cudaGraphLaunch(exec, stream));
    const Result r = result();
    EXPECT_EQ(r.y, eager_a.y);
    EXPECT_EQ(r.dx, eager_a.dx);
    for (const ParamInfo& prm : layer_params(cfg)) {
      const std::size_t at = offsets.at(prm.name) - grads_from, n = static_cast<std::size_t>(shape_numel(prm.shape));
      std::vector<float> g2(n), g1(n);
      std::memcpy(g2.data(), r.grads.data() + at, n * 4);
      std::memcpy(g1.data(), eager_a.grads.data() + at, n * 4);
      const bool indexer = prm.name.rfind("attn.indexer.", 0) == 0;
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(g2[i], indexer ? 2.0f * g1[i] : g1[i]) << prm.name << " element " << i;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Layers, CudaDeviceLayerGraph, ::testing::Values(0, 4, 128),
                         [](const auto& i) { return std::string(layer_kind_name(layer_kind(i.param))); });
#endif  // CSATTN_HAVE_CUDA

}  // namespace
}  // namespace csattn
