// GEMM and f16 expansion straight from GGUF block-quantized weights (Q8_0, Q4_0, Q5_0, Q4_K,
// Q5_K, Q6_K, Q2_K, Q3_K, TQ1_0, TQ2_0 in ggml's byte layouts, specified in
// kernels/cpu/quant.cpp), so the forward pass keeps the file's bytes on the device instead of an
// f16 copy 2-7x their size.
//
// Who reads what (both kernels): a row is cut into pieces of 256 columns: one K-quant
// super-block, or 8 consecutive 32-element blocks (Q8_0 / Q4_0 / Q5_0; the last piece of a row
// may hold fewer). Lane l (0..31) of the warp that handles a piece owns its 8 columns 32i + l,
// i = 0..7 ("slot" i):
//   Q8_0 / Q4_0 / Q5_0: element l of block i of the piece (Q4_0 / Q5_0: nibble byte l % 16,
//                       low nibble for l < 16, high for l >= 16; Q5_0's fifth bit is qh bit l);
//   Q4_K / Q5_K:        element l of sub-block i: byte l of 64-element chunk i / 2 of qs, low
//                       nibble for even i, high for odd; Q5_K's fifth bit is bit i of qh[l];
//                       scale / min from the 12 packed bytes (all lanes decode the same 8 pairs);
//   Q6_K:               element l of group i % 4 of half i / 4: ql byte 64h + 32(g % 2) + l
//                       (low nibble for g < 2), bits 2g, 2g+1 of qh[32h + l], int8 scale
//                       8h + 2g + l / 16;
//   Q2_K / Q3_K / TQ2_0 / TQ1_0 (element e = 32i + l of the super-block): each slot decodes
//                       element e with the expressions of its scalar decoder in quant.cpp
//                       (plane2, q3_k_scale, tq1_trit, copied below with the same names), only
//                       the loops over e are replaced by the lane's 8 slots; the 2-bit plane is
//                       byte 32(i / 4) + l, bits 2(i % 4), 2(i % 4) + 1; the 16-element
//                       sub-block's scale (Q2_K, Q3_K) is 2i + l / 16.
// So consecutive lanes read consecutive bytes of a block (its fp16 scales as broadcasts) and
// consecutive activations in shared memory (no bank conflicts). Every weight is computed in
// fp32 with the operations of dequantize_row, without contraction (__fmul_rn / __fsub_rn), so
// the f16 expansion is bit-identical to f32_to_fp16(dequantize_row(...)).
//
// tessera_cuda_gemm_gguf: grid = (ceil(rows / 8), ceil(n_tokens / kT)) per slab of up to
// 8 * 65535 tokens (one launch per slab), block = 256 threads = 8 warps, kT in {1, 2, 4, 8}
// (the smallest >= the slab's tokens, else 8). Warp w of block (b, g) computes row r = 8b + w
// for tokens [kT g, kT g + kT). The block walks the columns in chunks of 512 (2 pieces): all
// threads stage the chunk of its kT activation rows into shared memory as fp32 (0 outside the
// matrix; barrier), each warp decodes its row's pieces of the chunk, and each lane accumulates
// acc[t] = fma(w, x[t], acc[t]) over its slots in piece order, then slot order; a barrier at
// the top of the next chunk keeps the staging from overwriting values in use. At the end each
// acc[t] is summed over the warp (butterfly: xor 16, 8, 4, 2, 1) and lane 0 writes y. A warp
// whose row is past `rows` still joins every barrier.
//
// tessera_cuda_dequantize_gguf: one thread per (row, piece, lane), grid-stride, 256 threads a
// block; the thread writes its 8 slots to out[r * cols + 256 p + 32 i + l] (consecutive lanes
// write consecutive halves).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "common/block_geometry.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kPiece = 256;                  // columns per piece
constexpr int kPiecesPerChunk = 2;
constexpr int kChunk = kPiece * kPiecesPerChunk;  // columns staged per step
constexpr int64_t kMaxSlabTokens = int64_t{8} * 65535;

using BlockFormat = tessera::blocks::Geometry;

