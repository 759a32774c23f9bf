// A CPU stand-in for libtessera_cuda.so, for tests only: every C entry point of
// kernels/cuda/cuda_api.h implemented on the host, with host memory playing device memory and
// every call synchronous. Loaded through TESSERA_CUDA_LIBRARY, it lets CTest run the CUDA
// forward pass's host logic (weight upload and repacking, step metadata, block tables, op
// dispatch, logits) and the index math of the newer kernels on machines without a GPU
// (test `cuda_forward_fake_backend`). The prefill attention and W8A16 / W4A16 GEMMs (also the
// tensor-core ones, mma fragments included) follow their kernels' block / warp / lane
// decomposition step by step; the other ops are plain references (the sampler: the kernel's
// orders and fixed-point sums as a sequential algorithm). NCCL runs between processes through
// shared memory (below).
// The entry points follow cuda_api.h's list: its CALL entries are defined by hand (extern "C"
// below); each OP entry is an implementation fake_op::<symbol> with the entry's signature, and
// the exported symbol, generated from the list at the end of this file, checks the call
// (CallCheck), then records it while a graph is being captured or runs it (run_or_record).
// It says nothing about the real kernels' speed or synchronization: the `gpu` tests on a
// device do.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/dtype.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/sampling.h"

namespace {

using tessera::f32_to_fp16;
using tessera::fp16_to_f32;

const char* g_last_error = "";

// CUDA graph capture: while a stream is being captured, the ops (the list's OP entries) are
// recorded (with copies of their arguments, as a kernel launch copies its parameters) instead of
// run; a graph replays them in order. Copies and synchronizations during a capture fail, as they
// do on a device.
using Graph = std::vector<std::function<int()>>;
// initial-exec: this library is dlopen-ed, and LeakSanitizer (GCC 12, glibc 2.36) crashes at exit on
// the dynamic-TLS blocks __tls_get_addr hands out to such libraries; a static-TLS slot avoids them.
__attribute__((tls_model("initial-exec"))) thread_local Graph* g_capture = nullptr;

int record(std::function<int()> op) {
  g_capture->push_back(std::move(op));
  return 0;
}

int fail(const char* message) {
  g_last_error = message;
  return -1;
}

// What a recorded call keeps of one argument: its value (scalars, device pointers, the stream),
// or for an op's argument struct (`const TesseraCuda...Args*`, host memory read during the call,
// cuda_api.h) a copy of the struct, so the caller may reuse its struct once the call returns.
template <class T>
struct KeptArg {
  explicit KeptArg(T v) : value(v) {}
  T get() const { return value; }
  T value;
};
template <class T>
  requires std::is_class_v<T>
struct KeptArg<const T*> {
  explicit KeptArg(const T* p) : value(p ? std::optional<T>(*p) : std::nullopt) {}
  const T* get() const { return value ? &*value : nullptr; }
  std::optional<T> value;
};

// The checks an entry point makes on the host when it is called, before anything is enqueued, so
// they fail the call itself, also during a capture (the real library's do). None by default; an
// op with such checks specializes CallCheck (at the end of this file) with
// `static constexpr auto run = <a function of the op's parameters returning 0 or fail(...)>`.
template <auto Op>
struct CallCheck {
  static int run(auto...) { return 0; }
};

// An exported op: its call checks, then a record of the call (arguments kept as above) while the
// calling thread captures a graph, else the op itself. The replay runs Op on the kept arguments.
template <auto Op, class... A>
int run_or_record(A... args) {
  if (int rc = CallCheck<Op>::run(args...); rc != 0) return rc;
  if (!g_capture) return Op(args...);
  return record([kept = std::tuple<KeptArg<A>...>(KeptArg<A>(args)...)] {
    return std::apply([](const KeptArg<A>&... k) { return Op(k.get()...); }, kept);
  });
}

// A KV cache of kv_dtype elements (fp32, or fp16 widened exactly as it is read).
struct KvView {
  const void* data;
  int32_t dtype;
  float operator[](int64_t i) const {
    return dtype == TESSERA_CUDA_F16 ? fp16_to_f32(static_cast<const uint16_t*>(data)[i])
                                     : static_cast<const float*>(data)[i];
  }
};
// Stores x into element i of a kv_dtype cache (fp16: rounded to nearest even).
void kv_store(void* cache, int32_t dtype, int64_t i, float x) {
  if (dtype == TESSERA_CUDA_F16) static_cast<uint16_t*>(cache)[i] = f32_to_fp16(x);
  else static_cast<float*>(cache)[i] = x;
}
bool bad_kv_dtype(int32_t dtype) { return dtype != TESSERA_CUDA_F32 && dtype != TESSERA_CUDA_F16; }

// Softmax-weighted sum over the keys [first, last] of one (sequence, query head).
void attend(const float* q, float* out, KvView k_cache, KvView v_cache, const int32_t* table,
            int64_t first, int64_t last, int64_t hd, int64_t n_kv, int64_t kv_head, int64_t block_size, float scale) {
  auto offset = [&](int64_t key) {
    return ((static_cast<int64_t>(table[key / block_size]) * block_size + key % block_size) * n_kv + kv_head) * hd;
  };
  std::vector<float> scores;
  float m = -INFINITY;
  for (int64_t key = first; key <= last; ++key) {
    float dot = 0.0f;
    for (int64_t i = 0; i < hd; ++i) dot += q[i] * k_cache[offset(key) + i];
    scores.push_back(dot * scale);
    m = std::max(m, dot * scale);
  }
  double sum = 0.0;
  for (float& s : scores) sum += (s = std::exp(s - m));
  for (int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
  for (int64_t key = first; key <= last; ++key)
    for (int64_t i = 0; i < hd; ++i)
      out[i] += scores[static_cast<size_t>(key - first)] * v_cache[offset(key) + i] / static_cast<float>(sum);
}

// ---- quant_gemm_tc.cu, emulated step by step ----
// The same grid (64 weight rows x 8 kNT tokens per block), 4 warps of 32 lanes, 128-column chunks
// staged into a shared-memory image xs, and per k-step the A / B fragment registers each lane
// fills; the mma itself assembles A, B and C from the 32 lanes' registers with the PTX ISA's
// m16n8k16 f16 fragment layout and writes D back the same way. Shared memory the kernel never
// writes holds NaN, so reading a wrong xs position shows.
constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcWarpRows = 16;
constexpr int kTcBlockRows = kTcWarpRows * kTcWarps;
constexpr int kTcChunkCols = 128;
constexpr int kTcLaneCols = 32;
constexpr int kTcKSteps = kTcChunkCols / 16;
constexpr int kTcXsStride = kTcChunkCols + 8;

int tc_xs_offset(int c) { return c + ((c >> 6) << 2); }
uint32_t pack_half2(uint16_t lo, uint16_t hi) { return lo | (static_cast<uint32_t>(hi) << 16); }
float half_of(uint32_t reg, int h) { return fp16_to_f32(static_cast<uint16_t>(reg >> (16 * h))); }

int tc_token_tiles(int64_t n) { return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8; }

// Lane q's 16 bytes of a row per chunk = columns c0 + 32q + [0, 32).
struct TcW4 {
  const uint8_t* w;
  const uint16_t* scales;
  const uint8_t* zeros;
  int64_t rows, cols;
  struct Raw {
    uint8_t bytes[16];
  };
  struct Params {
    float z, d;
  };
  Raw load(int64_t r, int64_t c0, int q) const {
    Raw raw{};
    if (r < rows) std::memcpy(raw.bytes, w + r * (cols / 2) + (c0 + kTcLaneCols * q) / 2, sizeof(raw.bytes));
    return raw;
  }
  Params params(int64_t r, int64_t c0) const {
    if (r >= rows) return {0.0f, 0.0f};
    const int64_t g = r * (cols / kTcChunkCols) + c0 / kTcChunkCols;
    return {static_cast<float>(zeros[g]), fp16_to_f32(scales[g])};
  }
  // Columns 32q + 4s + 2h + {0, 1}: the nibbles of byte 2s + h, each rounded to f16 once.
  uint32_t fragment(const Raw& raw, const Params& p, int s, int h) const {
    const uint8_t byte = raw.bytes[2 * s + h];
    return pack_half2(f32_to_fp16((static_cast<float>(byte & 15) - p.z) * p.d),
                      f32_to_fp16((static_cast<float>(byte >> 4) - p.z) * p.d));
  }
  float row_scale(int64_t) const { return 1.0f; }
};

// Lane q's 32 bytes of a row per chunk = columns c0 + 32q + [0, 32), two 16-byte loads.
struct TcW8 {
  const int8_t* w;
  const float* scales;
  int64_t rows, cols;
  struct Raw {
    int8_t bytes[32];
  };
  struct Params {};
  Raw load(int64_t r, int64_t c0, int q) const {
    Raw raw{};
    const int64_t c = c0 + kTcLaneCols * q;
    if (r >= rows) return raw;
    if (c < cols) std::memcpy(raw.bytes, w + r * cols + c, 16);
    if (c + 16 < cols) std::memcpy(raw.bytes + 16, w + r * cols + c + 16, 16);
    return raw;
  }
  Params params(int64_t, int64_t) const { return {}; }
  uint32_t fragment(const Raw& raw, const Params&, int s, int h) const {
    return pack_half2(f32_to_fp16(raw.bytes[4 * s + 2 * h]), f32_to_fp16(raw.bytes[4 * s + 2 * h + 1]));
  }
  float row_scale(int64_t r) const { return r < rows ? scales[r] : 0.0f; }
};

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 d, a, b, d over the 32 lanes' registers.
void tc_mma(float (*d)[4], const uint32_t (*a)[4], const uint32_t (*b)[2]) {
  float A[16][16], B[16][8], D[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, q = lane & 3;
    for (int i = 0; i < 8; ++i) {  // a_i: register i / 2, half i & 1
      const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
      const int col = 2 * q + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = half_of(a[lane][i / 2], i & 1);
    }
    for (int i = 0; i < 4; ++i) B[2 * q + (i & 1) + (i >= 2 ? 8 : 0)][g] = half_of(b[lane][i / 2], i & 1);
    for (int i = 0; i < 4; ++i) D[i < 2 ? g : g + 8][2 * q + (i & 1)] = d[lane][i];
  }
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n)
      for (int k = 0; k < 16; ++k) D[m][n] += A[m][k] * B[k][n];
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) d[lane][i] = D[i < 2 ? lane >> 2 : (lane >> 2) + 8][2 * (lane & 3) + (i & 1)];
}

