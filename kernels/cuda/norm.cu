// RMSNorm on the device. One block per row; warp-shuffle reduction of the sum of squares.
// Launch: grid = n rows, block = 256 threads; fp32 in and out.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_api.h"

namespace tessera::cuda {
int record_error(const char* what, cudaError_t err);

namespace {
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                float* __restrict__ y, int64_t dim, float eps) {
  const float* row = x + blockIdx.x * dim;
  float* out = y + blockIdx.x * dim;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += row[i] * row[i];
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  __shared__ float partial[32];
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0.f;
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (threadIdx.x == 0) partial[0] = s;
  }
  __syncthreads();
  const float inv = rsqrtf(partial[0] / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[i] = row[i] * inv * w[i];
}
}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_rms_norm_f32(const float* x, const float* w, float* y, int64_t n,
                                         int64_t dim, float eps, void* stream) {
  if (n <= 0) return 0;
  tessera::cuda::rms_norm_kernel<<<static_cast<unsigned>(n), 256, 0,
                                   static_cast<cudaStream_t>(stream)>>>(x, w, y, dim, eps);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : tessera::cuda::record_error("rms_norm_kernel launch", err);
}