__host__ __device__ constexpr BlockFormat block_format(int type) {
  switch (type) {
    case TESSERA_CUDA_GGUF_Q8_0: return tessera::blocks::kQ8_0;
    case TESSERA_CUDA_GGUF_Q4_0: return tessera::blocks::kQ4_0;
    case TESSERA_CUDA_GGUF_Q5_0: return tessera::blocks::kQ5_0;
    case TESSERA_CUDA_GGUF_Q4_K: return tessera::blocks::kQ4_K;
    case TESSERA_CUDA_GGUF_Q5_K: return tessera::blocks::kQ5_K;
    case TESSERA_CUDA_GGUF_Q6_K: return tessera::blocks::kQ6_K;
    case TESSERA_CUDA_GGUF_Q2_K: return tessera::blocks::kQ2_K;
    case TESSERA_CUDA_GGUF_Q3_K: return tessera::blocks::kQ3_K;
    case TESSERA_CUDA_GGUF_TQ1_0: return tessera::blocks::kTQ1_0;
    case TESSERA_CUDA_GGUF_TQ2_0: return tessera::blocks::kTQ2_0;
    default: return {0, 0};
  }
}

__device__ __forceinline__ float load_half(const uint8_t* p) {  // p 2-byte aligned
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}

__device__ __forceinline__ uint32_t load_u32_unaligned2(const uint8_t* p) {  // p 2-byte aligned
  const auto* h = reinterpret_cast<const unsigned short*>(p);
  return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
}

// 6-bit scale and min of sub-block j of Q4_K / Q5_K (the packing of kernels/cpu/quant.cpp).
__device__ __forceinline__ void unpack_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// ---- the low-bit formats' element decoders: kernels/cpu/quant.cpp's, line for line ----

