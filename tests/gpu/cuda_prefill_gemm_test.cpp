// The ops added for the GPU forward pass against CPU references: paged prefill attention
// (kernels/paged_attention.h's paged_attention, several sequences with cached prefixes in one
// launch, GQA, sliding window), W8A16 and W4A16 GEMMs (a double-precision reference built from
// the definition of the formats) and their f16 expansions, residual add, bias add, row gather.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/paged_attention.h"
#include "tests/gpu/gpu_test_util.h"

namespace tessera {
namespace {

using gpu_test::gaussian;
using gpu_test::to_f16;
using CudaPrefill = gpu_test::GpuTest;
using CudaQuantGemm = gpu_test::GpuTest;
using CudaElementwise = gpu_test::GpuTest;

struct PrefillCase {
  int64_t head_dim, n_heads, n_kv_heads, block_size, sliding_window;
  std::vector<std::pair<int64_t, int64_t>> seqs;  // (start_pos, n_query_tokens)
};

// With an fp32 and with an fp16 cache (the CPU reference reads the same fp16 values).
TEST_F(CudaPrefill, MatchesCpuPagedAttention) {
  const PrefillCase cases[] = {
      {64, 4, 4, 16, 0, {{0, 5}}},
      {64, 8, 2, 16, 0, {{0, 33}, {17, 1}, {40, 20}}},
      {128, 4, 1, 5, 0, {{3, 16}, {0, 1}, {100, 31}}},
      {32, 6, 3, 1, 0, {{7, 9}}},
      {256, 2, 2, 8, 0, {{0, 17}, {9, 40}}},
      {80, 4, 2, 16, 7, {{0, 30}, {25, 18}}},  // sliding window, odd head_dim
      {16, 2, 1, 4, 3, {{10, 5}}},
  };
  for (const bool f16 : {false, true})
    for (const PrefillCase& c : cases) {
      const int64_t hd = c.head_dim, n_kv = c.n_kv_heads, bs = c.block_size;
      const int64_t n_seqs = static_cast<int64_t>(c.seqs.size());
      // Blocks: each sequence gets its own blocks, in a shuffled global order.
      int64_t total_blocks = 0, max_blocks = 1, n_tokens = 0, max_q = 0;
      for (auto [start, len] : c.seqs) {
        const int64_t blocks = (start + len + bs - 1) / bs;
        total_blocks += blocks;
        max_blocks = std::max(max_blocks, blocks);
        n_tokens += len;
        max_q = std::max(max_q, len);
      }
      std::vector<int32_t> ids(static_cast<size_t>(total_blocks));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
      std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
      std::vector<int32_t> tables(static_cast<size_t>(n_seqs * max_blocks), 0);
      std::vector<int32_t> qbegin, qlen, spos;
      size_t next = 0;
      int64_t row = 0;
      for (int64_t s = 0; s < n_seqs; ++s) {
        auto [start, len] = c.seqs[static_cast<size_t>(s)];
        const int64_t blocks = (start + len + bs - 1) / bs;
        for (int64_t b = 0; b < blocks; ++b) tables[static_cast<size_t>(s * max_blocks + b)] = ids[next++];
        qbegin.push_back(static_cast<int32_t>(row));
        qlen.push_back(static_cast<int32_t>(len));
        spos.push_back(static_cast<int32_t>(start));
        row += len;
      }
      const int64_t cache_floats = total_blocks * bs * n_kv * hd;
      std::vector<float> kc = gaussian(cache_floats, 11), vc = gaussian(cache_floats, 12);
      std::vector<uint16_t> kc16 = to_f16(kc), vc16 = to_f16(vc);
      const std::vector<float> q = gaussian(n_tokens * c.n_heads * hd, 13);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

      std::vector<float> want(q.size(), 0.0f);
      PagedKvLayer kv{kc.data(), vc.data(), total_blocks, bs, n_kv, hd};
      if (f16) kv = {nullptr, nullptr, total_blocks, bs, n_kv, hd, kc16.data(), vc16.data()};
      for (int64_t s = 0; s < n_seqs; ++s) {
        AttentionArgs a;
        a.q = &q[static_cast<size_t>(qbegin[s] * c.n_heads * hd)];
        a.out = &want[static_cast<size_t>(qbegin[s] * c.n_heads * hd)];
        a.n_tokens = qlen[s];
        a.start_pos = spos[s];
        a.n_heads = c.n_heads;
        a.scale = scale;
        a.sliding_window = c.sliding_window;
        a.block_table = &tables[static_cast<size_t>(s * max_blocks)];
        paged_attention(kv, a, nullptr);
      }

      TesseraCudaPrefillAttentionArgs a{};
      a.q = to_device(q);
      float* d_out = alloc<float>(static_cast<int64_t>(q.size()));
      a.out = d_out;
      a.k_cache = f16 ? static_cast<const void*>(to_device(kc16)) : to_device(kc);
      a.v_cache = f16 ? static_cast<const void*>(to_device(vc16)) : to_device(vc);
      a.kv_dtype = f16 ? TESSERA_CUDA_F16 : TESSERA_CUDA_F32;
      a.block_tables = to_device(tables);
      a.query_begin = to_device(qbegin);
      a.query_len = to_device(qlen);
      a.start_pos = to_device(spos);
      a.n_seqs = n_seqs;
      a.max_query_len = max_q;
      a.n_heads = c.n_heads;
      a.n_kv_heads = n_kv;
      a.head_dim = hd;
      a.block_size = bs;
      a.max_blocks_per_seq = max_blocks;
      a.scale = scale;
      a.sliding_window = c.sliding_window;
      ASSERT_EQ(api_->paged_prefill_attention_f32(&a, nullptr), 0) << api_->last_error();
      const std::vector<float> got = to_host(d_out, static_cast<int64_t>(q.size()));
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 2e-5f + 2e-4f * std::fabs(want[i]))
            << (f16 ? "fp16" : "fp32") << " cache, head_dim " << hd << " heads " << c.n_heads << "/" << n_kv
            << " block " << bs << " window " << c.sliding_window << " element " << i;
    }
}

TEST_F(CudaPrefill, RejectsBadArguments) {
  TesseraCudaPrefillAttentionArgs a{};
  a.head_dim = 512;
  a.n_heads = a.n_kv_heads = 1;
  a.block_size = a.max_blocks_per_seq = 1;
  EXPECT_NE(api_->paged_prefill_attention_f32(&a, nullptr), 0);
  a.head_dim = 64;
  a.n_heads = 3;
  a.n_kv_heads = 2;
  EXPECT_NE(api_->paged_prefill_attention_f32(&a, nullptr), 0);
  EXPECT_NE(api_->paged_prefill_attention_f32(nullptr, nullptr), 0);
  a.n_heads = 2;
  a.kv_dtype = 7;  // neither fp32 nor fp16
  EXPECT_NE(api_->paged_prefill_attention_f32(&a, nullptr), 0);
  EXPECT_NE(std::string(api_->last_error()).find("kv_dtype"), std::string::npos) << api_->last_error();
}

void expect_gemm_close(const std::vector<float>& got, const std::vector<double>& want,
                       const std::vector<double>& magnitude, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 + 1e-5 * magnitude[i]) << what << " element " << i;
}

