// Device metadata of one unpadded sequence for the kernel benchmarks: `rows` query rows at
// positions first_pos .. first_pos + rows - 1 of a segment of `raw_rows` rows with
// `comp_rows` compressed entries.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/params.hpp"

namespace csattn::bench {

// Bytes of device memory upload_one_sequence_metadata writes.
inline std::size_t one_sequence_metadata_bytes(int rows) {
  return sizeof(std::int32_t) * (4 + 2 * static_cast<std::size_t>(rows)) + static_cast<std::size_t>(rows);
}

// Fills `dev` (one_sequence_metadata_bytes(rows) bytes) as cu_padded = cu_real = [0, raw_rows] |
// comp_start [0, comp_rows] | row_segment (zeros) | row_position | row_is_padding (zero
// bytes) and returns the views into it.
inline cuda::DeviceMetadata upload_one_sequence_metadata(void* dev, int rows, int raw_rows, int comp_rows,
                                                         int first_pos) {
  std::vector<std::int32_t> h(4 + 2 * static_cast<std::size_t>(rows), 0);
  h[1] = raw_rows;
  h[3] = comp_rows;
  for (int t = 0; t < rows; ++t) h[4 + static_cast<std::size_t>(rows) + t] = first_pos + t;
  auto* mb = static_cast<std::int32_t*>(dev);
  CSATTN_CUDA_CHECK(cudaMemcpy(mb, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  CSATTN_CUDA_CHECK(cudaMemset(mb + h.size(), 0, static_cast<std::size_t>(rows)));
  cuda::DeviceMetadata m;
  m.cu_real = mb;
  m.cu_padded = mb;
  m.comp_start = mb + 2;
  m.row_segment = mb + 4;
  m.row_position = mb + 4 + rows;
  m.row_is_padding = reinterpret_cast<std::uint8_t*>(mb + 4 + 2 * rows);
  return m;
}

}  // namespace csattn::bench
