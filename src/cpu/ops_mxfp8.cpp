// ops.hpp, CPU backend: MXFP8 quantization, dequantization and scale packing.
#include <string>
#include <vector>

#include "core/mxfp8_layout.hpp"
#include "core/view_checks.hpp"
#include "cpu/mxfp8.hpp"
#include "csattn/error.hpp"
#include "csattn/ops.hpp"

namespace csattn::ops {

namespace {

// The row width D of an MXFP8 operand: its last dimension, a positive multiple of 32.
int mxfp8_cols(const ConstTensorView& v, const std::string& name) {
  require(!v.shape.empty(), ErrorKind::ShapeMismatch,
          name + " is a scalar, expected [..., D] with D a multiple of 32");
  const std::int64_t d = v.shape.back();
  require(d > 0 && d % mxfp8::kBlock == 0, ErrorKind::ShapeMismatch,
          name + " has shape " + shape_str(v.shape) +
              ": its last dimension must be a positive multiple of 32 (one E8M0 scale per 32 "
              "elements)");
  return static_cast<int>(d);
}

Shape with_last(Shape s, std::int64_t last) {
  s.back() = last;
  return s;
}

// Logical scales given as [rows, groups] or with the rows split (e.g. [T, H, groups]).
void check_logical_scales(const ConstTensorView& v, const Mxfp8ScalePlan& plan) {
  checks::view_any_shape(v, "logical_scales", {DType::e8m0}, {v.shape});
  require(!v.shape.empty() && v.shape.back() == plan.groups &&
              v.numel() == plan.logical_rows() * plan.groups,
          ErrorKind::ShapeMismatch,
          "logical_scales has shape " + shape_str(v.shape) + ", expected [" +
              std::to_string(plan.logical_rows()) + ", " + std::to_string(plan.groups) +
              "] (rows = tokens * rows_per_token, any split of the rows)");
}

}  // namespace

void quantize_mxfp8(ConstTensorView x, TensorView data, TensorView scales) {
  checks::view_any_shape(x, "x", {DType::f32, DType::bf16}, {x.shape});
  const int cols = mxfp8_cols(x, "x");
  checks::view(data, "data", {DType::e4m3}, x.shape);
  checks::view(scales, "scales", {DType::e8m0}, with_last(x.shape, cols / mxfp8::kBlock));
  checks::no_overlap(data, "data", scales, "scales");
  checks::no_overlap(x, "x", data, "data");
  checks::no_overlap(x, "x", scales, "scales");
  const std::int64_t rows = x.numel() / cols;
  if (x.dtype == DType::f32)
    cpu::mxfp8::quantize_rows(x.ptr<float>(), rows, cols, data.ptr<std::uint8_t>(),
                              scales.ptr<std::uint8_t>());
  else
    cpu::mxfp8::quantize_rows_bf16(x.ptr<std::uint16_t>(), rows, cols,
                                   data.ptr<std::uint8_t>(), scales.ptr<std::uint8_t>());
}

void dequantize_mxfp8(ConstTensorView data, ConstTensorView scales, TensorView out) {
  checks::view_any_shape(data, "data", {DType::e4m3}, {data.shape});
  const int cols = mxfp8_cols(data, "data");
  checks::view(scales, "scales", {DType::e8m0}, with_last(data.shape, cols / mxfp8::kBlock));
  checks::view(out, "out", {DType::f32}, data.shape);
  checks::no_overlap(data, "data", out, "out");
  checks::no_overlap(scales, "scales", out, "out");
  cpu::mxfp8::dequantize_rows(data.ptr<std::uint8_t>(), scales.ptr<std::uint8_t>(),
                              data.numel() / cols, cols, out.ptr<float>());
}

void pack_mxfp8_scales(const Mxfp8ScalePlan& plan, ConstTensorView logical, TensorView packed) {
  require(plan.format == QkvFormat::bshd, ErrorKind::InvalidArgument,
          "pack_mxfp8_scales: the plan is THD, which needs cu_seqlens and scale_cu_seqlens");
  check_logical_scales(logical, plan);
  checks::view(packed, "packed_scales", {DType::e8m0}, plan.packed_shape());
  checks::no_overlap(logical, "logical_scales", packed, "packed_scales");
  cpu::mxfp8::pack_scales_bshd(logical.ptr<std::uint8_t>(), plan.slices,
                               plan.tokens * plan.rows_per_token, plan.groups, plan.rows_padded,
                               plan.groups_padded, packed.ptr<std::uint8_t>());
}

void pack_mxfp8_scales(const Mxfp8ScalePlan& plan, ConstTensorView logical,
                       ConstTensorView cu_seqlens, TensorView packed,
                       TensorView scale_cu_seqlens) {
  require(plan.format == QkvFormat::thd, ErrorKind::InvalidArgument,
          "pack_mxfp8_scales: the plan is BSHD, which takes no cu_seqlens");
  check_logical_scales(logical, plan);
  const auto cu = checks::cu_seqlens(cu_seqlens, "cu_seqlens", plan.batch + 1);
  require(cu.back() == plan.tokens, ErrorKind::InvalidArgument,
          "cu_seqlens[-1] = " + std::to_string(cu.back()) + ", expected the plan's " +
              std::to_string(plan.tokens) + " tokens");
  checks::view(packed, "packed_scales", {DType::e8m0}, plan.packed_shape());
  checks::view(scale_cu_seqlens, "scale_cu_seqlens", {DType::i32}, {plan.batch + 1});
  checks::no_overlap(logical, "logical_scales", packed, "packed_scales");
  checks::no_overlap(packed, "packed_scales", scale_cu_seqlens, "scale_cu_seqlens");
  checks::no_overlap(cu_seqlens, "cu_seqlens", scale_cu_seqlens, "scale_cu_seqlens");
  // The prefixes of THIS layout, every call.
  std::span<std::int32_t> prefixes(scale_cu_seqlens.ptr<std::int32_t>(),
                                   static_cast<std::size_t>(plan.batch + 1));
  mxfp8::thd_scale_prefixes(cu, plan.rows_per_token, prefixes);
  require(prefixes.back() <= plan.capacity_tokens, ErrorKind::Internal,
          "padded scale tokens " + std::to_string(prefixes.back()) +
              " exceed the worst-case capacity " + std::to_string(plan.capacity_tokens));
  cpu::mxfp8::pack_scales_thd(logical.ptr<std::uint8_t>(), cu, prefixes, plan.rows_per_token,
                              plan.groups, plan.groups_padded, packed.ptr<std::uint8_t>(),
                              plan.packed_bytes());
}

}  // namespace csattn::ops