TEST_F(CudaQuantGemm, W8A16MatchesDefinition) {
  const int64_t shapes[][3] = {{1, 32, 1}, {7, 64, 3}, {33, 288, 8}, {64, 4096, 5}, {300, 96, 17}, {9, 1000, 32}};
  std::mt19937 rng(5);
  for (const auto& s : shapes) {
    const int64_t rows = s[0], cols = s[1], n = s[2];
    std::vector<int8_t> w(static_cast<size_t>(rows * cols));
    for (auto& v : w) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    std::vector<float> scales = gaussian(rows, 6, 0.01f);
    const std::vector<uint16_t> x16 = to_f16(gaussian(n * cols, 7));
    std::vector<double> want(static_cast<size_t>(n * rows)), mag(want.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double acc = 0, a = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double p = w[static_cast<size_t>(r * cols + c)] * static_cast<double>(fp16_to_f32(x16[static_cast<size_t>(t * cols + c)]));
          acc += p;
          a += std::fabs(p);
        }
        want[static_cast<size_t>(t * rows + r)] = acc * scales[static_cast<size_t>(r)];
        mag[static_cast<size_t>(t * rows + r)] = a * std::fabs(scales[static_cast<size_t>(r)]);
      }
    float* d_y = alloc<float>(n * rows);
    ASSERT_EQ(api_->gemm_w8a16(to_device(w), to_device(scales), to_device(x16), d_y, rows, cols, n, nullptr), 0)
        << api_->last_error();
    expect_gemm_close(to_host(d_y, n * rows), want, mag,
                      "w8a16 " + std::to_string(rows) + "x" + std::to_string(cols) + " n=" + std::to_string(n));
    // The f16 expansion used for large batches: exactly fp16(level * scale).
    uint16_t* d_f16 = alloc<uint16_t>(rows * cols);
    ASSERT_EQ(api_->dequantize_w8a16(to_device(w), to_device(scales), d_f16, rows, cols, nullptr), 0)
        << api_->last_error();
    const std::vector<uint16_t> f16 = to_host(d_f16, rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i)
      ASSERT_EQ(f16[static_cast<size_t>(i)],
                f32_to_fp16(static_cast<float>(w[static_cast<size_t>(i)]) * scales[static_cast<size_t>(i / cols)]))
          << "dequantize_w8a16 element " << i;
  }
}

