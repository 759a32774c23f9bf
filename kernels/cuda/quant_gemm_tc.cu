// Tensor-core W4A16 and W8A16 GEMMs for batches of tokens (prefill): the packed weights are read
// as they are stored (cuda_api.h), dequantized to f16 in registers and fed straight into
// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (sm_80 and later; nothing Hopper-only), with
// f16 activations and fp32 accumulation. y[t, r] = sum_c W[r, c] x[t, c] is computed as
// D (16 x 8) += A (16 x 16) * B (16 x 8) with A = W (M = weight rows, row-major as stored),
// B = x^T (N = tokens; "col" = x row-major as stored), D[m][n] = y[t0 + n][r0 + m].
//
// Launch: grid = (ceil(rows / 64), ceil(n_tokens / kBN)), block = 128 threads = 4 warps,
// kBN = 8 * kNT tokens per block, kNT in {1, 2, 4, 8} (the smallest with kBN >= n_tokens, else 8).
// Warp w of block (bx, by) owns weight rows [64 bx + 16 w, +16) and tokens [kBN by, +kBN): kNT
// accumulator tiles of 16 x 8. The columns are walked in chunks of 128 (one W4 group):
//   1. each lane loads its raw weight bytes for the chunk (global, before the barrier so the
//      loads overlap the staging);
//   2. barrier; all 128 threads stage the chunk of the kBN activation rows into shared memory xs
//      (16-byte global loads, two 8-byte stores; zeros past n_tokens / cols); barrier;
//   3. eight k-steps of 16 columns: dequantize the A fragment, then per token tile read the B
//      fragment from xs and issue one mma.
// A warp whose rows all lie past `rows` still joins every barrier; rows past `rows` read as 0
// and are not written. W8: the row scale is applied to the fp32 sums at the end (the int8
// levels are exact in f16). W4: w = (level - z) * d is rounded to f16 once (the fp32 product is
// exact), the same value tessera_cuda_dequantize_w4a16 writes.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), lane =
// 4 g + q (g = groupID = lane >> 2, q = threadID_in_group = lane & 3):
//   A (row-major 16 x 16, 4 x f16x2): a0 = A[g][2q, 2q+1]   a1 = A[g+8][2q, 2q+1]
//                                     a2 = A[g][2q+8, 2q+9] a3 = A[g+8][2q+8, 2q+9]
//   B (col-major 16 x 8, 2 x f16x2):  b0 = B[2q, 2q+1][g]   b1 = B[2q+8, 2q+9][g]
//   C/D (16 x 8, 4 x f32):            c0, c1 = D[g][2q, 2q+1]  c2, c3 = D[g+8][2q, 2q+1]
// The sum over k does not care which column of the chunk a k index stands for, as long as A
// and B agree. So k-step s (0..7) of a chunk gives lane q the four *contiguous* chunk columns
// 32q + 4s + {0, 1, 2, 3}: k = 2q, 2q+1 are columns 32q+4s+{0,1} and k = 2q+8, 2q+9 are
// 32q+4s+{2,3}. Over a chunk lane q thus reads one contiguous run of 32 columns of each of
// its two weight rows r0+g and r0+g+8 (W4: one 16-byte load per row, W8: two), and its B
// fragment is one 8-byte shared-memory read.
// Shared memory xs[kBN][136] f16: chunk column c sits at c + 4 (c >= 64); with the row stride
// of 136 halves (68 words) the 8-byte B reads of a half-warp (4 tokens x 4 lanes q) hit 32
// distinct banks.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kWarpRows = 16;                        // M of the mma
constexpr int kBlockRows = kWarpRows * kTcWarps;     // 64
constexpr int kChunkCols = 128;                      // columns per step (= W4 group)
constexpr int kLaneCols = 32;                        // contiguous chunk columns of lane q
constexpr int kKSteps = kChunkCols / 16;             // 8
constexpr int kXsStride = kChunkCols + 8;            // halves per staged token row
constexpr uint32_t kHalf2Bias1024 = 0x64006400u;     // f16x2 {1024, 1024}

