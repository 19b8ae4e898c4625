// The CUDA part of csattn::build_info(): the backend's target, the runtime and driver
// versions and the visible devices.
#pragma once
#include "csattn/build_info.hpp"

namespace csattn::cuda {

void describe_devices(BuildInfo& b);

}  // namespace csattn::cuda
