// Greedy sampling: argmax per row of fp32 logits, ties to the lowest id, NaN as -inf; with
// values, also the maximum (a TP rank's candidate over its slice of the vocabulary).
// Launch: grid = n_rows, block = 256; each thread scans ids threadIdx.x, +256, ...; the
// (value, id) candidates are merged by warp shuffles, then across the 8 warps in shared memory.
// Full sampling on the device (tessera_cuda_sample_f32): see sample_kernel below. This file is
// compiled with --fmad=false (CMakeLists.txt) and the sampler spells out every IEEE operation
// (__dadd_rn, __fmul_rn, ...) as well: its weights must be bit-identical to the CPU's.
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

constexpr int kThreads = 256;

// True when candidate (v, i) beats (best_v, best_i): larger value, or equal value and lower id.
__device__ __forceinline__ bool better(float v, int i, float best_v, int best_i) {
  return v > best_v || (v == best_v && i < best_i);
}

__global__ void argmax_kernel(const float* __restrict__ logits, int64_t vocab, int32_t* __restrict__ ids,
                              float* __restrict__ values, int32_t id_offset) {
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float best_v = -INFINITY;
  int best_i = INT_MAX;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    float v = row[i];
    if (isnan(v)) v = -INFINITY;
    if (better(v, static_cast<int>(i), best_v, best_i)) {
      best_v = v;
      best_i = static_cast<int>(i);
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best_v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, off);
    if (better(ov, oi, best_v, best_i)) {
      best_v = ov;
      best_i = oi;
    }
  }
  __shared__ float warp_v[kThreads / 32];
  __shared__ int warp_i[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    warp_v[warp] = best_v;
    warp_i[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w)
      if (better(warp_v[w], warp_i[w], best_v, best_i)) {
        best_v = warp_v[w];
        best_i = warp_i[w];
      }
    ids[blockIdx.x] = (best_i == INT_MAX ? 0 : best_i) + id_offset;
    if (values) values[blockIdx.x] = best_v;
  }
}

// ---- tessera_cuda_sample_f32 ----
// One block of kSampleThreads threads per row; the row's ids are handled with strided loops
// (coalesced) except the two id-order scans (below), which give each thread a contiguous chunk
// of ids. Every reduction is either exact (integer sums, max / argmax) or a fixed tree (the
// logprob's double sum), so the result does not depend on scheduling.
// Per row:
//  1. penalty entries (one thread each: ids are unique within a row), then __syncthreads;
//  2. sanitize + argmax (block argmax on (order-preserving key, id));
//  3. logprobs: block sum of det_exp(x - max) in double, then n_logprobs rounds of a block argmax
//     over the elements after the previous one in (x desc, id asc) order;
//  4. weights w into scratch, then selections with a radix select (select_kth below): the k-th
//     logit for top-k, the top-p cut over (w desc, id asc) and the draw, all on integer masses
//     wq = round(w * 2^43). The draw in id order (no top-k / top-p) is a block scan instead.
// Shared memory: a 256-bucket histogram of (uint64 mass, uint32 count) plus per-warp slots for
// the reductions, ~4 KB.
constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kRadixBuckets = 256;
constexpr double kFixedOne = 8796093022208.0;  // 2^43: the fixed point of the masses

