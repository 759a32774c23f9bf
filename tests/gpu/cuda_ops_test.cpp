// Element-wise and row-wise CUDA ops against the CPU reference kernels (kernels/*.h) over
// grids of shapes that include odd sizes: RMSNorm, add + RMSNorm, embedding (f32 / f16 tables
// and outputs), f32 <-> f16 conversion, SiLU·mul, GELU(tanh)·mul, scale, greedy argmax, F16 GEMM
// (cuBLAS).
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/tensor.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/sampling.h"
#include "tests/gpu/gpu_test_util.h"

namespace tessera {
namespace {

using gpu_test::gaussian;
using CudaOps = gpu_test::GpuTest;

// |a - b| <= atol + rtol * |b| for every element, reporting the first failure.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, float atol, float rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " element " << i;
}

TEST_F(CudaOps, RmsNormAndAddRmsNorm) {
  const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 64}, {2, 1000}, {4, 4097}};
  for (const auto& s : shapes) {
    const int64_t n = s[0], dim = s[1];
    const std::string what = "n=" + std::to_string(n) + " dim=" + std::to_string(dim);
    const std::vector<float> x = gaussian(n * dim, 1), delta = gaussian(n * dim, 2), w = gaussian(dim, 3);
    const float eps = 1e-5f;

    std::vector<float> want(x.size());
    rms_norm(x.data(), w.data(), want.data(), n, dim, eps);
    float* d_x = to_device(x);
    const float* d_w = to_device(w);
    float* d_y = alloc<float>(n * dim);
    ASSERT_EQ(api_->rms_norm_f32(d_x, d_w, d_y, n, dim, eps, nullptr), 0) << api_->last_error();
    expect_close(to_host(d_y, n * dim), want, 1e-5f, 5e-5f, "rms_norm " + what);

    std::vector<float> residual = x, want_y(x.size());
    add_rms_norm(residual.data(), delta.data(), w.data(), want_y.data(), n, dim, eps);
    float* d_delta = to_device(delta);
    // y aliases delta, which the API allows.
    ASSERT_EQ(api_->add_rms_norm_f32(d_x, d_delta, d_w, d_delta, n, dim, eps, nullptr), 0) << api_->last_error();
    expect_close(to_host(d_x, n * dim), residual, 0.0f, 0.0f, "add_rms_norm residual " + what);
    expect_close(to_host(d_delta, n * dim), want_y, 1e-5f, 5e-5f, "add_rms_norm y " + what);
  }
}

TEST_F(CudaOps, EmbeddingAllDtypes) {
  const int64_t vocab = 37;
  for (int64_t dim : {1, 5, 64, 300}) {
    const std::vector<float> table32 = gaussian(vocab * dim, 4);
    std::vector<uint16_t> table16(table32.size());
    for (size_t i = 0; i < table32.size(); ++i) table16[i] = f32_to_fp16(table32[i]);
    // Out-of-range ids (-1, vocab) give zero rows.
    const std::vector<int32_t> ids = {0, 36, 5, 5, -1, 37, 12};
    const int64_t n = static_cast<int64_t>(ids.size());
    const int32_t* d_ids = to_device(ids);
    for (int table_dtype : {TESSERA_CUDA_F32, TESSERA_CUDA_F16}) {
      const void* d_table = table_dtype == TESSERA_CUDA_F32 ? static_cast<const void*>(to_device(table32))
                                                            : static_cast<const void*>(to_device(table16));
      std::vector<float> want(static_cast<size_t>(n * dim), 0.0f);
      for (int64_t t = 0; t < n; ++t) {
        const int32_t id = ids[static_cast<size_t>(t)];
        if (id < 0 || id >= vocab) continue;
        for (int64_t i = 0; i < dim; ++i) {
          const size_t src = static_cast<size_t>(id * dim + i);
          want[static_cast<size_t>(t * dim + i)] =
              table_dtype == TESSERA_CUDA_F32 ? table32[src] : fp16_to_f32(table16[src]);
        }
      }
      const std::string what = "dim=" + std::to_string(dim) + " table_dtype=" + std::to_string(table_dtype);
      float* d_out32 = alloc<float>(n * dim);
      ASSERT_EQ(api_->embedding(d_table, table_dtype, vocab, dim, d_ids, n, d_out32, TESSERA_CUDA_F32, nullptr), 0)
          << api_->last_error();
      expect_close(to_host(d_out32, n * dim), want, 0.0f, 0.0f, "embedding f32 out " + what);

      uint16_t* d_out16 = alloc<uint16_t>(n * dim);
      ASSERT_EQ(api_->embedding(d_table, table_dtype, vocab, dim, d_ids, n, d_out16, TESSERA_CUDA_F16, nullptr), 0)
          << api_->last_error();
      const std::vector<uint16_t> got16 = to_host(d_out16, n * dim);
      for (size_t i = 0; i < got16.size(); ++i)
        ASSERT_EQ(got16[i], f32_to_fp16(want[i])) << "embedding f16 out " << what << " element " << i;
    }
  }
  int32_t* d_id = alloc<int32_t>(1);
  EXPECT_NE(api_->embedding(d_id, 7, vocab, 4, d_id, 1, d_id, TESSERA_CUDA_F32, nullptr), 0) << "bad dtype accepted";
}