__device__ __forceinline__ int xs_offset(int c) { return c + ((c >> 6) << 2); }

__device__ __forceinline__ __half2 as_half2(uint32_t u) {
  __half2 h;
  static_assert(sizeof(h) == sizeof(u));
  memcpy(&h, &u, sizeof(u));
  return h;
}
__device__ __forceinline__ uint32_t as_u32(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, sizeof(u));
  return u;
}

// W4A16 weights: a lane's raw bytes of one row for one chunk are 16 bytes = columns
// c0 + 32q + [0, 32); byte k holds column 2k (low nibble) and 2k + 1 (high nibble).
struct W4Weights {
  const uint8_t* w;
  const __half* scales;
  const uint8_t* zeros;
  int64_t rows, cols;

  struct Raw {
    uint4 v;
  };
  struct Params {
    __half2 zero_biased;  // {1024 + z, 1024 + z}
    __half2 scale;        // {d, d}
  };

  __device__ __forceinline__ Raw load(int64_t r, int64_t c0, int q) const {
    Raw raw{make_uint4(0, 0, 0, 0)};
    if (r < rows) raw.v = *reinterpret_cast<const uint4*>(w + r * (cols / 2) + (c0 + kLaneCols * q) / 2);
    return raw;
  }
  __device__ __forceinline__ Params params(int64_t r, int64_t c0) const {
    if (r >= rows) return Params{as_half2(kHalf2Bias1024), __float2half2_rn(0.0f)};
    const int64_t g = r * (cols / kChunkCols) + c0 / kChunkCols;
    const __half z = __float2half_rn(1024.0f + static_cast<float>(zeros[g]));
    return Params{__halves2half2(z, z), __halves2half2(scales[g], scales[g])};
  }
  // f16x2 of columns 32q + 4s + 2h + {0, 1}: byte 2s + h of the lane's 16.
  __device__ __forceinline__ uint32_t fragment(const Raw& raw, const Params& p, int s, int h) const {
    const uint32_t words[4] = {raw.v.x, raw.v.y, raw.v.z, raw.v.w};
    const uint32_t byte = (words[s >> 1] >> (16 * (s & 1) + 8 * h)) & 0xffu;
    // 1024 + level in each half (exact), minus 1024 + z (exact), times d (one rounding).
    const uint32_t biased = kHalf2Bias1024 | (byte & 0xfu) | ((byte >> 4) << 16);
    return as_u32(__hmul2(__hsub2(as_half2(biased), p.zero_biased), p.scale));
  }
  __device__ __forceinline__ float row_scale(int64_t) const { return 1.0f; }
};

// W8A16 weights: a lane's raw bytes of one row for one chunk are 32 bytes = columns
// c0 + 32q + [0, 32) (zero past cols, which is a multiple of 16); word s = columns 4s..4s+3.
struct W8Weights {
  const int8_t* w;
  const float* scales;
  int64_t rows, cols;

  struct Raw {
    uint4 lo, hi;
  };
  struct Params {};

  __device__ __forceinline__ Raw load(int64_t r, int64_t c0, int q) const {
    Raw raw{make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
    const int64_t c = c0 + kLaneCols * q;
    if (r >= rows) return raw;
    const int8_t* p = w + r * cols + c;
    if (c < cols) raw.lo = *reinterpret_cast<const uint4*>(p);
    if (c + 16 < cols) raw.hi = *reinterpret_cast<const uint4*>(p + 16);
    return raw;
  }
  __device__ __forceinline__ Params params(int64_t, int64_t) const { return {}; }
  // f16x2 of columns 32q + 4s + 2h + {0, 1}: bytes 2h, 2h + 1 of word s; exact.
  __device__ __forceinline__ uint32_t fragment(const Raw& raw, const Params&, int s, int h) const {
    const uint32_t words[8] = {raw.lo.x, raw.lo.y, raw.lo.z, raw.lo.w, raw.hi.x, raw.hi.y, raw.hi.z, raw.hi.w};
    const uint32_t pair = (words[s] >> (16 * h)) ^ 0x8080u;  // two levels + 128, as unsigned bytes
    const uint32_t biased = kHalf2Bias1024 | (pair & 0xffu) | ((pair & 0xff00u) << 8);
    return as_u32(__hsub2(as_half2(biased), __float2half2_rn(1152.0f)));  // (1024 + 128 + v) - 1152
  }
  __device__ __forceinline__ float row_scale(int64_t r) const { return r < rows ? scales[r] : 0.0f; }
};

__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // the launcher refuses devices below sm_80
#endif
}

