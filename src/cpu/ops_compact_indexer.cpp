// ops.hpp, CPU backend: the compact indexer forward + top-k, and the THD compact K packing.
// Validates every view against the plan, derives this call's metadata (candidate offsets,
// MXFP8 scale prefixes) into the workspace, then runs cpu::compact_indexer_topk.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/mxfp8_layout.hpp"
#include "core/view_checks.hpp"
#include "cpu/compact_indexer.hpp"
#include "cpu/mxfp8.hpp"
#include "csattn/error.hpp"
#include "csattn/ops.hpp"

namespace csattn::ops {

namespace {

template <class T>
T* region(const TensorView& ws, const WorkspaceRegion& r) {
  return reinterpret_cast<T*>(static_cast<unsigned char*>(ws.data) + r.offset);
}

cpu::OperandRows::Kind float_kind(DType dt) {
  return dt == DType::bf16 ? cpu::OperandRows::Kind::bf16 : cpu::OperandRows::Kind::f32;
}

// Quantizes one operand into the workspace and packs its scales; returns how to read it.
cpu::OperandRows quantize_operand(const ConstTensorView& x, std::int64_t rows, int rows_per_token,
                                  int cols, const Mxfp8ScalePlan& sp,
                                  std::span<const std::int32_t> cu, const TensorView& ws,
                                  const WorkspaceRegion& data_r, const WorkspaceRegion& logical_r,
                                  const WorkspaceRegion& packed_r,
                                  const WorkspaceRegion& prefix_r) {
  auto* data = region<std::uint8_t>(ws, data_r);
  auto* logical = region<std::uint8_t>(ws, logical_r);
  auto* packed = region<std::uint8_t>(ws, packed_r);
  const std::int64_t n = rows * rows_per_token;
  if (x.dtype == DType::f32)
    cpu::mxfp8::quantize_rows(x.ptr<float>(), n, cols, data, logical);
  else
    cpu::mxfp8::quantize_rows_bf16(x.ptr<std::uint16_t>(), n, cols, data, logical);
  cpu::OperandRows o;
  o.kind = cpu::OperandRows::Kind::mxfp8;
  o.data = data;
  o.rows_per_token = rows_per_token;
  o.cols = cols;
  o.packed_scales = packed;
  o.scales.rows_per_token = rows_per_token;
  o.scales.groups_padded = sp.groups_padded;
  if (sp.format == QkvFormat::bshd) {
    o.scales.thd = false;
    o.scales.slice_bytes = sp.rows_padded * sp.groups_padded;
    cpu::mxfp8::pack_scales_bshd(logical, sp.slices, sp.tokens * rows_per_token, sp.groups,
                                 sp.rows_padded, sp.groups_padded, packed);
  } else {
    // Prefixes of this call's boundaries, written before anything reads them.
    std::span<std::int32_t> prefixes(region<std::int32_t>(ws, prefix_r), cu.size());
    mxfp8::thd_scale_prefixes(cu, rows_per_token, prefixes);
    require(prefixes.back() <= sp.capacity_tokens, ErrorKind::Internal,
            "padded scale tokens exceed the worst-case capacity");
    cpu::mxfp8::pack_scales_thd(logical, cu, prefixes, rows_per_token, sp.groups,
                                sp.groups_padded, packed, sp.packed_bytes());
    o.scales.thd = true;
    o.scales.prefixes = prefixes.data();
  }
  return o;
}

void check_lengths(std::span<const std::int32_t> cu, int max_len, const std::string& name,
                   const char* max_name) {
  for (std::size_t b = 0; b + 1 < cu.size(); ++b)
    require(cu[b + 1] - cu[b] <= max_len, ErrorKind::InvalidArgument,
            name + ": segment " + std::to_string(b) + " has length " +
                std::to_string(cu[b + 1] - cu[b]) + ", more than the plan's " + max_name +
                " = " + std::to_string(max_len));
}

}  // namespace

void compact_indexer_topk(const CompactIndexerPlan& plan, const CompactIndexerInputs& in,
                          const CompactIndexerOutputs& out, TensorView workspace) {
  const CompactIndexerGeometry& g = plan.geometry;
  const std::int64_t B = g.batch, H = g.heads, D = g.head_dim, K = g.topk;
  const bool bshd = g.format == QkvFormat::bshd;
  const std::initializer_list<DType> floats = {DType::f32, DType::bf16};
  const std::int64_t Tq = plan.q_rows, Tk = plan.k_rows;
  const std::int64_t Sq = g.max_seqlen_q, Sk = g.max_seqlen_k;

  // Shapes.
  if (bshd) {
    checks::view(in.q, "q", floats, {B, Sq, H, D});
    checks::view_any_shape(in.k, "k", floats, {{B, Sk, D}, {B, Sk, 1, D}});
    checks::view(in.weights, "weights", floats, {B, Sq, H});
    require(in.cu_seqlens_q.absent() && in.cu_seqlens_k.absent(), ErrorKind::InvalidArgument,
            "cu_seqlens_q / cu_seqlens_k are given but the plan is BSHD");
  } else {
    checks::view(in.q, "q", floats, {Tq, H, D});
    checks::view_any_shape(in.k, "k", floats, {{Tk, D}, {Tk, 1, D}});
    checks::view(in.weights, "weights", floats, {Tq, H});
  }
  const Shape out_shape = bshd ? Shape{B, Sq, K} : Shape{Tq, K};
  checks::view(out.indices, "indices", {DType::i32}, out_shape);
  checks::view(out.logits, "logits", {DType::f32}, out_shape);
  if (!out.softmax.absent()) checks::view(out.softmax, "softmax", {DType::f32}, out_shape);
  require(std::isfinite(in.sm_scale), ErrorKind::InvalidArgument,
          "sm_scale = " + std::to_string(in.sm_scale) + " must be finite");

  // Workspace: size, alignment, no aliasing with anything else of the call.
  require(workspace.device == Device::cpu, ErrorKind::Unsupported,
          "workspace is a cuda view: this build has only the CPU backend");
  require(workspace.data != nullptr || plan.workspace_bytes == 0, ErrorKind::InvalidArgument,
          "workspace is missing (null data pointer)");
  require(workspace.nbytes() >= plan.workspace_bytes, ErrorKind::InvalidArgument,
          "workspace has " + std::to_string(workspace.nbytes()) + " bytes, the plan needs " +
              std::to_string(plan.workspace_bytes) + " (workspace_bytes(plan))");
  require(reinterpret_cast<std::uintptr_t>(workspace.data) % 16 == 0, ErrorKind::InvalidArgument,
          "workspace must be 16-byte aligned");
  const std::vector<std::pair<ConstTensorView, std::string>> all = {
      {in.q, "q"}, {in.k, "k"}, {in.weights, "weights"}, {in.cu_seqlens_q, "cu_seqlens_q"},
      {in.cu_seqlens_k, "cu_seqlens_k"}, {in.q_causal_offsets, "q_causal_offsets"},
      {out.indices, "indices"}, {out.logits, "logits"}, {out.softmax, "softmax"},
      {workspace, "workspace"}};
  for (std::size_t i = 6; i < all.size(); ++i)  // each output against everything before it
    for (std::size_t j = 0; j < i; ++j)
      checks::no_overlap(all[i].first, all[i].second, all[j].first, all[j].second);

  // The layout of THIS call, in THD form.
  std::vector<std::int32_t> bshd_cu_q, bshd_cu_k;
  std::span<const std::int32_t> cu_q, cu_k;
  if (bshd) {
    for (std::int64_t b = 0; b <= B; ++b) {
      bshd_cu_q.push_back(static_cast<std::int32_t>(b * Sq));
      bshd_cu_k.push_back(static_cast<std::int32_t>(b * Sk));
    }
    cu_q = bshd_cu_q;
    cu_k = bshd_cu_k;
  } else {
    cu_q = checks::cu_seqlens(in.cu_seqlens_q, "cu_seqlens_q", B + 1);
    cu_k = checks::cu_seqlens(in.cu_seqlens_k, "cu_seqlens_k", B + 1);
    require(cu_q.back() == Tq, ErrorKind::InvalidArgument,
            "cu_seqlens_q[-1] = " + std::to_string(cu_q.back()) + ", expected the " +
                std::to_string(Tq) + " rows of q");
    require(cu_k.back() <= Tk, ErrorKind::InvalidArgument,
            "cu_seqlens_k[-1] = " + std::to_string(cu_k.back()) + " exceeds the " +
                std::to_string(Tk) + " rows of k");
    check_lengths(cu_q, g.max_seqlen_q, "cu_seqlens_q", "max_seqlen_q");
    check_lengths(cu_k, g.max_seqlen_k, "cu_seqlens_k", "max_seqlen_k");
  }
  std::span<const std::int32_t> offsets;
  if (g.causal_offsets) {
    checks::view(in.q_causal_offsets, "q_causal_offsets", {DType::i32}, {B});
    offsets = {in.q_causal_offsets.ptr<std::int32_t>(), static_cast<std::size_t>(B)};
    for (std::size_t b = 0; b < offsets.size(); ++b)
      require(offsets[b] >= 0, ErrorKind::InvalidArgument,
              "q_causal_offsets[" + std::to_string(b) + "] = " + std::to_string(offsets[b]) +
                  " must be >= 0");
  } else {
    require(in.q_causal_offsets.absent(), ErrorKind::InvalidArgument,
            "q_causal_offsets is given but the plan was made without causal_offsets");
  }

  cpu::CompactIndexerCall c;
  c.heads = g.heads;
  c.dim = g.head_dim;
  c.topk = g.topk;
  c.ratio = g.ratio;
  c.sm_scale = in.sm_scale;
  c.cu_q = cu_q;
  c.cu_k = cu_k;
  c.offsets = offsets;
  c.w = {float_kind(in.weights.dtype), in.weights.data, 1, g.heads, nullptr, {}};
  if (g.precision == IndexerPrecision::mxfp8) {
    c.q = quantize_operand(in.q, Tq, g.heads, g.head_dim, plan.q_scale, cu_q, workspace,
                           plan.q_data, plan.q_scale_logical, plan.q_scale_packed,
                           plan.q_scale_cu_seqlens);
    c.k = quantize_operand(in.k, Tk, 1, g.head_dim, plan.k_scale, cu_k, workspace, plan.k_data,
                           plan.k_scale_logical, plan.k_scale_packed, plan.k_scale_cu_seqlens);
  } else {
    c.q = {float_kind(in.q.dtype), in.q.data, g.heads, g.head_dim, nullptr, {}};
    c.k = {float_kind(in.k.dtype), in.k.data, 1, g.head_dim, nullptr, {}};
  }
  c.cand_batch_offsets = {region<std::int64_t>(workspace, plan.cand_batch_offsets),
                          static_cast<std::size_t>(B + 1)};
  c.cand = region<float>(workspace, plan.cand_buffer);
  c.cand_capacity = plan.cand_capacity;
  c.pass_rows = plan.pass_rows;
  c.indices = out.indices.ptr<std::int32_t>();
  c.logits = out.logits.ptr<float>();
  c.softmax = out.softmax.absent() ? nullptr : out.softmax.ptr<float>();
  cpu::compact_indexer_topk(c);
}

void pack_thd_compact_k(ConstTensorView k, const ThdCompactKLayout& layout, TensorView out) {
  const std::int64_t R = layout.k_rows, P = layout.physical_rows();
  require(layout.source_row_map.size() == static_cast<std::size_t>(P), ErrorKind::InvalidArgument,
          "layout.source_row_map has " + std::to_string(layout.source_row_map.size()) +
              " entries, expected " + std::to_string(P) + " (physical rows)");
  require(!k.shape.empty(), ErrorKind::ShapeMismatch, "k is a scalar, expected [R, D]");
  const std::int64_t D = k.shape.back();
  const int form = checks::view_any_shape(k, "k", {DType::f32, DType::bf16}, {{R, D}, {R, 1, D}});
  checks::view(out, "out", {k.dtype}, form == 0 ? Shape{P, D} : Shape{P, 1, D});
  checks::no_overlap(k, "k", out, "out");
  const std::size_t row_bytes = static_cast<std::size_t>(D) * dtype_size(k.dtype);
  const auto* src = static_cast<const unsigned char*>(k.data);
  auto* dst = static_cast<unsigned char*>(out.data);
  for (std::int64_t p = 0; p < P; ++p) {
    const std::int32_t s = layout.source_row_map[static_cast<std::size_t>(p)];
    require(s >= 0 && s <= R, ErrorKind::InvalidArgument,
            "layout.source_row_map[" + std::to_string(p) + "] = " + std::to_string(s) +
                " is outside [0, " + std::to_string(R) + "]");
    if (s == R)
      std::memset(dst + p * row_bytes, 0, row_bytes);
    else
      std::memcpy(dst + p * row_bytes, src + s * row_bytes, row_bytes);
  }
}

}  // namespace csattn::ops
