// RoPE (rotate-half layout) on q and k, fused with the write of k and v into the paged cache.
// Launch: grid = n_tokens, block = 128 threads. Per token the block rotates its n_heads * half
// query pairs in place, then (when the token has a valid slot) writes the rotated key pairs
// and the value rows into the cache slot. Cache element (slot, kv_head, i) lives at
// ((slot * n_kv_heads + kv_head) * head_dim + i), slot = block_id * block_size + offset, which
// is [num_blocks][block_size][n_kv_heads][head_dim] (kernels/paged_attention.h), of fp32 or of
// fp16 (the rotated fp32 key and the value rounded to nearest even, as the CPU's kv_write).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ void store(float* p, float x) { *p = x; }
__device__ __forceinline__ void store(__half* p, float x) { *p = __float2half_rn(x); }

template <typename KV>
__global__ void rope_kv_write_kernel(TesseraCudaRopeKvArgs a) {
  const int64_t t = blockIdx.x;
  const int64_t hd = a.head_dim, half = a.head_dim / 2;
  const float pos = static_cast<float>(a.positions[t]);

  // Queries, in place: pair p = (head h, index i) rotates q[h][i] and q[h][i + half].
  float* q = a.q + t * a.n_heads * hd;
  for (int64_t p = threadIdx.x; p < a.n_heads * half; p += blockDim.x) {
    const int64_t h = p / half, i = p % half;
    const float angle = pos * a.inv_freq[i];
    const float c = cosf(angle), s = sinf(angle);
    float* v = q + h * hd;
    const float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * c - x1 * s;
    v[i + half] = x0 * s + x1 * c;
  }

  const int64_t slot = a.slots[t];
  if (slot < 0 || slot >= a.num_blocks * a.block_size) return;
  const int64_t row = a.n_kv_heads * hd;  // elements per token in k, v and per cache slot
  const float* k = a.k + t * row;
  KV* kc = static_cast<KV*>(a.k_cache) + slot * row;
  for (int64_t p = threadIdx.x; p < a.n_kv_heads * half; p += blockDim.x) {
    const int64_t h = p / half, i = p % half;
    const float angle = pos * a.inv_freq[i];
    const float c = cosf(angle), s = sinf(angle);
    const float x0 = k[h * hd + i], x1 = k[h * hd + i + half];
    store(&kc[h * hd + i], x0 * c - x1 * s);
    store(&kc[h * hd + i + half], x0 * s + x1 * c);
  }
  const float* v = a.v + t * row;
  KV* vc = static_cast<KV*>(a.v_cache) + slot * row;
  for (int64_t e = threadIdx.x; e < row; e += blockDim.x) store(&vc[e], v[e]);
}

}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_rope_kv_write_f32(const TesseraCudaRopeKvArgs* args, void* stream) {
  using namespace tessera::cuda;
  if (!args) return record_message("tessera_cuda_rope_kv_write_f32: null args");
  const TesseraCudaRopeKvArgs& a = *args;
  if (a.n_tokens < 0 || a.n_tokens > 0x7fffffff || a.head_dim <= 0 || a.head_dim % 2 != 0 || a.n_heads < 0 ||
      a.n_kv_heads < 0 || a.block_size <= 0 || a.num_blocks < 0)
    return record_message(
        "tessera_cuda_rope_kv_write_f32: need 0 <= n_tokens < 2^31, even head_dim > 0, block_size > 0");
  if (a.kv_dtype != TESSERA_CUDA_F32 && a.kv_dtype != TESSERA_CUDA_F16)
    return record_message("tessera_cuda_rope_kv_write_f32: kv_dtype must be TESSERA_CUDA_F32 or TESSERA_CUDA_F16");
  if (a.n_tokens == 0) return 0;
  const auto grid = static_cast<unsigned>(a.n_tokens);
  if (a.kv_dtype == TESSERA_CUDA_F16)
    rope_kv_write_kernel<__half><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  else
    rope_kv_write_kernel<float><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return check_launch("rope_kv_write_kernel launch");
}