// xs[t][xs_offset(c)] = x[t0 + t][c0 + c] for c < 128, 0 outside the matrix.
template <int kBN>
__device__ __forceinline__ void stage_chunk(__half (*xs)[kXsStride], const __half* x, int64_t cols, int64_t t0,
                                            int64_t n_tokens, int64_t c0) {
  constexpr int kVectors = kChunkCols / 8;  // 16-byte vectors per token row
  for (int e = threadIdx.x; e < kBN * kVectors; e += kTcThreads) {
    const int t = e / kVectors, c = 8 * (e % kVectors);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (t0 + t < n_tokens && c0 + c < cols) v = *reinterpret_cast<const uint4*>(x + (t0 + t) * cols + c0 + c);
    *reinterpret_cast<uint2*>(&xs[t][xs_offset(c)]) = make_uint2(v.x, v.y);
    *reinterpret_cast<uint2*>(&xs[t][xs_offset(c + 4)]) = make_uint2(v.z, v.w);
  }
}

template <class Weights, int kNT>
__global__ void __launch_bounds__(kTcThreads)
    gemm_tc_kernel(Weights wq, const __half* __restrict__ x, float* __restrict__ y, int64_t n_tokens) {
  constexpr int kBN = 8 * kNT;
  __shared__ __align__(16) __half xs[kBN][kXsStride];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int64_t rows = wq.rows, cols = wq.cols;
  const int64_t warp_row0 = static_cast<int64_t>(blockIdx.x) * kBlockRows + warp * kWarpRows;
  const int64_t row_lo = warp_row0 + g, row_hi = row_lo + 8;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const bool warp_has_rows = warp_row0 < rows;  // uniform over the warp

  float acc[kNT][4];
#pragma unroll
  for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  for (int64_t c0 = 0; c0 < cols; c0 += kChunkCols) {
    typename Weights::Raw raw_lo{}, raw_hi{};
    typename Weights::Params p_lo{}, p_hi{};
    if (warp_has_rows) {
      raw_lo = wq.load(row_lo, c0, q);
      raw_hi = wq.load(row_hi, c0, q);
      p_lo = wq.params(row_lo, c0);
      p_hi = wq.params(row_hi, c0);
    }
    __syncthreads();  // the previous chunk's readers are done with xs
    stage_chunk<kBN>(xs, x, cols, t0, n_tokens, c0);
    __syncthreads();
    if (!warp_has_rows) continue;
#pragma unroll
    for (int s = 0; s < kKSteps; ++s) {
      const uint32_t a[4] = {wq.fragment(raw_lo, p_lo, s, 0), wq.fragment(raw_hi, p_hi, s, 0),
                             wq.fragment(raw_lo, p_lo, s, 1), wq.fragment(raw_hi, p_hi, s, 1)};
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const uint2 b = *reinterpret_cast<const uint2*>(&xs[8 * j + g][xs_offset(kLaneCols * q + 4 * s)]);
        mma_m16n8k16(acc[j], a, b.x, b.y);
      }
    }
  }
  if (!warp_has_rows) return;
  const float scale_lo = wq.row_scale(row_lo), scale_hi = wq.row_scale(row_hi);
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t t = t0 + 8 * j + 2 * q + e;
      if (t >= n_tokens) continue;
      if (row_lo < rows) y[t * rows + row_lo] = acc[j][e] * scale_lo;
      if (row_hi < rows) y[t * rows + row_hi] = acc[j][2 + e] * scale_hi;
    }
}

