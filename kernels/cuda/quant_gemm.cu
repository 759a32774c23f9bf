// W8A16 and W4A16 GEMMs for small batches: the weights are dequantized in registers, the
// activations are f16, accumulation is fp32. Correctness first: no tensor cores yet.
//
// Launch (both): grid = (ceil(rows / 8), ceil(n_tokens / kT)), block = 256 threads = 8 warps,
// kT in {1, 2, 4, 8} (the smallest >= n_tokens, else 8). Warp w of block (b, g) computes output
// row r = 8b + w for the tokens [kT g, kT g + kT). The block walks the columns in chunks of
// 256: all threads stage the chunk of its kT activation rows into shared memory as fp32
// (barrier), every warp multiplies its weight row's chunk with them (lanes split the chunk's
// columns, each lane keeps kT partial sums), and a barrier at the top of the next chunk keeps
// the staging from overwriting values in use. At the end each partial sum is reduced over the
// warp and lane 0 writes y. A warp whose row is past `rows` still joins every barrier.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunk = 256;  // columns staged per step
constexpr int kGroup = 128;  // W4A16 group size

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

template <int kT>
__global__ void gemm_w8a16_kernel(const int8_t* __restrict__ w, const float* __restrict__ scales,
                                  const __half* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t cols,
                                  int64_t n_tokens) {
  __shared__ float xs[kT][kChunk];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kT;
  const bool has_row = r < rows;  // uniform over the warp
  const int8_t* wr = w + (has_row ? r : 0) * cols;
  float acc[kT];
#pragma unroll
  for (int t = 0; t < kT; ++t) acc[t] = 0.0f;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    __syncthreads();
    stage_activations<kT>(xs, x, cols, t0, n_tokens, c0);
    __syncthreads();
    if (!has_row) continue;
#pragma unroll
    for (int j = 0; j < kChunk / 32; ++j) {
      const int c = lane + 32 * j;  // consecutive lanes read consecutive bytes
      if (c0 + c >= cols) break;
      const float wv = static_cast<float>(wr[c0 + c]);
#pragma unroll
      for (int t = 0; t < kT; ++t) acc[t] += wv * xs[t][c];
    }
  }
  if (!has_row) return;
  const float scale = scales[r];
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    const float sum = warp_sum(acc[t]);
    if (lane == 0 && t0 + t < n_tokens) y[(t0 + t) * rows + r] = sum * scale;
  }
}

template <int kT>
__global__ void gemm_w4a16_kernel(const uint8_t* __restrict__ w, const __half* __restrict__ scales,
                                  const uint8_t* __restrict__ zeros, const __half* __restrict__ x,
                                  float* __restrict__ y, int64_t rows, int64_t cols, int64_t n_tokens) {
  __shared__ float xs[kT][kChunk];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kT;
  const bool has_row = r < rows;
  const int64_t n_groups = cols / kGroup;
  const int64_t rr = has_row ? r : 0;
  const uint8_t* wr = w + rr * (cols / 2);
  const __half* sr = scales + rr * n_groups;
  const uint8_t* zr = zeros + rr * n_groups;
  float acc[kT];
#pragma unroll
  for (int t = 0; t < kT; ++t) acc[t] = 0.0f;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    __syncthreads();
    stage_activations<kT>(xs, x, cols, t0, n_tokens, c0);
    __syncthreads();
    if (!has_row) continue;
#pragma unroll
    for (int j = 0; j < kChunk / 64; ++j) {
      const int b = lane + 32 * j;  // byte of the chunk: columns c0 + 2b (low nibble), c0 + 2b + 1 (high)
      const int64_t c = c0 + 2 * b;
      if (c >= cols) break;
      const uint8_t packed = wr[c / 2];
      const int64_t g = c / kGroup;
      const float d = __half2float(sr[g]);
      const float z = static_cast<float>(zr[g]);
      const float w0 = (static_cast<float>(packed & 15) - z) * d;
      const float w1 = (static_cast<float>(packed >> 4) - z) * d;
#pragma unroll
      for (int t = 0; t < kT; ++t) acc[t] += w0 * xs[t][2 * b] + w1 * xs[t][2 * b + 1];
    }
  }
  if (!has_row) return;
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    const float sum = warp_sum(acc[t]);
    if (lane == 0 && t0 + t < n_tokens) y[(t0 + t) * rows + r] = sum;
  }
}

// Dequantization to f16 for large batches (then cuBLAS): one thread per output element pair,
// grid-stride loop; element (r, c) -> out[r * cols + c].
__global__ void dequantize_w8_kernel(const int8_t* __restrict__ w, const float* __restrict__ scales,
                                     __half* __restrict__ out, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(static_cast<float>(w[i]) * scales[i / cols]);
}

__global__ void dequantize_w4_kernel(const uint8_t* __restrict__ w, const __half* __restrict__ scales,
                                     const uint8_t* __restrict__ zeros, __half* __restrict__ out, int64_t rows,
                                     int64_t cols) {
  const int64_t n = rows * cols, groups = cols / kGroup;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const uint8_t packed = w[r * (cols / 2) + c / 2];
    const int level = (c & 1) ? (packed >> 4) : (packed & 15);
    const int64_t g = r * groups + c / kGroup;
    out[i] = __float2half_rn((static_cast<float>(level) - static_cast<float>(zeros[g])) * __half2float(scales[g]));
  }
}

