// Measurement only (the `reductions` benchmark section): how fast fp32 gradient rows can be
// added into global memory on this GPU, in the attention backward's pattern. The wgmma
// backward spends ~40% of its time adding each 64-key tile's dK (64 random rows x 512 fp32)
// into the key-gradient rows (perf.md); these kernels time that traffic alone, by five
// paths, so a redesign knows which limit it is up against:
//   red_flush_layout - red.global.add.v4.f32 with flush_dk's addresses (a warp instruction
//                      touches 16 rows x 32 bytes), the kernel's path today;
//   red_row_major    - the same reductions with a warp instruction on 4 rows x 128 bytes
//                      (fewer, fuller L2 requests; what flush_dk_lines issues);
//   red_half_lines   - a warp instruction on 8 rows x 64 bytes (what a shuffle transpose
//                      inside each lane quad could give without shared memory);
//   bulk_shared      - cp.reduce.async.bulk ... .add.f32 from shared memory (the TMA unit adds
//                      512-byte row pieces; the threads only issue);
//   store_flush_layout - plain 16-byte stores with flush_dk's addresses (not a reduction: the
//                      write bandwidth of the pattern, for scale);
//   red_row_major_kept - red_row_major with an L2 cache hint: the rows below keep_rows at
//                      priority evict_last, the others evict_normal - whether a fixed set of
//                      rows stays resident under random reductions into more rows than L2
//                      holds (the caller may set a persisting L2 set-aside around it).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace csattn::cuda {

enum class ReductionPath {
  red_flush_layout,
  red_row_major,
  red_half_lines,
  bulk_shared,
  store_flush_layout,
  red_row_major_kept
};
const char* reduction_path_name(ReductionPath path);

// Adds 1.0f to every element of rows row_ids[64 t .. 64 t + 63] of dst ([rows x 512] fp32) for
// t < tiles (plain stores write 1.0f instead). Grid sizes from the device's multiprocessors.
// keep_rows: red_row_major_kept's evict_last rows (the others ignore it).
void launch_reduction_ceiling(ReductionPath path, float* dst, const std::int32_t* row_ids,
                              int tiles, cudaStream_t stream, int keep_rows = 0);

}  // namespace csattn::cuda
