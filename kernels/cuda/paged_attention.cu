// Paged decode attention: one query token per sequence, GQA, online softmax in fp32.
//
// Launch: grid = (n_heads, n_seqs), block = 128 threads = 4 warps. Block (h, s) computes query
// head h of sequence s over the keys [first, n_keys) of its sequence. Warp w visits keys
// first + w, first + w + 4, ...; lane l holds dims l, l + 32, ... (head_dim <= 256, so at most
// 8 per lane). Each warp keeps its own running max m, sum l and weighted value sum acc; at the
// end the 4 states are merged through shared memory:
//   M = max_w m_w,  L = sum_w l_w e^(m_w - M),  out = sum_w acc_w e^(m_w - M) / L.
// A warp that saw no key has m = -inf, l = 0, acc = 0 and contributes nothing.
// Split over the sequence (args.n_splits > 1): grid (n_heads, n_seqs, n_splits), block
// (h, s, p) covers keys [first + p * split_keys, min(n_keys, first + (p + 1) * split_keys)) the
// same way and writes its merged state (acc unnormalized, M, L) to args.partial; then
// decode_combine_kernel, grid (n_heads, n_seqs), 128 threads, merges the pieces with the same
// formula.
// The cache is fp32 or fp16 (kv_dtype); fp16 elements are widened as they are read.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxHeadDim = 256;
constexpr int kDimsPerLane = kMaxHeadDim / 32;

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }

template <typename KV>
__global__ void paged_decode_attention_kernel(TesseraCudaDecodeAttentionArgs a) {
  const int64_t h = blockIdx.x, s = blockIdx.y, piece = blockIdx.z;
  const bool split = a.n_splits > 1;
  const int64_t hd = a.head_dim;
  const int64_t group = a.n_heads / a.n_kv_heads;
  const int64_t kvh = h / group;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n_keys = a.seq_lens[s];
  float* out = a.out + (s * a.n_heads + h) * hd;
  float* part = split ? a.partial + ((s * a.n_heads + h) * a.n_splits + piece) * (hd + 2) : nullptr;
  if (n_keys <= 0) {  // precondition violated: write zeros rather than garbage
    if (split) {
      for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) part[d] = 0.0f;
      if (threadIdx.x == 0) {
        part[hd] = -INFINITY;
        part[hd + 1] = 0.0f;
      }
    } else {
      for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) out[d] = 0.0f;
    }
    return;
  }
  int64_t first = a.sliding_window > 0 && n_keys > a.sliding_window ? n_keys - a.sliding_window : 0;
  int64_t end = n_keys;
  if (split) {
    first += piece * a.split_keys;
    end = min(end, first + a.split_keys);
  }
  const float* q = a.q + (s * a.n_heads + h) * hd;
  const int32_t* table = a.block_tables + s * a.max_blocks_per_seq;

  float qr[kDimsPerLane], acc[kDimsPerLane];
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    qr[j] = d < hd ? q[d] : 0.0f;
    acc[j] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t key = first + warp; key < end; key += kWarps) {
    const int64_t block = table[key / a.block_size];
    const int64_t offset = ((block * a.block_size + key % a.block_size) * a.n_kv_heads + kvh) * hd;
    const KV* k = static_cast<const KV*>(a.k_cache) + offset;
    const KV* v = static_cast<const KV*>(a.v_cache) + offset;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kDimsPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) dot += qr[j] * load(&k[d]);
    }
    const float score = warp_sum(dot) * a.scale;
    const float m_new = fmaxf(m, score);
    const float correction = expf(m - m_new);  // m = -inf on the first key: 0
    const float p = expf(score - m_new);
    l = l * correction + p;
#pragma unroll
    for (int j = 0; j < kDimsPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      acc[j] = acc[j] * correction + (d < hd ? p * load(&v[d]) : 0.0f);
    }
    m = m_new;
  }

  __shared__ float warp_m[kWarps], warp_l[kWarps];
  __shared__ float warp_acc[kWarps][kMaxHeadDim];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) warp_acc[warp][lane + 32 * j] = acc[j];
  __syncthreads();

  float big_m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) big_m = fmaxf(big_m, warp_m[w]);
  float weight[kWarps];
  float big_l = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = warp_l[w] > 0.0f ? expf(warp_m[w] - big_m) : 0.0f;
    big_l += warp_l[w] * weight[w];
  }
  if (split) {  // this piece's state; an empty piece writes M = -inf, L = 0, acc = 0
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
      float o = 0.0f;
      for (int w = 0; w < kWarps; ++w) o += warp_acc[w][d] * weight[w];
      part[d] = o;
    }
    if (threadIdx.x == 0) {
      part[hd] = big_m;
      part[hd + 1] = big_l;
    }
    return;
  }
  const float inv_l = 1.0f / big_l;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o += warp_acc[w][d] * weight[w];
    out[d] = o * inv_l;
  }
}

