// GPU context parallelism (issue 7) against the single-GPU layer (CP = 1): P ranks share one
// GPU through the in-process group (device buffers), or take one GPU each through NCCL where
// the machine has several. Every rank's output rows, top-k rows and input gradients, the
// parameter gradients and the indexer loss summed over ranks, against CP = 1 on the same
// ragged padded batch. Both runs are bf16 GPU runs with the same kernels, but cuBLAS may
// sum a projection of another row count in another order and the backward's key gradients
// use atomics: outputs are compared per row (bf16-rounding level; measured bitwise equal on
// the H200), a near-tie may flip one top-k id, gradients by relative L2 error (measured
// <= 3.4e-3, the atomics' order; bound 1e-2). A wrong halo row, compressed-row map, copy
// count, copy-gradient sum or owned slot moves rows or sums far past these bounds:
// scripts/gpu-cp-mutants.sh checks that each such mutant fails these tests. Workspaces are
// poisoned with NaN before each run.
#include <gtest/gtest.h>

#ifdef CSATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cp_test_util.hpp"
#include "cuda_test_util.hpp"
#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;
using testing_util::DeviceArray;

struct GpuCpCase {
  std::string preset;
  int ranks;
  CpMode mode;
  int ratio;
};

std::string gpu_case_name(const ::testing::TestParamInfo<GpuCpCase>& i) {
  return i.param.preset + "_P" + std::to_string(i.param.ranks) + "_" + cp_mode_name(i.param.mode) +
         "_" + layer_kind_name(layer_kind(i.param.ratio));
}

AttentionConfig gpu_config(const std::string& preset, int ratio) {
  AttentionConfig cfg = ModelConfig::preset(preset).base;
  cfg.compress_ratio = ratio;
  cfg.loss_coeff = 0.5;
  cfg.validate();
  return cfg;
}

// Shorter than the window, L mod m tails, several compressed entries, padding rows; long
// enough that pieces cross sequences and halos come from several ranks.
SeqLayout gpu_batch(const AttentionConfig& cfg, CpMode mode, int P) {
  const int d_w = std::max(cfg.window, cfg.compress_ratio == 4 ? 8 : cfg.compress_ratio);
  SeqLayout base = cfg.compress_ratio == 128
                       ? SeqLayout::from_lengths({70, 300, 521}, {72, 300, 530})
                       : SeqLayout::from_lengths({5, 1, 77, 203, 130}, {8, 1, 77, 210, 130});
  if (cfg.d_model >= 4096)  // Flash: the tensor-core kernels, several top-k candidates
    base = cfg.compress_ratio == 128 ? SeqLayout::from_lengths({1100, 300}, {1104, 300})
                                     : SeqLayout::from_lengths({900, 37, 500}, {904, 40, 500});
  return pad_for_context_parallel(base, mode, P, d_w);
}

