// Greedy sampling: argmax per row of fp32 logits, ties to the lowest id, NaN as -inf; with
// values, also the maximum (a TP rank's candidate over its slice of the vocabulary).
// Launch: grid = n_rows, block = 256; each thread scans ids threadIdx.x, +256, ...; the
// (value, id) candidates are merged by warp shuffles, then across the 8 warps in shared memory.
#include <cuda_runtime.h>

#include <climits>

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