template <class Weights>
void tc_gemm(const Weights& wq, const uint16_t* x, float* y, int64_t n_tokens) {
  const int64_t rows = wq.rows, cols = wq.cols;
  const int nt = tc_token_tiles(n_tokens), bn = 8 * nt;
  const int64_t grid_x = (rows + kTcBlockRows - 1) / kTcBlockRows, grid_y = (n_tokens + bn - 1) / bn;
  std::vector<uint16_t> xs(static_cast<size_t>(bn * kTcXsStride));
  // acc[warp][j][lane][4]
  std::vector<float> acc_store(static_cast<size_t>(kTcWarps * nt * 32 * 4));
  auto acc = [&](int warp, int j) {
    return reinterpret_cast<float(*)[4]>(&acc_store[static_cast<size_t>((warp * nt + j) * 32 * 4)]);
  };
  std::vector<typename Weights::Raw> raw_lo(kTcThreads), raw_hi(kTcThreads);
  std::vector<typename Weights::Params> p_lo(kTcThreads), p_hi(kTcThreads);
  for (int64_t by = 0; by < grid_y; ++by)
    for (int64_t bx = 0; bx < grid_x; ++bx) {
      std::fill(acc_store.begin(), acc_store.end(), 0.0f);
      std::fill(xs.begin(), xs.end(), static_cast<uint16_t>(0x7e00));  // NaN: never written
      const int64_t t0 = by * bn;
      auto warp_row0 = [&](int warp) { return bx * kTcBlockRows + warp * kTcWarpRows; };
      for (int64_t c0 = 0; c0 < cols; c0 += kTcChunkCols) {
        // 1. raw weight loads
        for (int tid = 0; tid < kTcThreads; ++tid) {
          const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
          if (warp_row0(warp) >= rows) continue;
          const int64_t row_lo = warp_row0(warp) + g, row_hi = row_lo + 8;
          raw_lo[tid] = wq.load(row_lo, c0, q);
          raw_hi[tid] = wq.load(row_hi, c0, q);
          p_lo[tid] = wq.params(row_lo, c0);
          p_hi[tid] = wq.params(row_hi, c0);
        }
        // 2. staging: thread tid copies 16-byte vectors e = tid, tid + 128, ... as two 8-byte pieces
        constexpr int kVectors = kTcChunkCols / 8;
        for (int tid = 0; tid < kTcThreads; ++tid)
          for (int e = tid; e < bn * kVectors; e += kTcThreads) {
            const int t = e / kVectors, c = 8 * (e % kVectors);
            uint16_t v[8] = {};
            if (t0 + t < n_tokens && c0 + c < cols) std::memcpy(v, x + (t0 + t) * cols + c0 + c, sizeof(v));
            std::memcpy(&xs[static_cast<size_t>(t * kTcXsStride + tc_xs_offset(c))], v, 8);
            std::memcpy(&xs[static_cast<size_t>(t * kTcXsStride + tc_xs_offset(c + 4))], v + 4, 8);
          }
        // 3. k-steps: fragments per lane, one mma per token tile
        for (int warp = 0; warp < kTcWarps; ++warp) {
          if (warp_row0(warp) >= rows) continue;
          for (int s = 0; s < kTcKSteps; ++s) {
            uint32_t a[32][4];
            for (int lane = 0; lane < 32; ++lane) {
              const int tid = 32 * warp + lane;
              a[lane][0] = wq.fragment(raw_lo[tid], p_lo[tid], s, 0);
              a[lane][1] = wq.fragment(raw_hi[tid], p_hi[tid], s, 0);
              a[lane][2] = wq.fragment(raw_lo[tid], p_lo[tid], s, 1);
              a[lane][3] = wq.fragment(raw_hi[tid], p_hi[tid], s, 1);
            }
            for (int j = 0; j < nt; ++j) {
              uint32_t b[32][2];
              for (int lane = 0; lane < 32; ++lane) {
                const int g = lane >> 2, q = lane & 3;
                const int offset = (8 * j + g) * kTcXsStride + tc_xs_offset(kTcLaneCols * q + 4 * s);
                const uint16_t* p = &xs[static_cast<size_t>(offset)];
                b[lane][0] = pack_half2(p[0], p[1]);
                b[lane][1] = pack_half2(p[2], p[3]);
              }
              tc_mma(acc(warp, j), a, b);
            }
          }
        }
      }
      // epilogue
      for (int warp = 0; warp < kTcWarps; ++warp) {
        if (warp_row0(warp) >= rows) continue;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, q = lane & 3;
          const int64_t row_lo = warp_row0(warp) + g, row_hi = row_lo + 8;
          const float scale_lo = wq.row_scale(row_lo), scale_hi = wq.row_scale(row_hi);
          for (int j = 0; j < nt; ++j)
            for (int e = 0; e < 2; ++e) {
              const int64_t t = t0 + 8 * j + 2 * q + e;
              if (t >= n_tokens) continue;
              const float* c = acc(warp, j)[lane];
              if (row_lo < rows) y[t * rows + row_lo] = c[e] * scale_lo;
              if (row_hi < rows) y[t * rows + row_hi] = c[2 + e] * scale_hi;
            }
        }
      }
    }
}

int tc_check(const void* w, const void* x, int64_t rows, int64_t cols, int64_t n, int64_t col_multiple,
             const char* message) {
  if (rows < 0 || cols < 0 || n < 0 || cols % col_multiple != 0 || (n + 63) / 64 > 65535) return fail(message);
  if (rows == 0 || n == 0 || cols == 0) return 0;
  if ((reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(x)) % 16 != 0)
    return fail("tessera_cuda_gemm_w*a16_tc: w and x must be 16-byte aligned");
  return 0;
}

// ---- gguf_gemm.cu, emulated step by step ----
// Pieces of 256 columns (one K-quant super-block or 8 blocks of 32), lane l's slot i = column
// 32i + l of the piece, each weight decoded as the kernel's decode_piece does; the GEMM keeps
// one fma accumulator per (lane, token) in piece order, then slot order, 0-padded activations
// past cols, and sums the lanes with the kernel's xor butterfly.
static_assert(TESSERA_CUDA_GGUF_Q8_0 == static_cast<int>(tessera::QuantType::kQ8_0) &&
                  TESSERA_CUDA_GGUF_Q4_0 == static_cast<int>(tessera::QuantType::kQ4_0) &&
                  TESSERA_CUDA_GGUF_Q5_0 == static_cast<int>(tessera::QuantType::kQ5_0) &&
                  TESSERA_CUDA_GGUF_Q4_K == static_cast<int>(tessera::QuantType::kQ4_K) &&
                  TESSERA_CUDA_GGUF_Q5_K == static_cast<int>(tessera::QuantType::kQ5_K) &&
                  TESSERA_CUDA_GGUF_Q6_K == static_cast<int>(tessera::QuantType::kQ6_K) &&
                  TESSERA_CUDA_GGUF_Q2_K == static_cast<int>(tessera::QuantType::kQ2_K) &&
                  TESSERA_CUDA_GGUF_Q3_K == static_cast<int>(tessera::QuantType::kQ3_K) &&
                  TESSERA_CUDA_GGUF_TQ1_0 == static_cast<int>(tessera::QuantType::kTQ1_0) &&
                  TESSERA_CUDA_GGUF_TQ2_0 == static_cast<int>(tessera::QuantType::kTQ2_0),
              "the GGUF type ids of cuda_api.h are tessera::QuantType's values");
constexpr int kGgufPiece = 256;

struct GgufFormat {
  int elems = 0, bytes = 0;
};
// The geometry of a type the kernels read as stored (common/dtype.h's table); {} for others.
GgufFormat gguf_format(int type) {
  if (type < 0 || type >= static_cast<int>(tessera::QuantType::kCount)) return {};
  const tessera::QuantTraits& tr = tessera::quant_traits(static_cast<tessera::QuantType>(type));
  if (tr.cuda != tessera::CudaWeightForm::kBlocks) return {};
  return {tr.block_elems, tr.block_bytes};
}

float gguf_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

// The low-bit formats' element decoders of gguf_gemm.cu (kernels/cpu/quant.cpp's, line for line).
int gguf_plane2(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3; }
int gguf_q3_k_scale(const uint8_t* s, int j) {
  const int low = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
  const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}
