// Private to CudaForward's implementation files (shard/cuda_*.cpp), included by no one else:
// the device weight matrix and layer structs, the split-decode constants the workspace and the
// attention op share, and the CUDA error-check macros every file uses.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/cuda/cuda_loader.h"
#include "shard/cuda_forward.h"

namespace tessera {

// A weight matrix on the device, [rows, cols] row-major in one of four forms.
struct CudaForward::Matrix {
  enum class Kind { kF16, kW8, kW4, kGguf };
  Kind kind = Kind::kF16;
  int64_t rows = 0, cols = 0;
  // f16 [rows, cols] | int8 [rows, cols] | uint8 [rows, cols / 2] | GGUF: the file's blocks,
  // row r at r * row_bytes
  void* w = nullptr;
  void* scales = nullptr;  // W8: fp32 [rows]; W4: f16 [rows, cols / 128]
  void* zeros = nullptr;   // W4: uint8 [rows, cols / 128]
  QuantType gguf_type = QuantType::kF16;  // GGUF: the block type (tessera_cuda_gemm_gguf's `type`)
  int64_t row_bytes = 0;                  // GGUF: bytes of one row's blocks
  int64_t bytes = 0;
};

struct CudaForward::Layer {
  float* attn_norm = nullptr;
  float* ffn_norm = nullptr;
  float *post_attn_norm = nullptr, *post_ffn_norm = nullptr;
  float *bq = nullptr, *bk = nullptr, *bv = nullptr;
  float *q_norm = nullptr, *k_norm = nullptr;
  Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
};

namespace cuda_forward_detail {

// Split decode attention: pieces of about kSplitKeys keys, at most kMaxSplits of them, used
// while a step has fewer than kSplitBelowBlocks (sequence, head) pairs.
inline constexpr int64_t kSplitKeys = 512;
inline constexpr int64_t kMaxSplits = 32;
inline constexpr int64_t kSplitBelowBlocks = 1024;

inline double micros_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace cuda_forward_detail

// Both expect `api_` (the CudaApi table) in scope: they are for CudaForward's members.
#define TESSERA_CUDA_TRY(call, what) TESSERA_RETURN_IF_ERROR(api_->check((call), (what)))
// The same for a call that enqueues work on the stream (counted in last_step_.launches).
#define TESSERA_CUDA_LAUNCH(call, what) \
  do {                                  \
    ++last_step_.launches;              \
    TESSERA_CUDA_TRY(call, what);       \
  } while (0)

}  // namespace tessera