TEST_F(CudaOps, ConvertF32F16RoundTrip) {
  for (int64_t n : {1, 255, 256, 100003}) {
    std::vector<float> x = gaussian(n, 5, 100.0f);
    x[0] = 65520.0f;  // rounds to +inf in f16
    const float* d_x = to_device(x);
    uint16_t* d_h = alloc<uint16_t>(n);
    float* d_back = alloc<float>(n);
    ASSERT_EQ(api_->convert_f32_to_f16(d_x, d_h, n, nullptr), 0) << api_->last_error();
    ASSERT_EQ(api_->convert_f16_to_f32(d_h, d_back, n, nullptr), 0) << api_->last_error();
    const std::vector<uint16_t> h = to_host(d_h, n);
    const std::vector<float> back = to_host(d_back, n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(h[static_cast<size_t>(i)], f32_to_fp16(x[static_cast<size_t>(i)])) << "n=" << n << " element " << i;
      ASSERT_EQ(back[static_cast<size_t>(i)], fp16_to_f32(h[static_cast<size_t>(i)])) << "n=" << n << " element " << i;
    }
  }
}

TEST_F(CudaOps, SiluMul) {
  const int64_t shapes[][2] = {{1, 1}, {3, 17}, {8, 1000}, {2, 70001}};
  for (const auto& s : shapes) {
    const int64_t n = s[0], dim = s[1];
    const std::vector<float> gate = gaussian(n * dim, 6, 4.0f), up = gaussian(n * dim, 7);
    std::vector<float> want(gate.size());
    silu_mul(gate.data(), up.data(), want.data(), n, dim);
    float* d_gate = to_device(gate);
    const float* d_up = to_device(up);
    ASSERT_EQ(api_->silu_mul_f32(d_gate, d_up, d_gate, n, dim, nullptr), 0) << api_->last_error();  // in place
    expect_close(to_host(d_gate, n * dim), want, 1e-6f, 1e-5f,
                 "silu_mul n=" + std::to_string(n) + " dim=" + std::to_string(dim));
  }
}

// gelu_tanh_mul on the device against the CPU: tanhf's few-ulp error is an absolute error of
// (1 + t), which 0.5 * |gate| * |up| scales (it dominates where t is near -1), plus a few ulp of
// the result.
void expect_gelu_close(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& gate,
                       const std::vector<float>& up, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-6f * std::fabs(gate[i] * up[i]) + 2e-6f * std::fabs(want[i]) + 1e-30f)
        << what << " element " << i << " gate " << gate[i] << " up " << up[i];
}

TEST_F(CudaOps, GeluTanhMul) {
  const int64_t shapes[][2] = {{1, 1}, {3, 17}, {8, 1000}, {2, 70001}};
  for (const auto& s : shapes) {
    const int64_t n = s[0], dim = s[1];
    std::vector<float> gate = gaussian(n * dim, 11, 4.0f);
    const std::vector<float> up = gaussian(n * dim, 12);
    const float extremes[] = {30.0f, -30.0f, 1e30f, -1e30f, 0.0f, -0.0f};
    for (size_t i = 0; i < std::size(extremes) && i < gate.size(); ++i) gate[i] = extremes[i];
    std::vector<float> want(gate.size());
    gelu_tanh_mul(gate.data(), up.data(), want.data(), n, dim);
    const float* d_gate = to_device(gate);
    float* d_up = to_device(up);
    ASSERT_EQ(api_->gelu_tanh_mul_f32(d_gate, d_up, d_up, n, dim, nullptr), 0) << api_->last_error();  // out = up
    expect_gelu_close(to_host(d_up, n * dim), want, gate, up,
                      "gelu_tanh_mul n=" + std::to_string(n) + " dim=" + std::to_string(dim));
  }
  EXPECT_EQ(api_->gelu_tanh_mul_f32(nullptr, nullptr, nullptr, 0, 5, nullptr), 0) << api_->last_error();
  EXPECT_NE(api_->gelu_tanh_mul_f32(nullptr, nullptr, nullptr, -1, 5, nullptr), 0) << "negative size accepted";
}