// A device-cuda CP run: every rank constructs its own layer (GPU state is per rank), on
// GPU 0 through the in-process group, or (nccl) on GPU r through NCCL.
CpRun run_cp_gpu(const AttentionConfig& cfg, const LayerWeights& w, const CpPartition& part,
                 const Tensor& x, const Tensor& dy, bool nccl, bool deterministic = false) {
  CpRun run = empty_run(cfg, part);
  run_local_ranks(part.ranks(), [&](Communicator& boot) {
    const int r = boot.rank();
    // Throws, not ASSERT: a rank returning early would leave NCCL peers waiting for it.
    if (cudaSetDevice(nccl ? r : 0) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
    std::unique_ptr<Communicator> owned;
    if (nccl) owned = nccl_communicator(boot, r);
    Communicator& comm = nccl ? *owned : boot;
    RunOptions opt{Precision::bf16, Device::cuda};
    opt.poison_workspace = true;
    opt.deterministic = deterministic;
    const ContextParallelLayer layer(cfg, w, opt);
    const CpLayerOutputs out = layer.forward(comm, part, local_rows_of(x, part, r));
    record_forward(run, cfg, part, r, out);
    record_backward(run, cfg, part, r, layer.backward(comm, out, local_rows_of(dy, part, r)));
  });
  finish_run(run);
  return run;
}

constexpr double kGradTol = 1e-2;

// The CP run against CP = 1 (the comparisons the file comment describes).
void expect_matches_single(const AttentionConfig& cfg, const SeqLayout& layout, const CpRun& cp,
                           const LayerOutputs& ref, const LayerGradients& gref) {
  const int T = static_cast<int>(layout.total_rows()), d = cfg.d_model, K = cfg.index_topk;
  const std::vector<float> y = ref.output.to_f32();
  std::vector<bool> same_selection(static_cast<std::size_t>(T), true);
  if (cfg.has_indexer()) {
    const std::vector<std::int32_t> rt = topk_vector(ref);
    expect_topk_close(cp.topk, rt, K);
    for (int t = 0; t < T; ++t)
      same_selection[static_cast<std::size_t>(t)] =
          std::equal(cp.topk.begin() + static_cast<long>(t) * K, cp.topk.begin() + static_cast<long>(t + 1) * K,
                     rt.begin() + static_cast<long>(t) * K);
  }
  // Per row: rows with the same selection within bf16 rounding of the projections.
  int checked = 0;
  for (int t = 0; t < T; ++t) {
    if (!same_selection[static_cast<std::size_t>(t)]) continue;
    const std::vector<float> a(cp.output.begin() + static_cast<long>(t) * d, cp.output.begin() + static_cast<long>(t + 1) * d);
    const std::vector<float> b(y.begin() + static_cast<long>(t) * d, y.begin() + static_cast<long>(t + 1) * d);
    for (float v : a) ASSERT_TRUE(std::isfinite(v)) << "row " << t;
    ASSERT_LE(rel_l2(a, b), 2e-2) << "output row " << t;
    ++checked;
  }
  EXPECT_GE(checked, T * 9 / 10);
  // All rows together: on the H200 the rows come out bitwise equal (rel_l2 0), the same
  // kernels on the same rows; the bound leaves room for another GEMM algorithm choice.
  EXPECT_LE(rel_l2(cp.output, y), 1e-3);
  EXPECT_NEAR(cp.loss, ref.indexer_loss, 2e-2 * std::fabs(ref.indexer_loss) + 1e-7);
  // The loss is on (a zero loss would leave its CP sum untested) unless the case turns it off.
  if (cfg.has_indexer() && cfg.loss_coeff > 0.0) { EXPECT_GT(ref.indexer_loss, 0.0f); }
  // Gradients: relative L2 error (a boundary term missing from a sum of N random-sign terms
  // is ~1/sqrt(N) of it, far above the rounding differences).
  double worst = rel_l2(cp.output, y);
  std::string worst_name = "output";
  auto check_grad = [&](const std::string& name, const std::vector<float>& got, const std::vector<float>& ref_g) {
    for (float v : got) ASSERT_TRUE(std::isfinite(v)) << name;
    double m = 0.0;
    for (float v : ref_g) m = std::max(m, static_cast<double>(std::fabs(v)));
    if (m == 0.0) {  // parameters without a gradient here
      for (float v : got) ASSERT_EQ(v, 0.0f) << name;
      return;
    }
    const double e = rel_l2(got, ref_g);
    EXPECT_LE(e, kGradTol) << name;
    if (e > worst) {
      worst = e;
      worst_name = name;
    }
  };
  check_grad("grad_input", cp.grad_input, gref.grad_input.to_f32());
  for (const auto& [name, g] : gref.grad)
    check_grad(name, std::vector<float>(cp.grad.at(name).begin(), cp.grad.at(name).end()), g.to_f32());
  std::printf("  [cp parity] output rel_l2 %.2e, worst %s %.2e\n", rel_l2(cp.output, y), worst_name.c_str(), worst);
}

class CudaCp : public ::testing::TestWithParam<GpuCpCase> {};

TEST_P(CudaCp, RanksSharingOneGpuMatchSingleGpu) {
  SKIP_WITHOUT_GPU();
  const GpuCpCase k = GetParam();
  const AttentionConfig cfg = gpu_config(k.preset, k.ratio);
  const SeqLayout layout = gpu_batch(cfg, k.mode, k.ranks);
  const CpPartition part = CpPartition::build(layout, k.mode, k.ranks);
  const int T = static_cast<int>(layout.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 71);
  const Tensor x = random_tensor(T, cfg.d_model, 72, true);
  const Tensor dy = random_tensor(T, cfg.d_model, 73, true);
  HybridAttentionLayer single(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
  const LayerOutputs ref = single.forward(x, layout);
  const LayerGradients gref = single.backward(ref, dy);
  const CpRun cp = run_cp_gpu(cfg, w, part, x, dy, false);
  expect_matches_single(cfg, layout, cp, ref, gref);
  std::int64_t rows = 0;
  for (const CpWork& wk : cp.work) rows += wk.local_rows;
  EXPECT_EQ(rows, T);
}

std::vector<GpuCpCase> gpu_cases() {
  std::vector<GpuCpCase> cases;
  for (int P : {2, 3})
    for (CpMode mode : {CpMode::contiguous, CpMode::two_chunk})
      for (int ratio : {0, 4, 128}) cases.push_back({"small", P, mode, ratio});
  for (int ratio : {4, 128}) cases.push_back({"flash", 2, CpMode::two_chunk, ratio});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layers, CudaCp, ::testing::ValuesIn(gpu_cases()), gpu_case_name);

// One GPU per rank over NCCL (bootstrapped through the in-process group).
TEST(CudaCpNccl, OneGpuPerRankMatchesSingleGpu) {
  SKIP_WITHOUT_GPU();
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  // P = 1 runs on one GPU (the agreement and the collectives through NCCL); 2 and 4 where
  // the machine has that many GPUs.
  for (int P : {1, 2, 4}) {
    if (P > devices) continue;
    for (CpMode mode : {CpMode::contiguous, CpMode::two_chunk}) {
      for (int ratio : {4, 128}) {
        SCOPED_TRACE(std::string("P ") + std::to_string(P) + " " + cp_mode_name(mode) + " ratio " +
                     std::to_string(ratio));
        const AttentionConfig cfg = gpu_config("small", ratio);
        const SeqLayout layout = gpu_batch(cfg, mode, P);
        const CpPartition part = CpPartition::build(layout, mode, P);
        const int T = static_cast<int>(layout.total_rows());
        const LayerWeights w = LayerWeights::random(cfg, 81);
        const Tensor x = random_tensor(T, cfg.d_model, 82, true);
        const Tensor dy = random_tensor(T, cfg.d_model, 83, true);
        ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
        HybridAttentionLayer single(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
        const LayerOutputs ref = single.forward(x, layout);
        const LayerGradients gref = single.backward(ref, dy);
        const CpRun cp = run_cp_gpu(cfg, w, part, x, dy, true);
        expect_matches_single(cfg, layout, cp, ref, gref);
      }
    }
  }
}

// The deterministic backward (fixed-order key-gradient sums) under context parallelism: two
// runs give bitwise-equal gradients, and they match the single-GPU layer like the fast mode.
// (At the small shape the indexer loss has no deterministic kernel: the loss is off here,
// and its refusal is the next test.) Flash HCA (head_dim 512) takes the key-stationary pass
// for its compressed rows (launch_comp_grad_keyed) on rows that start mid-sequence
// (seg_pos0 > 0) and read halo rows, which no single-GPU test reaches.
TEST(CudaCp, DeterministicBackwardRepeatsBitwise) {
  SKIP_WITHOUT_GPU();
  for (const auto& [preset, ratio] : std::vector<std::pair<std::string, int>>{{"small", 4}, {"small", 128}, {"flash", 128}}) {
    SCOPED_TRACE(preset + " ratio " + std::to_string(ratio));
    AttentionConfig cfg = gpu_config(preset, ratio);
    cfg.loss_coeff = 0.0;
    const SeqLayout layout = gpu_batch(cfg, CpMode::two_chunk, 2);
    const CpPartition part = CpPartition::build(layout, CpMode::two_chunk, 2);
    const int T = static_cast<int>(layout.total_rows());
    const LayerWeights w = LayerWeights::random(cfg, 111);
    const Tensor x = random_tensor(T, cfg.d_model, 112, true);
    const Tensor dy = random_tensor(T, cfg.d_model, 113, true);
    const CpRun a = run_cp_gpu(cfg, w, part, x, dy, false, true);
    const CpRun b = run_cp_gpu(cfg, w, part, x, dy, false, true);
    EXPECT_TRUE(bitwise_equal(a.grad_input, b.grad_input)) << "grad_input";
    for (const auto& [name, g] : a.grad) { EXPECT_EQ(g, b.grad.at(name)) << name; }
    HybridAttentionLayer single(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
    const LayerOutputs ref = single.forward(x, layout);
    expect_matches_single(cfg, layout, a, ref, single.backward(ref, dy));
  }
}

// What the single-GPU backward refuses (deterministic loss gradient without its kernel) the
// CP backward refuses too, on every rank with the same error (agreed, no hang).
TEST(CudaCp, DeterministicLossWithoutItsKernelIsRefusedOnEveryRank) {
  SKIP_WITHOUT_GPU();
  const AttentionConfig cfg = gpu_config("small", 4);
  const SeqLayout layout = gpu_batch(cfg, CpMode::contiguous, 2);
  const CpPartition part = CpPartition::build(layout, CpMode::contiguous, 2);
  const int T = static_cast<int>(layout.total_rows());
  const LayerWeights w = LayerWeights::random(cfg, 121);
  const Tensor x = random_tensor(T, cfg.d_model, 122, true);
  std::vector<std::string> errors(2);
  run_local_ranks(2, [&](Communicator& comm) {
    if (cudaSetDevice(0) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
    RunOptions opt{Precision::bf16, Device::cuda};
    opt.deterministic = true;
    const ContextParallelLayer layer(cfg, w, opt);
    const CpLayerOutputs out = layer.forward(comm, part, local_rows_of(x, part, comm.rank()));
    try {
      layer.backward(comm, out, local_rows_of(x, part, comm.rank()));
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  for (const std::string& e : errors) EXPECT_NE(e.find("tensor-core loss kernel"), std::string::npos) << e;
}

// The device-memory entry points (caller's arrays and stream) give the same results as the
// host entry points: the same outputs, top-k and loss bitwise, gradients within the atomics' order.
TEST(CudaCp, DeviceMemoryEntryPointsMatchTheHostOnes) {
  SKIP_WITHOUT_GPU();
  const AttentionConfig cfg = gpu_config("small", 4);
  const int P = 2;
  const SeqLayout layout = gpu_batch(cfg, CpMode::two_chunk, P);
  const CpPartition part = CpPartition::build(layout, CpMode::two_chunk, P);
  const int T = static_cast<int>(layout.total_rows()), d = cfg.d_model, K = cfg.index_topk;
  const LayerWeights w = LayerWeights::random(cfg, 101);
  const Tensor x = random_tensor(T, d, 102, true);
  const Tensor dy = random_tensor(T, d, 103, true);
  run_local_ranks(P, [&](Communicator& comm) {
    if (cudaSetDevice(0) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
    const int r = comm.rank();
    const Tensor xl = local_rows_of(x, part, r), dyl = local_rows_of(dy, part, r);
    const int n = static_cast<int>(xl.dim(0));
    RunOptions opt{Precision::bf16, Device::cuda};
    opt.poison_workspace = true;
    const ContextParallelLayer host_layer(cfg, w, opt), dev_layer(cfg, w, opt);
    const CpLayerOutputs ref = host_layer.forward(comm, part, xl);
    const CpLayerGradients gref = host_layer.backward(comm, ref, dyl);

    auto bits = [](const Tensor& t) {
      std::vector<std::uint16_t> b(static_cast<std::size_t>(t.numel()));
      const std::vector<float> f = t.to_f32();
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = float_to_bf16_bits(f[i]);
      return b;
    };
    DeviceArray<std::uint16_t> dx_in(bits(xl)), ddy(bits(dyl)), dy_out(static_cast<std::size_t>(n) * d);
    DeviceArray<std::int32_t> dtopk(static_cast<std::size_t>(n) * K);
    DeviceArray<float> dloss(1), ddx(static_cast<std::size_t>(n) * d);
    dy_out.fill_bytes(0xFF);
    ddx.fill_bytes(0xFF);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    dev_layer.forward_device(comm, part, dx_in.get(), {dy_out.get(), dtopk.get(), dloss.get()}, stream);
    // The loss's upstream gradient on the device (1, as the host path's): the host value, 0
    // here, is ignored.
    DeviceArray<float> dgl(std::vector<float>{1.0f});
    dev_layer.backward_device(comm, ddy.get(), ddx.get(), 0.0f, stream, dgl.get());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaStreamDestroy(stream);

    const std::vector<std::uint16_t> yb = dy_out.download();
    const std::vector<float> yref = ref.output.to_f32();
    for (std::size_t i = 0; i < yb.size(); ++i) ASSERT_EQ(bf16_bits_to_float(yb[i]), yref[i]) << "y " << i;
    const std::vector<std::int32_t> tk = dtopk.download();
    const std::int32_t* tref = ref.topk_indices.ptr<std::int32_t>();
    for (std::size_t i = 0; i < tk.size(); ++i) ASSERT_EQ(tk[i], tref[i]) << "topk " << i;
    EXPECT_EQ(dloss.download()[0], ref.indexer_loss);
    EXPECT_LE(rel_l2(ddx.download(), gref.grad_input.to_f32()), kGradTol);
    const std::map<std::string, const float*> grads = dev_layer.device_gradients();
    ASSERT_EQ(grads.size(), gref.grad.size());
    for (const auto& [name, g] : gref.grad) {
      std::vector<float> got(static_cast<std::size_t>(g.numel()));
      ASSERT_EQ(cudaMemcpy(got.data(), grads.at(name), got.size() * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      const std::vector<float> want = g.to_f32();
      if (std::all_of(want.begin(), want.end(), [](float v) { return v == 0.0f; })) continue;  // none here
      EXPECT_LE(rel_l2(got, want), kGradTol) << name;
    }
  });
}

// Ranks that own padding rows only (4 ranks sharing the GPU): they run every kernel on
// padding and every collective, and the results still equal the single-GPU layer's. Two
// batches: sequences of 1 and 2 tokens (no compressed entry, so the loss is off), and one
// sequence of 200 real rows padded to 1024 (real rows on rank 0 with contiguous, ranks 0-1
// with two_chunk; CSA entries, the loss on: idle ranks add nothing but share its global
// denominator).
TEST(CudaCp, RanksHoldingOnlyPaddingRows) {
  SKIP_WITHOUT_GPU();
  struct Batch {
    const char* name;
    std::vector<int> real, padded;
    bool loss;
  };
  for (const Batch& batch : {Batch{"1+2 tokens", {1, 2}, {1, 2}, false}, Batch{"200 of 1024", {200}, {1024}, true}})
    for (CpMode mode : {CpMode::contiguous, CpMode::two_chunk})
      for (int ratio : {0, 4, 128}) {
        SCOPED_TRACE(std::string(batch.name) + ", " + cp_mode_name(mode) + ", ratio " + std::to_string(ratio));
        AttentionConfig cfg = gpu_config("small", ratio);
        if (!batch.loss) cfg.loss_coeff = 0.0;
        const int d_w = std::max(cfg.window, ratio == 4 ? 8 : ratio);
        const SeqLayout layout =
            pad_for_context_parallel(SeqLayout::from_lengths(batch.real, batch.padded), mode, 4, d_w);
        const CpPartition part = CpPartition::build(layout, mode, 4);
        const int T = static_cast<int>(layout.total_rows());
        ASSERT_GE(ranks_without_real_rows(layout, part), 2) << "the layout must leave ranks without real rows";
        const LayerWeights w = LayerWeights::random(cfg, 131);
        const Tensor x = random_tensor(T, cfg.d_model, 132, true);
        const Tensor dy = random_tensor(T, cfg.d_model, 133, true);
        HybridAttentionLayer single(cfg, w, RunOptions{Precision::bf16, Device::cuda, 0, true});
        const LayerOutputs ref = single.forward(x, layout);
        const CpRun cp = run_cp_gpu(cfg, w, part, x, dy, false);
        expect_matches_single(cfg, layout, cp, ref, single.backward(ref, dy));
      }
}

// A device-cuda layer holds one rank's GPU state: a second rank using it is refused.
TEST(CudaCp, OneLayerServesOneRank) {
  SKIP_WITHOUT_GPU();
  const AttentionConfig cfg = gpu_config("small", 0);
  const SeqLayout layout = SeqLayout::from_lengths({256});
  const CpPartition part = CpPartition::build(layout, CpMode::contiguous, 2);
  const LayerWeights w = LayerWeights::random(cfg, 91);
  const Tensor x = random_tensor(256, cfg.d_model, 92, true);
  const ContextParallelLayer layer(cfg, w, RunOptions{Precision::bf16, Device::cuda});
  try {
    run_local_ranks(2, [&](Communicator& comm) {
      layer.forward(comm, part, local_rows_of(x, part, comm.rank()));
    });
    FAIL() << "two ranks shared one device-cuda layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one rank"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
