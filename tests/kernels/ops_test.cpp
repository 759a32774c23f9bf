// Every CPU op against a naive reference written here, over grids of shapes that include odd
// sizes, for both the AVX2 and the scalar paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/tensor.h"
#include "common/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/cpu/vec.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/paged_attention.h"
#include "kernels/quant.h"
#include "kernels/rope.h"
#include "tests/kernels/kernel_test_util.h"

namespace tessera {
namespace {

using test::gaussian;

// Runs a test body with the AVX2 path (when the CPU has it) and with the scalar path.
class BothPaths : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!GetParam() && !cpu::has_avx2()) GTEST_SKIP() << "CPU has no AVX2/FMA/F16C";
    cpu::set_force_scalar(GetParam());
  }
  void TearDown() override { cpu::set_force_scalar(false); }
};

std::string path_name(const ::testing::TestParamInfo<bool>& info) {
  return info.param ? "Scalar" : "Simd";
}

// ------------------------------------------------------------------ matmul

struct QuantizedMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> dequantized;  // [rows, cols]
  TensorView view;
};

QuantizedMatrix make_matrix(QuantType type, int64_t rows, int64_t cols, uint32_t seed) {
  QuantizedMatrix m;
  const auto src = gaussian(rows * cols, seed, 0.5f);
  const size_t rb = row_bytes(type, cols);
  m.bytes.resize(rb * static_cast<size_t>(rows) + 1);
  m.dequantized.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, src.data() + r * cols, m.bytes.data() + r * rb, cols);
    dequantize_row(type, m.bytes.data() + r * rb, m.dequantized.data() + r * cols, cols);
  }
  m.view = make_view(m.bytes.data(), type, {rows, cols});
  return m;
}

// The block of activations the integer-dot kernels quantize together (0: float weights, no
// activation quantization); see kernels/cpu/qgemm.h.
int64_t activation_block(QuantType type) {
  switch (type) {
    case QuantType::kQ8_0: case QuantType::kQ4_0: case QuantType::kQ5_0: return 32;
    case QuantType::kQ4_K: case QuantType::kQ5_K: case QuantType::kQ6_K: return 256;
    default: return 0;
  }
}

// y_ref[t, r] in double, and the error budget: the scale sum |w||x| the fp32 error is relative
// to, plus, for formats with int8 activations, the rounding of each activation to its block's
// int8 grid (at most amax / 254 per element, plus amax / 2048 for the fp16 rounding of
// 32-block scales, times |w|).
void reference_matmul(const QuantizedMatrix& m, const std::vector<float>& x, int64_t n_tokens,
                      std::vector<double>* y, std::vector<double>* mag, std::vector<double>* act_err) {
  const int64_t rows = m.view.rows(), cols = m.view.cols();
  const int64_t blk = activation_block(m.view.type);
  y->assign(static_cast<size_t>(n_tokens * rows), 0.0);
  mag->assign(static_cast<size_t>(n_tokens * rows), 0.0);
  act_err->assign(static_cast<size_t>(n_tokens * rows), 0.0);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0, a = 0, e = 0, amax = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double w = m.dequantized[r * cols + c];
        const double p = w * x[t * cols + c];
        s += p;
        a += std::fabs(p);
        if (blk > 0) {
          if (c % blk == 0) {
            amax = 0;
            for (int64_t j = c; j < c + blk; ++j) amax = std::max(amax, std::fabs(static_cast<double>(x[t * cols + j])));
          }
          e += std::fabs(w) * amax * (1.0 / 254 + 1.0 / 2048);  // half a step + fp16 scale rounding
        }
      }
      (*y)[t * rows + r] = s;
      (*mag)[t * rows + r] = a;
      (*act_err)[t * rows + r] = e;
    }
}

const QuantType kAllWeightTypes[] = {QuantType::kF32,  QuantType::kF16,  QuantType::kBF16,
                                     QuantType::kQ8_0, QuantType::kQ4_0, QuantType::kQ5_0,
                                     QuantType::kQ4_K, QuantType::kQ5_K, QuantType::kQ6_K};

using MatmulTest = BothPaths;

