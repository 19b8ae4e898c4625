// The GPU workspace plans, checked on the host (no GPU needed): every buffer is 256-byte
// aligned, inside the allocation, holds what its kernels write, and no two buffers overlap
// but the planned aliases (dqb in dattn's bytes, dx in dq's), for every preset, layer type
// and a range of batch shapes (including ones no device test has run yet, e.g. Pro and 128K
// tokens). Also how the attention backward reads the output the layer keeps (OutputRows).
#ifdef CSATTN_HAVE_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "csattn/config.hpp"
#include "csattn/cp.hpp"
#include "csattn/layout.hpp"
#include "csattn/device_memory.hpp"
#include "csattn/error.hpp"
#include "csattn/weights.hpp"
#include "cuda/backward_kernels.hpp"
#include "cuda/indexer_topk_plan.hpp"
#include "cuda/ordered_scatter.hpp"
#include "cuda/workspace.hpp"

namespace csattn {
namespace {

struct Piece {
  std::string name;
  std::size_t offset, bytes;
};

void expect_disjoint_and_aligned(std::vector<Piece> pieces, std::size_t total, const std::string& what) {
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    if (p.bytes == 0) continue;
    EXPECT_EQ(p.offset % 256, 0u) << what << ": " << p.name << " is not 256-byte aligned";
    EXPECT_LE(p.offset + p.bytes, total) << what << ": " << p.name << " ends past the allocation";
    for (std::size_t j = i + 1; j < pieces.size(); ++j) {
      if (pieces[j].bytes == 0) continue;
      EXPECT_GE(pieces[j].offset, p.offset + p.bytes)
          << what << ": " << p.name << " overlaps " << pieces[j].name;
      break;  // sorted: the next non-empty piece is the only candidate
    }
  }
}

TEST(CudaPlan, BuffersAreAlignedDisjointAndLargeEnough) {
  for (const std::string preset : {"tiny", "small", "flash", "pro"})
    for (int ratio : {0, 4, 128})
      for (auto [T, B, L] : {std::tuple{1, 1, 1}, std::tuple{777, 3, 500}, std::tuple{4096, 1, 4096},
                             std::tuple{131072, 2, 100000}}) {
        AttentionConfig cfg = ModelConfig::preset(preset).base;
        cfg.compress_ratio = ratio;
        const std::string what = preset + " ratio " + std::to_string(ratio) + " T " + std::to_string(T);
        const cuda::WorkspacePlan f = cuda::plan_forward(cfg, T, B, L);
        const std::size_t t = static_cast<std::size_t>(T), hd = static_cast<std::size_t>(cfg.n_heads) * cfg.head_dim;
        const std::size_t nc = ratio > 1 ? t / ratio : 0;
        EXPECT_EQ(f.dims.comp_capacity, static_cast<int>(nc)) << what;
        std::vector<Piece> fp = {
            {"cu_real", f.cu_real, 4u * (B + 1)}, {"cu_padded", f.cu_padded, 4u * (B + 1)},
            {"row_segment", f.row_segment, 4 * t}, {"row_position", f.row_position, 4 * t},
            {"row_is_padding", f.row_is_padding, t}, {"comp_start", f.comp_start, 4u * (B + 1)},
            {"rope_table", f.rope_table, 4u * static_cast<std::size_t>(L) * (cfg.rope_dim / 2)},
            {"x", f.x, 2 * t * cfg.d_model}, {"q_proj", f.q_proj, 2 * t * cfg.q_lora_rank},
            {"cq", f.cq, 2 * t * cfg.q_lora_rank}, {"q_rstd", f.q_rstd, 4 * t * cfg.n_heads},
            {"q", f.q, 2 * t * hd}, {"kv_proj", f.kv_proj, 2 * t * cfg.head_dim},
            {"kv", f.kv, 2 * t * cfg.head_dim}, {"attn", f.attn, 2 * t * hd},
            {"lse", f.lse, 4 * t * cfg.n_heads}, {"attn_tail", f.attn_tail, 2 * t * cfg.n_heads * ((cfg.rope_dim + 7) / 8 * 8)},
            {"u", f.u, 2 * t * cfg.o_groups * cfg.o_lora_rank}, {"y", f.y, 2 * t * cfg.d_model},
            {"blas", f.blas, cuda::WorkspacePlan::kBlasWorkspaceBytes}};
        if (ratio > 1) {
          const std::size_t w = static_cast<std::size_t>(cfg.coff()) * cfg.head_dim;
          fp.push_back({"c_a", f.c_a, 2 * t * w});
          fp.push_back({"c_g", f.c_g, 2 * t * w});
          fp.push_back({"c_pooled", f.c_pooled, 2 * nc * cfg.head_dim});
          fp.push_back({"comp", f.comp, 2 * nc * cfg.head_dim});
        }
        if (ratio == 4) {
          const std::size_t hid = static_cast<std::size_t>(cfg.index_n_heads) * cfg.index_head_dim;
          fp.push_back({"qi_proj", f.qi_proj, 2 * t * hid});
          fp.push_back({"qi", f.qi, 2 * t * hid});
          fp.push_back({"w_raw", f.w_raw, 2 * t * cfg.index_n_heads});
          fp.push_back({"w_eff", f.w_eff, 4 * t * cfg.index_n_heads});
          fp.push_back({"i_a", f.i_a, 2 * t * 2 * cfg.index_head_dim});
          fp.push_back({"i_g", f.i_g, 2 * t * 2 * cfg.index_head_dim});
          fp.push_back({"i_pooled", f.i_pooled, 2 * nc * cfg.index_head_dim});
          fp.push_back({"i_keys", f.i_keys, 2 * nc * cfg.index_head_dim});
          fp.push_back({"topk", f.topk, 4 * t * cfg.index_topk});
          fp.push_back({"topk_scratch", f.topk_scratch, cuda::indexer_topk_scratch_bytes(f.dims)});
          fp.push_back({"loss_rows", f.loss_rows, 4 * t});
          fp.push_back({"loss", f.loss, 4});
          // What the sparse loss's backward reuses from the forward (every preset's loss).
          ASSERT_TRUE(cfg.loss_coeff > 0.0 && cfg.sparse_loss) << what;
          fp.push_back({"loss_kept", f.loss_kept, 8 * t * (cfg.index_topk + 1)});
        }
        expect_disjoint_and_aligned(fp, f.bytes, what + " forward");

        const cuda::BackwardPlan b = cuda::plan_backward(cfg, f.dims);
        const std::size_t di = cfg.has_indexer() ? cfg.index_head_dim : 0;
        const std::size_t hi = cfg.has_indexer() ? cfg.index_n_heads : 0;
        const std::size_t pw = std::max<std::size_t>(static_cast<std::size_t>(cfg.coff()) * cfg.head_dim, 2 * di);
        std::vector<Piece> bp = {
            {"dy", b.dy, 2 * t * cfg.d_model}, {"du", b.du, 2 * t * cfg.o_groups * cfg.o_lora_rank},
            {"dattn (and dqb)", b.dattn, 2 * t * hd}, {"dq", b.dq, 2 * t * hd},
            {"dkv_acc", b.dkv_acc, 4 * t * cfg.head_dim}, {"dcomp_acc", b.dcomp_acc, 4 * nc * cfg.head_dim},
            {"dsink_part", b.dsink_part, 4 * t * cfg.n_heads}, {"dkv", b.dkv, 2 * t * cfg.head_dim},
            {"dnormed", b.dnormed, 2 * t * std::max(cfg.head_dim, cfg.q_lora_rank)},
            {"dcq", b.dcq, 2 * t * cfg.q_lora_rank},
            {"rstd", b.rstd,
             4 * cuda::rmsnorm_backward_scratch_floats(
                     static_cast<int>(std::max(t, nc)),
                     std::max({cfg.q_lora_rank, cfg.head_dim, cfg.has_indexer() ? cfg.index_head_dim : 0}))},
            {"dcomp", b.dcomp, 2 * nc * std::max<std::size_t>(cfg.head_dim, di)},
            {"dpooled", b.dpooled, 2 * nc * std::max<std::size_t>(cfg.head_dim, di)},
            {"da", b.da, 2 * t * pw}, {"dg", b.dg, 2 * t * pw}, {"dqi", b.dqi, 2 * t * hi * di},
            {"dweff", b.dweff, 4 * t * hi}, {"dwraw", b.dwraw, 2 * t * hi},
            {"dkeys_acc", b.dkeys_acc, 4 * nc * di}, {"loss_grad_scale", b.loss_grad_scale, 4}};
        expect_disjoint_and_aligned(bp, b.grads_offset, what + " backward buffers");
        // The planned aliases: dqb (written by the query path) in dattn's bytes (last read by
        // the attention backward before it); dx (first written by the query path after its
        // norm backward read dq) in dq's where it fits, else a buffer of its own.
        EXPECT_EQ(b.dqb, b.dattn) << what;
        if (4u * cfg.d_model <= 2 * hd) {
          EXPECT_EQ(b.dx, b.dq) << what;
        } else {
          bp.push_back({"dx", b.dx, 4 * t * cfg.d_model});
          expect_disjoint_and_aligned(bp, b.grads_offset, what + " backward buffers with dx");
        }
        EXPECT_LE(b.grads_offset + b.grads_bytes, b.bytes) << what;
        std::size_t params = 0;
        for (const ParamInfo& p : layer_params(cfg)) params += 4 * static_cast<std::size_t>(shape_numel(p.shape));
        EXPECT_GE(b.grads_bytes, params) << what << ": the weight gradients do not fit";
      }
}

// The sparse loss's kept values (the backward reuses the forward's teacher) are planned only
// where a forward computes that loss: lambda > 0 and the sparse loss.
TEST(CudaPlan, LossKeptOnlyForTheSparseLoss) {
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  cfg.compress_ratio = 4;
  const cuda::WorkspacePlan with = cuda::plan_forward(cfg, 4096, 1, 4096);
  EXPECT_NE(with.loss_kept, 0u);
  const std::size_t kept = 8u * 4096 * cfg.index_topk + 8u * 4096;
  for (auto [coeff, sparse] : {std::pair{0.0, true}, std::pair{0.01, false}}) {
    cfg.loss_coeff = coeff;
    cfg.sparse_loss = sparse;
    const cuda::WorkspacePlan without = cuda::plan_forward(cfg, 4096, 1, 4096);
    EXPECT_EQ(without.loss_kept, 0u);
    EXPECT_EQ(without.bytes + kept, with.bytes) << "lambda " << coeff << ", sparse " << sparse;
  }
}

// The deterministic scratch: chunks of at least kDeterministicMinChunkCtas CTAs (attention:
// rows x head blocks; the loss: rows, its slots top-k sparse, every visible entry dense) unless
// the cap or the batch stops it; 256 MiB when the batch needs that much; never more than the
// batch's whole need, the cap (past one row), or the widest of the two needs' chunk.
TEST(CudaPlan, DeterministicScratchKeepsChunksWide) {
  using cuda::BackwardPlan;
  for (const std::string preset : {"flash", "pro"})
    for (int ratio : {0, 4, 128})
      for (bool dense : {false, true})
        for (int T : {1, 4096, 65536, 131072, 1048576}) {
          if (dense && ratio != 4) continue;
          AttentionConfig cfg = ModelConfig::preset(preset).base;
          cfg.compress_ratio = ratio;
          cfg.sparse_loss = !dense;
          const std::string what = preset + " ratio " + std::to_string(ratio) + (dense ? " dense" : "") +
                                   " T " + std::to_string(T);
          const cuda::WorkspacePlan f = cuda::plan_forward(cfg, T, 1, T);
          const BackwardPlan b = cuda::plan_backward(cfg, f.dims, true);
          const std::size_t bytes = b.det_scratch_bytes, ctas = BackwardPlan::kDeterministicMinChunkCtas;
          const std::size_t copies = (cfg.n_heads + 63) / 64;
          // HCA's compressed rows take the key-stationary pass: the attention's slots are the
          // window's, and the scratch holds that pass's partial sums too.
          EXPECT_EQ(cuda::comp_grad_keyed_applies(f.dims), ratio == 128 && f.dims.comp_capacity > 0) << what;
          const bool keyed = cuda::comp_grad_keyed_applies(f.dims);
          const int slots = keyed ? cfg.window : cuda::max_keys_per_query(f.dims);
          if (keyed) {
            EXPECT_GE(bytes, cuda::comp_grad_keyed_scratch_bytes(f.dims)) << what;
          }
          const std::size_t attn_row = 4ull * slots * copies * cfg.head_dim;
          const int cands = ratio != 4 ? 0 : dense ? T / 4 : cfg.index_topk;
          const std::size_t loss_row = 4ull * cands * cfg.index_head_dim;
          const std::size_t row = std::max(attn_row, loss_row);
          const std::size_t widest = std::max(attn_row * ((ctas + copies - 1) / copies), loss_row * ctas);
          const bool capped = bytes >= BackwardPlan::kDeterministicMaxScratchBytes;
          EXPECT_LE(bytes, std::max(BackwardPlan::kDeterministicMaxScratchBytes, row)) << what;
          EXPECT_LE(bytes, std::max(row * T, row)) << what;
          EXPECT_LE(bytes, std::max({BackwardPlan::kDeterministicScratchBytes, widest, row})) << what;
          EXPECT_GE(bytes, std::min(row * T, BackwardPlan::kDeterministicScratchBytes)) << what;
          if (!capped) {
            EXPECT_GE(cuda::scatter_chunk_rows(T, slots * static_cast<int>(copies), cfg.head_dim, bytes),
                      std::min<int>(T, static_cast<int>((ctas + copies - 1) / copies))) << what;
            if (ratio == 4) {
              EXPECT_GE(cuda::scatter_chunk_rows(T, cands, cfg.index_head_dim, bytes),
                        std::min<int>(T, static_cast<int>(ctas))) << what;
            }
          }
        }
  // The ends: a long HCA segment keeps the 256 MiB floor (its window slots; it filled the cap
  // while every compressed slot had a scratch row), so does a short SWA batch, and the sparse
  // loss at 64K tokens needs no more than the attention's chunk (its slots are its top-k, not
  // every visible entry).
  auto scratch = [](int ratio, int T, bool sparse) {
    AttentionConfig cfg = ModelConfig::preset("flash").base;
    cfg.compress_ratio = ratio;
    cfg.sparse_loss = sparse;
    return cuda::plan_backward(cfg, cuda::plan_forward(cfg, T, 1, T).dims, true).det_scratch_bytes;
  };
  EXPECT_EQ(scratch(128, 1048576, true), BackwardPlan::kDeterministicScratchBytes);
  EXPECT_EQ(scratch(0, 4096, true), BackwardPlan::kDeterministicScratchBytes);
  EXPECT_EQ(scratch(4, 65536, true), 4ull * (128 + 512) * 512 * BackwardPlan::kDeterministicMinChunkCtas);
  EXPECT_EQ(scratch(4, 65536, false), 4ull * (65536 / 4) * 128 * BackwardPlan::kDeterministicMinChunkCtas);
}

// plan_device_memory is the sum of the layer's allocations: the weight store's layout and the
// two workspace plans; bad shapes are refused.
TEST(CudaPlan, DeviceMemoryPlanAddsTheLayersAllocations) {
  for (const std::string preset : {"tiny", "flash", "pro"})
    for (int ratio : {0, 4, 128})
      for (bool det : {false, true}) {
        AttentionConfig cfg = ModelConfig::preset(preset).base;
        cfg.compress_ratio = ratio;
        const int T = 5000, B = 3, L = 4000;
        const DeviceMemoryPlan m = plan_device_memory(cfg, T, B, L, det);
        const cuda::WorkspacePlan f = cuda::plan_forward(cfg, T, B, L);
        const cuda::BackwardPlan b = cuda::plan_backward(cfg, f.dims, det);
        std::size_t params = 0;
        for (const ParamInfo& p : layer_params(cfg))
          params += static_cast<std::size_t>(shape_numel(p.shape)) * (p.file_dtype == DType::f32 ? 4 : 2);
        const std::string what = preset + " ratio " + std::to_string(ratio) + (det ? " det" : "");
        EXPECT_GE(m.weights, params) << what;
        EXPECT_LT(m.weights, params + 256 * (layer_params(cfg).size() + 1) + 4 * cfg.rope_dim) << what;
        EXPECT_EQ(m.forward_workspace, f.bytes) << what;
        EXPECT_EQ(m.backward_workspace, b.bytes) << what;
        EXPECT_EQ(m.weight_gradients, b.grads_bytes) << what;
        EXPECT_EQ(m.training_step(), m.weights + f.bytes + b.bytes) << what;
        EXPECT_EQ(m.forward_only(), m.weights + f.bytes) << what;
      }
  const AttentionConfig cfg = ModelConfig::preset("tiny").layer(1);
  for (auto [T, B, L] : {std::tuple{-1, 1, 10}, std::tuple{10, 0, 10}, std::tuple{10, 1, -1},
                         std::tuple{100, 2, 10}})
    EXPECT_THROW(plan_device_memory(cfg, T, B, L), Error) << T << " " << B << " " << L;
  AttentionConfig bad = cfg;
  bad.n_heads = 0;
  EXPECT_THROW(plan_device_memory(bad, 10, 1, 10), Error);
}

// The context-parallel layer, per rank: the weights of one layer, the rank's share of the
// rows (a quarter of a long sequence plus its halo and compressed-row copies), its own
// buffers, the totals the sums of the parts; two_chunk balances the ranks.
TEST(CudaPlan, ContextParallelRanksHoldAShareOfTheLayer) {
  for (int ratio : {0, 4, 128})
    for (CpMode mode : {CpMode::contiguous, CpMode::two_chunk}) {
      AttentionConfig cfg = ModelConfig::preset("flash").base;
      cfg.compress_ratio = ratio;
      const int L = 32768, P = 4;
      const CpPartition part = CpPartition::build(
          pad_for_context_parallel(SeqLayout::from_lengths({L}), mode, P), mode, P);
      const std::vector<DeviceMemoryPlan> ranks = plan_cp_device_memory(cfg, part);
      const DeviceMemoryPlan one = plan_device_memory(cfg, L, 1, L);
      const std::string what = "ratio " + std::to_string(ratio) + " " + cp_mode_name(mode);
      ASSERT_EQ(ranks.size(), static_cast<std::size_t>(P)) << what;
      std::size_t lo = ~std::size_t{0}, hi = 0;
      for (const DeviceMemoryPlan& m : ranks) {
        EXPECT_EQ(m.weights, one.weights) << what;
        EXPECT_GT(m.context_parallel, 0u) << what;
        EXPECT_EQ(m.training_step(), m.weights + m.forward_workspace + m.context_parallel + m.backward_workspace)
            << what;
        EXPECT_GT(m.forward_workspace, one.forward_workspace / 5) << what;
        EXPECT_LT(m.forward_workspace, one.forward_workspace / 3) << what;
        EXPECT_LT(m.backward_workspace, one.backward_workspace / 3) << what;
        lo = std::min(lo, m.training_step());
        hi = std::max(hi, m.training_step());
      }
      EXPECT_LT(static_cast<double>(hi) / lo, 1.1) << what;
    }
}

// How the attention backward reads O as the layer keeps it (params.hpp, OutputRows): each
// head row's first D - tail dims from `rows`, the rest from `tail`, for whole 16-byte groups
// (attention_tail_dim widens the RoPE dims to them where rows are made of them) and for
// single elements (the baseline kernel, any head_dim); whole rows when no tail is given.
TEST(CudaPlan, OutputRowsReadHeadsAndKeptTails) {
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  const cuda::LayerDims flash = cuda::make_dims(cfg, 16, 1, 16);
  EXPECT_EQ(cuda::attention_tail_dim(flash), 64);
  cuda::LayerDims d = flash;
  d.rope_dim = 12;
  EXPECT_EQ(cuda::attention_tail_dim(d), 16) << "widened to whole 16-byte groups";
  d.head_dim = 30;
  EXPECT_EQ(cuda::attention_tail_dim(d), 12) << "rows not made of 16-byte groups: the RoPE dims";

  // Fake addresses, never dereferenced: offsets in elements from two bases.
  const auto* rows = reinterpret_cast<const cuda::bf16*>(std::uintptr_t{1} << 20);
  const auto* tails = reinterpret_cast<const cuda::bf16*>(std::uintptr_t{1} << 30);
  for (const auto& [D, tail] : {std::pair{512, 64}, std::pair{30, 12}}) {
    SCOPED_TRACE("D " + std::to_string(D) + " tail " + std::to_string(tail));
    const cuda::OutputRows split(rows, tails, tail), whole(rows);
    for (long row : {0L, 1L, 777L})
      for (int e = 0; e < D; ++e) {
        EXPECT_EQ(whole.at(row, e, D), rows + row * D + e);
        const cuda::bf16* want = e < D - tail ? rows + row * D + e : tails + row * tail + (e - (D - tail));
        ASSERT_EQ(split.at(row, e, D), want) << "row " << row << " element " << e;
      }
  }
  // A 16-byte group (8 elements from a multiple of 8) of a 512-wide row never straddles the
  // split at the layer's tail: its last element comes from the same place as its first.
  const cuda::OutputRows layer(rows, tails, cuda::attention_tail_dim(flash));
  for (int e = 0; e < 512; e += 8) EXPECT_EQ(layer.at(3, e + 7, 512), layer.at(3, e, 512) + 7) << e;
}

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