// Q2_K, Q3_K, TQ2_0: element e (0..255) of the 64-byte 2-bit plane, bits 2s, 2s + 1 of byte
// 32h + l for e = 128h + 32s + l.
__device__ __forceinline__ int plane2(const uint8_t* qs, int e) {
  return (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
}

// The signed 6-bit scale of Q3_K sub-block j (0..15), stored + 32: low 4 bits in the low (j < 8)
// or high (j >= 8) nibble of byte j % 8, top 2 bits at bits 2(j / 4), 2(j / 4) + 1 of byte 8 + j % 4.
__device__ __forceinline__ int q3_k_scale(const uint8_t* s, int j) {
  const int low = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
  const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Digit p (0..4) of a TQ1_0 byte, as trit - 1: the top trit of byte * 3^p (mod 256), (b * 3) >> 8.
__device__ __forceinline__ int tq1_trit(uint8_t byte, int p) {
  const int pow3 = p == 0 ? 1 : p == 1 ? 3 : p == 2 ? 9 : p == 3 ? 27 : 81;
  const auto shifted = static_cast<uint8_t>(byte * pow3);
  return ((shifted * 3) >> 8) - 1;
}

// Element e of a low-bit super-block `blk`, computed with the single fp32 operations of
// dequant_q2_k / dequant_q3_k / dequant_tq1_0 / dequant_tq2_0.
template <int kType>
__device__ __forceinline__ float decode_low_bit(const uint8_t* blk, int e) {
  if constexpr (kType == TESSERA_CUDA_GGUF_Q2_K) {
    const uint8_t* scales = blk;  // sub-block i of 16: scale = low nibble, min = high nibble
    const uint8_t* qs = blk + 16;
    const float d = load_half(blk + 80), dmin = load_half(blk + 82);
    const int i = e / 16;
    const float dl = __fmul_rn(d, static_cast<float>(scales[i] & 0xF));
    const float ml = __fmul_rn(dmin, static_cast<float>(scales[i] >> 4));
    return __fsub_rn(__fmul_rn(dl, static_cast<float>(plane2(qs, e))), ml);
  } else if constexpr (kType == TESSERA_CUDA_GGUF_Q3_K) {
    const uint8_t* hmask = blk;  // bit e / 32 of byte e % 32: the third bit of element e
    const uint8_t* qs = blk + 32;
    const uint8_t* scales = blk + 96;
    const float d = load_half(blk + 108);
    const int i = e / 16;
    const float dl = __fmul_rn(d, static_cast<float>(q3_k_scale(scales, i)));
    const int high = (hmask[e % 32] >> (e / 32)) & 1;  // level = low2 + 4 * high, minus 4
    return __fmul_rn(dl, static_cast<float>(plane2(qs, e) - (high ? 0 : 4)));
  } else if constexpr (kType == TESSERA_CUDA_GGUF_TQ1_0) {
    const uint8_t* qs = blk;
    const uint8_t* qh = blk + 48;
    const float d = load_half(blk + 52);
    // dequant_tq1_0's three loops, inverted: dst[32p + l] from qs[l] (p < 5), dst[160 + 16p + l]
    // from qs[32 + l] (p < 5), dst[240 + 4p + l] from qh[l] (p < 4).
    if (e < 160) return __fmul_rn(d, static_cast<float>(tq1_trit(qs[e % 32], e / 32)));
    if (e < 240) return __fmul_rn(d, static_cast<float>(tq1_trit(qs[32 + (e - 160) % 16], (e - 160) / 16)));
    return __fmul_rn(d, static_cast<float>(tq1_trit(qh[(e - 240) % 4], (e - 240) / 4)));
  } else {  // TQ2_0
    const float d = load_half(blk + 64);
    return __fmul_rn(d, static_cast<float>(plane2(blk, e) - 1));
  }
}

template <int kType>
constexpr bool kLowBit = kType == TESSERA_CUDA_GGUF_Q2_K || kType == TESSERA_CUDA_GGUF_Q3_K ||
                         kType == TESSERA_CUDA_GGUF_TQ1_0 || kType == TESSERA_CUDA_GGUF_TQ2_0;

// v[i] = the weight of column 256 * piece + 32 i + lane of `row`; 0 for blocks past n_blocks
// (the last piece of a 32-element-block row).
template <int kType>
__device__ __forceinline__ void decode_piece(const uint8_t* row, int64_t piece, int64_t n_blocks, int lane,
                                             float (&v)[8]) {
  constexpr BlockFormat f = block_format(kType);
  if constexpr (f.elems == 32) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t b = piece * 8 + i;
      if (b >= n_blocks) {
        v[i] = 0.0f;
        continue;
      }
      const uint8_t* blk = row + b * f.bytes;
      const float d = load_half(blk);
      if constexpr (kType == TESSERA_CUDA_GGUF_Q8_0) {
        v[i] = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(blk[2 + lane])));
      } else if constexpr (kType == TESSERA_CUDA_GGUF_Q4_0) {
        const uint8_t byte = blk[2 + (lane & 15)];
        const int q = lane < 16 ? (byte & 0xF) : (byte >> 4);
        v[i] = __fmul_rn(static_cast<float>(q - 8), d);
      } else {  // Q5_0
        const uint32_t qh = load_u32_unaligned2(blk + 2);
        const uint8_t byte = blk[6 + (lane & 15)];
        const int q = (lane < 16 ? (byte & 0xF) : (byte >> 4)) | static_cast<int>(((qh >> lane) & 1u) << 4);
        v[i] = __fmul_rn(static_cast<float>(q - 16), d);
      }
    }
  } else if constexpr (kLowBit<kType>) {
    const uint8_t* blk = row + piece * f.bytes;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = decode_low_bit<kType>(blk, 32 * i + lane);
  } else if constexpr (kType == TESSERA_CUDA_GGUF_Q6_K) {
    const uint8_t* blk = row + piece * f.bytes;
    const float d = load_half(blk + 208);
    const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int h = i / 4, g = i % 4;
      const uint8_t lb = blk[64 * h + 32 * (g % 2) + lane];
      const uint8_t hb = blk[128 + 32 * h + lane];
      const int q = (((lb >> (g < 2 ? 0 : 4)) & 0xF) | (((hb >> (2 * g)) & 3) << 4)) - 32;
      const float scale = __fmul_rn(d, static_cast<float>(sc[8 * h + 2 * g + lane / 16]));
      v[i] = __fmul_rn(scale, static_cast<float>(q));
    }
  } else {  // Q4_K, Q5_K
    constexpr bool kHighBit = kType == TESSERA_CUDA_GGUF_Q5_K;
    const uint8_t* blk = row + piece * f.bytes;
    const float d = load_half(blk), dmin = load_half(blk + 2);
    const uint8_t* scales = blk + 4;
    const uint8_t* qs = blk + (kHighBit ? 48 : 16);
    const int qh = kHighBit ? blk[16 + lane] : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int sc, m;
      unpack_scale_min(scales, i, &sc, &m);
      const uint8_t byte = qs[32 * (i / 2) + lane];
      int q = (i % 2 == 0) ? (byte & 0xF) : (byte >> 4);
      if (kHighBit) q |= ((qh >> i) & 1) << 4;
      const float ds = __fmul_rn(d, static_cast<float>(sc)), dm = __fmul_rn(dmin, static_cast<float>(m));
      v[i] = __fsub_rn(__fmul_rn(ds, static_cast<float>(q)), dm);
    }
  }
}