TEST_P(MatmulTest, MatchesReferenceOverShapesAndTypes) {
  MatmulPrecisionScope fp32(MatmulPrecision::kFp32);  // the fp32 kernels (bf16: matmul_precision_test)
  ThreadPool pool3(ThreadPoolOptions{.num_threads = 3});
  for (QuantType type : kAllWeightTypes) {
    const int be = quant_traits(type).block_elems;
    std::vector<int64_t> ks = {256, 512};
    if (be == 32) ks.push_back(32);
    if (be == 1) ks.insert(ks.end(), {1, 7, 33, 100});
    for (int64_t rows : {1, 7, 33}) {
      for (int64_t k : ks) {
        const auto m = make_matrix(type, rows, k, static_cast<uint32_t>(rows * 1000 + k));
        for (int64_t n_tokens : {1, 3}) {
          const auto x = gaussian(n_tokens * k, static_cast<uint32_t>(k + n_tokens));
          std::vector<double> ref, mag, act_err;
          reference_matmul(m, x, n_tokens, &ref, &mag, &act_err);
          std::vector<float> y1(static_cast<size_t>(n_tokens * rows), NAN);
          std::vector<float> y3(y1.size(), NAN), y0(y1.size(), NAN);
          ThreadPool pool1(ThreadPoolOptions{.num_threads = 1});
          matmul(m.view, x.data(), n_tokens, y1.data(), &pool1);
          matmul(m.view, x.data(), n_tokens, y3.data(), &pool3);
          matmul(m.view, x.data(), n_tokens, y0.data(), nullptr);
          for (size_t i = 0; i < y1.size(); ++i) {
            ASSERT_NEAR(y1[i], ref[i], 1.001 * act_err[i] + 2e-6 * mag[i] + 1e-7)
                << quant_name(type) << " rows " << rows << " k " << k << " tokens " << n_tokens
                << " i " << i;
            // Deterministic reduction: the pool size never changes a bit of the result.
            ASSERT_EQ(std::memcmp(&y1[i], &y3[i], 4), 0) << quant_name(type) << " i " << i;
            ASSERT_EQ(std::memcmp(&y1[i], &y0[i], 4), 0) << quant_name(type) << " i " << i;
          }
        }
      }
    }
  }
}

TEST_P(MatmulTest, TokenAloneEqualsTokenInBatch) {
  // Decode (one token, fused row-dot) and prefill (dequantize once, many tokens) produce
  // bit-identical outputs for the same token.
  for (QuantType type : kAllWeightTypes) {
    const int64_t rows = 19, k = 512, n_tokens = 5;
    const auto m = make_matrix(type, rows, k, 77);
    const auto x = gaussian(n_tokens * k, 78);
    std::vector<float> batch(static_cast<size_t>(n_tokens * rows));
    matmul(m.view, x.data(), n_tokens, batch.data(), nullptr);
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::vector<float> one(static_cast<size_t>(rows));
      matmul(m.view, x.data() + t * k, 1, one.data(), nullptr);
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(std::memcmp(&one[r], &batch[t * rows + r], 4), 0)
            << quant_name(type) << " token " << t << " row " << r;
    }
  }
}

TEST_P(MatmulTest, RowsSliceWritesStridedOutput) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  for (QuantType type : {QuantType::kF32, QuantType::kQ4_K, QuantType::kQ8_0}) {
    const int64_t rows = 33, k = 256, n_tokens = 3, begin = 5, end = 22, stride = 20;
    const auto m = make_matrix(type, rows, k, 5);
    const auto x = gaussian(n_tokens * k, 6);
    std::vector<float> full(static_cast<size_t>(n_tokens * rows));
    matmul(m.view, x.data(), n_tokens, full.data(), &pool);
    std::vector<float> part(static_cast<size_t>(n_tokens * stride), -7.0f);
    matmul_rows(m.view, begin, end, x.data(), n_tokens, part.data(), stride, &pool);
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t j = 0; j < stride; ++j) {
        const float got = part[t * stride + j];
        if (j < end - begin) {
          ASSERT_EQ(got, full[t * rows + begin + j]) << quant_name(type) << " t " << t << " j " << j;
        } else {
          ASSERT_EQ(got, -7.0f) << "wrote past the slice: t " << t << " j " << j;
        }
      }
    }
    // An empty slice writes nothing.
    matmul_rows(m.view, 4, 4, x.data(), n_tokens, part.data(), stride, &pool);
  }
}