// kernels/cpu/sampling.cpp's det_exp, every operation an explicit IEEE double operation (no
// contraction into fma), so that it returns the same bits as on the CPU.
__device__ __forceinline__ double det_exp(double x) {
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2Hi = 0.6931471803691238;
  constexpr double kLn2Lo = 1.9082149292705877e-10;
  constexpr double kShifter = 6755399441055744.0;
  const bool underflow = !(x > -700.0);
  const double xc = underflow ? -700.0 : x;
  const double t = __dadd_rn(__dmul_rn(xc, kLog2e), kShifter);
  const double n = __dsub_rn(t, kShifter);
  const double r = __dsub_rn(__dsub_rn(xc, __dmul_rn(n, kLn2Hi)), __dmul_rn(n, kLn2Lo));
  double p = 1.0 / 3628800.0;
  p = __dadd_rn(__dmul_rn(p, r), 1.0 / 362880.0);
  p = __dadd_rn(__dmul_rn(p, r), 1.0 / 40320.0);
  p = __dadd_rn(__dmul_rn(p, r), 1.0 / 5040.0);
  p = __dadd_rn(__dmul_rn(p, r), 1.0 / 720.0);
  p = __dadd_rn(__dmul_rn(p, r), 1.0 / 120.0);
  p = __dadd_rn(__dmul_rn(p, r), 1.0 / 24.0);
  p = __dadd_rn(__dmul_rn(p, r), 1.0 / 6.0);
  p = __dadd_rn(__dmul_rn(p, r), 0.5);
  p = __dadd_rn(__dmul_rn(p, r), 1.0);
  p = __dadd_rn(__dmul_rn(p, r), 1.0);
  const long long ni = __double_as_longlong(t) - __double_as_longlong(kShifter);
  const double scale = __longlong_as_double(static_cast<long long>(static_cast<unsigned long long>(ni + 1023) << 52));
  return underflow ? 0.0 : __dmul_rn(p, scale);
}

// Order-preserving key of a (sanitized, non-NaN) logit: a > b as floats <=> key(a) > key(b);
// -0 and +0 compare equal, as they do on the CPU. Real keys are >= key(-inf) = 0x007fffff > 0.
__device__ __forceinline__ uint32_t logit_key(float x) {
  uint32_t b = __float_as_uint(x);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// round-to-nearest-even(w * 2^43); w in [0, 1].
__device__ __forceinline__ unsigned long long fixed_weight(float w) {
  return __double2ull_rn(__dmul_rn(static_cast<double>(w), kFixedOne));
}

struct SampleShared {
  unsigned long long hist_mass[kRadixBuckets];
  unsigned int hist_count[kRadixBuckets];
  unsigned long long warp_u64[kSampleWarps];
  double warp_f64[kSampleWarps];
  uint32_t warp_key[kSampleWarps];
  int warp_id[kSampleWarps];
  int sel_bucket;  // -1: the target is beyond the eligible mass
  unsigned long long sel_before;
  unsigned int sel_count;
  int found_id;
};

// Which elements a selection or a sum looks at: the top-k set (logit key at or before
// (k_key, k_id) in (x desc, id asc) order), min-p (w >= min_p), the top-p set (w key at or before
// (p_key, p_id) in (w desc, id asc) order).
struct Eligible {
  bool top_k = false, min_p = false, top_p = false;
  uint32_t k_key = 0, p_key = 0;
  int k_id = 0, p_id = 0;
  float min_p_value = 0.0f;
  __device__ __forceinline__ bool needs_logit() const { return top_k; }
  __device__ __forceinline__ bool needs_weight() const { return min_p || top_p; }
  __device__ __forceinline__ bool operator()(int i, uint32_t xkey, float w) const {
    if (top_k && !(xkey > k_key || (xkey == k_key && i <= k_id))) return false;
    if (min_p && !(w >= min_p_value)) return false;
    if (top_p) {
      const uint32_t wkey = __float_as_uint(w);
      if (!(wkey > p_key || (wkey == p_key && i <= p_id))) return false;
    }
    return true;
  }
};

// Block-wide sum (uint64, exact) / sum (double, fixed tree: xor butterfly in each warp, then an
// xor butterfly over the warps' sums) / argmax on (key desc, id asc). Every thread gets the
// result; two __syncthreads, so every thread of the block must call them.
// The second level has one warp slot per lane (kSampleWarps == 32): each warp reads the 32
// slots lane by lane and reduces them with shuffles. (A serial loop over the slots, unrolled,
// was compiled by ptxas 13.0 into reads past the slots on sm_90: compute-sanitizer found
// out-of-bounds shared reads on an H200, bench/results/gpu-check-*.)
static_assert(kSampleWarps == 32, "the second level of the block reductions has one lane per warp");

__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int off = 16; off > 0; off >>= 1) v = __dadd_rn(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

__device__ __forceinline__ unsigned long long block_sum_u64(unsigned long long v, SampleShared& sh) {
  v = warp_sum_u64(v);
  if ((threadIdx.x & 31) == 0) sh.warp_u64[threadIdx.x >> 5] = v;
  __syncthreads();
  const unsigned long long total = warp_sum_u64(sh.warp_u64[threadIdx.x & 31]);
  __syncthreads();
  return total;
}

__device__ __forceinline__ double block_sum_f64(double v, SampleShared& sh) {
  v = warp_sum_f64(v);
  if ((threadIdx.x & 31) == 0) sh.warp_f64[threadIdx.x >> 5] = v;
  __syncthreads();
  const double total = warp_sum_f64(sh.warp_f64[threadIdx.x & 31]);
  __syncthreads();
  return total;
}

__device__ __forceinline__ bool key_before(uint32_t key, int id, uint32_t best_key, int best_id) {
  return key > best_key || (key == best_key && id < best_id);
}

__device__ __forceinline__ void warp_argmax(uint32_t& key, int& id) {
  for (int off = 16; off > 0; off >>= 1) {
    const uint32_t ok = __shfl_xor_sync(kFullMask, key, off);
    const int oi = __shfl_xor_sync(kFullMask, id, off);
    if (key_before(ok, oi, key, id)) {
      key = ok;
      id = oi;
    }
  }
}

// Threads without a candidate pass key 0 (below every real key) and id INT_MAX.
__device__ __forceinline__ void block_argmax(uint32_t& key, int& id, SampleShared& sh) {
  warp_argmax(key, id);
  if ((threadIdx.x & 31) == 0) {
    sh.warp_key[threadIdx.x >> 5] = key;
    sh.warp_id[threadIdx.x >> 5] = id;
  }
  __syncthreads();
  key = sh.warp_key[threadIdx.x & 31];
  id = sh.warp_id[threadIdx.x & 31];
  warp_argmax(key, id);
  __syncthreads();
}

// Exclusive prefix sum of v over the threads in index order; *total = the block's sum.
__device__ __forceinline__ unsigned long long block_exclusive_scan(unsigned long long v, unsigned long long* total,
                                                                   SampleShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long incl = v;
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned long long y = __shfl_up_sync(kFullMask, incl, off);
    if (lane >= off) incl += y;
  }
  if (lane == 31) sh.warp_u64[warp] = incl;
  __syncthreads();
  // Lane l scans the warps' sums; warp w's offset is the exclusive scan at lane w.
  const unsigned long long s = sh.warp_u64[lane];
  unsigned long long warps_incl = s;
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned long long y = __shfl_up_sync(kFullMask, warps_incl, off);
    if (lane >= off) warps_incl += y;
  }
  const unsigned long long before = __shfl_sync(kFullMask, warps_incl - s, warp);
  *total = __shfl_sync(kFullMask, warps_incl, 31);
  __syncthreads();
  return before + incl - v;
}

