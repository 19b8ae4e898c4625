#include "core/rope_table.hpp"

#include <algorithm>
#include <cmath>

namespace csattn {

std::vector<float> rope_frequencies(const AttentionConfig& cfg) {
  const int dim = cfg.rope_dim;
  const int half = dim / 2;
  std::vector<float> omega(static_cast<std::size_t>(half));
  const bool yarn = cfg.compress_ratio > 1;
  const double base = yarn ? cfg.compress_rope_theta : cfg.rope_theta;
  for (int i = 0; i < half; ++i) omega[i] = static_cast<float>(std::pow(base, -2.0 * i / dim));
  if (!yarn) return omega;
  // YaRN: dims below `low` keep their frequency, dims above `high` are divided by s, a
  // linear ramp in between.
  const double pi = 3.14159265358979323846;
  auto corr = [&](double r) {
    return dim * std::log(cfg.yarn_original_max_pos / (2.0 * pi * r)) / (2.0 * std::log(base));
  };
  const double low = std::max(std::floor(corr(cfg.yarn_beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(cfg.yarn_beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extra = omega[i];
    omega[i] = static_cast<float>(extra / cfg.yarn_factor * ramp + extra * (1.0 - ramp));
  }
  return omega;
}

}  // namespace csattn