int gguf_tq1_trit(uint8_t byte, int p) {
  const int pow3 = p == 0 ? 1 : p == 1 ? 3 : p == 2 ? 9 : p == 3 ? 27 : 81;
  const auto shifted = static_cast<uint8_t>(byte * pow3);
  return ((shifted * 3) >> 8) - 1;
}
bool gguf_low_bit(int type) {
  return type == TESSERA_CUDA_GGUF_Q2_K || type == TESSERA_CUDA_GGUF_Q3_K || type == TESSERA_CUDA_GGUF_TQ1_0 ||
         type == TESSERA_CUDA_GGUF_TQ2_0;
}
// Element e of the super-block at blk (decode_low_bit).
float gguf_decode_low_bit(int type, const uint8_t* blk, int e) {
  if (type == TESSERA_CUDA_GGUF_Q2_K) {
    const float d = gguf_half(blk + 80), dmin = gguf_half(blk + 82);
    const float dl = d * static_cast<float>(blk[e / 16] & 0xF);
    const float ml = dmin * static_cast<float>(blk[e / 16] >> 4);
    return dl * static_cast<float>(gguf_plane2(blk + 16, e)) - ml;
  }
  if (type == TESSERA_CUDA_GGUF_Q3_K) {
    const float dl = gguf_half(blk + 108) * static_cast<float>(gguf_q3_k_scale(blk + 96, e / 16));
    const int high = (blk[e % 32] >> (e / 32)) & 1;
    return dl * static_cast<float>(gguf_plane2(blk + 32, e) - (high ? 0 : 4));
  }
  if (type == TESSERA_CUDA_GGUF_TQ1_0) {
    const float d = gguf_half(blk + 52);
    if (e < 160) return d * static_cast<float>(gguf_tq1_trit(blk[e % 32], e / 32));
    if (e < 240) return d * static_cast<float>(gguf_tq1_trit(blk[32 + (e - 160) % 16], (e - 160) / 16));
    return d * static_cast<float>(gguf_tq1_trit(blk[48 + (e - 240) % 4], (e - 240) / 4));
  }
  return gguf_half(blk + 64) * static_cast<float>(gguf_plane2(blk, e) - 1);  // TQ2_0
}

// v[i] = weight of column 256 piece + 32 i + lane; 0 for blocks past n_blocks.
void gguf_decode_piece(int type, const uint8_t* row, int64_t piece, int64_t n_blocks, int lane, float v[8]) {
  const GgufFormat f = gguf_format(type);
  for (int i = 0; i < 8; ++i) {
    if (f.elems == 32) {
      const int64_t b = piece * 8 + i;
      if (b >= n_blocks) {
        v[i] = 0.0f;
        continue;
      }
      const uint8_t* blk = row + b * f.bytes;
      const float d = gguf_half(blk);
      if (type == TESSERA_CUDA_GGUF_Q8_0) {
        v[i] = d * static_cast<float>(static_cast<int8_t>(blk[2 + lane]));
      } else if (type == TESSERA_CUDA_GGUF_Q4_0) {
        const uint8_t byte = blk[2 + (lane & 15)];
        v[i] = static_cast<float>((lane < 16 ? (byte & 0xF) : (byte >> 4)) - 8) * d;
      } else {
        uint32_t qh;
        std::memcpy(&qh, blk + 2, 4);
        const uint8_t byte = blk[6 + (lane & 15)];
        const int q = (lane < 16 ? (byte & 0xF) : (byte >> 4)) | static_cast<int>(((qh >> lane) & 1u) << 4);
        v[i] = static_cast<float>(q - 16) * d;
      }
    } else if (gguf_low_bit(type)) {
      v[i] = gguf_decode_low_bit(type, row + piece * f.bytes, 32 * i + lane);
    } else if (type == TESSERA_CUDA_GGUF_Q6_K) {
      const uint8_t* blk = row + piece * f.bytes;
      const float d = gguf_half(blk + 208);
      const int h = i / 4, g = i % 4;
      const uint8_t lb = blk[64 * h + 32 * (g % 2) + lane];
      const uint8_t hb = blk[128 + 32 * h + lane];
      const int q = (((lb >> (g < 2 ? 0 : 4)) & 0xF) | (((hb >> (2 * g)) & 3) << 4)) - 32;
      const float scale = d * static_cast<float>(static_cast<int8_t>(blk[192 + 8 * h + 2 * g + lane / 16]));
      v[i] = scale * static_cast<float>(q);
    } else {
      const bool high_bit = type == TESSERA_CUDA_GGUF_Q5_K;
      const uint8_t* blk = row + piece * f.bytes;
      const float d = gguf_half(blk), dmin = gguf_half(blk + 2);
      const uint8_t* s = blk + 4;
      int sc, m;
      if (i < 4) {
        sc = s[i] & 63;
        m = s[i + 4] & 63;
      } else {
        sc = (s[i + 4] & 0xF) | ((s[i - 4] >> 6) << 4);
        m = (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
      }
      const uint8_t byte = blk[(high_bit ? 48 : 16) + 32 * (i / 2) + lane];
      int q = i % 2 == 0 ? (byte & 0xF) : (byte >> 4);
      if (high_bit) q |= ((blk[16 + lane] >> i) & 1) << 4;
      v[i] = (d * static_cast<float>(sc)) * static_cast<float>(q) - dmin * static_cast<float>(m);
    }
  }
}

char g_gguf_message[256];

int gguf_check(const char* op, int type, const void* w, int64_t row_bytes, int64_t rows, int64_t cols) {
  const GgufFormat f = gguf_format(type);
  if (f.elems == 0) {
    std::snprintf(g_gguf_message, sizeof(g_gguf_message), "%s: weight type %d is not a supported GGUF block type",
                  op, type);
    return fail(g_gguf_message);
  }
  if (rows < 0 || cols < 0 || cols % f.elems != 0 || row_bytes < cols / f.elems * f.bytes || row_bytes % 2 != 0 ||
      (reinterpret_cast<uintptr_t>(w) & 1) != 0) {
    std::snprintf(g_gguf_message, sizeof(g_gguf_message), "%s: bad sizes for GGUF type %d", op, type);
    return fail(g_gguf_message);
  }
  return 0;
}

// ---- sampling.cu's sampler (tessera_cuda_sample_f32) as a plain sequential algorithm ----
// The kernel's result is defined by orders and integer sums, not by its radix select: sort, walk,
// stop at the first element whose running 2^-43 fixed-point mass reaches the target. Only the
// logprobs' double sum runs in another order (a tree on the device).

// Order-preserving key of a non-NaN logit, -0 == +0 (the kernel's logit_key).
uint32_t sample_logit_key(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
uint32_t sample_weight_key(float w) {
  uint32_t b;
  std::memcpy(&b, &w, sizeof(b));
  return b;
}
// round-to-nearest-even(w * 2^43)
uint64_t sample_fixed_weight(float w) { return static_cast<uint64_t>(std::nearbyint(static_cast<double>(w) * 0x1p43)); }

void sample_row(const TesseraCudaSampleArgs& a, int64_t r) {
  const int64_t n = a.vocab;
  float* x = a.logits + r * n;
  float* w = a.scratch + r * n;
  const TesseraCudaSampleRow& row = a.rows[r];
  // 1. penalties
  if (a.penalties) {
    for (int64_t e = row.penalty_begin; e < row.penalty_end; ++e) {
      const TesseraCudaPenalty& p = a.penalties[e];
      if (p.id < 0 || p.id >= n) continue;
      float v = p.banned ? -INFINITY : x[p.id];
      const float rep = row.repetition_penalty;
      if (rep != 1.0f && (p.in_prompt || p.out_count > 0)) v = v > 0.0f ? v / rep : v * rep;
      if ((row.presence_penalty != 0.0f || row.frequency_penalty != 0.0f) && p.out_count > 0) {
        const float penalty = row.presence_penalty + row.frequency_penalty * static_cast<float>(p.out_count);
        v -= penalty;
      }
      x[p.id] = v;
    }
  }
  // 2. sanitize, argmax
  int64_t argmax = 0;
  uint32_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) x[i] = -INFINITY;
    if (x[i] == INFINITY) x[i] = FLT_MAX;
    if (sample_logit_key(x[i]) > best) {
      best = sample_logit_key(x[i]);
      argmax = i;
    }
  }
  float max_logit = x[argmax];
  if (best == sample_logit_key(-INFINITY)) {
    std::fill(x, x + n, 0.0f);
    max_logit = 0.0f;
  }
  auto logit_before = [&](int64_t i, int64_t j) {  // (x desc, id asc)
    const uint32_t ki = sample_logit_key(x[i]), kj = sample_logit_key(x[j]);
    return ki > kj || (ki == kj && i < j);
  };
  auto weight_before = [&](int64_t i, int64_t j) {  // (w desc, id asc)
    const uint32_t ki = sample_weight_key(w[i]), kj = sample_weight_key(w[j]);
    return ki > kj || (ki == kj && i < j);
  };
  // 3. logprobs
  const int64_t n_top = std::min<int64_t>(std::clamp<int64_t>(row.n_logprobs, 0, TESSERA_CUDA_MAX_TOP_LOGPROBS), n);
  const bool want_logprobs = row.want_logprob != 0 || n_top > 0;
  double log_sum_exp = 0.0;
  if (want_logprobs) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i)
      sum += tessera::sampling_exp(static_cast<double>(x[i]) - static_cast<double>(max_logit));
    log_sum_exp = static_cast<double>(max_logit) + std::log(sum);
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
    std::partial_sort(order.begin(), order.begin() + n_top, order.end(), logit_before);
    for (int64_t j = 0; j < n_top; ++j) {
      const int64_t id = order[static_cast<size_t>(j)];
      a.top_ids[r * TESSERA_CUDA_MAX_TOP_LOGPROBS + j] = static_cast<int32_t>(id);
      a.top_logprobs[r * TESSERA_CUDA_MAX_TOP_LOGPROBS + j] =
          static_cast<float>(static_cast<double>(x[id]) - log_sum_exp);
    }
  }
  // 4. the token
  int64_t chosen = argmax;
  if (row.temperature != 0.0f) {
    const double temperature = row.temperature;
    for (int64_t i = 0; i < n; ++i)
      w[i] = static_cast<float>(
          tessera::sampling_exp((static_cast<double>(x[i]) - static_cast<double>(max_logit)) / temperature));
    const bool use_top_k = row.top_k > 0 && row.top_k < n;
    const bool use_top_p = row.top_p < 1.0f;
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;
    if (use_top_k) {  // the top_k first in (x desc, id asc) order, back in id order
      std::nth_element(ids.begin(), ids.begin() + (row.top_k - 1), ids.end(), logit_before);
      const int64_t kth = ids[static_cast<size_t>(row.top_k - 1)];
      ids.clear();
      for (int64_t i = 0; i < n; ++i)
        if (i == kth || logit_before(i, kth)) ids.push_back(i);
    }
    uint64_t mass = 0;  // of the top-k set
    for (int64_t i : ids) mass += sample_fixed_weight(w[i]);
    if (row.min_p > 0.0f)
      ids.erase(std::remove_if(ids.begin(), ids.end(), [&](int64_t i) { return !(w[i] >= row.min_p); }), ids.end());
    if (use_top_k || use_top_p) std::sort(ids.begin(), ids.end(), weight_before);
    if (use_top_p) {  // the first element whose running mass reaches the target ends the prefix
      const auto target = static_cast<uint64_t>(std::ceil(static_cast<double>(row.top_p) * static_cast<double>(mass)));
      uint64_t run = 0;
      for (size_t j = 0; j < ids.size(); ++j) {
        run += sample_fixed_weight(w[ids[j]]);
        if (run >= target) {
          ids.resize(j + 1);
          break;
        }
      }
    }
    uint64_t kept = 0;
    for (int64_t i : ids) kept += sample_fixed_weight(w[i]);
    double scaled = std::floor(row.u * static_cast<double>(kept));
    if (!(scaled >= 0.0)) scaled = 0.0;
    uint64_t below = scaled >= static_cast<double>(kept) ? kept : static_cast<uint64_t>(scaled);
    if (below > kept - 1) below = kept - 1;
    uint64_t run = 0;
    for (int64_t i : ids) {
      run += sample_fixed_weight(w[i]);
      if (run > below) {
        chosen = i;
        break;
      }
    }
  }
  a.ids[r] = static_cast<int32_t>(chosen);
  a.logprobs[r] = want_logprobs ? static_cast<float>(static_cast<double>(x[chosen]) - log_sum_exp) : 0.0f;
}

}  // namespace