// Adds (mass, 1) of the calling thread's element to bucket `bucket` when `active`. Called by all
// 32 lanes of a warp together. On sm_80+ the lanes with the same bucket are combined first
// (match + redux), so a histogram where most elements fall into one bucket costs one shared
// atomic per warp instead of 32 serialized ones. Integer sums: the result is the same either way.
template <bool kWeighted>
__device__ __forceinline__ void histogram_add(SampleShared& sh, bool active, unsigned bucket,
                                              unsigned long long mass) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned peers = __match_any_sync(kFullMask, active ? bucket : 0xffffffffu);
  const unsigned count = __popc(peers);
  unsigned long long sum = count;
  if (kWeighted) {
    // mass <= 2^43: 32 lanes of (mass >> 22) <= 2^21 and of the low 22 bits fit in 32 bits.
    const unsigned hi = __reduce_add_sync(peers, static_cast<unsigned>(mass >> 22));
    const unsigned lo = __reduce_add_sync(peers, static_cast<unsigned>(mass & 0x3fffffu));
    sum = (static_cast<unsigned long long>(hi) << 22) + lo;
  }
  if (active && (threadIdx.x & 31) == static_cast<unsigned>(__ffs(peers) - 1)) {
    atomicAdd(&sh.hist_mass[bucket], sum);
    atomicAdd(&sh.hist_count[bucket], count);
  }
