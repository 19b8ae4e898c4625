// Validation of the views passed to the operators of ops.hpp: every failure is a
// csattn::Error naming the argument, what it is and what was expected.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "csattn/tensor.hpp"

namespace csattn::checks {

// A present (non-null unless it holds no elements) CPU view with one of `dtypes` and exactly
// `shape`.
void view(const ConstTensorView& v, const std::string& name, std::initializer_list<DType> dtypes,
          const Shape& shape);
// The same, accepting any of `shapes`; returns the index of the shape that matched.
int view_any_shape(const ConstTensorView& v, const std::string& name,
                   std::initializer_list<DType> dtypes, std::initializer_list<Shape> shapes);

// i32 [count]: cu_seqlens starting at 0, non-decreasing; returns the values.
std::span<const std::int32_t> cu_seqlens(const ConstTensorView& v, const std::string& name,
                                         std::int64_t count);

// Outputs must not overlap each other or the inputs they are computed from.
void no_overlap(const ConstTensorView& a, const std::string& a_name, const ConstTensorView& b,
                const std::string& b_name);

}  // namespace csattn::checks
