// CPU matmul for every weight QuantType: picks the kernel family and splits rows over threads.
//
//   GGUF block formats (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, TQ1_0, TQ2_0): the
//     activations are quantized to int8 blocks once per call (kernels/cpu/qgemm.h), then
//     integer-dot kernels run on the weight blocks as stored in the file.
//   Load-time formats I8_CH and I4_G128 (--quant, AWQ / GPTQ): the same scheme with 32-element
//     activation blocks; I8_CH rows carry their scale after the levels (row_bytes includes it).
//   F32 / F16 / BF16: fp32 fma kernels (kernels/cpu/fgemm.h), fp32-accurate; or, in the bf16
//     matmul precision (kernels/gemm.h), bf16 dot products (kernels/cpu/fgemm_bf16.h) on
//     activations converted to bf16 once per call.
//   Anything else (I8, I32): each row dequantized, then the F32 kernel.
// Every output element is computed by one thread in an order fixed by the format (see those
// headers), so the result depends neither on the thread count, nor on the ISA path, nor on
// which other tokens share the call.
#include "kernels/gemm.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "common/check.h"
#include "common/thread_pool.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/fgemm.h"
#include "kernels/cpu/fgemm_bf16.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/vec.h"
#include "kernels/quant.h"

namespace tessera {
namespace {

// Caller-thread scratch for the quantized activations: grows to the largest call, then is
// reused (no allocation per decode step).
void* acts_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64);
}

float* row_scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

void run_q(const cpu::QMatmulArgs& a, int64_t b, int64_t e) {
  // The 16-row interleaved layouts (made where a SIMD path is active) run on the AVX-512 or
  // the AVX2 kernels, never the scalar ones.
  if (cpu::is_r16(a.type))
    return cpu::active_isa() == cpu::Isa::kAvx512 ? cpu::qmatmul_avx512(a, b, e) : cpu::qmatmul_avx2(a, b, e);
  switch (cpu::active_isa()) {
    case cpu::Isa::kAvx512: return cpu::qmatmul_avx512(a, b, e);
    case cpu::Isa::kAvx2: return cpu::qmatmul_avx2(a, b, e);
    case cpu::Isa::kScalar: return cpu::qmatmul_scalar(a, b, e);
  }
}

template <typename Fn>
void for_rows(ThreadPool* pool, int64_t n, int64_t grain, Fn&& fn) {
  if (pool == nullptr) {
    fn(0, n);
    return;
  }
  pool->parallel_for(n, grain, [&fn](int64_t b, int64_t e, int) { fn(b, e); });
}

std::atomic<MatmulPrecision> g_precision{MatmulPrecision::kAuto};

bool uses_bf16(QuantType type) {
  switch (g_precision.load(std::memory_order_relaxed)) {
    case MatmulPrecision::kFp32: return false;
    case MatmulPrecision::kBf16: return true;
    case MatmulPrecision::kAuto: break;
  }
  return (type == QuantType::kF16 || type == QuantType::kBF16) && cpu::bf16_dot_pays();
}

}  // namespace

Status set_matmul_precision(MatmulPrecision p) {
  if (p == MatmulPrecision::kBf16 && !cpu::has_bf16_dot())
    return Status::invalid_argument("matmul precision bf16 needs AVX512_BF16, which this CPU (" +
                                    cpu::cpu_info().brand + ") does not have; use fp32 or auto");
  g_precision.store(p, std::memory_order_relaxed);
  return Status::ok();
}

MatmulPrecision matmul_precision() { return g_precision.load(std::memory_order_relaxed); }

const char* matmul_compute_for(QuantType type) {
  if (!cpu::is_float_weight(type)) return cpu::has_qdot(type) ? "int8-dot" : "fp32";
  return uses_bf16(type) ? "bf16" : "fp32";
}

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
  if (cpu::is_r16(w.type)) {
    TESSERA_CHECK(cpu::detected_isa() >= cpu::Isa::kAvx2, "matmul: {} weight {} needs AVX2", quant_name(w.type),
                  w.shape_string());
    // Any end: a group's blocks hold all 16 rows (rows % 16 == 0) and only valid rows are stored.
    TESSERA_CHECK(row_begin % cpu::kQRowGroup == 0, "matmul: rows [{}, {}) of {} weight {} must start on a group of 16",
                  row_begin, row_end, quant_name(w.type), w.shape_string());
  }
  const uint8_t* w0 = w.row_ptr(row_begin);
  const size_t rb = w.row_stride_bytes();

  if (cpu::has_qdot(w.type)) {
    const int64_t blk = cpu::act_block(w.type);
    void* scratch = acts_scratch(cpu::acts_bytes(n_tokens, k, blk));
    cpu::QMatmulArgs a;
    a.type = w.type;
    a.w = w0;
    a.row_bytes = rb;
    a.k = k;
    a.acts = cpu::acts_view(scratch, n_tokens, k, blk);
    a.n_tokens = n_tokens;
    a.y = y;
    a.y_stride = y_stride;
    const cpu::QuantizedActs acts = a.acts;
    if (n_tokens >= 8 && pool != nullptr) {
      pool->parallel_for(n_tokens, 1, [&](int64_t b, int64_t e, int) { cpu::quantize_acts(x, b, e, acts); });
    } else {
      cpu::quantize_acts(x, 0, n_tokens, acts);
    }
    for_rows(pool, n_rows, cpu::kQRowGroup, [&a](int64_t b, int64_t e) { run_q(a, b, e); });
    return;
  }

  cpu::FMatmulArgs a;
  a.w = w0;
  a.row_bytes = rb;
  a.k = k;
  a.x = x;
  a.n_tokens = n_tokens;
  a.y = y;
  a.y_stride = y_stride;
  if (cpu::is_float_weight(w.type)) {
    a.type = w.type;
    if (uses_bf16(w.type)) {
      auto* xb = static_cast<uint16_t*>(acts_scratch(cpu::bf16_acts_bytes(n_tokens, k)));
      if (n_tokens >= 8 && pool != nullptr) {
        pool->parallel_for(n_tokens, 1, [&](int64_t b, int64_t e, int) { cpu::convert_acts_bf16(x, k, b, e, xb); });
      } else {
        cpu::convert_acts_bf16(x, k, 0, n_tokens, xb);
      }
      for_rows(pool, n_rows, cpu::kFRowGroup, [&a, xb](int64_t b, int64_t e) { cpu::fmatmul_bf16(a, xb, b, e); });
      return;
    }
    for_rows(pool, n_rows, cpu::kFRowGroup, [&a](int64_t b, int64_t e) { cpu::fmatmul(a, b, e); });
    return;
  }
  // Rare formats: widen one row at a time to fp32 and use the F32 kernel on it.
  for_rows(pool, n_rows, cpu::kFRowGroup, [&a, &w0, rb, type = w.type](int64_t b, int64_t e) {
    float* row = row_scratch(static_cast<size_t>(a.k));
    cpu::FMatmulArgs one = a;
    one.type = QuantType::kF32;
    one.w = reinterpret_cast<const uint8_t*>(row);
    one.row_bytes = static_cast<size_t>(a.k) * 4;
    for (int64_t r = b; r < e; ++r) {
      dequantize_row(type, w0 + static_cast<size_t>(r) * rb, row, a.k);
      one.y = a.y + r;
      cpu::fmatmul(one, 0, 1);
    }
  });
}

void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool) {
  matmul_rows(w, 0, w.rows(), x, n_tokens, y, w.rows(), pool);
}

}  // namespace tessera
