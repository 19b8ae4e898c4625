// The deterministic key gradients of HCA's compressed rows, key-stationary (see
// backward_kernels.hpp, launch_comp_grad_keyed): the pass's host side - D_row, the chunking of
// the rows, the launch of its kernel (attention_backward_keyed_wgmma.cu) and the fixed-order
// sum of the chunks' partials. Why the pass exists: the deterministic backward's scratch
// holds one fp32 row per (query, key slot), and an HCA query has W + L / 128 slots, so the
// scratch traffic grows as T x L / 256 x 2 KB each way (34 GB at 64K tokens, 8.8 TB at 1M).
// Here each CTA owns 64 compressed rows and walks the queries that see them in ascending row
// order (attention_keyed_walk.cuh), recomputing P and dS from the saved LSE and D_row, so
// every sum has one fixed order and nothing per (query, slot) is stored: the traffic is the
// Q / dO rows read once per 64 entries and the per-chunk partial sums.
//
// Entry j of segment b is seen by the rows of b at positions p with j < (p + 1) / ratio (the
// key list of attention_keys.cuh, the ordered scatter's predicate). The kernel history: a
// 32-entry mma.sync kernel (bound by its ldmatrix bytes) took 96 ms at 128K tokens on an H100,
// this wgmma one 60 ms; the per-(row, slot) scratch it replaced made the whole deterministic
// attention stage 204 ms against 148 ms for the window chunks and this pass (perf.md,
// 2026-12-06); the mma.sync kernel and the scratch path for HCA were then removed.
#include <algorithm>
#include <string>

#include "cuda/attention_row_terms.cuh"
#include "cuda/backward_kernels.hpp"
#include "cuda/check.hpp"
#include "cuda/device_util.cuh"

namespace csattn::cuda {

namespace {

constexpr int kDim = 512;
constexpr int kHeadBlock = 64;  // head rows per tile of the kernel
// The grid aims at this many CTAs (chunks x key blocks): ~8 waves of 132 SMs, so that the
// triangular work (early entries are seen by more rows) spreads; no more chunks than 64-row
// pieces of the batch.
constexpr int kTargetCtas = 1024;
constexpr int kMinChunkRows = 64;

int key_blocks_of(const LayerDims& d) {
  return (d.comp_capacity + comp_grad_keyed_wgmma_entries() - 1) / comp_grad_keyed_wgmma_entries();
}

// dst[e] = sum over the chunks in order of partials[c][e], for the entries e < total.
__global__ void sum_chunks_kernel(const float* partials, int chunks, long chunk_floats,
                                  const std::int32_t* comp_start, int segments, float* dst) {
  const long total4 = static_cast<long>(comp_start[segments]) * (kDim / 4);
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < total4;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    float4 s = reinterpret_cast<const float4*>(partials)[i];
    for (int c = 1; c < chunks; ++c) {
      const float4 v = reinterpret_cast<const float4*>(partials + c * chunk_floats)[i];
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
    reinterpret_cast<float4*>(dst)[i] = s;
  }
}

// D_row = dO . O for every (row, head): a warp a row of 512, 16-byte loads.
__global__ void row_dot_kernel(OutputRows out, const bf16* dout, long rows, float* drow) {
  const int lane = threadIdx.x & 31;
  for (long r = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) >> 5; r < rows;
       r += (static_cast<long>(gridDim.x) * blockDim.x) >> 5) {
    // attention_row_terms' order: lane l's dims 8 l .. + 7, then 256 + 8 l .. + 7.
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const long off = r * kDim + 256 * k + 8 * lane;
      acc += dot_bf16x8(out.at(r, 256 * k + 8 * lane, kDim), dout + off);
    }
    acc = warp_sum(acc);
    if (lane == 0) drow[r] = acc;
  }
}

}  // namespace

bool comp_grad_keyed_applies(const LayerDims& d) {
  return d.ratio > 1 && d.ratio != 4 && d.head_dim == kDim && d.comp_capacity > 0;
}

int comp_grad_keyed_chunks(const LayerDims& d) {
  const int blocks = std::max(1, key_blocks_of(d));
  const int by_rows = std::max(1, (d.rows + kMinChunkRows - 1) / kMinChunkRows);
  return std::max(1, std::min((kTargetCtas + blocks - 1) / blocks, by_rows));
}

std::size_t comp_grad_keyed_scratch_bytes(const LayerDims& d) {
  const int chunks = comp_grad_keyed_chunks(d);
  return chunks > 1 ? sizeof(float) * static_cast<std::size_t>(chunks) *
                          static_cast<std::size_t>(d.comp_capacity) * kDim
                    : 0;
}

void launch_comp_grad_keyed(const LayerDims& d, const DeviceMetadata& meta, const bf16* q,
                            const bf16* comp, OutputRows out, const float* lse,
                            const bf16* dout, float* drow, float* dcomp_acc, float* scratch,
                            std::size_t scratch_bytes, cudaStream_t stream) {
  require(comp_grad_keyed_applies(d), ErrorKind::Unsupported,
          "the key-stationary compressed-row gradient needs an HCA layer with head_dim 512");
  check_output_rows(d, out);
  if (d.rows <= 0) return;
  const int chunks = comp_grad_keyed_chunks(d);
  const std::size_t needed = comp_grad_keyed_scratch_bytes(d);
  require(scratch_bytes >= needed && (chunks == 1 || scratch != nullptr), ErrorKind::InvalidArgument,
          "the key-stationary compressed-row gradient needs " + std::to_string(needed) +
              " bytes of scratch, got " + std::to_string(scratch_bytes));
  const long head_rows = static_cast<long>(d.rows) * d.heads;
  row_dot_kernel<<<static_cast<unsigned>(std::min<long>((head_rows + 7) / 8, 1l << 20)), 256, 0,
                   stream>>>(out, dout, head_rows, drow);
  CSATTN_CUDA_LAUNCH_CHECK();

  const int key_blocks = key_blocks_of(d);
  const int chunk_rows = (d.rows + chunks - 1) / chunks;
  const int head_blocks = (d.heads + kHeadBlock - 1) / kHeadBlock;
  float* partials = chunks > 1 ? scratch : dcomp_acc;
  // Every chunk's CTAs run (a chunk past the rows writes its zeros): sum_chunks reads them all.
  const long blocks = static_cast<long>(key_blocks) * chunks;
  require(blocks < (1l << 31), ErrorKind::Unsupported, "too many compressed rows for one launch");
  launch_comp_grad_keyed_wgmma_kernel(d, meta, q, comp, lse, drow, dout, partials, blocks, key_blocks,
                                      chunk_rows, head_blocks, stream);
  if (chunks > 1) {
    const long total4 = static_cast<long>(d.comp_capacity) * (kDim / 4);
    sum_chunks_kernel<<<static_cast<unsigned>(std::min<long>((total4 + 255) / 256, 4096)), 256, 0,
                        stream>>>(partials, chunks, static_cast<long>(d.comp_capacity) * kDim,
                                  meta.comp_start, d.segments, dcomp_acc);
    CSATTN_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace csattn::cuda
