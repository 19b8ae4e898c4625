// Staging an mma C-fragment block of 8 rows x 32 fp32 columns through 1 KB of a warp's shared
// memory so that it leaves as whole 128-byte lines: lane (g, q) holds columns 8 n + 2 q (+1)
// of row g at v[n] (the m16n8 C layout, one 8-row half), and after stage_rows lane l reads
// row l / 8 (+ 4), 16-byte piece l % 8 - 4 rows x 128 contiguous bytes a warp instruction,
// where the fragment layout gives 8 rows x 32 B. The 16-byte pieces are XOR-swizzled by
// 2 x row, so the fragment writes take the minimum two wavefronts and the reads four. Used by
// the indexer loss's flush (add_key_grads_lines). The attention backward's flush_dk_lines
// (attention_backward_wgmma.cu) holds the same layout inline: moving it onto these helpers
// changed its machine code (+8 instructions in the measured kernel, 2026-12-06), so it stays
// as measured until a device run can time the change. The reductions benchmark gives whole
// lines 1.65x the rate of the fragment layout in L2.
#pragma once

namespace csattn::cuda {

constexpr int kLineStageFloats = 8 * 32;  // a warp's staging area

// Where 16-byte piece `piece` (4 columns) of staged row `row` lies.
__device__ __forceinline__ float* line_stage_at(float* stage, int row, int piece) {
  return stage + row * 32 + (((piece ^ (2 * row)) & 7) << 2);
}

// Writes the warp's 8 x 32 block (see above) into `stage`, then syncs the warp.
__device__ __forceinline__ void line_stage_rows(float* stage, const float2 (&v)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    const int col = 8 * n + 2 * qd;
    *reinterpret_cast<float2*>(line_stage_at(stage, g, col >> 2) + (col & 3)) = v[n];
  }
  __syncwarp();
}

// This lane's piece k (k = 0, 1) of the staged block: row lane / 8 + 4 k, columns
// 4 (lane % 8) .. + 3. (The caller syncs the warp before the area is written again.)
__device__ __forceinline__ float4 line_stage_piece(float* stage, int k) {
  const int lane = threadIdx.x & 31;
  return *reinterpret_cast<const float4*>(line_stage_at(stage, (lane >> 3) + 4 * k, lane & 7));
}

}  // namespace csattn::cuda