extern "C" {

int tessera_cuda_device_count() { return 1; }
const char* tessera_cuda_last_error() { return g_last_error; }
int tessera_cuda_set_device(int) { return 0; }
int tessera_cuda_device_info(int, char* name, int cap, int* major, int* minor) {
  std::snprintf(name, static_cast<size_t>(cap), "fake CPU backend");
  *major = 8;
  *minor = 0;
  return 0;
}
int tessera_cuda_malloc(void** p, int64_t bytes) {
  *p = std::malloc(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
  if (!*p) return fail("fake malloc failed");
  std::memset(*p, 0x7f, static_cast<size_t>(bytes));  // garbage, as fresh device memory may hold
  return 0;
}
int tessera_cuda_free(void* p) {
  std::free(p);
  return 0;
}
int tessera_cuda_memcpy(void* dst, const void* src, int64_t bytes) {
  if (g_capture) return fail("fake backend: a copy during a graph capture");
  std::memcpy(dst, src, static_cast<size_t>(bytes));
  return 0;
}
int tessera_cuda_memcpy_async(void* dst, const void* src, int64_t bytes, void*) {
  return tessera_cuda_memcpy(dst, src, bytes);
}
int tessera_cuda_memset(void* p, int value, int64_t bytes) {
  std::memset(p, value, static_cast<size_t>(bytes));
  return 0;
}
int tessera_cuda_device_synchronize() { return 0; }
int tessera_cuda_stream_create(void** s) {
  static int token;
  *s = &token;
  return 0;
}
int tessera_cuda_stream_destroy(void*) { return 0; }
int tessera_cuda_stream_synchronize(void*) {
  if (g_capture) return fail("fake backend: stream synchronization during a graph capture");
  return 0;
}
int tessera_cuda_graph_begin_capture(void* stream) {
  if (!stream) return fail("fake backend: the legacy stream cannot be captured");
  if (g_capture) return fail("fake backend: already capturing");
  g_capture = new Graph;
  return 0;
}
int tessera_cuda_graph_end_capture(void*, void** graph_exec) {
  if (!g_capture) return fail("fake backend: not capturing");
  *graph_exec = g_capture;
  g_capture = nullptr;
  return 0;
}
int tessera_cuda_graph_launch(void* graph_exec, void*) {
  if (g_capture) return fail("fake backend: graph launch during a capture");
  for (auto& op : *static_cast<Graph*>(graph_exec))
    if (int rc = op(); rc != 0) return rc;
  return 0;
}
int tessera_cuda_graph_destroy(void* graph_exec) {
  delete static_cast<Graph*>(graph_exec);
  return 0;
}
int tessera_cuda_event_create(void** e) { return tessera_cuda_stream_create(e); }
int tessera_cuda_event_destroy(void*) { return 0; }
int tessera_cuda_event_record(void*, void*) { return 0; }
int tessera_cuda_event_elapsed_ms(void*, void*, float* ms) {
  *ms = 1.0f;
  return 0;
}
int tessera_cuda_mem_get_info(int64_t* free_bytes, int64_t* total_bytes) {
  *free_bytes = int64_t{1} << 30;
  *total_bytes = int64_t{2} << 30;
  return 0;
}

// NCCL between processes on this host through a POSIX shared-memory segment named by the
// unique id: every collective copies this rank's data into its slot, meets the other ranks at
// a barrier, reads the slots in rank order (so every rank computes the same sums) and meets
// them again before a slot may be reused. Synchronous, like every op here; recorded during a
// graph capture like the kernels. TESSERA_FAKE_NCCL=0 makes it report "built without NCCL".
int tessera_nccl_available() {
  const char* env = std::getenv("TESSERA_FAKE_NCCL");
  return env && std::strcmp(env, "0") == 0 ? 0 : 1;
}
int64_t tessera_nccl_unique_id_bytes() { return tessera_nccl_available() ? 128 : 0; }
int tessera_nccl_get_unique_id(void* id, int64_t id_bytes) {
  if (!tessera_nccl_available()) return fail("fake backend: built without NCCL (TESSERA_FAKE_NCCL=0)");
  if (id_bytes < 64) return fail("fake NCCL: unique id buffer too small");
  static std::atomic<int> counter{0};
  std::memset(id, 0, static_cast<size_t>(id_bytes));
  std::snprintf(static_cast<char*>(id), static_cast<size_t>(id_bytes), "/tessera_fake_nccl_%d_%d",
                static_cast<int>(::getpid()), counter.fetch_add(1));
  return 0;
}

namespace {

constexpr int64_t kFakeNcclMaxRanks = 8;
constexpr int64_t kFakeNcclSlotBytes = int64_t{16} << 20;  // per rank; sparse until touched

struct FakeNcclShared {
  std::atomic<int64_t> arrived;
  std::atomic<int64_t> generation;
};

struct FakeNcclComm {
  std::string name;
  int rank = 0, nranks = 1;
  size_t bytes = 0;
  FakeNcclShared* shared = nullptr;
  uint8_t* slots = nullptr;  // nranks x kFakeNcclSlotBytes
  uint8_t* slot(int r) const { return slots + static_cast<int64_t>(r) * kFakeNcclSlotBytes; }
};

// Every rank arrives; the last one starts the next generation. Gives up after 60 s (a rank died).
int fake_barrier(FakeNcclComm* c) {
  const int64_t gen = c->shared->generation.load();
  if (c->shared->arrived.fetch_add(1) + 1 == c->nranks) {
    c->shared->arrived.store(0);
    c->shared->generation.fetch_add(1);
    return 0;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (c->shared->generation.load() == gen) {
    if (std::chrono::steady_clock::now() > deadline) return fail("fake NCCL: a rank never reached the barrier");
    std::this_thread::yield();
  }
  return 0;
}

int fake_check_size(int64_t bytes) {
  return bytes < 0 || bytes > kFakeNcclSlotBytes ? fail("fake NCCL: a collective larger than its 16 MiB slot") : 0;
}

}  // namespace

int tessera_nccl_comm_init(void** comm, const void* id, int64_t id_bytes, int rank, int nranks, int) {
  if (!tessera_nccl_available()) return fail("fake backend: built without NCCL (TESSERA_FAKE_NCCL=0)");
  if (nranks < 1 || nranks > kFakeNcclMaxRanks || rank < 0 || rank >= nranks || id_bytes < 64)
    return fail("fake NCCL: bad rank / size / id");
  auto* c = new FakeNcclComm;
  c->name.assign(static_cast<const char*>(id), strnlen(static_cast<const char*>(id), static_cast<size_t>(id_bytes)));
  c->rank = rank;
  c->nranks = nranks;
  c->bytes = sizeof(FakeNcclShared) + 64 + static_cast<size_t>(nranks * kFakeNcclSlotBytes);
  const int fd = ::shm_open(c->name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(c->bytes)) != 0) {
    if (fd >= 0) ::close(fd);
    delete c;
    return fail("fake NCCL: cannot create the shared-memory segment");
  }
  void* p = ::mmap(nullptr, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    delete c;
    return fail("fake NCCL: cannot map the shared-memory segment");
  }
  c->shared = static_cast<FakeNcclShared*>(p);  // zero-filled by ftruncate: 0 arrived, generation 0
  c->slots = static_cast<uint8_t*>(p) + sizeof(FakeNcclShared) + 64;
  if (int rc = fake_barrier(c); rc != 0) return rc;  // all ranks mapped it
  if (rank == 0) ::shm_unlink(c->name.c_str());    // the mappings stay; the name goes
  *comm = c;
  return 0;
}
int tessera_nccl_comm_destroy(void* comm) {
  auto* c = static_cast<FakeNcclComm*>(comm);
  if (!c) return 0;
  ::munmap(c->shared, c->bytes);
  delete c;
  return 0;
}
int tessera_cuda_blas_create(void** handle) { return tessera_cuda_stream_create(handle); }
int tessera_cuda_blas_destroy(void*) { return 0; }

}  // extern "C"

// ---- the ops (OP entries of the list): implementations, exported at the end of this file ----
namespace {
namespace fake_op {

int tessera_nccl_all_reduce_sum_f32(void* comm, const float* send, float* recv, int64_t count, void* stream) {
  auto* c = static_cast<FakeNcclComm*>(comm);
  if (int rc = fake_check_size(count * 4); rc != 0) return rc;
  std::memcpy(c->slot(c->rank), send, static_cast<size_t>(count) * 4);
  if (int rc = fake_barrier(c); rc != 0) return rc;
  for (int64_t i = 0; i < count; ++i) {
    float sum = 0.0f;
    for (int r = 0; r < c->nranks; ++r) sum += reinterpret_cast<const float*>(c->slot(r))[i];
    recv[i] = sum;
  }
  return fake_barrier(c);
}
int tessera_nccl_all_gather(void* comm, const void* send, void* recv, int64_t bytes, void* stream) {
  auto* c = static_cast<FakeNcclComm*>(comm);
  if (int rc = fake_check_size(bytes); rc != 0) return rc;
  std::memcpy(c->slot(c->rank), send, static_cast<size_t>(bytes));
  if (int rc = fake_barrier(c); rc != 0) return rc;
  for (int r = 0; r < c->nranks; ++r)
    std::memcpy(static_cast<uint8_t*>(recv) + static_cast<int64_t>(r) * bytes, c->slot(r), static_cast<size_t>(bytes));
  return fake_barrier(c);
}
int tessera_nccl_broadcast(void* comm, void* data, int64_t bytes, int root, void* stream) {
  auto* c = static_cast<FakeNcclComm*>(comm);
  if (int rc = fake_check_size(bytes); rc != 0) return rc;
  if (root < 0 || root >= c->nranks) return fail("fake NCCL: broadcast root out of range");
  if (c->rank == root) std::memcpy(c->slot(root), data, static_cast<size_t>(bytes));
  if (int rc = fake_barrier(c); rc != 0) return rc;
  if (c->rank != root) std::memcpy(data, c->slot(root), static_cast<size_t>(bytes));
  return fake_barrier(c);
}

int tessera_cuda_rms_norm_f32(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps,
                              void* stream) {
  for (int64_t r = 0; r < n; ++r) {
    float sum = 0.0f;
    for (int64_t i = 0; i < dim; ++i) sum += x[r * dim + i] * x[r * dim + i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] * inv * w[i];
  }
  return 0;
}
int tessera_cuda_add_rms_norm_f32(float* residual, const float* delta, const float* w, float* y, int64_t n, int64_t dim,
                                  float eps, void* stream) {
  for (int64_t i = 0; i < n * dim; ++i) residual[i] += delta[i];
  return tessera_cuda_rms_norm_f32(residual, w, y, n, dim, eps, stream);
}
int tessera_cuda_embedding(const void* table, int table_dtype, int64_t vocab, int64_t dim, const int32_t* ids,
                           int64_t n, void* out, int out_dtype, void* stream) {
  if ((table_dtype != TESSERA_CUDA_F32 && table_dtype != TESSERA_CUDA_F16) ||
      (out_dtype != TESSERA_CUDA_F32 && out_dtype != TESSERA_CUDA_F16))
    return fail("fake backend: embedding dtype must be TESSERA_CUDA_F32 or TESSERA_CUDA_F16");
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < dim; ++i) {
      float v = 0.0f;
      if (ids[t] >= 0 && ids[t] < vocab)
        v = table_dtype == TESSERA_CUDA_F16 ? fp16_to_f32(static_cast<const uint16_t*>(table)[ids[t] * dim + i])
                                            : static_cast<const float*>(table)[ids[t] * dim + i];
      if (out_dtype == TESSERA_CUDA_F16) static_cast<uint16_t*>(out)[t * dim + i] = f32_to_fp16(v);
      else static_cast<float*>(out)[t * dim + i] = v;
    }
  return 0;
}
int tessera_cuda_convert_f32_to_f16(const float* src, uint16_t* dst, int64_t n, void* stream) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_fp16(src[i]);
  return 0;
}
int tessera_cuda_convert_f16_to_f32(const uint16_t* src, float* dst, int64_t n, void* stream) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(src[i]);
  return 0;
}
int tessera_cuda_rope_kv_write_f32(const TesseraCudaRopeKvArgs* a, void* stream) {
  const int64_t hd = a->head_dim, half = hd / 2, row = a->n_kv_heads * hd;
  if (bad_kv_dtype(a->kv_dtype)) return fail("tessera_cuda_rope_kv_write_f32: bad kv_dtype");
  // Rotates pair (i, i + half) of src; put(j, x) stores element j of the rotated head.
  auto rotate = [&](const float* src, int64_t i, float pos, auto put) {
    const float angle = pos * a->inv_freq[i], c = std::cos(angle), s = std::sin(angle);
    const float x0 = src[i], x1 = src[i + half];
    put(i, x0 * c - x1 * s);
    put(i + half, x0 * s + x1 * c);
  };
  for (int64_t t = 0; t < a->n_tokens; ++t) {
    const auto pos = static_cast<float>(a->positions[t]);
    for (int64_t h = 0; h < a->n_heads; ++h) {
      float* qh = a->q + (t * a->n_heads + h) * hd;
      for (int64_t i = 0; i < half; ++i) rotate(qh, i, pos, [qh](int64_t j, float x) { qh[j] = x; });
    }
    const int64_t slot = a->slots[t];
    if (slot < 0 || slot >= a->num_blocks * a->block_size) continue;
    for (int64_t h = 0; h < a->n_kv_heads; ++h)
      for (int64_t i = 0; i < half; ++i)
        rotate(a->k + t * row + h * hd, i, pos,
               [&](int64_t j, float x) { kv_store(a->k_cache, a->kv_dtype, slot * row + h * hd + j, x); });
    for (int64_t e = 0; e < row; ++e) kv_store(a->v_cache, a->kv_dtype, slot * row + e, a->v[t * row + e]);
  }
  return 0;
}
int tessera_cuda_paged_decode_attention_f32(const TesseraCudaDecodeAttentionArgs* a, void* stream) {
  const int64_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
  if (a->n_splits > 1 && (a->split_keys <= 0 || !a->partial)) return fail("fake backend: bad split arguments");
  if (bad_kv_dtype(a->kv_dtype)) return fail("tessera_cuda_paged_decode_attention_f32: bad kv_dtype");
  const KvView k_cache{a->k_cache, a->kv_dtype}, v_cache{a->v_cache, a->kv_dtype};
  for (int64_t s = 0; s < a->n_seqs; ++s)
    for (int64_t h = 0; h < a->n_heads; ++h) {
      const int64_t n = a->seq_lens[s];
      const int64_t first = a->sliding_window > 0 && n > a->sliding_window ? n - a->sliding_window : 0;
      const float* q = a->q + (s * a->n_heads + h) * hd;
      float* out = a->out + (s * a->n_heads + h) * hd;
      const int32_t* table = a->block_tables + s * a->max_blocks_per_seq;
      if (a->n_splits <= 1) {
        attend(q, out, k_cache, v_cache, table, first, n - 1, hd, a->n_kv_heads, h / group, a->block_size,
               a->scale);
        continue;
      }
      // The split kernel: each piece's (acc, m, l) in the partial buffer, then the merge.
      float* part = a->partial + (s * a->n_heads + h) * a->n_splits * (hd + 2);
      for (int64_t p = 0; p < a->n_splits; ++p) {
        float* st = part + p * (hd + 2);
        const int64_t lo = first + p * a->split_keys, hi = std::min(n, lo + a->split_keys);
        float m = -INFINITY, l = 0.0f;
        std::vector<float> acc(static_cast<size_t>(hd), 0.0f);
        for (int64_t key = lo; key < hi; ++key) {
          const int64_t off =
              ((static_cast<int64_t>(table[key / a->block_size]) * a->block_size + key % a->block_size) *
                   a->n_kv_heads +
               h / group) *
              hd;
          float dot = 0.0f;
          for (int64_t d = 0; d < hd; ++d) dot += q[d] * k_cache[off + d];
          const float score = dot * a->scale, m_new = std::max(m, score);
          const float corr = std::exp(m - m_new), w = std::exp(score - m_new);
          l = l * corr + w;
          for (int64_t d = 0; d < hd; ++d)
            acc[static_cast<size_t>(d)] = acc[static_cast<size_t>(d)] * corr + w * v_cache[off + d];
          m = m_new;
        }
        std::copy(acc.begin(), acc.end(), st);
        st[hd] = m;
        st[hd + 1] = l;
      }
      float big_m = -INFINITY, big_l = 0.0f;
      for (int64_t p = 0; p < a->n_splits; ++p)
        if (part[p * (hd + 2) + hd + 1] > 0.0f) big_m = std::max(big_m, part[p * (hd + 2) + hd]);
      for (int64_t p = 0; p < a->n_splits; ++p)
        if (part[p * (hd + 2) + hd + 1] > 0.0f)
          big_l += part[p * (hd + 2) + hd + 1] * std::exp(part[p * (hd + 2) + hd] - big_m);
      for (int64_t d = 0; d < hd; ++d) {
        float o = 0.0f;
        for (int64_t p = 0; p < a->n_splits; ++p)
          if (part[p * (hd + 2) + hd + 1] > 0.0f) o += part[p * (hd + 2) + d] * std::exp(part[p * (hd + 2) + hd] - big_m);
        out[d] = big_l > 0.0f ? o / big_l : 0.0f;
      }
    }
  return 0;
}