unsigned elementwise_blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

int tokens_per_block(int64_t n_tokens) {
  if (n_tokens <= 1) return 1;
  if (n_tokens <= 2) return 2;
  if (n_tokens <= 4) return 4;
  return 8;
}

dim3 gemm_grid(int64_t rows, int64_t n_tokens, int kt) {
  return dim3(static_cast<unsigned>((rows + kWarps - 1) / kWarps), static_cast<unsigned>((n_tokens + kt - 1) / kt));
}

int check_sizes(int64_t rows, int64_t cols, int64_t n_tokens, const char* op) {
  if (rows < 0 || cols < 0 || n_tokens < 0 || (rows + kWarps - 1) / kWarps > 0x7fffffff || n_tokens > 65535)
    return record_message(op);
  return 0;
}

}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_gemm_w8a16(const int8_t* w, const float* scales, const uint16_t* x, float* y,
                                       int64_t rows, int64_t cols, int64_t n_tokens, void* stream) {
  using namespace tessera::cuda;
  if (int rc = check_sizes(rows, cols, n_tokens,
                           "tessera_cuda_gemm_w8a16: need rows, cols >= 0 and 0 <= n_tokens <= 65535"))
    return rc;
  if (rows == 0 || n_tokens == 0) return 0;
  const auto* xh = reinterpret_cast<const __half*>(x);
  auto s = static_cast<cudaStream_t>(stream);
  const int kt = tokens_per_block(n_tokens);
  const dim3 grid = gemm_grid(rows, n_tokens, kt);
  switch (kt) {
    case 1: gemm_w8a16_kernel<1><<<grid, kThreads, 0, s>>>(w, scales, xh, y, rows, cols, n_tokens); break;
    case 2: gemm_w8a16_kernel<2><<<grid, kThreads, 0, s>>>(w, scales, xh, y, rows, cols, n_tokens); break;
    case 4: gemm_w8a16_kernel<4><<<grid, kThreads, 0, s>>>(w, scales, xh, y, rows, cols, n_tokens); break;
    default: gemm_w8a16_kernel<8><<<grid, kThreads, 0, s>>>(w, scales, xh, y, rows, cols, n_tokens); break;
  }
  return check_launch("gemm_w8a16_kernel launch");
}

extern "C" int tessera_cuda_gemm_w4a16(const uint8_t* w, const uint16_t* scales, const uint8_t* zeros,
                                       const uint16_t* x, float* y, int64_t rows, int64_t cols, int64_t n_tokens,
                                       void* stream) {
  using namespace tessera::cuda;
  if (int rc = check_sizes(rows, cols, n_tokens,
                           "tessera_cuda_gemm_w4a16: need rows, cols >= 0 and 0 <= n_tokens <= 65535"))
    return rc;
  if (cols % kGroup != 0) return record_message("tessera_cuda_gemm_w4a16: cols must be a multiple of 128");
  if (rows == 0 || n_tokens == 0) return 0;
  const auto* xh = reinterpret_cast<const __half*>(x);
  const auto* sh = reinterpret_cast<const __half*>(scales);
  auto s = static_cast<cudaStream_t>(stream);
  const int kt = tokens_per_block(n_tokens);
  const dim3 grid = gemm_grid(rows, n_tokens, kt);
  switch (kt) {
    case 1: gemm_w4a16_kernel<1><<<grid, kThreads, 0, s>>>(w, sh, zeros, xh, y, rows, cols, n_tokens); break;
    case 2: gemm_w4a16_kernel<2><<<grid, kThreads, 0, s>>>(w, sh, zeros, xh, y, rows, cols, n_tokens); break;
    case 4: gemm_w4a16_kernel<4><<<grid, kThreads, 0, s>>>(w, sh, zeros, xh, y, rows, cols, n_tokens); break;
    default: gemm_w4a16_kernel<8><<<grid, kThreads, 0, s>>>(w, sh, zeros, xh, y, rows, cols, n_tokens); break;
  }
  return check_launch("gemm_w4a16_kernel launch");
}

extern "C" int tessera_cuda_dequantize_w8a16(const int8_t* w, const float* scales, uint16_t* out, int64_t rows,
                                             int64_t cols, void* stream) {
  using namespace tessera::cuda;
  if (rows < 0 || cols < 0) return record_message("tessera_cuda_dequantize_w8a16: rows and cols must be >= 0");
  if (rows == 0 || cols == 0) return 0;
  dequantize_w8_kernel<<<elementwise_blocks(rows * cols), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      w, scales, reinterpret_cast<__half*>(out), rows, cols);
  return check_launch("dequantize_w8_kernel launch");
}

extern "C" int tessera_cuda_dequantize_w4a16(const uint8_t* w, const uint16_t* scales, const uint8_t* zeros,
                                             uint16_t* out, int64_t rows, int64_t cols, void* stream) {
  using namespace tessera::cuda;
  if (rows < 0 || cols < 0 || cols % kGroup != 0)
    return record_message("tessera_cuda_dequantize_w4a16: need rows >= 0 and cols a multiple of 128");
  if (rows == 0 || cols == 0) return 0;
  dequantize_w4_kernel<<<elementwise_blocks(rows * cols), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      w, reinterpret_cast<const __half*>(scales), zeros, reinterpret_cast<__half*>(out), rows, cols);
  return check_launch("dequantize_w4_kernel launch");
}
