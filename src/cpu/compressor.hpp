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
  std::vector<float> a, g;     // [rows, coff*d] projections (content, gate logits)
  std::vector<float> pooled;   // [entries, d] before the norm
  std::vector<float> rstd;     // [entries]
  std::vector<float> out;      // [entries, d] final compressed rows
};

// One compressed entry to compute: its own block of m tokens starts at row `first_row` of the
// input rows, the previous block (m = 4 overlap, A halves) at `prev_row` (-1: the entry is the
// first of its sequence, no previous candidates), and its RoPE position is j*m. The single
// rank lists every entry of every segment; a context-parallel rank lists the groups it owns,
// with rows in its halo + local row buffer (the compressor-input compaction of spec 02 §5.1
// as an index map instead of a copy).
struct CompressorEntry {
  int first_row = 0;
  int prev_row = -1;
  int position = 0;
};

// Entries of every segment of a batch, segment-major (the single-rank layout).
std::vector<CompressorEntry> compressor_entries(const BatchGeometry& geo);

// x: [x_rows, d_model]; the projections run over all x_rows rows, then entry e's pooled,
// normed, rotated row is st.out[e].
void compressor_forward(const CompressorEntry* entries, int n_entries, int ratio,
                        const CompressorSpec& spec, const RopeTable& rope, const float* x,
                        int x_rows, int d_model, const CompressorWeights& w,
                        CompressorState& st);
// dout: [n_entries, d]. Weight grads accumulate; dx [x_rows, d_model] (nullable) accumulates.
void compressor_backward(const CompressorEntry* entries, int n_entries, int ratio,
                         const CompressorSpec& spec, const RopeTable& rope, const float* x,
                         int x_rows, int d_model, const CompressorWeights& w,
                         const CompressorState& st, const float* dout,
                         const CompressorGrads& grads, float* dx);

// The single-rank form: every entry of the batch (compressor_entries) over x = all T rows.
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