__global__ void decode_combine_kernel(TesseraCudaDecodeAttentionArgs a) {
  const int64_t h = blockIdx.x, s = blockIdx.y;
  const int64_t hd = a.head_dim, stride = hd + 2;
  const float* part = a.partial + (s * a.n_heads + h) * a.n_splits * stride;
  float* out = a.out + (s * a.n_heads + h) * hd;
  float big_m = -INFINITY;
  for (int64_t p = 0; p < a.n_splits; ++p)
    if (part[p * stride + hd + 1] > 0.0f) big_m = fmaxf(big_m, part[p * stride + hd]);
  float big_l = 0.0f;
  for (int64_t p = 0; p < a.n_splits; ++p) {
    const float l = part[p * stride + hd + 1];
    if (l > 0.0f) big_l += l * expf(part[p * stride + hd] - big_m);
  }
  const float inv_l = big_l > 0.0f ? 1.0f / big_l : 0.0f;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int64_t p = 0; p < a.n_splits; ++p) {
      const float l = part[p * stride + hd + 1];
      if (l > 0.0f) o += part[p * stride + d] * expf(part[p * stride + hd] - big_m);
    }
    out[d] = o * inv_l;
  }
}

}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_paged_decode_attention_f32(const TesseraCudaDecodeAttentionArgs* args, void* stream) {
  using namespace tessera::cuda;
  if (!args) return record_message("tessera_cuda_paged_decode_attention_f32: null args");
  const TesseraCudaDecodeAttentionArgs& a = *args;
  if (a.head_dim <= 0 || a.head_dim > kMaxHeadDim)
    return record_message("tessera_cuda_paged_decode_attention_f32: head_dim must be in [1, 256]");
  if (a.n_kv_heads <= 0 || a.n_heads <= 0 || a.n_heads % a.n_kv_heads != 0 || a.n_heads > 0x7fffffff)
    return record_message("tessera_cuda_paged_decode_attention_f32: n_heads must be a positive multiple of n_kv_heads");
  if (a.block_size <= 0 || a.max_blocks_per_seq <= 0)
    return record_message("tessera_cuda_paged_decode_attention_f32: block_size and max_blocks_per_seq must be > 0");
  if (a.n_seqs < 0 || a.n_seqs > 65535)
    return record_message("tessera_cuda_paged_decode_attention_f32: n_seqs must be in [0, 65535]");
  const bool split = a.n_splits > 1;
  if (split && (a.n_splits > 65535 || a.split_keys <= 0 || !a.partial))
    return record_message(
        "tessera_cuda_paged_decode_attention_f32: a split needs n_splits <= 65535, split_keys > 0 and partial");
  if (a.kv_dtype != TESSERA_CUDA_F32 && a.kv_dtype != TESSERA_CUDA_F16)
    return record_message(
        "tessera_cuda_paged_decode_attention_f32: kv_dtype must be TESSERA_CUDA_F32 or TESSERA_CUDA_F16");
  if (a.n_seqs == 0) return 0;
  const dim3 grid(static_cast<unsigned>(a.n_heads), static_cast<unsigned>(a.n_seqs),
                  split ? static_cast<unsigned>(a.n_splits) : 1u);
  if (a.kv_dtype == TESSERA_CUDA_F16)
    paged_decode_attention_kernel<__half><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  else
    paged_decode_attention_kernel<float><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  if (int rc = check_launch("paged_decode_attention_kernel launch"); rc != 0 || !split) return rc;
  const dim3 combine_grid(static_cast<unsigned>(a.n_heads), static_cast<unsigned>(a.n_seqs));
  decode_combine_kernel<<<combine_grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return check_launch("decode_combine_kernel launch");
}
