// RMSNorm and fused residual-add + RMSNorm on the device, fp32.
// Launch: grid = n rows, block = 256 threads; each thread strides over the row's dim elements,
// the sum of squares is reduced over the block (block_reduce.cuh).
#include <cuda_runtime.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

constexpr int kNormThreads = 256;

// x and y may alias (each element is read before it is written, by the same thread).
__global__ void rms_norm_kernel(const float* x, const float* __restrict__ w, float* y, int64_t dim, float eps) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += x[base + i] * x[base + i];
  const float inv = rsqrtf(block_sum(sum) / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) y[base + i] = x[base + i] * inv * w[i];
}

// residual += delta, then y = rms_norm(residual) * w. Element i is handled by the same thread
// in both passes, so y may alias delta (not residual).
__global__ void add_rms_norm_kernel(float* residual, const float* delta, const float* __restrict__ w, float* y,
                                    int64_t dim, float eps) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float r = residual[base + i] + delta[base + i];
    residual[base + i] = r;
    sum += r * r;
  }
  const float inv = rsqrtf(block_sum(sum) / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) y[base + i] = residual[base + i] * inv * w[i];
}

int check_rows(int64_t n, int64_t dim, const char* op) {
  if (n < 0 || dim <= 0 || n > 0x7fffffff) return record_message(op);
  return 0;
}

}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_rms_norm_f32(const float* x, const float* w, float* y, int64_t n, int64_t dim,
                                         float eps, void* stream) {
  using namespace tessera::cuda;
  if (int rc = check_rows(n, dim, "tessera_cuda_rms_norm_f32: need 0 <= n < 2^31 and dim > 0")) return rc;
  if (n == 0) return 0;
  rms_norm_kernel<<<static_cast<unsigned>(n), kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, w, y, dim,
                                                                                                     eps);
  return check_launch("rms_norm_kernel launch");
}

extern "C" int tessera_cuda_add_rms_norm_f32(float* residual, const float* delta, const float* w, float* y,
                                             int64_t n, int64_t dim, float eps, void* stream) {
  using namespace tessera::cuda;
  if (int rc = check_rows(n, dim, "tessera_cuda_add_rms_norm_f32: need 0 <= n < 2^31 and dim > 0")) return rc;
  if (n == 0) return 0;
  add_rms_norm_kernel<<<static_cast<unsigned>(n), kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      residual, delta, w, y, dim, eps);
  return check_launch("add_rms_norm_kernel launch");
}
