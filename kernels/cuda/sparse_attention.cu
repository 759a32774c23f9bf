// Quest sparse decode attention on the device (kernels/sparse_attention.h; entry points
// documented in cuda_api.h): key summaries, block scores and the compacted block tables that
// the paged decode / prefill attention kernels then read unchanged.
//
//  * kv_summary_kernel: grid n_tokens, 128 threads. The block's summaries have the layout of one
//    slot's key row ([n_kv_heads][head_dim]); thread e folds elements e, e + 128, ... of slots
//    0 .. last over the block (min / max are exact, so the result is the CPU's bit for bit).
//  * block_scores_kernel: grid (min(max_blocks_per_seq, 512), n_seqs), 128 threads = 16 groups
//    of 8 lanes; block x scores competing blocks sink + x, sink + x + gridDim.x, ...; lane j of a
//    group sums the terms of dims d = j, j + 8, ... of one head in increasing d (the canonical
//    lanes), the group combines them with three xor shuffles, which compute
//    ((0+4)+(2+6))+((1+5)+(3+7)) on lane 0 (IEEE addition commutes), products and sums as
//    __fmul_rn / __fadd_rn so nothing contracts into an FMA.
//  * select_kernel: one block of 256 threads per sequence: radix select of the top_blocks-th
//    largest score key (4 passes of 8 bits over a shared histogram), then in index order the
//    blocks above it and the lowest-index ones equal to it, placed with block-wide prefix sums.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

constexpr int kSummaryThreads = 128;
constexpr int kScoreThreads = 128;
constexpr int kLanes = 8;  // the canonical arithmetic's lanes (kernels/sparse_attention.h)
constexpr int kScoreGroups = kScoreThreads / kLanes;
constexpr int64_t kScoreGridX = 512;  // blocks per sequence in the grid; each strides over the competing blocks
constexpr int kSelectThreads = 256;
constexpr int kSelectWarps = kSelectThreads / 32;

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }

template <typename KV>
__global__ void kv_summary_kernel(TesseraCudaKvSummaryArgs a) {
  const int64_t t = blockIdx.x;
  const int64_t slot = a.slots[t];
  const int64_t capacity = a.num_blocks * a.block_size;
  if (slot < 0 || slot >= capacity) return;
  const int64_t block = slot / a.block_size;
  if (t + 1 < a.n_tokens) {  // a later token of this step writes the same block: it summarizes it
    const int64_t next = a.slots[t + 1];
    if (next >= 0 && next < capacity && next / a.block_size == block) return;
  }
  const int64_t last = slot % a.block_size;
  const int64_t row = a.n_kv_heads * a.head_dim;
  const KV* keys = static_cast<const KV*>(a.k_cache) + block * a.block_size * row;
  for (int64_t e = threadIdx.x; e < row; e += blockDim.x) {
    float lo = load(&keys[e]), hi = lo;
    for (int64_t s = 1; s <= last; ++s) {
      const float k = load(&keys[s * row + e]);
      lo = k < lo ? k : lo;  // std::min(lo, k) / std::max(hi, k), as the CPU folds
      hi = hi < k ? k : hi;
    }
    a.kmin[block * row + e] = lo;
    a.kmax[block * row + e] = hi;
  }
}

// The competing logical blocks [*lo, *hi) of sequence s; false when s is not sparse.
__device__ __forceinline__ bool sparse_range(const TesseraCudaSparseArgs& a, int64_t s, int64_t* lo, int64_t* hi) {
  const int64_t n = a.seq_lens[s];
  if (a.query_len[s] != 1 || n < a.threshold_tokens || n < 1) return false;
  const int64_t n_blocks = (n - 1) / a.block_size + 1;
  if (n_blocks <= a.sink_blocks + a.recent_blocks + a.top_blocks) return false;
  *lo = a.sink_blocks;
  *hi = n_blocks - a.recent_blocks;
  return true;
}

// The score of competing block b of sequence s into scores[s, b]; every thread of the block calls it.
__device__ void score_block(const TesseraCudaSparseArgs& a, int64_t s, int64_t b) {
  const int64_t block = a.block_tables[s * a.max_blocks_per_seq + b];
  float* out = a.scores + s * a.max_blocks_per_seq + b;
  if (block < 0 || block >= a.num_blocks) {  // the host validates tables; never read outside
    if (threadIdx.x == 0) *out = -INFINITY;
    return;
  }
  const int64_t hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  const int g = threadIdx.x / kLanes, j = threadIdx.x % kLanes;
  const float* q_row = a.q + static_cast<int64_t>(a.query_begin[s]) * a.n_heads * hd;
  float best = -INFINITY;
  // Warp-uniform trip count (h0), so every lane takes part in the shuffles.
  for (int64_t h0 = 0; h0 < a.n_heads; h0 += kScoreGroups) {
    const int64_t h = h0 + g;
    float l = 0.0f;
    if (h < a.n_heads) {
      const float* q = q_row + h * hd;
      const int64_t off = (block * a.n_kv_heads + h / group) * hd;
      const float* kmin = a.kmin + off;
      const float* kmax = a.kmax + off;
      for (int64_t d = j; d < hd; d += kLanes) {
        const float x = __fmul_rn(q[d], kmin[d]), y = __fmul_rn(q[d], kmax[d]);
        l = __fadd_rn(l, x < y ? y : x);  // std::max(x, y)
      }
    }
    l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 4));
    l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 2));
    l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 1));
    if (h < a.n_heads && l > best) best = l;  // a NaN bound never wins
  }
  __shared__ float group_best[kScoreGroups];
  if (j == 0) group_best[g] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int i = 0; i < kScoreGroups; ++i)
      if (group_best[i] > m) m = group_best[i];
    *out = m;
  }
}