// xs[t][c] = x[t0 + t][c0 + c] as fp32, 0 outside the matrix.
template <int kT>
__device__ __forceinline__ void stage_activations(float (*xs)[kChunk], const __half* x, int64_t cols, int64_t t0,
                                                  int64_t n_tokens, int64_t c0) {
  for (int e = threadIdx.x; e < kT * kChunk; e += blockDim.x) {
    const int t = e / kChunk, c = e % kChunk;
    const bool inside = t0 + t < n_tokens && c0 + c < cols;
    xs[t][c] = inside ? __half2float(x[(t0 + t) * cols + c0 + c]) : 0.0f;
  }
}

template <int kType, int kT>
__global__ void __launch_bounds__(kThreads)
    gemm_gguf_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, const __half* __restrict__ x,
                     float* __restrict__ y, int64_t rows, int64_t cols, int64_t n_tokens) {
  __shared__ float xs[kT][kChunk];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kT;
  const bool has_row = r < rows;  // uniform over the warp
  const uint8_t* row = w + (has_row ? r : 0) * row_bytes;
  const int64_t n_blocks = cols / block_format(kType).elems;
  float acc[kT];
#pragma unroll
  for (int t = 0; t < kT; ++t) acc[t] = 0.0f;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    __syncthreads();
    stage_activations<kT>(xs, x, cols, t0, n_tokens, c0);
    __syncthreads();
    if (!has_row) continue;
#pragma unroll
    for (int j = 0; j < kPiecesPerChunk; ++j) {
      if (c0 + kPiece * j >= cols) break;
      float v[8];
      decode_piece<kType>(row, c0 / kPiece + j, n_blocks, lane, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int c = kPiece * j + 32 * i + lane;
#pragma unroll
        for (int t = 0; t < kT; ++t) acc[t] = fmaf(v[i], xs[t][c], acc[t]);
      }
    }
  }
  if (!has_row) return;
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    const float sum = warp_sum(acc[t]);
    if (lane == 0 && t0 + t < n_tokens) y[(t0 + t) * rows + r] = sum;
  }
}

template <int kType>
__global__ void __launch_bounds__(kThreads)
    dequantize_gguf_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, __half* __restrict__ out, int64_t rows,
                           int64_t cols) {
  const int64_t pieces = (cols + kPiece - 1) / kPiece;
  const int64_t n_blocks = cols / block_format(kType).elems;
  const int64_t units = rows * pieces * 32;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < units;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int lane = static_cast<int>(u & 31);
    const int64_t piece = (u >> 5) % pieces, r = (u >> 5) / pieces;
    float v[8];
    decode_piece<kType>(w + r * row_bytes, piece, n_blocks, lane, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t c = piece * kPiece + 32 * i + lane;
      if (c < cols) out[r * cols + c] = __float2half_rn(v[i]);
    }
  }
}

int tokens_per_block(int64_t n_tokens) {
  if (n_tokens <= 1) return 1;
  if (n_tokens <= 2) return 2;
  if (n_tokens <= 4) return 4;
  return 8;
}

template <int kType, int kT>
void launch_gemm(const uint8_t* w, int64_t row_bytes, const __half* x, float* y, int64_t rows, int64_t cols,
                 int64_t n_tokens, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((rows + kWarps - 1) / kWarps),
                  static_cast<unsigned>((n_tokens + kT - 1) / kT));
  gemm_gguf_kernel<kType, kT><<<grid, kThreads, 0, s>>>(w, row_bytes, x, y, rows, cols, n_tokens);
}

