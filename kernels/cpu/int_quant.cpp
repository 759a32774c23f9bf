// RTN quantizers and reference decoders of the load-time weight formats I8_CH and I4_G128
// (grids in kernels/quant.h, byte layouts in common/dtype.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "kernels/cpu/int_quant.h"
#include "kernels/quant.h"

namespace tessera {
namespace {

int rne(float v) { return static_cast<int>(std::nearbyint(v)); }

}  // namespace

void rtn_int4_group(const float* x, Int4Grid grid, Int4Group* g) {
  float lo = 0.0f, hi = 0.0f, amax = 0.0f;
  for (int64_t i = 0; i < kInt4Group; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  const float d = grid == Int4Grid::kSymmetric ? 2.0f * amax / 15.0f : (hi - lo) / 15.0f;
  g->scale_fp16 = f32_to_fp16(d);
  const float df = fp16_to_f32(g->scale_fp16);
  if (df == 0.0f || !std::isfinite(df)) {
    g->scale_fp16 = 0;
    g->zero = 0;
    std::memset(g->levels, 0, sizeof(g->levels));
    return;
  }
  const int z = grid == Int4Grid::kSymmetric ? 8 : std::clamp(rne(-lo / df), 0, 15);
  g->zero = static_cast<uint8_t>(z);
  for (int64_t i = 0; i < kInt4Group; ++i)
    g->levels[i] = static_cast<uint8_t>(std::clamp(rne(x[i] / df) + z, 0, 15));
}

// The layout's one writer is common/dtype.h's (the AWQ / GPTQ conversion in model/ uses it too).
void pack_int4_group(const Int4Group& g, uint8_t* dst) { write_int4_group(g, dst); }

void unpack_int4_group(const uint8_t* src, Int4Group* g) {
  std::memcpy(&g->scale_fp16, src, 2);
  g->zero = src[2];
  for (int s = 0; s < 4; ++s)
    for (int j = 0; j < 16; ++j) {
      g->levels[32 * s + j] = src[4 + 16 * s + j] & 0xF;
      g->levels[32 * s + 16 + j] = src[4 + 16 * s + j] >> 4;
    }
}

void quantize_row_int4(const float* src, void* dst, int64_t k, Int4Grid grid) {
  TESSERA_CHECK(k % kInt4Group == 0, "I4_G128 row of {} elements: not a multiple of {}", k, kInt4Group);
  auto* d = static_cast<uint8_t*>(dst);
  Int4Group g;
  for (int64_t b = 0; b < k / kInt4Group; ++b) {
    rtn_int4_group(src + b * kInt4Group, grid, &g);
    pack_int4_group(g, d + b * 68);
  }
}

namespace cpu {

void quantize_row_i8_ch(const float* src, uint8_t* dst, int64_t k) {
  float amax = 0.0f;
  for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(src[i]));
  const float s = std::isfinite(amax) ? amax / 127.0f : 0.0f;
  for (int64_t i = 0; i < k; ++i)
    dst[i] = static_cast<uint8_t>(static_cast<int8_t>(s == 0.0f ? 0 : std::clamp(rne(src[i] / s), -127, 127)));
  std::memcpy(dst + k, &s, 4);
}

void dequant_i8_ch(const uint8_t* src, float* dst, int64_t k) {
  float s;
  std::memcpy(&s, src + k, 4);
  for (int64_t i = 0; i < k; ++i) dst[i] = static_cast<float>(static_cast<int8_t>(src[i])) * s;
}

void dequant_i4_g128(const uint8_t* src, float* dst, int64_t k) {
  Int4Group g;
  for (int64_t b = 0; b < k / kInt4Group; ++b) {
    unpack_int4_group(src + b * 68, &g);
    const float d = fp16_to_f32(g.scale_fp16);
    for (int64_t i = 0; i < kInt4Group; ++i)
      dst[b * kInt4Group + i] = static_cast<float>(static_cast<int>(g.levels[i]) - g.zero) * d;
  }
}

}  // namespace cpu
}  // namespace tessera
