// SiLU·mul (SwiGLU's elementwise part) and GELU(tanh)·mul (GeGLU's), fp32. Launch: 256 threads
// per block, grid-stride loop over the n_tokens * dim contiguous elements (rows have stride dim).
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

constexpr int kThreads = 256;

// out may alias gate or up: element i is read and written by the same thread.
__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

// The steps of kernels/activation.h's gelu_tanh_mul, with tanhf (and nvcc's fma contraction):
// equal to the CPU within a few ulp of each factor.
__global__ void gelu_tanh_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = gate[i];
    const float c = x * x * x;
    const float t = tanhf(0.7978845608f * (x + 0.044715f * c));
    out[i] = 0.5f * x * (1.0f + t) * up[i];
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_silu_mul_f32(const float* gate, const float* up, float* out, int64_t n_tokens,
                                         int64_t dim, void* stream) {
  using namespace tessera::cuda;
  if (n_tokens < 0 || dim < 0) return record_message("tessera_cuda_silu_mul_f32: negative size");
  const int64_t n = n_tokens * dim;
  if (n == 0) return 0;
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(gate, up, out, n);
  return check_launch("silu_mul_kernel launch");
}

extern "C" int tessera_cuda_gelu_tanh_mul_f32(const float* gate, const float* up, float* out, int64_t n_tokens,
                                              int64_t dim, void* stream) {
  using namespace tessera::cuda;
  if (n_tokens < 0 || dim < 0) return record_message("tessera_cuda_gelu_tanh_mul_f32: negative size");
  const int64_t n = n_tokens * dim;
  if (n == 0) return 0;
  gelu_tanh_mul_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(gate, up, out, n);
  return check_launch("gelu_tanh_mul_kernel launch");
}