#else
  if (active) {
    atomicAdd(&sh.hist_mass[bucket], kWeighted ? mass : 1ull);
    atomicAdd(&sh.hist_count[bucket], 1u);
  }
#endif
}

struct Selected {
  bool found;
  uint32_t key;
  int id;
  unsigned long long run;  // the running mass up to and including the selected element
};

// The first eligible element, in (key desc, id asc) order, whose running mass is >= target
// (target 0: the first one); not found when the eligible mass is below target. kByWeight: key =
// the float bits of w (w >= 0, so the bits order like the values), mass = wq; else key =
// logit_key(x), mass 1 (the target-th element).
// Radix select, 8 bits a pass from the top: each pass histograms (mass, count) over the eligible
// elements whose key has the digits chosen so far, and warp 0 walks the buckets from 255 down,
// accumulating mass, to the first non-empty bucket where the running mass reaches the target.
// After 4 passes the key is exact; the elements left are ties with one mass wq each, in id
// order, so the answer is tie number j = ceil((target - mass before them) / wq) - 1, found by a
// block scan over contiguous id chunks.
template <bool kByWeight>
__device__ Selected select_kth(const float* x, const float* w, int n, const Eligible& el, unsigned long long target,
                               SampleShared& sh) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool load_w = kByWeight || el.needs_weight();
  const bool load_x = !kByWeight || el.needs_logit();
  uint32_t prefix = 0, prefix_mask = 0;
  unsigned long long before = 0;
  unsigned count = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int b = tid; b < kRadixBuckets; b += kSampleThreads) {
      sh.hist_mass[b] = 0;
      sh.hist_count[b] = 0;
    }
    __syncthreads();
    for (int base = 0; base < n; base += kSampleThreads) {
      const int i = base + tid;
      bool active = false;
      unsigned bucket = 0;
      unsigned long long mass = 0;
      if (i < n) {
        const float wi = load_w ? w[i] : 0.0f;
        const uint32_t xkey = load_x ? logit_key(x[i]) : 0u;
        const uint32_t key = kByWeight ? __float_as_uint(wi) : xkey;
        if ((key & prefix_mask) == prefix && el(i, xkey, wi)) {
          active = true;
          bucket = (key >> shift) & 0xffu;
          mass = kByWeight ? fixed_weight(wi) : 1ull;
        }
      }
      histogram_add<kByWeight>(sh, active, bucket, mass);
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l owns buckets 255 - 8l down to 248 - 8l; an inclusive scan of the lanes' masses
      // gives each lane the mass of the buckets above its own.
      unsigned long long own = 0;
      for (int k = 0; k < 8; ++k) own += sh.hist_mass[255 - 8 * lane - k];
      unsigned long long incl = own;
      for (int off = 1; off < 32; off <<= 1) {
        const unsigned long long y = __shfl_up_sync(kFullMask, incl, off);
        if (lane >= off) incl += y;
      }
      unsigned long long cum = before + (incl - own);
      int found = -1;
      unsigned long long found_before = 0;
      for (int k = 0; k < 8; ++k) {
        const int b = 255 - 8 * lane - k;
        const unsigned long long m = sh.hist_mass[b];
        if (found < 0 && sh.hist_count[b] > 0 && cum + m >= target) {
          found = b;
          found_before = cum;
        }
        cum += m;
      }
      const unsigned ballot = __ballot_sync(kFullMask, found >= 0);
      const int first = ballot ? __ffs(ballot) - 1 : 0;
      if (lane == first) {
        sh.sel_bucket = ballot ? found : -1;
        sh.sel_before = found_before;
        sh.sel_count = ballot ? sh.hist_count[found] : 0u;
      }
    }
    __syncthreads();
    const int bucket = sh.sel_bucket;
    if (bucket < 0) return Selected{false, 0u, 0, 0ull};  // uniform: every thread read the same value
    before = sh.sel_before;
    count = sh.sel_count;
    prefix |= static_cast<uint32_t>(bucket) << shift;
    prefix_mask |= 0xffu << shift;
  }
  // The ties: `count` eligible elements with key == prefix, mass `each` each.
  const unsigned long long each = kByWeight ? fixed_weight(__uint_as_float(prefix)) : 1ull;
  unsigned long long j = 0;
  if (target > before && each > 0) j = (target - before + each - 1) / each - 1;
  if (j >= count) j = count - 1;  // cannot happen: the bucket's mass reaches the target
  const unsigned long long run = before + (j + 1) * each;
  auto matches = [&](int i) {
    const float wi = load_w ? w[i] : 0.0f;
    const uint32_t xkey = load_x ? logit_key(x[i]) : 0u;
    const uint32_t key = kByWeight ? __float_as_uint(wi) : xkey;
    return key == prefix && el(i, xkey, wi);
  };
  if (count == 1) {
    for (int i = tid; i < n; i += kSampleThreads)
      if (matches(i)) sh.found_id = i;  // exactly one thread writes
  } else {
    const int chunk = (n + kSampleThreads - 1) / kSampleThreads;
    const int lo = min(tid * chunk, n), hi = min(lo + chunk, n);
    unsigned long long mine = 0;
    for (int i = lo; i < hi; ++i) mine += matches(i) ? 1u : 0u;
    unsigned long long total = 0;
    const unsigned long long first = block_exclusive_scan(mine, &total, sh);
    if (j >= first && j < first + mine) {
      unsigned long long left = j - first;
      for (int i = lo; i < hi; ++i)
        if (matches(i)) {
          if (left == 0) {
            sh.found_id = i;
            break;
          }
          --left;
        }
    }
  }
  __syncthreads();
  const int id = sh.found_id;
  __syncthreads();
  return Selected{true, prefix, id, run};
}