// ---- sparse_attention.cu ----
// The summary kernel's writer rule (token t summarizes its block unless token t + 1 writes it too)
// and fold; the score kernel's 8 lanes per head and their xor-shuffle combination; the select
// kernel's radix select over 8-bit digits and its index-order compaction, run sequentially.
int tessera_cuda_kv_summary_update_f32(const TesseraCudaKvSummaryArgs* a, void* stream) {
  if (bad_kv_dtype(a->kv_dtype)) return fail("tessera_cuda_kv_summary_update_f32: bad kv_dtype");
  const int64_t capacity = a->num_blocks * a->block_size, row = a->n_kv_heads * a->head_dim;
  const KvView k_cache{a->k_cache, a->kv_dtype};
  for (int64_t t = 0; t < a->n_tokens; ++t) {
    const int64_t slot = a->slots[t];
    if (slot < 0 || slot >= capacity) continue;
    const int64_t block = slot / a->block_size;
    if (t + 1 < a->n_tokens) {
      const int64_t next = a->slots[t + 1];
      if (next >= 0 && next < capacity && next / a->block_size == block) continue;
    }
    const int64_t last = slot % a->block_size, base = block * a->block_size * row;
    for (int64_t e = 0; e < row; ++e) {
      float lo = k_cache[base + e], hi = lo;
      for (int64_t s = 1; s <= last; ++s) {
        const float k = k_cache[base + s * row + e];
        lo = k < lo ? k : lo;
        hi = hi < k ? k : hi;
      }
      a->kmin[block * row + e] = lo;
      a->kmax[block * row + e] = hi;
    }
  }
  return 0;
}

