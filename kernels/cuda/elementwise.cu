// Small element-wise / row ops of the forward pass: residual add, bias add, row gather, the
// reorder of a vocabulary-parallel LM head's gathered logits, scaling by a scalar.
// Launch: 1-D grids of 256-thread blocks with a grid-stride loop (at most 65535 * 4 blocks),
// so any element count works.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(b, 1), 65535 * 4));
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void add_bias_kernel(float* y, const float* __restrict__ bias, int64_t n_tokens, int64_t dim) {
  const int64_t n = n_tokens * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += bias[i % dim];
}

__global__ void gather_rows_kernel(const float* __restrict__ src, const int32_t* __restrict__ rows,
                                   float* __restrict__ dst, int64_t n_rows, int64_t dim) {
  const int64_t n = n_rows * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / dim, c = i % dim;
    dst[i] = src[static_cast<int64_t>(rows[r]) * dim + c];
  }
}

// One thread per output element: column c of row t comes from rank c / per_rank's chunk.
__global__ void unshard_logits_kernel(const float* __restrict__ gathered, int64_t n_rows, int64_t vocab,
                                      int64_t per_rank, float* __restrict__ out) {
  const int64_t n = n_rows * vocab;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / vocab, c = e % vocab;
    const int64_t r = c / per_rank, i = c - r * per_rank;
    const int64_t count = min(vocab, (r + 1) * per_rank) - r * per_rank;
    out[e] = gathered[r * n_rows * per_rank + t * count + i];
  }
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] *= s;
}

}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_add_f32(float* y, const float* x, int64_t n, void* stream) {
  using namespace tessera::cuda;
  if (n < 0) return record_message("tessera_cuda_add_f32: n must be >= 0");
  if (n == 0) return 0;
  add_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(y, x, n);
  return check_launch("add_kernel launch");
}

extern "C" int tessera_cuda_add_bias_f32(float* y, const float* bias, int64_t n_tokens, int64_t dim, void* stream) {
  using namespace tessera::cuda;
  if (n_tokens < 0 || dim <= 0) return record_message("tessera_cuda_add_bias_f32: need n_tokens >= 0, dim > 0");
  if (n_tokens == 0) return 0;
  add_bias_kernel<<<blocks_for(n_tokens * dim), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(y, bias, n_tokens,
                                                                                                  dim);
  return check_launch("add_bias_kernel launch");
}

extern "C" int tessera_cuda_gather_rows_f32(const float* src, const int32_t* rows, float* dst, int64_t n_rows,
                                            int64_t dim, void* stream) {
  using namespace tessera::cuda;
  if (n_rows < 0 || dim <= 0) return record_message("tessera_cuda_gather_rows_f32: need n_rows >= 0, dim > 0");
  if (n_rows == 0) return 0;
  gather_rows_kernel<<<blocks_for(n_rows * dim), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, rows, dst,
                                                                                                   n_rows, dim);
  return check_launch("gather_rows_kernel launch");
}

extern "C" int tessera_cuda_unshard_logits_f32(const float* gathered, int64_t n_rows, int64_t vocab, int64_t per_rank,
                                               int64_t tp, float* out, void* stream) {
  using namespace tessera::cuda;
  // per_rank * tp >= vocab, written so that it cannot overflow.
  if (n_rows < 0 || vocab <= 0 || per_rank <= 0 || tp <= 0 || per_rank < (vocab + tp - 1) / tp)
    return record_message(
        "tessera_cuda_unshard_logits_f32: need n_rows >= 0, vocab > 0, tp > 0 and per_rank > 0 with per_rank * tp >= "
        "vocab");
  if (n_rows == 0) return 0;
  if (!gathered || !out) return record_message("tessera_cuda_unshard_logits_f32: gathered and out must not be null");
  unshard_logits_kernel<<<blocks_for(n_rows * vocab), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      gathered, n_rows, vocab, per_rank, out);
  return check_launch("unshard_logits_kernel launch");
}

extern "C" int tessera_cuda_scale_f32(float* x, float s, int64_t n, void* stream) {
  using namespace tessera::cuda;
  if (n < 0) return record_message("tessera_cuda_scale_f32: n must be >= 0");
  if (n == 0) return 0;
  scale_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, s, n);
  return check_launch("scale_kernel launch");
}