__global__ void __launch_bounds__(kSampleThreads, 1) sample_kernel(TesseraCudaSampleArgs a) {
  __shared__ SampleShared sh;
  const int tid = threadIdx.x;
  const int n = static_cast<int>(a.vocab);
  const int64_t r = blockIdx.x;
  // Not __restrict__ / const: the block writes both and reads them back after __syncthreads.
  float* x = a.logits + r * a.vocab;
  float* w = a.scratch + r * a.vocab;
  const TesseraCudaSampleRow row = a.rows[r];

  // 1. Penalties: one thread per entry (ids are unique within a row).
  if (a.penalties) {
    const float rep = row.repetition_penalty, presence = row.presence_penalty, frequency = row.frequency_penalty;
    for (int64_t e = static_cast<int64_t>(row.penalty_begin) + tid; e < row.penalty_end; e += kSampleThreads) {
      const TesseraCudaPenalty p = a.penalties[e];
      if (p.id < 0 || p.id >= n) continue;
      float v = p.banned ? -INFINITY : x[p.id];
      if (rep != 1.0f && (p.in_prompt || p.out_count > 0)) v = v > 0.0f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
      if ((presence != 0.0f || frequency != 0.0f) && p.out_count > 0)
        v = __fsub_rn(v, __fadd_rn(presence, __fmul_rn(frequency, static_cast<float>(p.out_count))));
      x[p.id] = v;
    }
  }
  __syncthreads();

  // 2. Sanitize, argmax (the first maximum).
  uint32_t best_key = 0;
  int best_id = INT_MAX;
  for (int i = tid; i < n; i += kSampleThreads) {
    float v = x[i];
    if (isnan(v)) {
      v = -INFINITY;
      x[i] = v;
    } else if (v == INFINITY) {
      v = FLT_MAX;
      x[i] = v;
    }
    const uint32_t k = logit_key(v);
    if (k > best_key) {  // ids rise within a thread: the first of equal values stays
      best_key = k;
      best_id = i;
    }
  }
  block_argmax(best_key, best_id, sh);  // ends with __syncthreads: the writes above are visible
  float max_logit;
  if (best_key == logit_key(-INFINITY)) {  // everything -inf: uniform
    for (int i = tid; i < n; i += kSampleThreads) x[i] = 0.0f;
    __syncthreads();
    max_logit = 0.0f;
  } else {
    max_logit = x[best_id];
  }

  // 3. Logprobs.
  const int n_top = min(max(row.n_logprobs, 0), min(static_cast<int>(TESSERA_CUDA_MAX_TOP_LOGPROBS), n));
  const bool want_logprobs = row.want_logprob != 0 || n_top > 0;
  double log_sum_exp = 0.0;
  if (want_logprobs) {
    double sum = 0.0;
    for (int i = tid; i < n; i += kSampleThreads)
      sum = __dadd_rn(sum, det_exp(__dsub_rn(static_cast<double>(x[i]), static_cast<double>(max_logit))));
    sum = block_sum_f64(sum, sh);
    log_sum_exp = __dadd_rn(static_cast<double>(max_logit), log(sum));
    uint32_t prev_key = 0xffffffffu;  // above every real key: nothing is excluded at first
    int prev_id = -1;
    for (int j = 0; j < n_top; ++j) {
      uint32_t key = 0;
      int id = INT_MAX;
      for (int i = tid; i < n; i += kSampleThreads) {
        const uint32_t k = logit_key(x[i]);
        if ((k < prev_key || (k == prev_key && i > prev_id)) && k > key) {
          key = k;
          id = i;
        }
      }
      block_argmax(key, id, sh);
      if (tid == 0) {
        const int64_t at = r * TESSERA_CUDA_MAX_TOP_LOGPROBS + j;
        a.top_ids[at] = id;
        a.top_logprobs[at] = static_cast<float>(__dsub_rn(static_cast<double>(x[id]), log_sum_exp));
      }
      prev_key = key;
      prev_id = id;
    }
  }

  // 4. The token.
  int chosen = best_id;
  if (row.temperature != 0.0f) {
    const double temperature = row.temperature;
    for (int i = tid; i < n; i += kSampleThreads)
      w[i] = __double2float_rn(
          det_exp(__ddiv_rn(__dsub_rn(static_cast<double>(x[i]), static_cast<double>(max_logit)), temperature)));
    __syncthreads();
    const bool use_top_k = row.top_k > 0 && row.top_k < n;
    const bool use_min_p = row.min_p > 0.0f;
    const bool use_top_p = row.top_p < 1.0f;
    Eligible el;
    if (use_top_k) {
      const Selected kth = select_kth<false>(x, w, n, el, static_cast<unsigned long long>(row.top_k), sh);
      el.top_k = true;
      el.k_key = kth.key;
      el.k_id = kth.id;
    }
    // Masses of the top-k set (the top-p reference) and of its min-p part.
    unsigned long long mass_k = 0, mass_e = 0;
    for (int i = tid; i < n; i += kSampleThreads) {
      const float wi = w[i];
      if (use_top_k) {
        const uint32_t xkey = logit_key(x[i]);
        if (!(xkey > el.k_key || (xkey == el.k_key && i <= el.k_id))) continue;
      }
      const unsigned long long q = fixed_weight(wi);
      mass_k += q;
      if (!use_min_p || wi >= row.min_p) mass_e += q;
    }
    mass_k = block_sum_u64(mass_k, sh);
    mass_e = block_sum_u64(mass_e, sh);
    el.min_p = use_min_p;
    el.min_p_value = row.min_p;
    unsigned long long kept = mass_e;
    if (use_top_p) {
      const double t = ceil(__dmul_rn(static_cast<double>(row.top_p), static_cast<double>(mass_k)));
      const Selected cut = select_kth<true>(x, w, n, el, static_cast<unsigned long long>(t), sh);
      if (cut.found) {  // else the min-p set holds less than top_p of the mass: all of it stays
        el.top_p = true;
        el.p_key = cut.key;
        el.p_id = cut.id;
        kept = cut.run;
      }
    }
    // The draw: the first kept element whose running mass exceeds floor(u * kept). kept >= 2^43
    // (the maximum, w = 1, is always kept) unless the parameters are invalid (NaN temperature):
    // then the argmax stays.
    if (kept > 0) {
      double scaled = floor(__dmul_rn(row.u, static_cast<double>(kept)));
      if (!(scaled >= 0.0)) scaled = 0.0;
      unsigned long long below = scaled >= static_cast<double>(kept) ? kept : static_cast<unsigned long long>(scaled);
      if (below > kept - 1) below = kept - 1;
      const unsigned long long target = below + 1;
      if (use_top_k || use_top_p) {
        const Selected draw = select_kth<true>(x, w, n, el, target, sh);
        if (draw.found) chosen = draw.id;
      } else {
        // Id order: contiguous chunks, a block scan of their masses, the crossing chunk walks.
        const int chunk = (n + kSampleThreads - 1) / kSampleThreads;
        const int lo = min(tid * chunk, n), hi = min(lo + chunk, n);
        unsigned long long mine = 0;
        for (int i = lo; i < hi; ++i) {
          const float wi = w[i];
          if (!use_min_p || wi >= row.min_p) mine += fixed_weight(wi);
        }
        unsigned long long total = 0;
        const unsigned long long first = block_exclusive_scan(mine, &total, sh);
        if (target > first && target <= first + mine) {
          unsigned long long run = first;
          for (int i = lo; i < hi; ++i) {
            const float wi = w[i];
            if (use_min_p && !(wi >= row.min_p)) continue;
            run += fixed_weight(wi);
            if (run >= target) {
              sh.found_id = i;
              break;
            }
          }
        }
        __syncthreads();
        chosen = sh.found_id;
      }
    }
  }

  // 5. Results.
  if (tid == 0) {
    a.ids[r] = chosen;
    a.logprobs[r] =
        want_logprobs ? static_cast<float>(__dsub_rn(static_cast<double>(x[chosen]), log_sum_exp)) : 0.0f;
  }
}

}  // namespace
}  // namespace tessera::cuda

