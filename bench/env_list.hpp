// The benchmarks' list variables (CSATTN_BENCH_LAYER_TOKENS, CSATTN_BENCH_DET_TOKENS, ...):
// one reading rule for all of them, host-only so the CPU test suite checks it.
#pragma once
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "csattn/error.hpp"

namespace csattn::bench {

// The comma list of integers in environment variable `var` (token counts, ratios), or
// `defaults` when it is unset or empty; every item in [min_value, 2^24) and a multiple of
// `multiple_of`. Throws csattn::Error (InvalidArgument) naming the variable and `what` otherwise.
inline std::vector<int> int_list_from_env(const char* var, std::vector<int> defaults, const std::string& what,
                                          int min_value = 1, int multiple_of = 1) {
  const char* env = std::getenv(var);
  if (env == nullptr || *env == '\0') return defaults;
  std::vector<int> values;
  std::stringstream list(env);
  for (std::string item; std::getline(list, item, ',');) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    require(!item.empty() && *end == '\0' && v >= min_value && v < (1l << 24) && v % multiple_of == 0,
            ErrorKind::InvalidArgument,
            std::string(var) + ": not a comma list of " + what +
                (multiple_of > 1 ? " divisible by " + std::to_string(multiple_of) : "") + ": " + env);
    values.push_back(static_cast<int>(v));
  }
  // ("," alone, or a trailing comma: getline yields no empty last item)
  require(!values.empty() && env[std::string(env).size() - 1] != ',', ErrorKind::InvalidArgument,
          std::string(var) + ": not a comma list of " + what + ": " + env);
  return values;
}

}  // namespace csattn::bench
