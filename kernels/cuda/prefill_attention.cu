// Paged prefill attention: causal attention of a chunk of query tokens per sequence over every
// key of that sequence in the paged cache (earlier chunks, a cached prefix and the chunk
// itself, whose keys rope_kv.cu wrote before this runs). GQA, online softmax in fp32.
//
// Launch: grid = (n_heads, ceil(max_query_len / 16), n_seqs), block = 128 threads = 4 warps,
// dynamic shared memory 2 * 16 * head_dim floats (32 KiB at head_dim 256).
// Block (h, tile, s) handles query head h of the queries [16 * tile, 16 * tile + 16) of
// sequence s (a block past the sequence's queries returns at once; the test is uniform over
// the block, before any barrier). Warp w owns the block's queries 4w .. 4w + 3; lane l holds
// dims l, l + 32, ... of each (head_dim <= 256: at most 8 per lane).
// The block walks the keys the tile needs, [first key of its first query, last query's
// position], in tiles of 16 keys: all 128 threads copy a K and a V tile from the paged cache
// into shared memory (barrier), then each warp scores the tile's keys against its queries
// (a key outside a query's causal / sliding window range is skipped; the test depends only on
// the query and key, so it is uniform over the warp and the warp reductions stay convergent),
// and a barrier at the start of the next tile keeps the copy from overwriting keys in use.
// Every query sees at least its own key, so its softmax sum is > 0 at the end.
// The cache is fp32 or fp16 (kv_dtype); the tiles in shared memory are fp32 either way.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kQueriesPerWarp = 4;
constexpr int kQueryTile = kWarps * kQueriesPerWarp;
constexpr int kKeyTile = 16;
constexpr int kMaxHeadDim = 256;
constexpr int kDimsPerLane = kMaxHeadDim / 32;

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }

template <typename KV>
__global__ void paged_prefill_attention_kernel(TesseraCudaPrefillAttentionArgs a) {
  extern __shared__ float smem[];  // K tile [kKeyTile][head_dim], then V tile, same shape
  const int64_t h = blockIdx.x, tile = blockIdx.y, s = blockIdx.z;
  const int64_t q_len = a.query_len[s];
  const int64_t tile_begin = tile * kQueryTile;
  if (tile_begin >= q_len) return;  // uniform over the block
  const int64_t tile_end = min(q_len, tile_begin + static_cast<int64_t>(kQueryTile));
  const int64_t hd = a.head_dim;
  const int64_t kvh = h / (a.n_heads / a.n_kv_heads);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = a.query_begin[s];  // row of the sequence's first query in q / out
  const int64_t start = a.start_pos[s];   // position of that query
  const int32_t* table = a.block_tables + s * a.max_blocks_per_seq;
  const int64_t window = a.sliding_window;
  // Keys the tile needs: from the first query's first visible key to the last query's position.
  const int64_t key_end = start + tile_end;
  const int64_t key_first = window > 0 ? max(static_cast<int64_t>(0), start + tile_begin - window + 1) : 0;

  float qr[kQueriesPerWarp][kDimsPerLane], acc[kQueriesPerWarp][kDimsPerLane];
  float m[kQueriesPerWarp], l[kQueriesPerWarp];
  int64_t qpos[kQueriesPerWarp];
  bool valid[kQueriesPerWarp];
#pragma unroll
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int64_t qi = tile_begin + warp * kQueriesPerWarp + i;
    valid[i] = qi < tile_end;
    qpos[i] = start + qi;
    m[i] = -INFINITY;
    l[i] = 0.0f;
    const float* q = a.q + ((row0 + qi) * a.n_heads + h) * hd;
#pragma unroll
    for (int j = 0; j < kDimsPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      qr[i][j] = valid[i] && d < hd ? q[d] : 0.0f;
      acc[i][j] = 0.0f;
    }
  }

  float* ks = smem;
  float* vs = smem + kKeyTile * hd;
  for (int64_t kt = key_first; kt < key_end; kt += kKeyTile) {
    const int64_t n_keys = min(static_cast<int64_t>(kKeyTile), key_end - kt);
    __syncthreads();  // every warp is done with the previous tile
    for (int64_t e = threadIdx.x; e < n_keys * hd; e += blockDim.x) {
      const int64_t j = e / hd, d = e % hd, key = kt + j;
      const int64_t block = table[key / a.block_size];
      const int64_t off = ((block * a.block_size + key % a.block_size) * a.n_kv_heads + kvh) * hd + d;
      ks[j * hd + d] = load(static_cast<const KV*>(a.k_cache) + off);
      vs[j * hd + d] = load(static_cast<const KV*>(a.v_cache) + off);
    }
    __syncthreads();  // the tile is in shared memory
#pragma unroll
    for (int i = 0; i < kQueriesPerWarp; ++i) {
      if (!valid[i]) continue;
      const int64_t lo = window > 0 ? qpos[i] - window + 1 : 0;
      for (int64_t j = 0; j < n_keys; ++j) {
        const int64_t key = kt + j;
        if (key > qpos[i] || key < lo) continue;
        float dot = 0.0f;
#pragma unroll
        for (int jj = 0; jj < kDimsPerLane; ++jj) {
          const int64_t d = lane + 32 * jj;
          if (d < hd) dot += qr[i][jj] * ks[j * hd + d];
        }
        const float score = warp_sum(dot) * a.scale;
        const float m_new = fmaxf(m[i], score);
        const float correction = expf(m[i] - m_new);  // first key: m = -inf gives 0
        const float p = expf(score - m_new);
        l[i] = l[i] * correction + p;
#pragma unroll
        for (int jj = 0; jj < kDimsPerLane; ++jj) {
          const int64_t d = lane + 32 * jj;
          acc[i][jj] = acc[i][jj] * correction + (d < hd ? p * vs[j * hd + d] : 0.0f);
        }
        m[i] = m_new;
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    if (!valid[i]) continue;
    const int64_t qi = tile_begin + warp * kQueriesPerWarp + i;
    float* out = a.out + ((row0 + qi) * a.n_heads + h) * hd;
    const float inv_l = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
    for (int j = 0; j < kDimsPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) out[d] = acc[i][j] * inv_l;
    }
  }
}

}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_paged_prefill_attention_f32(const TesseraCudaPrefillAttentionArgs* args, void* stream) {
  using namespace tessera::cuda;
  if (!args) return record_message("tessera_cuda_paged_prefill_attention_f32: null args");
  const TesseraCudaPrefillAttentionArgs& a = *args;
  if (a.head_dim <= 0 || a.head_dim > kMaxHeadDim)
    return record_message("tessera_cuda_paged_prefill_attention_f32: head_dim must be in [1, 256]");
  if (a.n_kv_heads <= 0 || a.n_heads <= 0 || a.n_heads % a.n_kv_heads != 0 || a.n_heads > 0x7fffffff)
    return record_message(
        "tessera_cuda_paged_prefill_attention_f32: n_heads must be a positive multiple of n_kv_heads");
  if (a.block_size <= 0 || a.max_blocks_per_seq <= 0)
    return record_message("tessera_cuda_paged_prefill_attention_f32: block_size and max_blocks_per_seq must be > 0");
  if (a.n_seqs < 0 || a.n_seqs > 65535 || a.max_query_len < 0)
    return record_message("tessera_cuda_paged_prefill_attention_f32: n_seqs must be in [0, 65535]");
  const int64_t tiles = (a.max_query_len + kQueryTile - 1) / kQueryTile;
  if (tiles > 65535)
    return record_message("tessera_cuda_paged_prefill_attention_f32: max_query_len must be < 65535 * 16");
  if (a.kv_dtype != TESSERA_CUDA_F32 && a.kv_dtype != TESSERA_CUDA_F16)
    return record_message(
        "tessera_cuda_paged_prefill_attention_f32: kv_dtype must be TESSERA_CUDA_F32 or TESSERA_CUDA_F16");
  if (a.n_seqs == 0 || tiles == 0) return 0;
  const dim3 grid(static_cast<unsigned>(a.n_heads), static_cast<unsigned>(tiles), static_cast<unsigned>(a.n_seqs));
  const size_t smem = 2 * kKeyTile * static_cast<size_t>(a.head_dim) * sizeof(float);
  if (a.kv_dtype == TESSERA_CUDA_F16)
    paged_prefill_attention_kernel<__half><<<grid, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(a);
  else
    paged_prefill_attention_kernel<float><<<grid, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(a);
  return check_launch("paged_prefill_attention_kernel launch");
}