TEST_P(MatmulTest, LongRowsUseSmallTiles) {
  // k large enough that a tile holds fewer rows than the grain.
  const int64_t rows = 37, k = 256 * 80, n_tokens = 2;
  const auto m = make_matrix(QuantType::kQ6_K, rows, k, 9);
  const auto x = gaussian(n_tokens * k, 10);
  std::vector<double> ref, mag, act_err;
  reference_matmul(m, x, n_tokens, &ref, &mag, &act_err);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows));
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  matmul(m.view, x.data(), n_tokens, y.data(), &pool);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 1.001 * act_err[i] + 1e-5 * mag[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Paths, MatmulTest, ::testing::Values(false, true), path_name);

// ------------------------------------------------------------------ norm, activation, rope

TEST(RmsNorm, MatchesReference) {
  for (int64_t dim : {1, 7, 64, 4096}) {
    const int64_t n = 3;
    const auto x = gaussian(n * dim, static_cast<uint32_t>(dim), 3.0f);
    const auto w = gaussian(dim, 99);
    std::vector<float> y(x.size());
    rms_norm(x.data(), w.data(), y.data(), n, dim, 1e-5f);
    for (int64_t r = 0; r < n; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int64_t i = 0; i < dim; ++i) {
        const double want = x[r * dim + i] * inv * w[i];
        ASSERT_NEAR(y[r * dim + i], want, 1e-6 * std::fabs(want) + 1e-7) << dim << " " << r << " " << i;
      }
    }
    // In place gives the same bits.
    std::vector<float> inplace = x;
    rms_norm(inplace.data(), w.data(), inplace.data(), n, dim, 1e-5f);
    EXPECT_EQ(inplace, y);
  }
}

TEST(RmsNorm, AddRmsNormUpdatesResidual) {
  const int64_t n = 2, dim = 33;
  auto residual = gaussian(n * dim, 1);
  const auto delta = gaussian(n * dim, 2);
  const auto w = gaussian(dim, 3);
  std::vector<float> sum(residual.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = residual[i] + delta[i];
  std::vector<float> want(sum.size()), got(sum.size());
  rms_norm(sum.data(), w.data(), want.data(), n, dim, 1e-6f);
  add_rms_norm(residual.data(), delta.data(), w.data(), got.data(), n, dim, 1e-6f);
  EXPECT_EQ(residual, sum);
  EXPECT_EQ(got, want);
}

TEST(SiluMul, MatchesReference) {
  const int64_t n_tokens = 3, dim = 37;
  auto gate = gaussian(n_tokens * dim, 4, 4.0f);
  gate[0] = 100.0f;
  gate[1] = -100.0f;
  const auto up = gaussian(n_tokens * dim, 5);
  std::vector<float> out(gate.size());
  silu_mul(gate.data(), up.data(), out.data(), n_tokens, dim);
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double want = g / (1.0 + std::exp(-g)) * up[i];
    ASSERT_NEAR(out[i], want, 1e-6 * std::fabs(want) + 1e-7) << i;
  }
  silu_mul(gate.data(), up.data(), gate.data(), n_tokens, dim);  // out aliases gate
  EXPECT_EQ(gate, out);
}

// Against the formula in double. The fp32 steps round the cube and the tanh argument (which
// moves t by at most ~3e-7 where (1 - t^2) is largest) and tanh itself; near t = -1 that is an
// absolute error of (1 + t), scaled by 0.5 * |gate| * |up|, else a few ulp of the result.
TEST(GeluTanhMul, MatchesReference) {
  const double sqrt_2_over_pi = std::sqrt(2.0 / std::numbers::pi);
  for (int64_t dim : {1, 7, 64, 1000}) {
    const int64_t n_tokens = 3;
    auto gate = gaussian(n_tokens * dim, static_cast<uint32_t>(dim) + 40, 4.0f);
    const float extremes[] = {100.0f, -100.0f, 1e30f, -1e30f, 0.0f, -0.0f, 1e-20f, 8.0f, -8.0f};
    for (size_t i = 0; i < std::size(extremes) && i < gate.size(); ++i) gate[i] = extremes[i];
    const auto up = gaussian(n_tokens * dim, static_cast<uint32_t>(dim) + 41);
    std::vector<float> out(gate.size());
    gelu_tanh_mul(gate.data(), up.data(), out.data(), n_tokens, dim);
    for (size_t i = 0; i < gate.size(); ++i) {
      const double g = gate[i], u = up[i];
      const double want = 0.5 * g * (1.0 + std::tanh(sqrt_2_over_pi * (g + 0.044715 * g * g * g))) * u;
      ASSERT_NEAR(out[i], want, 3e-7 * std::fabs(g * u) + 1e-6 * std::fabs(want) + 1e-30)
          << "dim " << dim << " element " << i << " gate " << g;
    }
    // out aliasing gate or up gives the same bits.
    std::vector<float> in_gate = gate, in_up = up;
    gelu_tanh_mul(in_gate.data(), up.data(), in_gate.data(), n_tokens, dim);
    gelu_tanh_mul(gate.data(), in_up.data(), in_up.data(), n_tokens, dim);
    EXPECT_TRUE(test::same_bits(in_gate, out)) << dim;
    EXPECT_TRUE(test::same_bits(in_up, out)) << dim;
  }
  const float nan = std::numeric_limits<float>::quiet_NaN(), one = 1.0f;
  float out = 0.0f;
  gelu_tanh_mul(&nan, &one, &out, 1, 1);
  EXPECT_TRUE(std::isnan(out));
}