bool sparse_range(const TesseraCudaSparseArgs& a, int64_t s, int64_t* lo, int64_t* hi) {
  const int64_t n = a.seq_lens[s];
  if (a.query_len[s] != 1 || n < a.threshold_tokens || n < 1) return false;
  const int64_t n_blocks = (n - 1) / a.block_size + 1;
  if (n_blocks <= a.sink_blocks + a.recent_blocks + a.top_blocks) return false;
  *lo = a.sink_blocks;
  *hi = n_blocks - a.recent_blocks;
  return true;
}

int check_sparse_args(const TesseraCudaSparseArgs* a) {
  if (!a) return fail("sparse attention op: null args");
  if (a->n_seqs < 0 || a->n_seqs > 65535 || a->head_dim <= 0 || a->n_kv_heads <= 0 || a->n_heads <= 0 ||
      a->n_heads % a->n_kv_heads != 0 || a->block_size <= 0 || a->max_blocks_per_seq <= 0 || a->num_blocks <= 0 ||
      a->n_ranks < 1 || a->threshold_tokens < 1 || a->sink_blocks < 0 || a->recent_blocks < 1 || a->top_blocks < 0)
    return fail("sparse attention op: bad sizes or selection options");
  if (!a->block_tables || !a->query_len || !a->seq_lens || !a->scores)
    return fail("sparse attention op: block_tables, query_len, seq_lens and scores must be set");
  return 0;
}
int check_sparse_scores_args(const TesseraCudaSparseArgs* a, void*) {
  if (int rc = check_sparse_args(a); rc != 0) return rc;
  if (!a->q || !a->query_begin || !a->kmin || !a->kmax)
    return fail("tessera_cuda_sparse_block_scores_f32: q, query_begin, kmin and kmax must be set");
  return 0;
}
int check_sparse_select_args(const TesseraCudaSparseArgs* a, void*) {
  if (int rc = check_sparse_args(a); rc != 0) return rc;
  if (!a->compact_tables || !a->compact_seq_lens || !a->compact_start_pos || (a->n_ranks > 1 && !a->gathered_scores))
    return fail("tessera_cuda_sparse_select_blocks: compact outputs (and gathered_scores at n_ranks > 1) must be set");
  return 0;
}

int tessera_cuda_sparse_block_scores_f32(const TesseraCudaSparseArgs* args, void* stream) {
  const TesseraCudaSparseArgs& a = *args;
  constexpr int kLanes = 8;
  const int64_t hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    int64_t lo = 0, hi = 0;
    if (!sparse_range(a, s, &lo, &hi)) continue;
    const float* q_row = a.q + static_cast<int64_t>(a.query_begin[s]) * a.n_heads * hd;
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t block = a.block_tables[s * a.max_blocks_per_seq + b];
      float best = -INFINITY;
      for (int64_t h = 0; block >= 0 && block < a.num_blocks && h < a.n_heads; ++h) {
        const float* q = q_row + h * hd;
        const int64_t off = (block * a.n_kv_heads + h / group) * hd;
        float l[kLanes] = {};
        for (int j = 0; j < kLanes; ++j)
          for (int64_t d = j; d < hd; d += kLanes) {
            const float x = q[d] * a.kmin[off + d], y = q[d] * a.kmax[off + d];
            l[j] += x < y ? y : x;
          }
        float v[kLanes];  // the xor shuffles 4, 2, 1: lane j adds lane j ^ off
        for (const int sh : {4, 2, 1}) {
          for (int j = 0; j < kLanes; ++j) v[j] = l[j] + l[j ^ sh];
          std::copy(v, v + kLanes, l);
        }
        if (l[0] > best) best = l[0];
      }
      a.scores[s * a.max_blocks_per_seq + b] = best;
    }
  }
  return 0;
}