__global__ void block_scores_kernel(TesseraCudaSparseArgs a) {
  const int64_t s = blockIdx.y;
  int64_t lo = 0, hi = 0;
  if (!sparse_range(a, s, &lo, &hi)) return;  // uniform over the block
  for (int64_t b = lo + blockIdx.x; b < hi; b += gridDim.x) {
    score_block(a, s, b);
    __syncthreads();  // group_best is reused by the next block
  }
}

// Order-preserving key of a score: larger score, larger key; -0 and +0 tie (the CPU compares
// with ==). Scores are never NaN (a NaN bound counts as -inf).
__device__ __forceinline__ uint32_t score_key(float x) {
  const uint32_t u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of v over the block (blockDim.x == kSelectThreads), *total = the sum.
// Every thread must call it.
__device__ int block_exclusive_scan(int v, int* total) {
  __shared__ int warp_sums[kSelectWarps];
  __shared__ int warp_offsets[kSelectWarps + 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int w = 0; w < kSelectWarps; ++w) {
      warp_offsets[w] = run;
      run += warp_sums[w];
    }
    warp_offsets[kSelectWarps] = run;
  }
  __syncthreads();
  const int result = warp_offsets[warp] + x - v;
  *total = warp_offsets[kSelectWarps];
  __syncthreads();  // the shared arrays may be rewritten by the next call
  return result;
}

__global__ void select_kernel(TesseraCudaSparseArgs a) {
  const int64_t s = blockIdx.x;
  const int64_t stride = a.max_blocks_per_seq;
  const int32_t* table = a.block_tables + s * stride;
  int32_t* out = a.compact_tables + s * stride;
  const int64_t n = a.seq_lens[s];
  int64_t lo = 0, hi = 0;
  if (!sparse_range(a, s, &lo, &hi)) {  // dense: the step's table as it is
    for (int64_t i = threadIdx.x; i < stride; i += blockDim.x) out[i] = table[i];
    if (threadIdx.x == 0) {
      a.compact_seq_lens[s] = static_cast<int32_t>(n);
      a.compact_start_pos[s] = static_cast<int32_t>(n - a.query_len[s]);
    }
    return;
  }
  float* scores = a.scores + s * stride;
  if (a.n_ranks > 1) {  // every rank's heads: the element-wise max (bit-exact, order-free)
    const int64_t rank_stride = a.n_seqs * stride;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      float m = a.gathered_scores[s * stride + i];
      for (int64_t r = 1; r < a.n_ranks; ++r) {
        const float v = a.gathered_scores[r * rank_stride + s * stride + i];
        m = v > m ? v : m;
      }
      scores[i] = m;
    }
    __syncthreads();
  }

  if (a.top_blocks > 0) {  // uniform over the block
    // Radix select: the key of the top_blocks-th best competing block (top_blocks < hi - lo,
    // since the sequence is sparse) and how many of the blocks with that key are taken.
    __shared__ int hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_remaining;
    uint32_t prefix = 0, mask = 0;
    int remaining = static_cast<int>(a.top_blocks);
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const uint32_t key = score_key(scores[i]);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
      }
      __syncthreads();
      if (threadIdx.x == 0) {  // the digit where the running count from the top reaches `remaining`
        int above = 0, digit = 255;
        for (; digit > 0; --digit) {
          if (above + hist[digit] >= remaining) break;
          above += hist[digit];
        }
        s_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
        s_remaining = remaining - above;  // >= 1
      }
      __syncthreads();
      prefix = s_prefix;
      remaining = s_remaining;
      mask |= 255u << shift;
    }
    // In index order: the blocks above the kth key and the first `remaining` equal to it.
    const uint32_t kth = prefix;
    int base_eq = 0, base_sel = 0;
    for (int64_t c0 = lo; c0 < hi; c0 += blockDim.x) {
      const int64_t i = c0 + threadIdx.x;
      const uint32_t key = i < hi ? score_key(scores[i]) : 0u;
      const bool gt = i < hi && key > kth, eq = i < hi && key == kth;
      int eq_total = 0, sel_total = 0;
      const int eq_rank = base_eq + block_exclusive_scan(eq ? 1 : 0, &eq_total);
      const bool sel = gt || (eq && eq_rank < remaining);
      const int pos = base_sel + block_exclusive_scan(sel ? 1 : 0, &sel_total);
      if (sel) out[lo + pos] = table[i];
      base_eq += eq_total;
      base_sel += sel_total;
    }
  }
  const int64_t top = a.top_blocks, recent = a.recent_blocks;
  const int64_t selected = lo + top + recent;
  for (int64_t i = threadIdx.x; i < lo; i += blockDim.x) out[i] = table[i];
  for (int64_t i = threadIdx.x; i < recent; i += blockDim.x) out[lo + top + i] = table[hi + i];
  for (int64_t i = selected + threadIdx.x; i < stride; i += blockDim.x) out[i] = 0;
  if (threadIdx.x == 0) {
    const auto len = static_cast<int32_t>((selected - 1) * a.block_size + (n - 1) % a.block_size + 1);
    a.compact_seq_lens[s] = len;
    a.compact_start_pos[s] = len - 1;
  }
}