// One fp32 multiply per element: the same bits as the CPU.
TEST_F(CudaOps, ScaleMatchesCpuBitForBit) {
  for (int64_t n : {1, 255, 256, 100003}) {
    for (float s : {0.125f, -3.7f, 45.254833f}) {
      const std::vector<float> x = gaussian(n, 13, 10.0f);
      std::vector<float> want = x;
      scale_f32(want.data(), s, n);
      float* d_x = to_device(x);
      ASSERT_EQ(api_->scale_f32(d_x, s, n, nullptr), 0) << api_->last_error();
      EXPECT_EQ(to_host(d_x, n), want) << "scale n=" << n << " s=" << s;
    }
  }
  EXPECT_EQ(api_->scale_f32(nullptr, 2.0f, 0, nullptr), 0) << api_->last_error();
  EXPECT_NE(api_->scale_f32(nullptr, 2.0f, -1, nullptr), 0) << "negative size accepted";
}

// Both ops captured into a CUDA graph: nothing runs during the capture, and every replay reads
// the buffers as they are then.
TEST_F(CudaOps, GeluTanhMulAndScaleReplayFromAGraph) {
  const int64_t n = 5, dim = 301, count = n * dim;
  const float s = 0.5f;
  float* d_gate = alloc<float>(count);
  float* d_up = alloc<float>(count);
  const std::vector<float> sentinel(static_cast<size_t>(count), 7.0f);
  float* d_out = to_device(sentinel);
  void* stream = nullptr;
  ASSERT_EQ(api_->stream_create(&stream), 0) << api_->last_error();
  void* graph = nullptr;
  ASSERT_EQ(api_->graph_begin_capture(stream), 0) << api_->last_error();
  ASSERT_EQ(api_->gelu_tanh_mul_f32(d_gate, d_up, d_out, n, dim, stream), 0) << api_->last_error();
  ASSERT_EQ(api_->scale_f32(d_out, s, count, stream), 0) << api_->last_error();
  ASSERT_EQ(api_->graph_end_capture(stream, &graph), 0) << api_->last_error();
  EXPECT_EQ(to_host(d_out, count), sentinel) << "an op ran during the capture";
  for (uint32_t replay = 0; replay < 2; ++replay) {
    const std::vector<float> gate = gaussian(count, 20 + replay, 3.0f), up = gaussian(count, 30 + replay);
    ASSERT_EQ(api_->device_memcpy(d_gate, gate.data(), count * static_cast<int64_t>(sizeof(float))), 0);
    ASSERT_EQ(api_->device_memcpy(d_up, up.data(), count * static_cast<int64_t>(sizeof(float))), 0);
    ASSERT_EQ(api_->graph_launch(graph, stream), 0) << api_->last_error();
    ASSERT_EQ(api_->stream_synchronize(stream), 0) << api_->last_error();
    std::vector<float> want(static_cast<size_t>(count));
    gelu_tanh_mul(gate.data(), up.data(), want.data(), n, dim);
    scale_f32(want.data(), s, count);  // exact (a power of two), so the gelu bound still holds
    std::vector<float> scaled_up = up;
    scale_f32(scaled_up.data(), s, count);
    expect_gelu_close(to_host(d_out, count), want, gate, scaled_up, "replay " + std::to_string(replay));
  }
  EXPECT_EQ(api_->graph_destroy(graph), 0);
  EXPECT_EQ(api_->stream_destroy(stream), 0);
}

