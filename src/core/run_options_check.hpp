// The checks every layer entry point makes of its RunOptions (single-rank and
// context-parallel alike), with the same messages.
#pragma once
#include <string>

#include "csattn/error.hpp"
#include "csattn/layer.hpp"

namespace csattn {

inline void check_run_options(const RunOptions& o) {
  require(o.threads >= 0, ErrorKind::InvalidArgument,
          "threads = " + std::to_string(o.threads) + " must be >= 0");
  if (o.device != Device::cuda) return;
  std::string why;
  const bool ok = cuda_available(&why);  // before the message is built from `why`
  require(ok, ErrorKind::Unsupported, "device cuda: " + why);
  require(o.precision == Precision::bf16, ErrorKind::Unsupported,
          "device cuda computes in bf16 only (fp32 is a CPU reference mode)");
}

}  // namespace csattn