// The fp16-grid GeGLU: the table is exactly fp16(gelu(fp16(x))) on every fp16 input in (-10, 10),
// the limits outside, and within 2^-10 of the exact function.
TEST(GeluTanhMulFp16Grid, IsTheExactGeluOnTheFp16Grid) {
  const double sqrt_2_over_pi = std::sqrt(2.0 / std::numbers::pi);
  std::vector<float> gate, up;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = fp16_to_f32(static_cast<uint16_t>(h));
    if (std::isfinite(x)) gate.push_back(x);
  }
  for (float x : {-10.0f, 10.0f, -10.5f, 11.0f, -1e30f, 1e30f, 0.3333333f, -2.7182818f}) gate.push_back(x);
  up.assign(gate.size(), 1.0f);
  up[7] = -3.0f;
  std::vector<float> out(gate.size());
  const cpu::Isa best = cpu::active_isa();
  for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
    if (static_cast<int>(isa) > static_cast<int>(best)) continue;
    cpu::set_max_isa(isa);
    gelu_tanh_mul_fp16_grid(gate.data(), up.data(), out.data(), 1, static_cast<int64_t>(gate.size()));
    cpu::set_max_isa(best);
    SCOPED_TRACE(cpu::isa_name(isa));
    for (size_t i = 0; i < gate.size(); ++i) {
      const float x = gate[i];
      if (x <= -10.0f) {
        ASSERT_EQ(out[i], 0.0f) << x;
      } else if (x >= 10.0f) {
        ASSERT_EQ(out[i], x * up[i]) << x;
      } else {
        const float x16 = fp16_to_f32(f32_to_fp16(x)), unit = 1.0f;
        float g = 0.0f;
        gelu_tanh_mul(&x16, &unit, &g, 1, 1);
        ASSERT_EQ(out[i], fp16_to_f32(f32_to_fp16(g)) * up[i]) << "x " << x;
        const double want = 0.5 * x * (1.0 + std::tanh(sqrt_2_over_pi * (x + 0.044715 * double(x) * x * x))) * up[i];
        // Float cancellation in 1 + tanh for x << 0 costs ~1e-7 absolute (llama.cpp computes it the same way).
        ASSERT_NEAR(out[i], want, std::ldexp(1.0, -10) * std::fabs(want) + 3e-7 * std::fabs(up[i])) << "x " << x;
      }
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN(), one = 1.0f;
  float o = 0.0f;
  gelu_tanh_mul_fp16_grid(&nan, &one, &o, 1, 1);
  EXPECT_TRUE(std::isnan(o));
}

// One fp32 multiply: the product of two floats is exact in double, so rounding it to float is
// the correctly rounded fp32 product, bit for bit.
TEST(ScaleF32, IsOneRoundedMultiply) {
  for (int64_t n : {0, 1, 17, 4096}) {
    for (float s : {0.0f, -1.0f, 0.3f, 45.254833f, 1e30f}) {
      const auto x = gaussian(std::max<int64_t>(n, 1), static_cast<uint32_t>(n) + 50, 10.0f);
      std::vector<float> y = x;
      scale_f32(y.data(), s, n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = static_cast<float>(static_cast<double>(x[i]) * static_cast<double>(s));
        ASSERT_EQ(std::memcmp(&y[i], &want, sizeof(float)), 0) << "n " << n << " s " << s << " element " << i;
      }
      for (size_t i = static_cast<size_t>(n); i < y.size(); ++i) EXPECT_EQ(y[i], x[i]) << "wrote past n";
    }
  }
}