TEST_F(CudaQuantGemm, W4A16MatchesDefinition) {
  const int64_t shapes[][3] = {{1, 128, 1}, {5, 256, 2}, {17, 384, 4}, {64, 4096, 3}, {33, 640, 9}, {8, 128, 32}};
  std::mt19937 rng(9);
  for (const auto& s : shapes) {
    const int64_t rows = s[0], cols = s[1], n = s[2], groups = cols / 128;
    std::vector<uint8_t> levels(static_cast<size_t>(rows * cols)), zeros(static_cast<size_t>(rows * groups));
    for (auto& v : levels) v = static_cast<uint8_t>(rng() % 16);
    for (auto& v : zeros) v = static_cast<uint8_t>(rng() % 16);
    const std::vector<uint16_t> scales = to_f16(gaussian(rows * groups, 8, 0.02f));
    std::vector<uint8_t> packed(static_cast<size_t>(rows * cols / 2));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < cols / 2; ++b)
        packed[static_cast<size_t>(r * cols / 2 + b)] = static_cast<uint8_t>(
            levels[static_cast<size_t>(r * cols + 2 * b)] | (levels[static_cast<size_t>(r * cols + 2 * b + 1)] << 4));
    const std::vector<uint16_t> x16 = to_f16(gaussian(n * cols, 10));
    std::vector<double> want(static_cast<size_t>(n * rows)), mag(want.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double acc = 0, a = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const size_t g = static_cast<size_t>(r * groups + c / 128);
          const double wv = (static_cast<double>(levels[static_cast<size_t>(r * cols + c)]) - zeros[g]) *
                            static_cast<double>(fp16_to_f32(scales[g]));
          const double p = wv * fp16_to_f32(x16[static_cast<size_t>(t * cols + c)]);
          acc += p;
          a += std::fabs(p);
        }
        want[static_cast<size_t>(t * rows + r)] = acc;
        mag[static_cast<size_t>(t * rows + r)] = a;
      }
    float* d_y = alloc<float>(n * rows);
    ASSERT_EQ(api_->gemm_w4a16(to_device(packed), to_device(scales), to_device(zeros), to_device(x16), d_y, rows,
                               cols, n, nullptr),
              0)
        << api_->last_error();
    expect_gemm_close(to_host(d_y, n * rows), want, mag,
                      "w4a16 " + std::to_string(rows) + "x" + std::to_string(cols) + " n=" + std::to_string(n));
    uint16_t* d_f16 = alloc<uint16_t>(rows * cols);
    ASSERT_EQ(api_->dequantize_w4a16(to_device(packed), to_device(scales), to_device(zeros), d_f16, rows, cols,
                                     nullptr),
              0)
        << api_->last_error();
    const std::vector<uint16_t> f16 = to_host(d_f16, rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const size_t g = static_cast<size_t>(r * groups + c / 128);
        const float wv = (static_cast<float>(levels[static_cast<size_t>(r * cols + c)]) - static_cast<float>(zeros[g])) *
                         fp16_to_f32(scales[g]);
        ASSERT_EQ(f16[static_cast<size_t>(r * cols + c)], f32_to_fp16(wv)) << "dequantize_w4a16 " << r << "," << c;
      }
  }
  EXPECT_NE(api_->gemm_w4a16(nullptr, nullptr, nullptr, nullptr, nullptr, 4, 100, 1, nullptr), 0);  // cols % 128
}