uint32_t sparse_score_key(float x) {
  uint32_t u = 0;
  const float y = x == 0.0f ? 0.0f : x;
  std::memcpy(&u, &y, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

int tessera_cuda_sparse_select_blocks(const TesseraCudaSparseArgs* args, void* stream) {
  const TesseraCudaSparseArgs& a = *args;
  const int64_t stride = a.max_blocks_per_seq;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    const int32_t* table = a.block_tables + s * stride;
    int32_t* out = a.compact_tables + s * stride;
    const int64_t n = a.seq_lens[s];
    int64_t lo = 0, hi = 0;
    if (!sparse_range(a, s, &lo, &hi)) {
      std::copy(table, table + stride, out);
      a.compact_seq_lens[s] = static_cast<int32_t>(n);
      a.compact_start_pos[s] = static_cast<int32_t>(n - a.query_len[s]);
      continue;
    }
    float* scores = a.scores + s * stride;
    if (a.n_ranks > 1)
      for (int64_t i = lo; i < hi; ++i) {
        float m = a.gathered_scores[s * stride + i];
        for (int64_t r = 1; r < a.n_ranks; ++r) {
          const float v = a.gathered_scores[r * a.n_seqs * stride + s * stride + i];
          m = v > m ? v : m;
        }
        scores[i] = m;
      }
    if (a.top_blocks > 0) {
      uint32_t prefix = 0, mask = 0;
      int64_t remaining = a.top_blocks;
      for (int shift = 24; shift >= 0; shift -= 8) {
        int64_t hist[256] = {};
        for (int64_t i = lo; i < hi; ++i) {
          const uint32_t key = sparse_score_key(scores[i]);
          if ((key & mask) == prefix) ++hist[(key >> shift) & 255u];
        }
        int64_t above = 0;
        int digit = 255;
        for (; digit > 0; --digit) {
          if (above + hist[digit] >= remaining) break;
          above += hist[digit];
        }
        prefix |= static_cast<uint32_t>(digit) << shift;
        remaining -= above;
        mask |= 255u << shift;
      }
      int64_t eq_rank = 0, pos = 0;
      for (int64_t i = lo; i < hi; ++i) {
        const uint32_t key = sparse_score_key(scores[i]);
        const bool eq = key == prefix;
        const bool sel = key > prefix || (eq && eq_rank < remaining);
        eq_rank += eq ? 1 : 0;
        if (sel) out[lo + pos++] = table[i];
      }
      if (pos != a.top_blocks) return fail("fake backend: sparse selection lost count");
    }
    const int64_t selected = lo + a.top_blocks + a.recent_blocks;
    std::copy(table, table + lo, out);
    std::copy(table + hi, table + hi + a.recent_blocks, out + lo + a.top_blocks);
    std::fill(out + selected, out + stride, 0);
    const auto len = static_cast<int32_t>((selected - 1) * a.block_size + (n - 1) % a.block_size + 1);
    a.compact_seq_lens[s] = len;
    a.compact_start_pos[s] = len - 1;
  }
  return 0;
}

// prefill_attention.cu step by step: blocks (h, tile, s), 4 warps x 4 queries, 16-key tiles.
int tessera_cuda_paged_prefill_attention_f32(const TesseraCudaPrefillAttentionArgs* args, void* stream) {
  if (!args) return fail("null args");
  const TesseraCudaPrefillAttentionArgs& a = *args;
  if (a.head_dim <= 0 || a.head_dim > 256 || a.n_kv_heads <= 0 || a.n_heads <= 0 || a.n_heads % a.n_kv_heads != 0 ||
      a.block_size <= 0 || a.max_blocks_per_seq <= 0)
    return fail("bad prefill attention arguments");
  if (bad_kv_dtype(a.kv_dtype)) return fail("tessera_cuda_paged_prefill_attention_f32: bad kv_dtype");
  const KvView k_cache{a.k_cache, a.kv_dtype}, v_cache{a.v_cache, a.kv_dtype};
  constexpr int kWarps = 4, kPerWarp = 4, kTile = 16, kKeys = 16;
  const int64_t hd = a.head_dim, tiles = (a.max_query_len + kTile - 1) / kTile;
  std::vector<float> ks(kKeys * hd), vs(kKeys * hd);
  std::vector<float> acc(static_cast<size_t>(kWarps * kPerWarp * hd));
  for (int64_t s = 0; s < a.n_seqs; ++s)
    for (int64_t tile = 0; tile < tiles; ++tile)
      for (int64_t h = 0; h < a.n_heads; ++h) {
        const int64_t q_len = a.query_len[s], tile_begin = tile * kTile;
        if (tile_begin >= q_len) continue;
        const int64_t tile_end = std::min(q_len, tile_begin + kTile), kvh = h / (a.n_heads / a.n_kv_heads);
        const int64_t row0 = a.query_begin[s], start = a.start_pos[s], window = a.sliding_window;
        const int32_t* table = a.block_tables + s * a.max_blocks_per_seq;
        const int64_t key_end = start + tile_end;
        const int64_t key_first = window > 0 ? std::max<int64_t>(0, start + tile_begin - window + 1) : 0;
        float m[kWarps * kPerWarp], l[kWarps * kPerWarp];
        std::fill(acc.begin(), acc.end(), 0.0f);
        std::fill(m, m + kWarps * kPerWarp, -INFINITY);
        std::fill(l, l + kWarps * kPerWarp, 0.0f);
        for (int64_t kt = key_first; kt < key_end; kt += kKeys) {
          const int64_t n_keys = std::min<int64_t>(kKeys, key_end - kt);
          for (int64_t e = 0; e < n_keys * hd; ++e) {
            const int64_t j = e / hd, d = e % hd, key = kt + j;
            const int64_t off =
                ((static_cast<int64_t>(table[key / a.block_size]) * a.block_size + key % a.block_size) * a.n_kv_heads +
                 kvh) * hd + d;
            ks[static_cast<size_t>(j * hd + d)] = k_cache[off];
            vs[static_cast<size_t>(j * hd + d)] = v_cache[off];
          }
          for (int qw = 0; qw < kWarps * kPerWarp; ++qw) {
            const int64_t qi = tile_begin + qw;
            if (qi >= tile_end) continue;
            const int64_t qpos = start + qi, lo = window > 0 ? qpos - window + 1 : 0;
            const float* q = a.q + ((row0 + qi) * a.n_heads + h) * hd;
            float* o = &acc[static_cast<size_t>(qw * hd)];
            for (int64_t j = 0; j < n_keys; ++j) {
              const int64_t key = kt + j;
              if (key > qpos || key < lo) continue;
              float dot = 0.0f;
              for (int64_t d = 0; d < hd; ++d) dot += q[d] * ks[static_cast<size_t>(j * hd + d)];
              const float score = dot * a.scale, m_new = std::max(m[qw], score);
              const float corr = std::exp(m[qw] - m_new), p = std::exp(score - m_new);
              l[qw] = l[qw] * corr + p;
              for (int64_t d = 0; d < hd; ++d) o[d] = o[d] * corr + p * vs[static_cast<size_t>(j * hd + d)];
              m[qw] = m_new;
            }
          }
        }
        for (int qw = 0; qw < kWarps * kPerWarp; ++qw) {
          const int64_t qi = tile_begin + qw;
          if (qi >= tile_end) continue;
          for (int64_t d = 0; d < hd; ++d)
            a.out[((row0 + qi) * a.n_heads + h) * hd + d] =
                acc[static_cast<size_t>(qw * hd + d)] * (l[qw] > 0.0f ? 1.0f / l[qw] : 0.0f);
        }
      }
  return 0;
}

int tessera_cuda_silu_mul_f32(const float* gate, const float* up, float* out, int64_t n, int64_t dim, void* stream) {
  for (int64_t i = 0; i < n * dim; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  return 0;
}
// kernels/activation.h's gelu_tanh_mul step by step (this file is built with -ffp-contract=off, as
// the CPU kernels are): the same bits as the CPU.
int tessera_cuda_gelu_tanh_mul_f32(const float* gate, const float* up, float* out, int64_t n, int64_t dim,
                                   void* stream) {
  if (n < 0 || dim < 0) return fail("tessera_cuda_gelu_tanh_mul_f32: negative size");
  for (int64_t i = 0; i < n * dim; ++i) {
    const float x = gate[i];
    const float c = x * x * x;
    const float t = std::tanh(0.7978845608f * (x + 0.044715f * c));
    out[i] = 0.5f * x * (1.0f + t) * up[i];
  }
  return 0;
}
int tessera_cuda_argmax_value_f32(const float* logits, int64_t n_rows, int64_t vocab, int32_t id_offset, int32_t* ids,
                                  float* values, void* stream) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float best = -INFINITY;
    int64_t at = -1;
    for (int64_t i = 0; i < vocab; ++i) {
      const float v = std::isnan(logits[r * vocab + i]) ? -INFINITY : logits[r * vocab + i];
      if (at < 0 || v > best) {
        best = v;
        at = i;
      }
    }
    ids[r] = static_cast<int32_t>(at) + id_offset;
    if (values) values[r] = best;
  }
  return 0;
}
int tessera_cuda_argmax_f32(const float* logits, int64_t n_rows, int64_t vocab, int32_t* ids, void* stream) {
  return tessera_cuda_argmax_value_f32(logits, n_rows, vocab, 0, ids, nullptr, stream);
}
int tessera_cuda_gemm_f16(void* handle, const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t cols,
                          int64_t n, void* stream) {
  std::vector<float> xf(static_cast<size_t>(cols));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < cols; ++c) xf[static_cast<size_t>(c)] = fp16_to_f32(x[t * cols + c]);
    for (int64_t r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int64_t c = 0; c < cols; ++c) sum += fp16_to_f32(w[r * cols + c]) * xf[static_cast<size_t>(c)];
      y[t * rows + r] = sum;
    }
  }
  return 0;
}