std::vector<float> llama_inv_freq(int64_t head_dim, float theta) {
  std::vector<float> f(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i)
    f[static_cast<size_t>(i)] =
        1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  return f;
}

TEST(Rope, MatchesReferenceRotateHalf) {
  for (int64_t head_dim : {2, 8, 64}) {
    for (int64_t n_heads : {1, 3}) {
      const std::vector<int32_t> positions = {0, 1, 17, 4095};
      const auto n_tokens = static_cast<int64_t>(positions.size());
      const auto inv_freq = llama_inv_freq(head_dim, 10000.0f);
      const auto x = gaussian(n_tokens * n_heads * head_dim, 8);
      std::vector<float> y = x;
      rope_apply(y.data(), positions.data(), n_tokens, n_heads, head_dim, inv_freq.data());
      const int64_t half = head_dim / 2;
      for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t h = 0; h < n_heads; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const size_t base = static_cast<size_t>((t * n_heads + h) * head_dim);
            // Angle as fp32 does it (pos * inv_freq rounded to float), then exact trig.
            const double angle = static_cast<float>(positions[t]) * inv_freq[i];
            const double a = x[base + i], b = x[base + i + half];
            const double want0 = a * std::cos(angle) - b * std::sin(angle);
            const double want1 = a * std::sin(angle) + b * std::cos(angle);
            ASSERT_NEAR(y[base + i], want0, 2e-6) << head_dim << " t " << t << " i " << i;
            ASSERT_NEAR(y[base + i + half], want1, 2e-6) << head_dim << " t " << t << " i " << i;
          }
    }
  }
}

TEST(Rope, EqualsInterleavedFormulationAfterPermutation) {
  // llama2.c rotates adjacent pairs (2i, 2i+1) with freq 1 / 10000^(2i / head_dim); a GGUF/HF
  // checkpoint permuted to rotate-half must give the same numbers.
  const int64_t head_dim = 48, n_heads = 2;
  const auto inv_freq = llama_inv_freq(head_dim, 10000.0f);
  const auto x = gaussian(n_heads * head_dim, 12);
  for (int32_t pos : {0, 3, 250, 1000}) {
    std::vector<float> interleaved = x;
    for (int64_t h = 0; h < n_heads; ++h) {
      for (int64_t i = 0; i < head_dim; i += 2) {
        const float freq = 1.0f / std::pow(10000.0f, static_cast<float>(i) / static_cast<float>(head_dim));
        const float val = static_cast<float>(pos) * freq;
        const float c = std::cos(val), s = std::sin(val);
        float* v = interleaved.data() + h * head_dim + i;
        const float v0 = v[0], v1 = v[1];
        v[0] = v0 * c - v1 * s;
        v[1] = v0 * s + v1 * c;
      }
    }
    // Rotate-half layout: element i <- interleaved 2i, element i + half <- interleaved 2i + 1.
    std::vector<float> half_layout(x.size());
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < n_heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        half_layout[h * head_dim + i] = x[h * head_dim + 2 * i];
        half_layout[h * head_dim + half + i] = x[h * head_dim + 2 * i + 1];
      }
    rope_apply(half_layout.data(), &pos, 1, n_heads, head_dim, inv_freq.data());
    for (int64_t h = 0; h < n_heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        EXPECT_NEAR(half_layout[h * head_dim + i], interleaved[h * head_dim + 2 * i], 1e-6);
        EXPECT_NEAR(half_layout[h * head_dim + half + i], interleaved[h * head_dim + 2 * i + 1], 1e-6);
      }
  }
}

// ------------------------------------------------------------------ paged attention

struct AttnCase {
  int64_t block_size, n_heads, n_kv_heads, head_dim, start_pos, n_tokens, window;
};

// A cache with a shuffled block table, holding positions [0, start_pos + n_tokens).
struct CacheFixture {
  std::vector<float> k_store, v_store;
  std::vector<int32_t> block_table;
  PagedKvLayer layer;
  std::vector<float> k_all, v_all;  // contiguous [pos][kv_head][dim], for the reference