int check_sparse_args(const TesseraCudaSparseArgs* args) {
  if (!args) return record_message("sparse attention op: null args");
  const TesseraCudaSparseArgs& a = *args;
  if (a.n_seqs < 0 || a.n_seqs > 65535 || a.head_dim <= 0 || a.n_kv_heads <= 0 || a.n_heads <= 0 ||
      a.n_heads % a.n_kv_heads != 0 || a.block_size <= 0 || a.max_blocks_per_seq <= 0 ||
      a.max_blocks_per_seq > 0x7fffffff || a.num_blocks <= 0 || a.n_ranks < 1)
    return record_message(
        "sparse attention op: need n_seqs in [0, 65535], head_dim > 0, n_heads a positive multiple of n_kv_heads, "
        "block_size, max_blocks_per_seq (< 2^31), num_blocks and n_ranks > 0");
  if (a.threshold_tokens < 1 || a.sink_blocks < 0 || a.recent_blocks < 1 || a.top_blocks < 0 ||
      a.top_blocks > 0x7fffffff)
    return record_message(
        "sparse attention op: need threshold_tokens >= 1, sink_blocks >= 0, recent_blocks >= 1, top_blocks in "
        "[0, 2^31)");
  if (!a.block_tables || !a.query_len || !a.seq_lens || !a.scores)
    return record_message("sparse attention op: block_tables, query_len, seq_lens and scores must be set");
  return 0;
}

}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_kv_summary_update_f32(const TesseraCudaKvSummaryArgs* args, void* stream) {
  using namespace tessera::cuda;
  if (!args) return record_message("tessera_cuda_kv_summary_update_f32: null args");
  const TesseraCudaKvSummaryArgs& a = *args;
  if (a.n_tokens < 0 || a.n_tokens > 0x7fffffff || a.head_dim <= 0 || a.n_kv_heads <= 0 || a.block_size <= 0 ||
      a.num_blocks < 0)
    return record_message(
        "tessera_cuda_kv_summary_update_f32: need 0 <= n_tokens < 2^31, head_dim, n_kv_heads and block_size > 0");
  if (a.kv_dtype != TESSERA_CUDA_F32 && a.kv_dtype != TESSERA_CUDA_F16)
    return record_message("tessera_cuda_kv_summary_update_f32: kv_dtype must be TESSERA_CUDA_F32 or TESSERA_CUDA_F16");
  if (a.n_tokens == 0) return 0;
  const auto grid = static_cast<unsigned>(a.n_tokens);
  if (a.kv_dtype == TESSERA_CUDA_F16)
    kv_summary_kernel<__half><<<grid, kSummaryThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  else
    kv_summary_kernel<float><<<grid, kSummaryThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return check_launch("kv_summary_kernel launch");
}

extern "C" int tessera_cuda_sparse_block_scores_f32(const TesseraCudaSparseArgs* args, void* stream) {
  using namespace tessera::cuda;
  if (int rc = check_sparse_args(args); rc != 0) return rc;
  const TesseraCudaSparseArgs& a = *args;
  if (!a.q || !a.query_begin || !a.kmin || !a.kmax)
    return record_message("tessera_cuda_sparse_block_scores_f32: q, query_begin, kmin and kmax must be set");
  if (a.n_seqs == 0) return 0;
  const dim3 grid(static_cast<unsigned>(a.max_blocks_per_seq < kScoreGridX ? a.max_blocks_per_seq : kScoreGridX),
                  static_cast<unsigned>(a.n_seqs));
  block_scores_kernel<<<grid, kScoreThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return check_launch("block_scores_kernel launch");
}

extern "C" int tessera_cuda_sparse_select_blocks(const TesseraCudaSparseArgs* args, void* stream) {
  using namespace tessera::cuda;
  if (int rc = check_sparse_args(args); rc != 0) return rc;
  const TesseraCudaSparseArgs& a = *args;
  if (!a.compact_tables || !a.compact_seq_lens || !a.compact_start_pos || (a.n_ranks > 1 && !a.gathered_scores))
    return record_message(
        "tessera_cuda_sparse_select_blocks: compact_tables, compact_seq_lens, compact_start_pos (and with n_ranks > 1 "
        "gathered_scores) must be set");
  if (a.n_seqs == 0) return 0;
  select_kernel<<<static_cast<unsigned>(a.n_seqs), kSelectThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return check_launch("select_kernel launch");
}