// quant_gemm.cu's chunk (256 columns) / lane decomposition, one lane sum per lane.
int tessera_cuda_gemm_w8a16(const int8_t* w, const float* scales, const uint16_t* x, float* y, int64_t rows,
                            int64_t cols, int64_t n, void* stream) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      float lanes[32] = {};
      for (int64_t c0 = 0; c0 < cols; c0 += 256)
        for (int j = 0; j < 8; ++j)
          for (int lane = 0; lane < 32; ++lane) {
            const int64_t c = c0 + lane + 32 * j;
            if (c < cols) lanes[lane] += static_cast<float>(w[r * cols + c]) * fp16_to_f32(x[t * cols + c]);
          }
      float sum = 0.0f;
      for (float v : lanes) sum += v;
      y[t * rows + r] = sum * scales[r];
    }
  return 0;
}
int tessera_cuda_gemm_w4a16(const uint8_t* w, const uint16_t* scales, const uint8_t* zeros, const uint16_t* x, float* y,
                            int64_t rows, int64_t cols, int64_t n, void* stream) {
  if (cols % 128 != 0) return fail("cols must be a multiple of 128");
  const int64_t groups = cols / 128;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      float lanes[32] = {};
      for (int64_t c0 = 0; c0 < cols; c0 += 256)
        for (int j = 0; j < 4; ++j)
          for (int lane = 0; lane < 32; ++lane) {
            const int64_t c = c0 + 2 * (lane + 32 * j);
            if (c >= cols) continue;
            const uint8_t packed = w[r * (cols / 2) + c / 2];
            const int64_t g = r * groups + c / 128;
            const float d = fp16_to_f32(scales[g]), z = static_cast<float>(zeros[g]);
            lanes[lane] += (static_cast<float>(packed & 15) - z) * d * fp16_to_f32(x[t * cols + c]) +
                           (static_cast<float>(packed >> 4) - z) * d * fp16_to_f32(x[t * cols + c + 1]);
          }
      float sum = 0.0f;
      for (float v : lanes) sum += v;
      y[t * rows + r] = sum;
    }
  return 0;
}
// quant_gemm_tc.cu's decomposition, emulated (tc_gemm above).
int tessera_cuda_gemm_w8a16_tc(const int8_t* w, const float* scales, const uint16_t* x, float* y, int64_t rows,
                               int64_t cols, int64_t n, void* stream) {
  if (int rc = tc_check(w, x, rows, cols, n, 16, "tessera_cuda_gemm_w8a16_tc: bad sizes")) return rc;
  if (rows == 0 || n == 0) return 0;
  tc_gemm(TcW8{w, scales, rows, cols}, x, y, n);
  return 0;
}
int tessera_cuda_gemm_w4a16_tc(const uint8_t* w, const uint16_t* scales, const uint8_t* zeros, const uint16_t* x,
                               float* y, int64_t rows, int64_t cols, int64_t n, void* stream) {
  if (int rc = tc_check(w, x, rows, cols, n, 128, "tessera_cuda_gemm_w4a16_tc: bad sizes")) return rc;
  if (rows == 0 || n == 0) return 0;
  tc_gemm(TcW4{w, scales, zeros, rows, cols}, x, y, n);
  return 0;
}
int tessera_cuda_dequantize_w8a16(const int8_t* w, const float* scales, uint16_t* out, int64_t rows, int64_t cols,
                                  void* stream) {
  for (int64_t i = 0; i < rows * cols; ++i) out[i] = f32_to_fp16(static_cast<float>(w[i]) * scales[i / cols]);
  return 0;
}
int tessera_cuda_dequantize_w4a16(const uint8_t* w, const uint16_t* scales, const uint8_t* zeros, uint16_t* out,
                                  int64_t rows, int64_t cols, void* stream) {
  if (cols % 128 != 0) return fail("cols must be a multiple of 128");
  const int64_t groups = cols / 128;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const int64_t r = i / cols, c = i % cols;
    const uint8_t packed = w[r * (cols / 2) + c / 2];
    const int level = (c & 1) ? (packed >> 4) : (packed & 15);
    const int64_t g = r * groups + c / 128;
    out[i] = f32_to_fp16((static_cast<float>(level) - static_cast<float>(zeros[g])) * fp16_to_f32(scales[g]));
  }
  return 0;
}
// gguf_gemm.cu's decomposition (gguf_decode_piece above).
int tessera_cuda_gemm_gguf(int type, const void* w, int64_t row_bytes, const uint16_t* x, float* y, int64_t rows,
                           int64_t cols, int64_t n, void* stream) {
  if (int rc = gguf_check("tessera_cuda_gemm_gguf", type, w, row_bytes, rows, cols)) return rc;
  if (n < 0) return fail("tessera_cuda_gemm_gguf: n_tokens must be >= 0");
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t n_blocks = cols / gguf_format(type).elems, pieces = (cols + kGgufPiece - 1) / kGgufPiece;
  std::vector<float> xf(static_cast<size_t>(pieces * kGgufPiece));
  for (int64_t t = 0; t < n; ++t) {
    std::fill(xf.begin(), xf.end(), 0.0f);
    for (int64_t c = 0; c < cols; ++c) xf[static_cast<size_t>(c)] = fp16_to_f32(x[t * cols + c]);
    for (int64_t r = 0; r < rows; ++r) {
      float lanes[32] = {};
      for (int64_t p = 0; p < pieces; ++p)
        for (int lane = 0; lane < 32; ++lane) {
          float v[8];
          gguf_decode_piece(type, wb + r * row_bytes, p, n_blocks, lane, v);
          for (int i = 0; i < 8; ++i)
            lanes[lane] = std::fma(v[i], xf[static_cast<size_t>(p * kGgufPiece + 32 * i + lane)], lanes[lane]);
        }
      for (int off = 16; off > 0; off >>= 1) {  // warp_sum's butterfly
        float next[32];
        for (int lane = 0; lane < 32; ++lane) next[lane] = lanes[lane] + lanes[lane ^ off];
        std::memcpy(lanes, next, sizeof(lanes));
      }
      y[t * rows + r] = lanes[0];
    }
  }
  return 0;
}
int tessera_cuda_dequantize_gguf(int type, const void* w, int64_t row_bytes, uint16_t* out, int64_t rows, int64_t cols,
                                 void* stream) {
  if (int rc = gguf_check("tessera_cuda_dequantize_gguf", type, w, row_bytes, rows, cols)) return rc;
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t n_blocks = cols / gguf_format(type).elems, pieces = (cols + kGgufPiece - 1) / kGgufPiece;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < pieces; ++p)
      for (int lane = 0; lane < 32; ++lane) {
        float v[8];
        gguf_decode_piece(type, wb + r * row_bytes, p, n_blocks, lane, v);
        for (int i = 0; i < 8; ++i) {
          const int64_t c = p * kGgufPiece + 32 * i + lane;
          if (c < cols) out[r * cols + c] = f32_to_fp16(v[i]);
        }
      }
  return 0;
}
int tessera_cuda_add_f32(float* y, const float* x, int64_t n, void* stream) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  return 0;
}
int tessera_cuda_scale_f32(float* x, float s, int64_t n, void* stream) {
  if (n < 0) return fail("tessera_cuda_scale_f32: n must be >= 0");
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
  return 0;
}
int tessera_cuda_add_bias_f32(float* y, const float* bias, int64_t n, int64_t dim, void* stream) {
  for (int64_t i = 0; i < n * dim; ++i) y[i] += bias[i % dim];
  return 0;
}
int tessera_cuda_gather_rows_f32(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t dim,
                                 void* stream) {
  for (int64_t i = 0; i < n * dim; ++i) dst[i] = src[static_cast<int64_t>(rows[i / dim]) * dim + i % dim];
  return 0;
}

// Its arguments are checked when the call is made (CallCheck below), as the real entry point does
// on the host, also during a capture.
int check_sample_args(const TesseraCudaSampleArgs* args, void*) {
  if (!args) return fail("tessera_cuda_sample_f32: args is null");
  const TesseraCudaSampleArgs& a = *args;
  if (a.n_rows < 0 || a.n_rows > 0x7fffffff) return fail("tessera_cuda_sample_f32: need 0 <= n_rows < 2^31");
  if (a.vocab < 1 || a.vocab > (int64_t{1} << 20)) return fail("tessera_cuda_sample_f32: need 1 <= vocab <= 2^20");
  if (a.n_rows == 0) return 0;
  if (!a.logits || !a.scratch || !a.rows || !a.ids || !a.logprobs || !a.top_ids || !a.top_logprobs)
    return fail(
        "tessera_cuda_sample_f32: logits, scratch, rows, ids, logprobs, top_ids and top_logprobs must not be null");
  return 0;
}
int tessera_cuda_sample_f32(const TesseraCudaSampleArgs* args, void*) {
  for (int64_t r = 0; r < args->n_rows; ++r) sample_row(*args, r);
  return 0;
}
// Checked when the call is made, like sample_f32.
int check_unshard_logits_args(const float* gathered, int64_t n_rows, int64_t vocab, int64_t per_rank, int64_t tp,
                              float* out, void*) {
  if (n_rows < 0 || vocab <= 0 || per_rank <= 0 || tp <= 0 || per_rank < (vocab + tp - 1) / tp)
    return fail(
        "tessera_cuda_unshard_logits_f32: need n_rows >= 0, vocab > 0, tp > 0 and per_rank > 0 with per_rank * tp >= "
        "vocab");
  if (n_rows == 0) return 0;
  if (!gathered || !out) return fail("tessera_cuda_unshard_logits_f32: gathered and out must not be null");
  return 0;
}
int tessera_cuda_unshard_logits_f32(const float* gathered, int64_t n_rows, int64_t vocab, int64_t per_rank, int64_t tp,
                                    float* out, void*) {
  for (int64_t t = 0; t < n_rows; ++t)
    for (int64_t c = 0; c < vocab; ++c) {
      const int64_t r = c / per_rank, i = c % per_rank;
      const int64_t count = std::min(vocab, (r + 1) * per_rank) - r * per_rank;
      out[t * vocab + c] = gathered[r * n_rows * per_rank + t * count + i];
    }
  return 0;
}

}  // namespace fake_op

template <>
struct CallCheck<&fake_op::tessera_cuda_sample_f32> {
  static constexpr auto run = &fake_op::check_sample_args;
};
template <>
struct CallCheck<&fake_op::tessera_cuda_unshard_logits_f32> {
  static constexpr auto run = &fake_op::check_unshard_logits_args;
};
template <>
struct CallCheck<&fake_op::tessera_cuda_sparse_block_scores_f32> {
  static constexpr auto run = &fake_op::check_sparse_scores_args;
};
template <>
struct CallCheck<&fake_op::tessera_cuda_sparse_select_blocks> {
  static constexpr auto run = &fake_op::check_sparse_select_args;
};

}  // namespace

// The exported op symbols, one per OP entry of the list (the CALL entries are defined above).
#define TESSERA_FAKE_CALL(ret, symbol, field, params)
#define TESSERA_FAKE_OP(ret, symbol, field, params, args) \
  ret symbol params { return run_or_record<&fake_op::symbol> args; }
extern "C" {
TESSERA_CUDA_ENTRY_POINTS(TESSERA_FAKE_CALL, TESSERA_FAKE_OP)
}  // extern "C"
#undef TESSERA_FAKE_CALL
#undef TESSERA_FAKE_OP
