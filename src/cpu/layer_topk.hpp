// The layers' top-k through the public compact indexer (ops::compact_indexer_topk), for the
// single-rank layer and for a context-parallel rank alike.
//
// The query rows (core/geometry.hpp QueryRows) become compact THD segments, each a run of
// consecutive rows of one sequence split into its real rows (scoring the sequence's
// compressed keys) and its padding rows (no keys), so padding rows are never scored and get
// -1 / -inf / 0 without any masking afterwards.
//  - Every row of the batch (the single-rank layer, QueryRows::all): 2B segments, all at
//    causal offset 0, reading the sequence-major keys in place.
//  - Any other row set (a context-parallel rank's pieces): one pair per run, at the causal
//    offset of the run's first position, with the keys each run can see gathered into a
//    compact K buffer (a sequence split over two chunks of one rank needs its keys twice).
// The compact op computes every row from its own operands and position only, so a row's
// selection is the same whichever set it is computed in (bitwise in the batch-invariant fp32
// forward, docs/numerics.md), in both indexer precisions.
#pragma once
#include <cstdint>

#include "core/geometry.hpp"
#include "cpu/indexer_loss.hpp"
#include "csattn/config.hpp"

namespace csattn::cpu {

// a.q, a.weights: [queries.count, ...] in query order; a.keys: the batch's sequence-major
// compressed rows [Nc, D_I]. topk, logits: [queries.count, K]; softmax: the same, or null
// (not computed).
void layer_indexer_topk(const QueryRows& queries, const IndexerArgs& a,
                        IndexerPrecision precision, std::int32_t* topk, float* logits,
                        float* softmax);

inline void layer_indexer_topk(const BatchGeometry& geo, const IndexerArgs& a,
                               IndexerPrecision precision, std::int32_t* topk, float* logits,
                               float* softmax) {
  layer_indexer_topk(QueryRows::all(geo), a, precision, topk, logits, softmax);
}

}  // namespace csattn::cpu