TEST_F(CudaOps, ArgmaxMatchesGreedySampler) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t vocab : {1, 3, 1000, 32000, 128256}) {
    const int64_t rows = 6;
    std::vector<float> logits = gaussian(rows * vocab, 8, 3.0f);
    float* row = logits.data();
    if (vocab > 2) {
      row[vocab - 1] = 50.0f;  // row 0: a tie between the last id and id 1 -> id 1
      row[1] = 50.0f;
    }
    row += vocab;
    for (int64_t i = 0; i < vocab; ++i) row[i] = -inf;  // row 1: all -inf -> 0
    row += vocab;
    row[vocab / 2] = nan;  // row 2: NaN counts as -inf
    row[vocab - 1] = inf;  // and +inf wins
    row += vocab;
    for (int64_t i = 0; i < vocab; ++i) row[i] = nan;  // row 3: all NaN -> 0
    // rows 4, 5: plain random.
    std::vector<int32_t> want(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      SamplingParams p;
      p.temperature = 0.0f;
      Sampler sampler(p);
      std::vector<float> copy(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
      want[static_cast<size_t>(r)] = sampler.sample(copy.data(), vocab).id;
    }
    const float* d_logits = to_device(logits);
    int32_t* d_ids = alloc<int32_t>(rows);
    ASSERT_EQ(api_->argmax_f32(d_logits, rows, vocab, d_ids, nullptr), 0) << api_->last_error();
    EXPECT_EQ(to_host(d_ids, rows), want) << "vocab=" << vocab;
    // With values and an id offset (a TP rank's slice of the vocabulary).
    float* d_values = alloc<float>(rows);
    ASSERT_EQ(api_->argmax_value_f32(d_logits, rows, vocab, 1000, d_ids, d_values, nullptr), 0) << api_->last_error();
    const std::vector<int32_t> ids = to_host(d_ids, rows);
    const std::vector<float> values = to_host(d_values, rows);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(ids[static_cast<size_t>(r)], want[static_cast<size_t>(r)] + 1000) << "vocab=" << vocab << " row " << r;
      const float v = logits[static_cast<size_t>(r * vocab + want[static_cast<size_t>(r)])];
      EXPECT_EQ(values[static_cast<size_t>(r)], std::isnan(v) ? -inf : v) << "vocab=" << vocab << " row " << r;
    }
  }
}

TEST_F(CudaOps, GemmF16MatchesCpuMatmul) {
  void* blas = nullptr;
  ASSERT_EQ(api_->blas_create(&blas), 0) << api_->last_error();
  const int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 3}, {64, 128, 1}, {257, 96, 5}, {1000, 512, 32}, {33, 4096, 8}};
  for (const auto& s : shapes) {
    const int64_t rows = s[0], cols = s[1], n = s[2];
    const std::string what = "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " n=" + std::to_string(n);
    const std::vector<float> w32 = gaussian(rows * cols, 9, 0.5f), x32 = gaussian(n * cols, 10);
    std::vector<uint16_t> w16(w32.size()), x16(x32.size());
    std::vector<float> x_rounded(x32.size());
    for (size_t i = 0; i < w32.size(); ++i) w16[i] = f32_to_fp16(w32[i]);
    for (size_t i = 0; i < x32.size(); ++i) {
      x16[i] = f32_to_fp16(x32[i]);
      x_rounded[i] = fp16_to_f32(x16[i]);
    }
    std::vector<float> want(static_cast<size_t>(n * rows));
    matmul(make_view(w16.data(), QuantType::kF16, {rows, cols}), x_rounded.data(), n, want.data(), nullptr);
    // Error bound: fp32 accumulation of cols products, scaled by the sum of their magnitudes.
    std::vector<float> bound(want.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double mag = 0.0;
        for (int64_t c = 0; c < cols; ++c)
          mag += std::fabs(fp16_to_f32(w16[static_cast<size_t>(r * cols + c)]) * x_rounded[static_cast<size_t>(t * cols + c)]);
        bound[static_cast<size_t>(t * rows + r)] = static_cast<float>(1e-5 + 2e-4 * mag);
      }

    const uint16_t* d_w = to_device(w16);
    // x goes up as f32 and is converted on the device, the path the forward pass will use.
    const float* d_x32 = to_device(x32);
    uint16_t* d_x16 = alloc<uint16_t>(n * cols);
    ASSERT_EQ(api_->convert_f32_to_f16(d_x32, d_x16, n * cols, nullptr), 0) << api_->last_error();
    float* d_y = alloc<float>(n * rows);
    ASSERT_EQ(api_->gemm_f16(blas, d_w, d_x16, d_y, rows, cols, n, nullptr), 0) << api_->last_error();
    EXPECT_EQ(to_host(d_x16, n * cols), x16) << "device f32->f16 conversion " << what;
    const std::vector<float> got = to_host(d_y, n * rows);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], bound[i]) << "gemm_f16 " << what << " element " << i;
  }
  EXPECT_EQ(api_->blas_destroy(blas), 0) << api_->last_error();
}

}  // namespace
}  // namespace tessera
