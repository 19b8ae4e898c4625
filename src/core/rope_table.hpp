// RoPE frequencies of a layer: plain for SWA, YaRN with the compress base for m > 1
// (spec 01 §2.5; magnitude factor forced to 1). One table per layer, shared by Q, K=V, the
// compressors and the indexer.
#pragma once
#include <vector>

#include "csattn/config.hpp"

namespace csattn {

// omega_i for i in [0, rope_dim/2), in fp32 as the reference builds them.
std::vector<float> rope_frequencies(const AttentionConfig& cfg);

}  // namespace csattn