int token_tiles_per_block(int64_t n_tokens) {
  if (n_tokens <= 8) return 1;
  if (n_tokens <= 16) return 2;
  if (n_tokens <= 32) return 4;
  return 8;
}

// Shared checks of both entry points; 0 when the launch may proceed.
int check_tc_arguments(const void* w, const void* x, int64_t rows, int64_t cols, int64_t n_tokens, int64_t col_multiple,
                       const char* op_message) {
  if (rows < 0 || cols < 0 || n_tokens < 0 || cols % col_multiple != 0 ||
      (rows + kBlockRows - 1) / kBlockRows > 0x7fffffff || (n_tokens + 63) / 64 > 65535)
    return record_message(op_message);
  if (rows == 0 || n_tokens == 0 || cols == 0) return 0;
  if ((reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(x)) % 16 != 0)
    return record_message("tessera_cuda_gemm_w*a16_tc: w and x must be 16-byte aligned");
  int device = 0, major = 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 8) return record_message("tessera_cuda_gemm_w*a16_tc: needs compute capability 8.0 or later");
  return 0;
}

template <class Weights>
int launch_tc(const Weights& wq, const uint16_t* x, float* y, int64_t n_tokens, void* stream, const char* what) {
  const auto* xh = reinterpret_cast<const __half*>(x);
  auto s = static_cast<cudaStream_t>(stream);
  const int nt = token_tiles_per_block(n_tokens);
  const int64_t tokens_per_block = 8 * nt;
  const dim3 grid(static_cast<unsigned>((wq.rows + kBlockRows - 1) / kBlockRows),
                  static_cast<unsigned>((n_tokens + tokens_per_block - 1) / tokens_per_block));
  switch (nt) {
    case 1: gemm_tc_kernel<Weights, 1><<<grid, kTcThreads, 0, s>>>(wq, xh, y, n_tokens); break;
    case 2: gemm_tc_kernel<Weights, 2><<<grid, kTcThreads, 0, s>>>(wq, xh, y, n_tokens); break;
    case 4: gemm_tc_kernel<Weights, 4><<<grid, kTcThreads, 0, s>>>(wq, xh, y, n_tokens); break;
    default: gemm_tc_kernel<Weights, 8><<<grid, kTcThreads, 0, s>>>(wq, xh, y, n_tokens); break;
  }
  return check_launch(what);
}

}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_gemm_w8a16_tc(const int8_t* w, const float* scales, const uint16_t* x, float* y,
                                          int64_t rows, int64_t cols, int64_t n_tokens, void* stream) {
  using namespace tessera::cuda;
  if (int rc = check_tc_arguments(w, x, rows, cols, n_tokens, 16,
                                  "tessera_cuda_gemm_w8a16_tc: need rows >= 0, cols >= 0 a multiple of 16 and "
                                  "0 <= n_tokens <= 64 * 65535"))
    return rc;
  if (rows == 0 || n_tokens == 0) return 0;
  return launch_tc(W8Weights{w, scales, rows, cols}, x, y, n_tokens, stream, "gemm_w8a16_tc kernel launch");
}

extern "C" int tessera_cuda_gemm_w4a16_tc(const uint8_t* w, const uint16_t* scales, const uint8_t* zeros,
                                          const uint16_t* x, float* y, int64_t rows, int64_t cols, int64_t n_tokens,
                                          void* stream) {
  using namespace tessera::cuda;
  if (int rc = check_tc_arguments(w, x, rows, cols, n_tokens, kChunkCols,
                                  "tessera_cuda_gemm_w4a16_tc: need rows >= 0, cols >= 0 a multiple of 128 and "
                                  "0 <= n_tokens <= 64 * 65535"))
    return rc;
  if (rows == 0 || n_tokens == 0) return 0;
  return launch_tc(W4Weights{w, reinterpret_cast<const __half*>(scales), zeros, rows, cols}, x, y, n_tokens, stream,
                   "gemm_w4a16_tc kernel launch");
}