  CacheFixture(const AttnCase& c, uint32_t seed) {
    const int64_t total = c.start_pos + c.n_tokens;
    const int64_t needed = (total + c.block_size - 1) / c.block_size;
    const int64_t num_blocks = needed + 3;
    const int64_t row = c.n_kv_heads * c.head_dim;
    k_store.assign(static_cast<size_t>(num_blocks * c.block_size * row), NAN);
    v_store.assign(k_store.size(), NAN);  // unwritten slots must never be read
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    block_table.assign(ids.begin(), ids.begin() + needed);
    layer = PagedKvLayer{k_store.data(), v_store.data(), num_blocks, c.block_size, c.n_kv_heads,
                         c.head_dim};
    k_all = gaussian(total * row, seed + 1);
    v_all = gaussian(total * row, seed + 2);
  }
};

// out[t, h, :] in double.
std::vector<double> reference_attention(const AttnCase& c, const CacheFixture& f,
                                        const std::vector<float>& q, float scale) {
  const int64_t hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  std::vector<double> out(static_cast<size_t>(c.n_tokens * c.n_heads * hd), 0.0);
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    const int64_t p = c.start_pos + t;
    for (int64_t h = 0; h < c.n_heads; ++h) {
      const int64_t kvh = h / group;
      std::vector<double> s;
      std::vector<int64_t> keys;
      for (int64_t j = 0; j <= p; ++j) {
        if (c.window > 0 && j <= p - c.window) continue;
        double d = 0;
        for (int64_t i = 0; i < hd; ++i)
          d += static_cast<double>(q[(t * c.n_heads + h) * hd + i]) *
               f.k_all[(j * c.n_kv_heads + kvh) * hd + i];
        s.push_back(d * scale);
        keys.push_back(j);
      }
      double mx = -INFINITY, sum = 0;
      for (double v : s) mx = std::max(mx, v);
      for (double& v : s) sum += (v = std::exp(v - mx));
      for (size_t n = 0; n < keys.size(); ++n)
        for (int64_t i = 0; i < hd; ++i)
          out[(t * c.n_heads + h) * hd + i] +=
              s[n] / sum * f.v_all[(keys[n] * c.n_kv_heads + kvh) * hd + i];
    }
  }
  return out;
}

using AttentionTest = BothPaths;

