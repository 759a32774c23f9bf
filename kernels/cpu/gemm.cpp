// CPU matmul for every weight QuantType.
//
// Work is split over weight rows (grain kRowGrain); each output element is one dot product
// computed by one thread in a fixed order, so results do not depend on the pool size.
//   n_tokens == 1 (decode): a per-format fused row-dot (dequantize in registers + FMA) where
//     one exists, else dequantize the row into a thread-local buffer and dot it.
//   n_tokens > 1 (prefill): a tile of rows is dequantized once into a thread-local buffer
//     (F32 rows are used in place) and dotted with every token; the tile is sized to stay in
//     L2 while the token rows stream through L1.
// Both paths give bit-identical results (see kernels/cpu/vec.h). A format gains a faster
// decode path by adding an entry to row_dot_for(); int8-activation kernels (VNNI) would slot
// in the same way.
#include "kernels/gemm.h"

#include <algorithm>
#include <vector>

#include "common/check.h"
#include "common/thread_pool.h"
#include "kernels/cpu/vec.h"
#include "kernels/quant.h"

namespace tessera {
namespace {

constexpr int64_t kRowGrain = 16;
constexpr int64_t kMaxTileRows = 16;
constexpr int64_t kTileFloats = 64 * 1024;  // 256 KiB of dequantized weights per tile

// dot(W row, x) over k elements; must be bit-identical to dot_f32(dequantize(row), x).
using RowDotFn = float (*)(const void* row, const float* x, int64_t k);

float dot_row_f32(const void* row, const float* x, int64_t k) {
  return cpu::dot_f32(static_cast<const float*>(row), x, k);
}

RowDotFn row_dot_for(QuantType type) {
  switch (type) {
    case QuantType::kF32: return dot_row_f32;
    case QuantType::kF16: return cpu::dot_f16_f32;
    case QuantType::kBF16: return cpu::dot_bf16_f32;
    case QuantType::kQ8_0: return cpu::dot_q8_0_f32;
    default: return nullptr;  // generic: dequantize, then dot_f32
  }
}

float* thread_scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

struct MatmulJob {
  const TensorView* w;
  int64_t row_begin;
  const float* x;
  int64_t n_tokens;
  float* y;
  int64_t y_stride;
  int64_t k;
  RowDotFn dot;
  int64_t tile_rows;
};

// Output rows [b, e) relative to row_begin.
void run_rows(const MatmulJob& job, int64_t b, int64_t e) {
  const TensorView& w = *job.w;
  const int64_t k = job.k;
  if (job.n_tokens == 1 && job.dot != nullptr) {
    for (int64_t r = b; r < e; ++r) job.y[r] = job.dot(w.row_ptr(job.row_begin + r), job.x, k);
    return;
  }
  const bool in_place = w.type == QuantType::kF32;
  float* tile = in_place ? nullptr : thread_scratch(static_cast<size_t>(job.tile_rows * k));
  for (int64_t r0 = b; r0 < e; r0 += job.tile_rows) {
    const int64_t r1 = std::min(e, r0 + job.tile_rows);
    const float* rows[kMaxTileRows];
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* src = w.row_ptr(job.row_begin + r);
      if (in_place) {
        rows[r - r0] = reinterpret_cast<const float*>(src);
      } else {
        float* dst = tile + (r - r0) * k;
        dequantize_row(w.type, src, dst, k);
        rows[r - r0] = dst;
      }
    }
    int64_t t = 0;
    for (; t + 3 <= job.n_tokens; t += 3) {  // three tokens share each weight load
      const float* xt = job.x + t * k;
      float* yt = job.y + t * job.y_stride;
      for (int64_t r = r0; r < r1; ++r) {
        float out[3];
        cpu::dot3_f32(rows[r - r0], xt, xt + k, xt + 2 * k, k, out);
        yt[r] = out[0];
        yt[job.y_stride + r] = out[1];
        yt[2 * job.y_stride + r] = out[2];
      }
    }
    for (; t < job.n_tokens; ++t) {
      const float* xt = job.x + t * k;
      float* yt = job.y + t * job.y_stride;
      for (int64_t r = r0; r < r1; ++r) yt[r] = cpu::dot_f32(rows[r - r0], xt, k);
    }
  }
}

}  // namespace

void matmul_rows(const TensorView& w, int64_t row_begin, int64_t row_end, const float* x,
                 int64_t n_tokens, float* y, int64_t y_stride, ThreadPool* pool) {
  const int64_t k = w.cols();
  TESSERA_CHECK(w.ndim >= 1, "matmul: weight has no dimensions");
  TESSERA_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= w.rows(),
                "matmul: rows [{}, {}) outside weight {}", row_begin, row_end, w.shape_string());
  TESSERA_CHECK(k % quant_traits(w.type).block_elems == 0, "matmul: {} weight {} cols not blocked",
                quant_name(w.type), w.shape_string());
  TESSERA_CHECK(n_tokens >= 0 && y_stride >= row_end - row_begin, "matmul: n_tokens {} y_stride {}",
                n_tokens, y_stride);
  const int64_t n_rows = row_end - row_begin;
  if (n_rows == 0 || n_tokens == 0) return;
  // One token: dequantize a row at a time so it is still in L1 when dotted.
  const int64_t tile_rows =
      n_tokens == 1 ? 1 : std::clamp<int64_t>(kTileFloats / std::max<int64_t>(k, 1), 1, kMaxTileRows);
  MatmulJob job{&w, row_begin, x, n_tokens, y, y_stride, k, row_dot_for(w.type), tile_rows};
  if (pool == nullptr) {
    run_rows(job, 0, n_rows);
    return;
  }
  pool->parallel_for(n_rows, kRowGrain, [&job](int64_t b, int64_t e, int) { run_rows(job, b, e); });
}

void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool) {
  matmul_rows(w, 0, w.rows(), x, n_tokens, y, w.rows(), pool);
}

}  // namespace tessera
