// The rows one launch of a backward kernel covers and where its key gradients go: the whole
// batch with fp32 atomics (fast mode), or - deterministic mode - one chunk of rows writing
// per-(row, copy, slot) contributions to a scratch that launch_ordered_scatter
// (ordered_scatter.hpp) then adds in a fixed order. A "copy" is a head block: with more than
// 64 heads the attention backward runs several CTAs per row, each with its own contribution.
#pragma once

namespace csattn::cuda {

struct GradChunk {
  int r0 = 0;                // first row of the launch
  int rows = -1;             // rows in the launch; -1: every row from r0 on
  float* scratch = nullptr;  // null: atomics; else [rows, copies, slots, width] fp32
  int slots = 0;             // scratch slots per (row, copy)
  int copies = 1;
  // Deterministic mode only: the compressed slots are not written (slots covers the window);
  // launch_comp_grad_keyed sums the compressed rows' gradients key-stationary (HCA).
  bool window_only = false;

  int launch_rows(int total) const { return rows < 0 ? total - r0 : rows; }
};

}  // namespace csattn::cuda
