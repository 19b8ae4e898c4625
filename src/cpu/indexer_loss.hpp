// The indexer KL loss (spec 01 §6) and its analytic backward into qI, w' and KI. The scores
// I[t,j] = sum_h w'[t,h] ReLU(qI[t,h] . KI[j]) and the top-k come from the compact indexer
// (compact_indexer.hpp); the loss recomputes the q.k products it needs from the bf16 / fp32
// operands (never from MXFP8 ones).
#pragma once
#include <cstdint>

#include "core/geometry.hpp"

namespace csattn::cpu {

struct IndexerArgs {
  int heads = 0, dim = 0, topk = 0;   // H_I, D_I, K
  const float* q = nullptr;           // [T, H_I, D_I] after RoPE + Hadamard (T: query rows)
  const float* weights = nullptr;     // [T, H_I] effective weights w' (H_I^-1/2 and D_I^-1/2 in)
  const float* keys = nullptr;        // [Nc, D_I] indexer compressor output
};

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
  // [T, K] or null: the compact indexer's softmax over the selected slots, slot-aligned with
  // topk. When given (sparse loss), it is the predictor p - log max(p, FLT_MIN) in the KL and
  // p - T in the gradient - instead of a softmax of recomputed scores (spec 03 §8).
  const float* predict = nullptr;
  bool sparse = true;
  bool per_token = false;
  double coeff = 0.0;                  // lambda
};

// lambda * KL(teacher || predictor), reduced as the config says (mean over real rows or
// per-token sum). Padding rows and rows without candidates contribute 0.
//
// The general forms take the query rows explicitly (core/geometry.hpp QueryRows): per-query
// inputs (q, weights, topk, predict, teacher q, outputs) are indexed by query index, sequence
// facts come from each query's global row, keys are the sequence-major compressed rows of the
// whole batch (geo.comp_start), and the teacher's window rows sit right before each query's
// own K=V row in teacher.kv (QueryRows::kv_row). The loss is reduced over the batch's real
// rows (geo.real_rows), so the losses of disjoint query sets add up to the whole batch's. The
// BatchGeometry forms are the single-rank layer's (every row: QueryRows::all).
double indexer_loss_forward(const BatchGeometry& geo, const LossArgs& a);
double indexer_loss_forward(const QueryRows& queries, const LossArgs& a);

// Gradients of grad_loss * loss: dq [T, H_I, D_I], dweights [T, H_I] (overwritten), dkeys
// [Nc, D_I] (accumulated).
void indexer_loss_backward(const BatchGeometry& geo, const LossArgs& a, float grad_loss,
                           float* dq, float* dweights, float* dkeys);
void indexer_loss_backward(const QueryRows& queries, const LossArgs& a, float grad_loss,
                           float* dq, float* dweights, float* dkeys);

}  // namespace csattn::cpu
