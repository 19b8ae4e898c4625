// The gated-pooling compressor (spec 01 §3): projections, per-channel softmax pooling over
// m slots (m = 4: 8 overlapping candidates from two blocks, A/B halves), RMSNorm, RoPE at
// position j*m, and for the indexer compressor the Hadamard rotation. Forward and backward.
#pragma once
#include <vector>

#include "core/geometry.hpp"
#include "cpu/elementwise.hpp"

namespace csattn::cpu {

struct CompressorWeights {
  const float* wkv = nullptr;    // [coff*d, d_model]
  const float* wgate = nullptr;  // [coff*d, d_model]
  const float* ape = nullptr;    // [m, coff*d], fp32
  const float* norm = nullptr;   // [d]
};

struct CompressorGrads {
  float* wkv = nullptr;
  float* wgate = nullptr;
  float* ape = nullptr;
  float* norm = nullptr;
};

struct CompressorSpec {
  int d = 0;             // output dim (D or D_I)
  int rope_dim = 0;      // rotary dims at the end of each output row
  bool rotate = false;   // Hadamard after RoPE (indexer compressor)
  float eps = 1e-6f;
  bool bf16 = false;
};

// What the backward needs, kept by the forward.
struct CompressorState {
  std::vector<float> a, g;     // [T, coff*d] projections (content, gate logits)
  std::vector<float> pooled;   // [Nc, d] before the norm
  std::vector<float> rstd;     // [Nc]
  std::vector<float> out;      // [Nc, d] final compressed rows
};

void compressor_forward(const BatchGeometry& geo, const CompressorSpec& spec,
                        const RopeTable& rope, const float* x, int d_model,
                        const CompressorWeights& w, CompressorState& st);

// dout: [Nc, d] gradient of the compressed rows. Weight grads accumulate; dx (nullable)
// accumulates the gradient of the hidden states.
void compressor_backward(const BatchGeometry& geo, const CompressorSpec& spec,
                         const RopeTable& rope, const float* x, int d_model,
                         const CompressorWeights& w, const CompressorState& st,
                         const float* dout, const CompressorGrads& grads, float* dx);

}  // namespace csattn::cpu
