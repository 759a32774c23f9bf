// Software prefetch of a matmul's weight bytes, shared by the AVX2 and AVX-512 kernels
// (qgemm_avx2.cpp, qgemm_avx512.cpp). A kernel ticks once per weight block; each tick touches
// `step` more bytes of the stream, `left` in all.
//   Row-stream matrices: the next row group's bytes, non-temporal (each weight byte is used
//     once per matmul; keep it out of the outer caches).
//   R16 matrices (qgemm.h): one contiguous stream, prefetched into L1 kernel_tuning() bytes in
//     front of the read position where the CPU needs it (kernels/cpu/cpu_info.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace tessera::cpu {

struct WeightPrefetch {
  const uint8_t* p = nullptr;
  size_t left = 0;
  size_t step = 0;     // bytes per block
  bool to_l1 = false;  // T0 (ahead in an R16 stream) rather than NTA (the next row group)

  inline __attribute__((always_inline)) void tick() {
#if defined(__x86_64__)
    const size_t n = std::min(left, step);
    if (to_l1) {
      for (size_t i = 0; i < n; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
    } else {
      for (size_t i = 0; i < n; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_NTA);
    }
    p += n;
    left -= n;
#endif
  }

  // The R16 stream of the group starting at row g0 of a slice whose rows [.., r1) are read
  // (w: its row 0): `ahead` bytes in front, one group's bytes over nb blocks; nothing when
  // ahead is 0 or the range ends before the prefetch would start.
  static WeightPrefetch r16_stream(const uint8_t* w, int64_t g0, int64_t r1, size_t row_bytes, int64_t group_rows,
                                   int64_t nb, size_t ahead) {
    WeightPrefetch pf;
    const size_t group_bytes = static_cast<size_t>(group_rows) * row_bytes;
    pf.step = (group_bytes / static_cast<size_t>(nb) + 63) / 64 * 64;
    const size_t at = static_cast<size_t>(g0) * row_bytes + ahead, end = static_cast<size_t>(r1) * row_bytes;
    if (ahead == 0 || at >= end) return pf;
    pf.p = w + at;
    pf.left = std::min(end - at, group_bytes);
    pf.to_l1 = true;
    return pf;
  }
};

}  // namespace tessera::cpu