template <int kType>
int gemm_gguf(const uint8_t* w, int64_t row_bytes, const __half* x, float* y, int64_t rows, int64_t cols,
              int64_t n_tokens, cudaStream_t s) {
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kMaxSlabTokens) {
    const int64_t n = n_tokens - t0 < kMaxSlabTokens ? n_tokens - t0 : kMaxSlabTokens;
    const __half* xs = x + t0 * cols;
    float* ys = y + t0 * rows;
    switch (tokens_per_block(n)) {
      case 1: launch_gemm<kType, 1>(w, row_bytes, xs, ys, rows, cols, n, s); break;
      case 2: launch_gemm<kType, 2>(w, row_bytes, xs, ys, rows, cols, n, s); break;
      case 4: launch_gemm<kType, 4>(w, row_bytes, xs, ys, rows, cols, n, s); break;
      default: launch_gemm<kType, 8>(w, row_bytes, xs, ys, rows, cols, n, s); break;
    }
    if (int rc = check_launch("gemm_gguf_kernel launch")) return rc;
  }
  return 0;
}

template <int kType>
int dequantize_gguf(const uint8_t* w, int64_t row_bytes, __half* out, int64_t rows, int64_t cols, cudaStream_t s) {
  const int64_t units = rows * ((cols + kPiece - 1) / kPiece) * 32;
  int64_t blocks = (units + kThreads - 1) / kThreads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  dequantize_gguf_kernel<kType><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(w, row_bytes, out, rows, cols);
  return check_launch("dequantize_gguf_kernel launch");
}

thread_local char g_message[256];

// Validates type and sizes; 0 or the recorded -1.
int check_args(const char* op, int type, const void* w, int64_t row_bytes, int64_t rows, int64_t cols) {
  const BlockFormat f = block_format(type);
  if (f.elems == 0) {
    std::snprintf(g_message, sizeof(g_message),
                  "%s: weight type %d is not a supported GGUF block type (Q8_0 = 3, Q4_0 = 4, Q5_0 = 5, Q4_K = 6, "
                  "Q5_K = 7, Q6_K = 8, Q2_K = 9, Q3_K = 10, TQ1_0 = 11, TQ2_0 = 12)",
                  op, type);
    return record_message(g_message);
  }
  if (rows < 0 || cols < 0 || cols % f.elems != 0 || row_bytes < cols / f.elems * f.bytes || row_bytes % 2 != 0 ||
      (reinterpret_cast<uintptr_t>(w) & 1) != 0 || (rows + kWarps - 1) / kWarps > 0x7fffffff) {
    std::snprintf(g_message, sizeof(g_message),
                  "%s: type %d needs rows, cols >= 0, cols a multiple of %d and row_bytes >= %lld (even), w 2-byte "
                  "aligned; got rows %lld, cols %lld, row_bytes %lld",
                  op, type, f.elems, static_cast<long long>(cols / f.elems * f.bytes), static_cast<long long>(rows),
                  static_cast<long long>(cols), static_cast<long long>(row_bytes));
    return record_message(g_message);
  }
  return 0;
}

}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_gemm_gguf(int type, const void* w, int64_t row_bytes, const uint16_t* x, float* y,
                                      int64_t rows, int64_t cols, int64_t n_tokens, void* stream) {
  using namespace tessera::cuda;
  if (int rc = check_args("tessera_cuda_gemm_gguf", type, w, row_bytes, rows, cols)) return rc;
  if (n_tokens < 0) return record_message("tessera_cuda_gemm_gguf: n_tokens must be >= 0");
  if (rows == 0 || n_tokens == 0) return 0;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xh = reinterpret_cast<const __half*>(x);
  auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case TESSERA_CUDA_GGUF_Q8_0: return gemm_gguf<TESSERA_CUDA_GGUF_Q8_0>(wb, row_bytes, xh, y, rows, cols, n_tokens, s);
    case TESSERA_CUDA_GGUF_Q4_0: return gemm_gguf<TESSERA_CUDA_GGUF_Q4_0>(wb, row_bytes, xh, y, rows, cols, n_tokens, s);
    case TESSERA_CUDA_GGUF_Q5_0: return gemm_gguf<TESSERA_CUDA_GGUF_Q5_0>(wb, row_bytes, xh, y, rows, cols, n_tokens, s);
    case TESSERA_CUDA_GGUF_Q4_K: return gemm_gguf<TESSERA_CUDA_GGUF_Q4_K>(wb, row_bytes, xh, y, rows, cols, n_tokens, s);
    case TESSERA_CUDA_GGUF_Q5_K: return gemm_gguf<TESSERA_CUDA_GGUF_Q5_K>(wb, row_bytes, xh, y, rows, cols, n_tokens, s);
    case TESSERA_CUDA_GGUF_Q6_K: return gemm_gguf<TESSERA_CUDA_GGUF_Q6_K>(wb, row_bytes, xh, y, rows, cols, n_tokens, s);
    case TESSERA_CUDA_GGUF_Q2_K: return gemm_gguf<TESSERA_CUDA_GGUF_Q2_K>(wb, row_bytes, xh, y, rows, cols, n_tokens, s);
    case TESSERA_CUDA_GGUF_Q3_K: return gemm_gguf<TESSERA_CUDA_GGUF_Q3_K>(wb, row_bytes, xh, y, rows, cols, n_tokens, s);
    case TESSERA_CUDA_GGUF_TQ1_0: return gemm_gguf<TESSERA_CUDA_GGUF_TQ1_0>(wb, row_bytes, xh, y, rows, cols, n_tokens, s);
    default: return gemm_gguf<TESSERA_CUDA_GGUF_TQ2_0>(wb, row_bytes, xh, y, rows, cols, n_tokens, s);
  }
}

