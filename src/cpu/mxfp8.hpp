// MXFP8 on the CPU (spec 03 §5.2-§5.5): the E8M0 scale rule, block quantization to E4M3,
// dequantization and the packing of logical scales into the 128x4 layout. Bit-exact: these
// are the reference the CUDA quantizer is compared with bytewise.
#pragma once
#include <cstdint>
#include <span>

namespace csattn::cpu::mxfp8 {

// max |x| over n values in fp32; NaN if any value is NaN (a NaN must not vanish in a max).
float block_amax(const float* x, int n);

// The E8M0 scale byte of a block with this amax (Transformer Engine's float_to_e8m0 applied to
// amax * fp32(1/448)): NaN -> 0xFF, Inf -> 0xFE, 0 -> 0x00; otherwise the fp32 exponent field,
// plus one when the mantissa is non-zero (ceil to a power of two), except at 0xFE (finite
// saturation) and for values <= 2^-127 (which byte 0 already covers).
std::uint8_t e8m0_from_amax(float amax);

// The quantization multiplier 2^(127 - e) (exactly representable for every byte), and 1 for
// e = 0 (TE's exp2f_rcp).
float quant_multiplier(std::uint8_t e);

// Quantizes `rows` rows of `cols` values (cols a multiple of 32). data: rows*cols bytes;
// scales: rows * cols/32 bytes (logical). Threaded over rows.
void quantize_rows(const float* x, std::int64_t rows, int cols, std::uint8_t* data,
                   std::uint8_t* scales);
void quantize_rows_bf16(const std::uint16_t* x, std::int64_t rows, int cols,
                        std::uint8_t* data, std::uint8_t* scales);

// One block of 32: out[i] = E4M3(data[i]) * 2^(scale - 127) in fp32 (scale 0xFF: NaN).
void dequantize_block(const std::uint8_t* data, std::uint8_t scale, float* out);
// `rows` rows of `cols` values with their logical scales [rows, cols/32].
void dequantize_rows(const std::uint8_t* data, const std::uint8_t* scales, std::int64_t rows,
                     int cols, float* out);

// Packing into the 128x4 layout. logical: [rows, groups]; packed: zero-filled first, then
// every logical byte scattered to scale_byte_offset.
//  BSHD: slices of rows_per_slice logical rows; each slice rows_padded * groups_padded bytes.
void pack_scales_bshd(const std::uint8_t* logical, std::int64_t slices,
                      std::int64_t rows_per_slice, int groups, std::int64_t rows_padded,
                      int groups_padded, std::uint8_t* packed);
//  THD: token t of sequence b, sub-row h -> row prefix[b]*rpt + (t - cu[b])*rpt + h.
//  packed_bytes bounds every write (the caller checked prefix.back()*rpt <= its rows).
void pack_scales_thd(const std::uint8_t* logical, std::span<const std::int32_t> cu_seqlens,
                     std::span<const std::int32_t> prefixes, int rows_per_token, int groups,
                     int groups_padded, std::uint8_t* packed, std::int64_t packed_bytes);

}  // namespace csattn::cpu::mxfp8