// ---- tensor-core GEMMs (quant_gemm_tc.cu) over the grid n_tokens x rows x cols ----

constexpr int64_t kTcTokens[] = {1, 7, 16, 33, 64, 200};
constexpr int64_t kTcRows[] = {8, 24, 200, 4096};
constexpr int64_t kTcCols[] = {128, 256, 4096};
// The CPU stand-in emulates every lane of every mma, so there shapes above this many
// multiply-adds are left to the device run (the index math is the same at every size; the
// emulated grid still covers every token tiling, row tail and multi-chunk column walk).
constexpr int64_t kFakeBackendMaxMacs = int64_t{1} << 27;

bool on_fake_backend(const CudaApi* api) {
  char name[128] = {};
  int major = 0, minor = 0;
  return api->device_info(0, name, sizeof(name), &major, &minor) == 0 && std::strstr(name, "fake") != nullptr;
}

// Runs `run(n)` (which returns y [n, rows] from the device) for each n in `tokens` and compares it
// with the double-precision product of the dequantized weights `w` [rows, cols] and the f16
// activations x16 [>= max n, cols]: |got - want| <= 1e-5 + rel_tol * sum_c |w x|.
void expect_tc_gemm(const std::vector<double>& w, const std::vector<uint16_t>& x16, int64_t rows, int64_t cols,
                    const std::vector<int64_t>& tokens, double rel_tol, const std::string& what,
                    const std::function<std::vector<float>(int64_t)>& run) {
  const int64_t n_max = *std::max_element(tokens.begin(), tokens.end());
  std::vector<double> x(static_cast<size_t>(n_max * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = fp16_to_f32(x16[i]);
  std::vector<double> want(static_cast<size_t>(n_max * rows)), mag(want.size());
  for (int64_t t = 0; t < n_max; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      const double* wr = &w[static_cast<size_t>(r * cols)];
      const double* xt = &x[static_cast<size_t>(t * cols)];
      double acc = 0, a = 0;
      for (int64_t c = 0; c < cols; ++c) {
        acc += wr[c] * xt[c];
        a += std::fabs(wr[c] * xt[c]);
      }
      want[static_cast<size_t>(t * rows + r)] = acc;
      mag[static_cast<size_t>(t * rows + r)] = a;
    }
  for (int64_t n : tokens) {
    const std::vector<float> got = run(n);
    ASSERT_EQ(got.size(), static_cast<size_t>(n * rows)) << what;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 + rel_tol * mag[i])
          << what << " " << rows << "x" << cols << " n=" << n << " token " << static_cast<int64_t>(i) / rows
          << " row " << static_cast<int64_t>(i) % rows;
  }
}

// The tokens of the grid to run for one weight shape (all of them on a device).
std::vector<int64_t> tc_tokens(const CudaApi* api, int64_t rows, int64_t cols) {
  std::vector<int64_t> tokens;
  const bool fake = on_fake_backend(api);
  for (int64_t n : kTcTokens)
    if (!fake || n * rows * cols <= kFakeBackendMaxMacs) tokens.push_back(n);
  return tokens;
}

// W8: the int8 levels are exact in f16 and the sums are fp32, so the only error is the
// accumulation's (tensor-core fp32 adds): 1e-4 of sum |w x|.
TEST_F(CudaQuantGemm, W8A16TensorCoreMatchesDefinition) {
  std::vector<std::array<int64_t, 2>> shapes;
  for (int64_t rows : kTcRows)
    for (int64_t cols : kTcCols) shapes.push_back({rows, cols});
  shapes.push_back({40, 144});   // cols % 128 != 0: a partial last chunk
  shapes.push_back({17, 1040});
  std::mt19937 rng(21);
  for (const auto& [rows, cols] : shapes) {
    std::vector<int64_t> tokens = tc_tokens(api_, rows, cols);
    if (cols % 128 != 0) tokens = {9, 33};
    if (tokens.empty()) continue;
    std::vector<int8_t> levels(static_cast<size_t>(rows * cols));
    for (auto& v : levels) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    const std::vector<float> scales = gaussian(rows, static_cast<uint32_t>(rows + cols), 0.01f);
    std::vector<double> w(levels.size());
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = levels[i] * static_cast<double>(scales[i / static_cast<size_t>(cols)]);
    const int64_t n_max = *std::max_element(tokens.begin(), tokens.end());
    const std::vector<uint16_t> x16 = to_f16(gaussian(n_max * cols, static_cast<uint32_t>(cols)));
    const int8_t* d_w = to_device(levels);
    const float* d_scales = to_device(scales);
    const uint16_t* d_x = to_device(x16);
    float* d_y = alloc<float>(n_max * rows);
    expect_tc_gemm(w, x16, rows, cols, tokens, 1e-4, "w8a16_tc", [&](int64_t n) {
      EXPECT_EQ(api_->gemm_w8a16_tc(d_w, d_scales, d_x, d_y, rows, cols, n, nullptr), 0) << api_->last_error();
      return to_host(d_y, n * rows);
    });
    if (HasFatalFailure()) return;
  }
}

// W4: each weight is rounded to f16 (relative error <= 2^-11 = 4.9e-4) before the fp32 sums.
TEST_F(CudaQuantGemm, W4A16TensorCoreMatchesDefinition) {
  std::mt19937 rng(23);
  for (int64_t rows : kTcRows)
    for (int64_t cols : kTcCols) {
      const std::vector<int64_t> tokens = tc_tokens(api_, rows, cols);
      if (tokens.empty()) continue;
      const int64_t groups = cols / 128;
      std::vector<uint8_t> levels(static_cast<size_t>(rows * cols)), zeros(static_cast<size_t>(rows * groups));
      for (auto& v : levels) v = static_cast<uint8_t>(rng() % 16);
      for (auto& v : zeros) v = static_cast<uint8_t>(rng() % 16);
      const std::vector<uint16_t> scales =
          to_f16(gaussian(rows * groups, static_cast<uint32_t>(rows * 7 + cols), 0.02f));
      std::vector<uint8_t> packed(static_cast<size_t>(rows * cols / 2));
      for (size_t b = 0; b < packed.size(); ++b)
        packed[b] = static_cast<uint8_t>(levels[2 * b] | (levels[2 * b + 1] << 4));
      std::vector<double> w(levels.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const size_t g = static_cast<size_t>(r * groups + c / 128);
          w[static_cast<size_t>(r * cols + c)] =
              (static_cast<double>(levels[static_cast<size_t>(r * cols + c)]) - zeros[g]) * fp16_to_f32(scales[g]);
        }
      const int64_t n_max = *std::max_element(tokens.begin(), tokens.end());
      const std::vector<uint16_t> x16 = to_f16(gaussian(n_max * cols, static_cast<uint32_t>(cols + 1)));
      const uint8_t* d_w = to_device(packed);
      const uint16_t* d_scales = to_device(scales);
      const uint8_t* d_zeros = to_device(zeros);
      const uint16_t* d_x = to_device(x16);
      float* d_y = alloc<float>(n_max * rows);
      expect_tc_gemm(w, x16, rows, cols, tokens, 6e-4, "w4a16_tc", [&](int64_t n) {
        EXPECT_EQ(api_->gemm_w4a16_tc(d_w, d_scales, d_zeros, d_x, d_y, rows, cols, n, nullptr), 0)
            << api_->last_error();
        return to_host(d_y, n * rows);
      });
      if (HasFatalFailure()) return;
    }
}

TEST_F(CudaQuantGemm, TensorCoreRejectsBadArguments) {
  const uint8_t* d_w = alloc<uint8_t>(64 * 256);
  const uint16_t* d_x = alloc<uint16_t>(4 * 256 + 8);
  const uint16_t* d_s = alloc<uint16_t>(64 * 2);
  const uint8_t* d_z = alloc<uint8_t>(64 * 2);
  float* d_y = alloc<float>(4 * 64);
  const auto* d_w8 = reinterpret_cast<const int8_t*>(d_w);
  const auto* d_f = reinterpret_cast<const float*>(d_s);
  EXPECT_NE(api_->gemm_w4a16_tc(d_w, d_s, d_z, d_x, d_y, 64, 200, 4, nullptr), 0);     // cols % 128
  EXPECT_NE(api_->gemm_w8a16_tc(d_w8, d_f, d_x, d_y, 64, 200, 4, nullptr), 0);         // cols % 16
  EXPECT_NE(api_->gemm_w4a16_tc(d_w, d_s, d_z, d_x + 1, d_y, 64, 256, 4, nullptr), 0);  // x misaligned
  EXPECT_NE(api_->gemm_w8a16_tc(d_w8 + 8, d_f, d_x, d_y, 64, 256, 4, nullptr), 0);     // w misaligned
  EXPECT_EQ(api_->gemm_w8a16_tc(d_w8, d_f, d_x, d_y, 0, 256, 4, nullptr), 0) << api_->last_error();  // empty
  EXPECT_EQ(api_->gemm_w4a16_tc(d_w, d_s, d_z, d_x, d_y, 64, 256, 0, nullptr), 0) << api_->last_error();
}

TEST_F(CudaElementwise, AddBiasAndGatherRows) {
  for (int64_t dim : {1, 7, 4096}) {
    const int64_t n = 5;
    const std::vector<float> y = gaussian(n * dim, 1), x = gaussian(n * dim, 2), b = gaussian(dim, 3);
    float* d_y = to_device(y);
    ASSERT_EQ(api_->add_f32(d_y, to_device(x), n * dim, nullptr), 0) << api_->last_error();
    ASSERT_EQ(api_->add_bias_f32(d_y, to_device(b), n, dim, nullptr), 0) << api_->last_error();
    const std::vector<float> got = to_host(d_y, n * dim);
    for (int64_t i = 0; i < n * dim; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], (y[static_cast<size_t>(i)] + x[static_cast<size_t>(i)]) +
                                                 b[static_cast<size_t>(i % dim)])
          << "dim " << dim << " element " << i;
    const std::vector<int32_t> rows = {4, 0, 0, 2};
    float* d_g = alloc<float>(4 * dim);
    ASSERT_EQ(api_->gather_rows_f32(to_device(y), to_device(rows), d_g, 4, dim, nullptr), 0) << api_->last_error();
    const std::vector<float> g = to_host(d_g, 4 * dim);
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < dim; ++c)
        ASSERT_EQ(g[static_cast<size_t>(r * dim + c)], y[static_cast<size_t>(rows[static_cast<size_t>(r)] * dim + c)]);
  }
}

TEST_F(CudaElementwise, MemGetInfo) {
  int64_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(api_->mem_get_info(&free_bytes, &total_bytes), 0) << api_->last_error();
  EXPECT_GT(total_bytes, 0);
  EXPECT_GT(free_bytes, 0);
  EXPECT_LE(free_bytes, total_bytes);
}

}  // namespace
}  // namespace tessera
