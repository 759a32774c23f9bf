// Embedding lookup and f32 <-> f16 conversions.
// Embedding launch: grid = (n_tokens, ceil(dim / 256)), block = 256; thread (t, i) copies one
// element of row ids[t]. Conversions: 256 threads per block, grid-stride loop.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float load_f32(const T* p, int64_t i);
template <>
__device__ __forceinline__ float load_f32<float>(const float* p, int64_t i) { return p[i]; }
template <>
__device__ __forceinline__ float load_f32<__half>(const __half* p, int64_t i) { return __half2float(p[i]); }

template <typename T>
__device__ __forceinline__ void store_f32(T* p, int64_t i, float v);
template <>
__device__ __forceinline__ void store_f32<float>(float* p, int64_t i, float v) { p[i] = v; }
template <>
__device__ __forceinline__ void store_f32<__half>(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

template <typename TIn, typename TOut>
__global__ void embedding_kernel(const TIn* __restrict__ table, int64_t vocab, int64_t dim,
                                 const int32_t* __restrict__ ids, TOut* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= dim) return;
  const int32_t id = ids[t];
  const float v = (id >= 0 && id < vocab) ? load_f32(table, static_cast<int64_t>(id) * dim + i) : 0.0f;
  store_f32(out, t * dim + i, v);
}

template <typename TIn, typename TOut>
int launch_embedding(const void* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n_tokens,
                     void* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>((dim + kThreads - 1) / kThreads));
  embedding_kernel<TIn, TOut><<<grid, kThreads, 0, stream>>>(static_cast<const TIn*>(table), vocab, dim, ids,
                                                               static_cast<TOut*>(out));
  return check_launch("embedding_kernel launch");
}

__global__ void f32_to_f16_kernel(const float* __restrict__ src, __half* __restrict__ dst, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __float2half_rn(src[i]);
}

__global__ void f16_to_f32_kernel(const __half* __restrict__ src, float* __restrict__ dst, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __half2float(src[i]);
}

unsigned elementwise_blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_embedding(const void* table, int table_dtype, int64_t vocab, int64_t dim,
                                      const int32_t* ids, int64_t n_tokens, void* out, int out_dtype,
                                      void* stream) {
  using namespace tessera::cuda;
  if (n_tokens < 0 || n_tokens > 0x7fffffff || dim <= 0 || vocab <= 0 || (dim + kThreads - 1) / kThreads > 65535)
    return record_message("tessera_cuda_embedding: need 0 <= n_tokens < 2^31, vocab > 0, 0 < dim <= 16776960");
  if (n_tokens == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  if (table_dtype == TESSERA_CUDA_F32 && out_dtype == TESSERA_CUDA_F32)
    return launch_embedding<float, float>(table, vocab, dim, ids, n_tokens, out, s);
  if (table_dtype == TESSERA_CUDA_F32 && out_dtype == TESSERA_CUDA_F16)
    return launch_embedding<float, __half>(table, vocab, dim, ids, n_tokens, out, s);
  if (table_dtype == TESSERA_CUDA_F16 && out_dtype == TESSERA_CUDA_F32)
    return launch_embedding<__half, float>(table, vocab, dim, ids, n_tokens, out, s);
  if (table_dtype == TESSERA_CUDA_F16 && out_dtype == TESSERA_CUDA_F16)
    return launch_embedding<__half, __half>(table, vocab, dim, ids, n_tokens, out, s);
  return record_message("tessera_cuda_embedding: dtypes must be TESSERA_CUDA_F32 or TESSERA_CUDA_F16");
}

extern "C" int tessera_cuda_convert_f32_to_f16(const float* src, uint16_t* dst, int64_t n, void* stream) {
  using namespace tessera::cuda;
  if (n < 0) return record_message("tessera_cuda_convert_f32_to_f16: negative count");
  if (n == 0) return 0;
  f32_to_f16_kernel<<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      src, reinterpret_cast<__half*>(dst), n);
  return check_launch("f32_to_f16_kernel launch");
}

extern "C" int tessera_cuda_convert_f16_to_f32(const uint16_t* src, float* dst, int64_t n, void* stream) {
  using namespace tessera::cuda;
  if (n < 0) return record_message("tessera_cuda_convert_f16_to_f32: negative count");
  if (n == 0) return 0;
  f16_to_f32_kernel<<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const __half*>(src), dst, n);
  return check_launch("f16_to_f32_kernel launch");
}
