// The lightning indexer (spec 01 §4): scores I[t,j] = sum_h w'[t,h] ReLU(qI[t,h] . KI[j])
// over the visible compressed entries of the query's segment, the top-k selection, and the
// indexer KL loss (§6) with its analytic backward into qI, w' and KI.
#pragma once
#include <cstdint>

#include "core/geometry.hpp"

namespace csattn::cpu {

struct IndexerArgs {
  int heads = 0, dim = 0, topk = 0;   // H_I, D_I, K
  const float* q = nullptr;           // [T, H_I, D_I] after RoPE + Hadamard
  const float* weights = nullptr;     // [T, H_I] effective weights w' (H_I^-1/2 and D_I^-1/2 in)
  const float* keys = nullptr;        // [Nc, D_I] indexer compressor output
};

// The general forms take the query rows explicitly (core/geometry.hpp QueryRows): per-query
// inputs (q, weights, topk, teacher q, outputs) are indexed by query index, sequence facts
// come from each query's global row, keys are the sequence-major compressed rows of the
// whole batch (geo.comp_start), and the teacher's window rows sit right before each query's
// own K=V row in teacher.kv (QueryRows::kv_row). The loss is reduced over the batch's real
// rows (geo.real_rows), so the losses of disjoint query sets add up to the whole batch's.
void indexer_topk(const QueryRows& queries, const IndexerArgs& a, std::int32_t* topk);

// topk: [T, K]. Per row the min(K, visible) best entries (ties to the smaller index),
// written in ascending index order, then -1. Padding rows get no candidates (all -1). The
// score matrix is never materialised: rows are scored a block at a time.
void indexer_topk(const BatchGeometry& geo, const IndexerArgs& a, std::int32_t* topk);

// Index scores of one row for entries ids[0..n) (fp32 accumulation). For tests and tools.
void indexer_row_scores(const IndexerArgs& a, int row, const int* seg_local_ids, int n,
                        int comp_start, float* scores);

// The detached main attention the teacher is built from.
struct TeacherArgs {
  int heads = 0, dim = 0, window = 0;
  float scale = 0.0f;
  const float* q = nullptr;     // [T, H, D]
  const float* kv = nullptr;    // [T, D] raw K=V rows (QueryRows::kv_row indexes them)
  const float* comp = nullptr;  // [Nc, D] main compressor output
  const float* sink = nullptr;  // [H]
};

struct LossArgs {
  IndexerArgs indexer;
  TeacherArgs teacher;
  const std::int32_t* topk = nullptr;  // [T, K] (sparse loss candidates)
  bool sparse = true;
  bool per_token = false;
  double coeff = 0.0;                  // lambda
};

// lambda * KL(teacher || predictor), reduced as the config says (mean over real rows or
// per-token sum). Padding rows and rows without candidates contribute 0.
double indexer_loss_forward(const BatchGeometry& geo, const LossArgs& a);
double indexer_loss_forward(const QueryRows& queries, const LossArgs& a);

// Gradients of grad_loss * loss: dq [T, H_I, D_I], dweights [T, H_I] (overwritten), dkeys
// [Nc, D_I] (accumulated).
void indexer_loss_backward(const BatchGeometry& geo, const LossArgs& a, float grad_loss,
                           float* dq, float* dweights, float* dkeys);
void indexer_loss_backward(const QueryRows& queries, const LossArgs& a, float grad_loss,
                           float* dq, float* dweights, float* dkeys);

}  // namespace csattn::cpu
