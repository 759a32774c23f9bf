// Internal: reference codecs of I8_CH and I4_G128 rows (used by quant.cpp's dispatch).
#pragma once

#include <cstdint>

namespace tessera::cpu {

// k int8 levels then the fp32 scale (row_bytes(kI8_CH, k) bytes).
void quantize_row_i8_ch(const float* src, uint8_t* dst, int64_t k);
void dequant_i8_ch(const uint8_t* src, float* dst, int64_t k);
void dequant_i4_g128(const uint8_t* src, float* dst, int64_t k);

}  // namespace tessera::cpu