TEST_P(AttentionTest, MatchesReferenceOverGrid) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  const std::pair<int64_t, int64_t> heads[] = {{1, 1}, {2, 1}, {4, 2}, {8, 2}};
  uint32_t seed = 1;
  for (int64_t block_size : {1, 7, 16}) {
    for (auto [n_heads, n_kv] : heads) {
      for (int64_t head_dim : {8, 36}) {
        for (int64_t start_pos : {0, 5, 19}) {
          for (int64_t n_tokens : {1, 3, 10}) {
            for (int64_t window : {0, 4}) {
              const AttnCase c{block_size, n_heads, n_kv, head_dim, start_pos, n_tokens, window};
              CacheFixture f(c, ++seed);
              const int64_t row = n_kv * head_dim;
              // Earlier steps wrote [0, start_pos); this step writes its own tokens first.
              kv_write(f.layer, f.block_table.data(), 0, start_pos, f.k_all.data(), f.v_all.data());
              kv_write(f.layer, f.block_table.data(), start_pos, n_tokens,
                       f.k_all.data() + start_pos * row, f.v_all.data() + start_pos * row);
              const auto q = gaussian(n_tokens * n_heads * head_dim, seed + 100);
              const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
              std::vector<float> out(q.size(), NAN), out1(q.size(), NAN);
              AttentionArgs args{q.data(), out.data(), n_tokens, start_pos, n_heads, scale, window,
                                 f.block_table.data()};
              paged_attention(f.layer, args, &pool);
              args.out = out1.data();
              paged_attention(f.layer, args, nullptr);
              const auto ref = reference_attention(c, f, q, scale);
              for (size_t i = 0; i < out.size(); ++i) {
                ASSERT_NEAR(out[i], ref[i], 2e-6)
                    << "bs " << block_size << " heads " << n_heads << "/" << n_kv << " hd "
                    << head_dim << " start " << start_pos << " tokens " << n_tokens << " window "
                    << window << " i " << i;
                ASSERT_EQ(std::memcmp(&out[i], &out1[i], 4), 0) << "pool changed the result";
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(AttentionTest, ChunkedPrefillEqualsOneShot) {
  const AttnCase c{5, 4, 2, 16, 0, 12, 0};
  CacheFixture f(c, 42);
  kv_write(f.layer, f.block_table.data(), 0, c.n_tokens, f.k_all.data(), f.v_all.data());
  const auto q = gaussian(c.n_tokens * c.n_heads * c.head_dim, 43);
  std::vector<float> whole(q.size()), chunked(q.size());
  AttentionArgs args{q.data(), whole.data(), c.n_tokens, 0, c.n_heads, 0.25f, 0, f.block_table.data()};
  paged_attention(f.layer, args, nullptr);
  const int64_t per_token = c.n_heads * c.head_dim;
  for (int64_t start : {0, 4, 11}) {
    const int64_t n = (start == 0 ? 4 : start == 4 ? 7 : 1);
    AttentionArgs part{q.data() + start * per_token, chunked.data() + start * per_token, n, start,
                       c.n_heads, 0.25f, 0, f.block_table.data()};
    paged_attention(f.layer, part, nullptr);
  }
  EXPECT_EQ(whole, chunked);
}

// Prompts long enough for the prefill tiles (16 tokens x GQA heads per item, transposed keys):
// every shape must match the reference and give the bits of the same tokens attended one at a
// time (per-token items), with and without a pool; head_dim 160 exceeds the tiles' limit.
TEST_P(AttentionTest, LongPromptsMatchReferenceAndTokenByToken) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  const AttnCase cases[] = {{16, 4, 4, 64, 0, 50, 0},  {7, 8, 2, 64, 13, 33, 0},  {1, 2, 1, 36, 0, 17, 0},
                            {16, 2, 2, 128, 5, 40, 9},  {5, 6, 3, 8, 0, 70, 24},   {16, 32, 4, 16, 0, 20, 0},
                            {3, 4, 4, 100, 21, 16, 3},  {16, 4, 1, 160, 0, 18, 0}, {16, 64, 1, 64, 3, 17, 5},
                            {4, 3, 3, 80, 0, 65, 16}};
  uint32_t seed = 500;
  for (const AttnCase& c : cases) {
    CacheFixture f(c, ++seed);
    const int64_t per_token = c.n_heads * c.head_dim;
    kv_write(f.layer, f.block_table.data(), 0, c.start_pos + c.n_tokens, f.k_all.data(), f.v_all.data());
    const auto q = gaussian(c.n_tokens * per_token, seed + 100, 2.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    std::vector<float> out(q.size(), NAN), pooled(q.size(), NAN), single(q.size(), NAN);
    AttentionArgs args{q.data(), out.data(), c.n_tokens, c.start_pos, c.n_heads, scale, c.window,
                       f.block_table.data()};
    paged_attention(f.layer, args, nullptr);
    args.out = pooled.data();
    paged_attention(f.layer, args, &pool);
    for (int64_t t = 0; t < c.n_tokens; ++t) {
      AttentionArgs one{q.data() + t * per_token, single.data() + t * per_token, 1, c.start_pos + t, c.n_heads,
                        scale, c.window, f.block_table.data()};
      paged_attention(f.layer, one, nullptr);
    }
    const auto ref = reference_attention(c, f, q, scale);
    const std::string shape = "bs " + std::to_string(c.block_size) + " heads " + std::to_string(c.n_heads) + "/" +
                              std::to_string(c.n_kv_heads) + " hd " + std::to_string(c.head_dim) + " start " +
                              std::to_string(c.start_pos) + " tokens " + std::to_string(c.n_tokens) + " window " +
                              std::to_string(c.window);
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_NEAR(out[i], ref[i], 4e-6) << shape << " i " << i;
      ASSERT_EQ(std::memcmp(&out[i], &pooled[i], 4), 0) << shape << " pool changed the result at " << i;
      ASSERT_EQ(std::memcmp(&out[i], &single[i], 4), 0) << shape << " token by token differs at " << i;
    }
  }
}

// Several sequences over one cache layer (each with its own blocks): decode tokens, a prompt
// long enough for tiles, short chunks and an empty one. One batched call must give the bits of
// one call per sequence, whatever the pool.
TEST_P(AttentionTest, BatchEqualsOneCallPerSequence) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  struct Seq { int64_t start_pos, n_tokens; };
  const Seq seqs[] = {{7, 1}, {0, 40}, {30, 1}, {12, 3}, {5, 0}, {0, 1}, {18, 20}, {40, 1}};
  // One KV head: consecutive sequences then share the head index of the per-thread caches.
  for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{4, 2}, {2, 1}}) {
    const int64_t block_size = 8, hd = 64, window = 0, max_len = 48;
    const int64_t per_seq_blocks = max_len / block_size, n = std::size(seqs);
    const AttnCase shape{block_size, n_heads, n_kv, hd, 0, n * max_len, window};
    CacheFixture f(shape, 77);  // its shuffled table, cut into one table per sequence
    const int64_t row = n_kv * hd, per_token = n_heads * hd;
    std::vector<std::vector<float>> q(n), want(n), got(n);
    std::vector<AttentionArgs> args(n);
    for (int64_t s = 0; s < n; ++s) {
      const int32_t* table = f.block_table.data() + s * per_seq_blocks;
      const int64_t len = seqs[s].start_pos + seqs[s].n_tokens;
      kv_write(f.layer, table, 0, len, f.k_all.data() + s * max_len * row,
               f.v_all.data() + s * max_len * row);
      q[s] = gaussian(std::max<int64_t>(1, seqs[s].n_tokens) * per_token, 900 + static_cast<uint32_t>(s));
      want[s].assign(q[s].size(), NAN);
      AttentionArgs a{q[s].data(), want[s].data(), seqs[s].n_tokens, seqs[s].start_pos,
                      n_heads, 0.125f, window, table};
      paged_attention(f.layer, a, nullptr);
      args[s] = a;
    }
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      for (int64_t s = 0; s < n; ++s) {
        got[s].assign(q[s].size(), NAN);
        args[s].out = got[s].data();
      }
      paged_attention_batch(f.layer, args, p);
      for (int64_t s = 0; s < n; ++s) {
        const size_t filled = static_cast<size_t>(seqs[s].n_tokens * per_token);
        ASSERT_EQ(std::memcmp(got[s].data(), want[s].data(), filled * 4), 0) << "sequence " << s;
        if (seqs[s].n_tokens == 0) {
          EXPECT_TRUE(std::isnan(got[s][0])) << "empty sequence written";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, AttentionTest, ::testing::Values(false, true), path_name);

TEST(KvWrite, PlacesTokensAtDocumentedOffsets) {
  const AttnCase c{3, 2, 2, 4, 2, 5, 0};
  CacheFixture f(c, 7);
  const int64_t row = c.n_kv_heads * c.head_dim;
  kv_write(f.layer, f.block_table.data(), c.start_pos, c.n_tokens, f.k_all.data() + c.start_pos * row,
           f.v_all.data() + c.start_pos * row);
  for (int64_t p = 0; p < c.start_pos + c.n_tokens; ++p) {
    const int64_t block = f.block_table[static_cast<size_t>(p / c.block_size)];
    const int64_t base = (block * c.block_size + p % c.block_size) * row;
    for (int64_t i = 0; i < row; ++i) {
      if (p < c.start_pos) {
        EXPECT_TRUE(std::isnan(f.k_store[base + i])) << "position " << p << " was written";
      } else {
        EXPECT_EQ(f.k_store[base + i], f.k_all[p * row + i]) << p;
        EXPECT_EQ(f.v_store[base + i], f.v_all[p * row + i]) << p;
      }
    }
  }
}

TEST(PagedAttention, SingleKeyReturnsItsValue) {
  const AttnCase c{4, 2, 1, 8, 0, 1, 0};
  CacheFixture f(c, 3);
  kv_write(f.layer, f.block_table.data(), 0, 1, f.k_all.data(), f.v_all.data());
  const auto q = gaussian(c.n_heads * c.head_dim, 4, 100.0f);
  std::vector<float> out(q.size());
  AttentionArgs args{q.data(), out.data(), 1, 0, c.n_heads, 1.0f, 0, f.block_table.data()};
  paged_attention(f.layer, args, nullptr);
  for (int64_t h = 0; h < c.n_heads; ++h)
    for (int64_t i = 0; i < c.head_dim; ++i) EXPECT_EQ(out[h * c.head_dim + i], f.v_all[i]);
}

}  // namespace
}  // namespace tessera
