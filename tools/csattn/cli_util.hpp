// Small helpers shared by the csattn subcommands: option-value parsing (comma lists, enums)
// that fails with a csattn::Error naming the option, seeded random tensors, norms, timing.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "csattn/config.hpp"
#include "csattn/layer.hpp"
#include "csattn/tensor.hpp"

namespace csattn::cli {

// Throws csattn::Error(InvalidArgument, "<option>: <message>").
[[noreturn]] void bad_option(const std::string& option, const std::string& message);

// Items of a comma list option (CLI11 already split on ','), each an integer.
// "4,x" -> Error "--seqlens: 'x' is not an integer".
std::vector<int> parse_int_list(const std::vector<std::string>& items, const std::string& option);

// Compress ratios: every value in {0, 4, 128}.
std::vector<int> parse_ratio_list(const std::vector<std::string>& items,
                                  const std::string& option);

// Preset names, checked against ModelConfig::preset_names().
std::string check_preset(const std::string& name, const std::string& option);

Precision parse_precision(const std::string& value, const std::string& option);

// The one line printed for an error: newlines folded into "; ".
std::string one_line(const std::string& message);

// Seeded N(0, 1) values (deterministic for a given seed and stream), optionally rounded to
// bf16.
std::vector<float> random_normal(std::size_t n, std::uint64_t seed, std::uint64_t stream,
                                 bool round_to_bf16);

// Copies values into an f32 tensor of the given shape, rounding to bf16 when asked.
Tensor f32_tensor(std::vector<float> values, Shape shape, bool round_to_bf16);

// L2 norm of a float tensor (accumulated in double).
double l2_norm(const Tensor& t);
double sum_squares(const Tensor& t);

double median(std::vector<double> values);

// Joins integers with a separator: {1, 2} -> "1,2".
std::string join_ints(const std::vector<int>& values, const char* sep = ",");

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Applies --threads: omp_set_num_threads(n) for n > 0; returns the thread count in effect.
int apply_threads(int threads, const std::string& option);

// CUDA devices this process sees (0 without the CUDA backend or a driver).
int visible_gpus();

}  // namespace csattn::cli