extern "C" int tessera_cuda_dequantize_gguf(int type, const void* w, int64_t row_bytes, uint16_t* out, int64_t rows,
                                            int64_t cols, void* stream) {
  using namespace tessera::cuda;
  if (int rc = check_args("tessera_cuda_dequantize_gguf", type, w, row_bytes, rows, cols)) return rc;
  if (rows == 0 || cols == 0) return 0;
  const auto* wb = static_cast<const uint8_t*>(w);
  auto* oh = reinterpret_cast<__half*>(out);
  auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case TESSERA_CUDA_GGUF_Q8_0: return dequantize_gguf<TESSERA_CUDA_GGUF_Q8_0>(wb, row_bytes, oh, rows, cols, s);
    case TESSERA_CUDA_GGUF_Q4_0: return dequantize_gguf<TESSERA_CUDA_GGUF_Q4_0>(wb, row_bytes, oh, rows, cols, s);
    case TESSERA_CUDA_GGUF_Q5_0: return dequantize_gguf<TESSERA_CUDA_GGUF_Q5_0>(wb, row_bytes, oh, rows, cols, s);
    case TESSERA_CUDA_GGUF_Q4_K: return dequantize_gguf<TESSERA_CUDA_GGUF_Q4_K>(wb, row_bytes, oh, rows, cols, s);
    case TESSERA_CUDA_GGUF_Q5_K: return dequantize_gguf<TESSERA_CUDA_GGUF_Q5_K>(wb, row_bytes, oh, rows, cols, s);
    case TESSERA_CUDA_GGUF_Q6_K: return dequantize_gguf<TESSERA_CUDA_GGUF_Q6_K>(wb, row_bytes, oh, rows, cols, s);
    case TESSERA_CUDA_GGUF_Q2_K: return dequantize_gguf<TESSERA_CUDA_GGUF_Q2_K>(wb, row_bytes, oh, rows, cols, s);
    case TESSERA_CUDA_GGUF_Q3_K: return dequantize_gguf<TESSERA_CUDA_GGUF_Q3_K>(wb, row_bytes, oh, rows, cols, s);
    case TESSERA_CUDA_GGUF_TQ1_0: return dequantize_gguf<TESSERA_CUDA_GGUF_TQ1_0>(wb, row_bytes, oh, rows, cols, s);
    default: return dequantize_gguf<TESSERA_CUDA_GGUF_TQ2_0>(wb, row_bytes, oh, rows, cols, s);
  }
}
