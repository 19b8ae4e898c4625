#include "cli_util.hpp"

#ifdef CSATTN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <omp.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <random>

#include "csattn/error.hpp"

namespace csattn::cli {

void bad_option(const std::string& option, const std::string& message) {
  throw Error(ErrorKind::InvalidArgument, option + ": " + message);
}

namespace {

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  const auto last = s.find_last_not_of(" \t");
  return s.substr(first, last - first + 1);
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<int> parse_int_list(const std::vector<std::string>& items,
                                const std::string& option) {
  std::vector<int> out;
  out.reserve(items.size());
  for (const std::string& raw : items) {
    const std::string item = trim(raw);
    if (item.empty()) bad_option(option, "empty entry in the list");
    int value = 0;
    const char* end = item.data() + item.size();
    auto [ptr, ec] = std::from_chars(item.data(), end, value);
    if (ec == std::errc::result_out_of_range) bad_option(option, "'" + item + "' is out of range");
    if (ec != std::errc() || ptr != end) bad_option(option, "'" + item + "' is not an integer");
    out.push_back(value);
  }
  return out;
}

std::vector<int> parse_ratio_list(const std::vector<std::string>& items,
                                  const std::string& option) {
  std::vector<int> ratios = parse_int_list(items, option);
  for (int r : ratios) {
    if (r != 0 && r != 4 && r != 128)
      bad_option(option, "compress ratio " + std::to_string(r) +
                             " is not supported: expected 0 (SWA), 4 (CSA) or 128 (HCA)");
  }
  return ratios;
}

std::string check_preset(const std::string& name, const std::string& option) {
  const auto names = ModelConfig::preset_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return name;
  std::string expected;
  for (std::size_t i = 0; i < names.size(); ++i) expected += (i ? ", " : "") + names[i];
  bad_option(option, "unknown preset '" + name + "': expected one of " + expected);
}

Precision parse_precision(const std::string& value, const std::string& option) {
  if (value == "bf16") return Precision::bf16;
  if (value == "fp32" || value == "f32") return Precision::fp32;
  bad_option(option, "'" + value + "' is not a supported dtype: expected bf16 or fp32");
}

std::string one_line(const std::string& message) {
  std::string out;
  out.reserve(message.size());
  for (std::size_t i = 0; i < message.size(); ++i) {
    const char ch = message[i];
    if (ch == '\n' || ch == '\r') {
      // Fold line breaks (and the indentation after them) into one separator.
      while (!out.empty() && out.back() == ' ') out.pop_back();
      if (!out.empty() && out.back() != ';' && i + 1 < message.size()) out += "; ";
      while (i + 1 < message.size() &&
             (message[i + 1] == ' ' || message[i + 1] == '\n' || message[i + 1] == '\r'))
        ++i;
    } else {
      out += ch;
    }
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ';')) out.pop_back();
  return out;
}

std::vector<float> random_normal(std::size_t n, std::uint64_t seed, std::uint64_t stream,
                                 bool round_to_bf16) {
  std::mt19937_64 gen(splitmix64(seed ^ splitmix64(stream)));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = round_to_bf16 ? round_bf16(dist(gen)) : dist(gen);
  return v;
}

Tensor f32_tensor(std::vector<float> values, Shape shape, bool round_to_bf16) {
  if (round_to_bf16)
    for (float& x : values) x = round_bf16(x);
  return Tensor::from_f32(values, std::move(shape));
}

double sum_squares(const Tensor& t) {
  if (t.nbytes() == 0) return 0.0;
  double s = 0.0;
  if (t.dtype() == DType::f32) {
    const float* p = t.ptr<float>();
    for (std::int64_t i = 0; i < t.numel(); ++i) s += static_cast<double>(p[i]) * p[i];
  } else {
    for (double v : t.to_f64()) s += v * v;
  }
  return s;
}

double l2_norm(const Tensor& t) { return std::sqrt(sum_squares(t)); }

double median(std::vector<double> values) {
  if (values.empty()) return std::nan("");
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::string join_ints(const std::vector<int>& values, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += sep;
    out += std::to_string(values[i]);
  }
  return out;
}

int apply_threads(int threads, const std::string& option) {
  if (threads < 0)
    bad_option(option, std::to_string(threads) + " must be >= 0 (0 = OpenMP default)");
  if (threads > 0) omp_set_num_threads(threads);
  return threads > 0 ? threads : omp_get_max_threads();
}

int visible_gpus() {
#ifdef CSATTN_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a failed query
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

}  // namespace csattn::cli
