// The CUDA part of csattn::build_info(): the backend's target, the runtime and driver
// versions and the visible devices.
#pragma once
#include "csattn/build_info.hpp"

namespace csattn::cuda {

// The target, runtime and driver versions.
void describe_backend(BuildInfo& b);
// Those and the visible devices (call where cuda_available() said there are some).
void describe_devices(BuildInfo& b);

}  // namespace csattn::cuda