extern "C" int tessera_cuda_argmax_f32(const float* logits, int64_t n_rows, int64_t vocab, int32_t* ids,
                                       void* stream) {
  using namespace tessera::cuda;
  if (n_rows < 0 || n_rows > 0x7fffffff || vocab <= 0 || vocab > 0x7fffffff)
    return record_message("tessera_cuda_argmax_f32: need 0 <= n_rows < 2^31 and 0 < vocab < 2^31");
  if (n_rows == 0) return 0;
  argmax_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, vocab, ids, nullptr, 0);
  return check_launch("argmax_kernel launch");
}

extern "C" int tessera_cuda_argmax_value_f32(const float* logits, int64_t n_rows, int64_t vocab, int32_t id_offset,
                                             int32_t* ids, float* values, void* stream) {
  using namespace tessera::cuda;
  if (n_rows < 0 || n_rows > 0x7fffffff || vocab <= 0 || vocab > 0x7fffffff || !values)
    return record_message("tessera_cuda_argmax_value_f32: need 0 <= n_rows < 2^31, 0 < vocab < 2^31 and values");
  if (n_rows == 0) return 0;
  argmax_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, vocab, ids, values, id_offset);
  return check_launch("argmax_kernel launch");
}

extern "C" int tessera_cuda_sample_f32(const TesseraCudaSampleArgs* args, void* stream) {
  using namespace tessera::cuda;
  if (!args) return record_message("tessera_cuda_sample_f32: args is null");
  const TesseraCudaSampleArgs& a = *args;
  if (a.n_rows < 0 || a.n_rows > 0x7fffffff)
    return record_message("tessera_cuda_sample_f32: need 0 <= n_rows < 2^31");
  if (a.vocab < 1 || a.vocab > (int64_t{1} << 20))
    return record_message("tessera_cuda_sample_f32: need 1 <= vocab <= 2^20");
  if (a.n_rows == 0) return 0;
  if (!a.logits || !a.scratch || !a.rows || !a.ids || !a.logprobs || !a.top_ids || !a.top_logprobs)
    return record_message(
        "tessera_cuda_sample_f32: logits, scratch, rows, ids, logprobs, top_ids and top_logprobs must not be null");
  sample_kernel<<<static_cast<unsigned>(a.n_rows), kSampleThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return check_launch("sample_kernel launch");
}
