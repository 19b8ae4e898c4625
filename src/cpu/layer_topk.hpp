// The CSA layer's top-k through the public compact indexer (ops::compact_indexer_topk): the
// layer's padded THD batch becomes 2B compact segments - each segment's real rows with its
// compressed keys, then its padding rows with none - so padding rows are never scored and get
// -1 / -inf / 0 without any masking afterwards.
#pragma once
#include <cstdint>

#include "core/geometry.hpp"
#include "cpu/indexer_loss.hpp"
#include "csattn/config.hpp"

namespace csattn::cpu {

// topk, logits: [T, K]; softmax: [T, K] or null (not computed).
void layer_indexer_topk(const BatchGeometry& geo, const IndexerArgs& a,
                        IndexerPrecision precision, std::int32_t* topk, float* logits,
                        float* softmax);

}  // namespace csattn::cpu
