// The fast CPU kernels: every ISA path this CPU supports (scalar, AVX2, AVX-512) against the
// dequantized fp32 reference over grids of shapes (odd sizes included), and against each other:
// the kernels define one canonical arithmetic per format (kernels/cpu/qgemm.h, fgemm.h,
// paged_attention.cpp), so the ISA, the thread count and the batch composition must not change
// a single bit of any result.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "common/tensor.h"
#include "common/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/kernel_tune.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/vec.h"
#include "kernels/gemm.h"
#include "kernels/paged_attention.h"
#include "kernels/quant.h"
#include "tests/kernels/kernel_test_util.h"

namespace tessera {
namespace {

using test::gaussian;
using test::IsaGuard;
using test::same_bits;
using test::supported_isas;

using Matrix = test::TestMatrix;
using test::run_matmul;

Matrix make_matrix(QuantType type, int64_t rows, int64_t cols, uint32_t seed) {
  return test::make_test_matrix(type, rows, cols, seed, 0.5f);
}

// Activations with a few outliers, as real hidden states have.
std::vector<float> activations(int64_t n, uint32_t seed) {
  auto x = gaussian(n, seed);
  for (int64_t i = 0; i < n; i += 97) x[static_cast<size_t>(i)] *= 8.0f;
  return x;
}

void check_against_reference(const Matrix& m, const std::vector<float>& x, int64_t n_tokens,
                             const std::vector<float>& y, const std::string& what) {
  const int64_t blk = cpu::has_qdot(m.view.type) ? cpu::act_block(m.view.type) : 0;
  test::expect_near_reference(m, x, n_tokens, y, blk, what);
}

const QuantType kBlockTypes[] = {QuantType::kQ8_0, QuantType::kQ4_0, QuantType::kQ5_0,
                                 QuantType::kQ4_K, QuantType::kQ5_K, QuantType::kQ6_K};

TEST(FastMatmul, QuantizedEveryIsaMatchesReferenceAndEachOther) {
  IsaGuard guard;
  for (QuantType type : kBlockTypes) {
    const int be = quant_traits(type).block_elems;
    const std::vector<int64_t> ks = be == 32 ? std::vector<int64_t>{32, 96, 800} : std::vector<int64_t>{256, 768};
    for (int64_t rows : {1, 15, 17, 40}) {
      for (int64_t k : ks) {
        const Matrix m = make_matrix(type, rows, k, static_cast<uint32_t>(rows * 131 + k));
        for (int64_t n_tokens : {1, 2, 9, 17}) {
          const auto x = activations(n_tokens * k, static_cast<uint32_t>(k * 7 + n_tokens));
          const std::string what = std::string(quant_name(type)) + " rows " + std::to_string(rows) + " k " +
                                   std::to_string(k) + " tokens " + std::to_string(n_tokens);
          test::expect_same_bits_everywhere(
              [&](const std::vector<float>& xs, int64_t n, ThreadPool* pool) { return run_matmul(m, xs, n, pool); },
              [&](const std::vector<float>& y) { check_against_reference(m, x, n_tokens, y, what); }, x, rows, k,
              n_tokens, what);
        }
      }
    }
  }
}

TEST(FastMatmul, EveryBatchedDecodeSizeMatchesEachTokenAlone) {
  // 2..16 tokens take the batched-decode kernels (token groups over a chunk of blocks, or the
  // unit built in registers for the 32-element formats), 17 and more the prefill tile: every
  // size must give each token the bits it gets alone, on every ISA. 11 blocks of 32 leave a
  // partial chunk; 37 rows leave partial row groups of 16 and 8.
  IsaGuard guard;
  for (QuantType type : kBlockTypes) {
    const int64_t rows = 37, k = quant_traits(type).block_elems == 32 ? 32 * 11 : 256 * 3;
    const Matrix m = make_matrix(type, rows, k, 4242 + static_cast<uint32_t>(type));
    for (int64_t n_tokens = 2; n_tokens <= 18; ++n_tokens) {
      const auto x = activations(n_tokens * k, static_cast<uint32_t>(31 * n_tokens + 5));
      const std::string what = std::string(quant_name(type)) + " batch of " + std::to_string(n_tokens);
      test::expect_same_bits_everywhere(
          [&](const std::vector<float>& xs, int64_t n, ThreadPool* pool) { return run_matmul(m, xs, n, pool); },
          [&](const std::vector<float>& y) { check_against_reference(m, x, n_tokens, y, what); }, x, rows, k,
          n_tokens, what);
    }
  }
}

TEST(FastMatmul, FloatEveryIsaMatchesReferenceAndEachOther) {
  IsaGuard guard;
  MatmulPrecisionScope fp32(MatmulPrecision::kFp32);  // the fp32 kernels (bf16: matmul_precision_test)
  ThreadPool pool3(ThreadPoolOptions{.num_threads = 3});
  for (QuantType type : {QuantType::kF32, QuantType::kF16, QuantType::kBF16}) {
    for (int64_t rows : {1, 5, 17, 33}) {
      for (int64_t k : {1, 7, 16, 17, 33, 100, 1000}) {
        const Matrix m = make_matrix(type, rows, k, static_cast<uint32_t>(rows * 17 + k));
        for (int64_t n_tokens : {1, 2, 7, 13}) {
          const auto x = activations(n_tokens * k, static_cast<uint32_t>(k + 1000 * n_tokens));
          const std::string what = std::string(quant_name(type)) + " rows " + std::to_string(rows) + " k " +
                                   std::to_string(k) + " tokens " + std::to_string(n_tokens);
          std::vector<float> canonical;
          for (cpu::Isa isa : supported_isas()) {
            cpu::set_max_isa(isa);
            const auto y3 = run_matmul(m, x, n_tokens, &pool3);
            const auto y0 = run_matmul(m, x, n_tokens, nullptr);
            ASSERT_TRUE(same_bits(y3, y0)) << what << " isa " << cpu::isa_name(isa) << ": threads";
            if (canonical.empty()) {
              canonical = y3;
              check_against_reference(m, x, n_tokens, y3, what);
            } else {
              ASSERT_TRUE(same_bits(y3, canonical)) << what << " isa " << cpu::isa_name(isa) << " differs from scalar";
            }
          }
        }
      }
    }
  }
}

TEST(FastMatmul, LargeRowsAndVocabularySlices) {
  // Long rows (many blocks per tile) and a row slice written with a stride, on the fastest path.
  IsaGuard guard;
  MatmulPrecisionScope fp32(MatmulPrecision::kFp32);  // the fp32 kernels (bf16: matmul_precision_test)
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  for (QuantType type : {QuantType::kQ4_0, QuantType::kQ4_K, QuantType::kQ6_K, QuantType::kF16}) {
    const int64_t rows = 70, k = 256 * 22, n_tokens = 3, begin = 19, end = 61, stride = 50;
    const Matrix m = make_matrix(type, rows, k, 5);
    const auto x = activations(n_tokens * k, 6);
    const auto full = run_matmul(m, x, n_tokens, &pool);
    check_against_reference(m, x, n_tokens, full, std::string(quant_name(type)) + " long rows");
    std::vector<float> part(static_cast<size_t>(n_tokens * stride), -7.0f);
    matmul_rows(m.view, begin, end, x.data(), n_tokens, part.data(), stride, &pool);
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int64_t j = 0; j < stride; ++j)
        ASSERT_EQ(part[static_cast<size_t>(t * stride + j)],
                  j < end - begin ? full[static_cast<size_t>(t * rows + begin + j)] : -7.0f)
            << quant_name(type) << " t " << t << " j " << j;
  }
}

// The 16-row interleaved layouts (Q8_0_R16 .. Q6_K_R16, I8_CH_R16, I4_G128_R16; made at load where
// AVX2 or AVX-512 runs): the same bits as the file's layout for decode (1 token), small batches
// (2..16, fused) and prefill tiles (> 16), on the AVX-512 kernels and on the AVX2 ones (which
// also take them under a scalar cap), several row groups, threads, and row ranges that start
// on a group and end anywhere; the repack is a permutation of the bytes.
TEST(FastMatmul, SixteenRowInterleavedLayoutsGiveTheSameBits) {
  if (cpu::detected_isa() < cpu::Isa::kAvx2) GTEST_SKIP() << "the R16 layouts need AVX2";
  IsaGuard guard;
  const size_t saved_prefetch = cpu::kernel_tuning().r16_prefetch_bytes;
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  std::vector<QuantType> types(std::begin(kBlockTypes), std::end(kBlockTypes));
  types.push_back(QuantType::kI8_CH);    // + a row trailer (the scale)
  types.push_back(QuantType::kI4_G128);  // 128-element groups
  for (QuantType type : types) {
    for (const int64_t rows : {16, 48, 80}) {
      const int64_t k = quant_traits(type).block_elems >= 128 ? 256 * 3 : 32 * 13;
      const Matrix m = make_matrix(type, rows, k, static_cast<uint32_t>(rows));
      ASSERT_FALSE(cpu::r16_of(type, rows + 1).has_value());
      const QuantType r16 = cpu::r16_of(type, rows).value();
      Matrix packed = m;
      cpu::repack_r16(type, m.bytes.data(), rows, k, packed.bytes.data());
      packed.view.data = packed.bytes.data();
      packed.view.type = r16;
      std::vector<uint8_t> a = m.bytes, b = packed.bytes;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      ASSERT_EQ(a, b) << quant_name(r16) << " is not a permutation";
      for (const int64_t n_tokens : {1, 2, 5, 16, 17, 40}) {
        const auto x = activations(n_tokens * k, static_cast<uint32_t>(7 * n_tokens));
        const std::string what =
            std::string(quant_name(r16)) + " rows " + std::to_string(rows) + " tokens " + std::to_string(n_tokens);
        const auto want = run_matmul(m, x, n_tokens, &pool);
        for (cpu::Isa isa : supported_isas()) {
          cpu::set_max_isa(isa);
          // Every R16 prefetch variant of the AVX-512 kernels (kernels/cpu/cpu_info.h): none,
          // the Intel default, and one that runs past the end of the matrix within the first
          // group.
          for (const size_t ahead : {size_t{0}, size_t{2048}, size_t{1} << 20}) {
            cpu::set_r16_prefetch_bytes(ahead);
            ASSERT_TRUE(same_bits(run_matmul(packed, x, n_tokens, &pool), want))
                << what << " isa " << cpu::isa_name(isa) << " prefetch " << ahead;
            ASSERT_TRUE(same_bits(run_matmul(packed, x, n_tokens, nullptr), want))
                << what << " isa " << cpu::isa_name(isa) << " one thread";
            if (isa != cpu::Isa::kAvx512) break;
          }
          cpu::set_r16_prefetch_bytes(saved_prefetch);
        }
        cpu::set_max_isa(cpu::Isa::kAvx512);
        // Rows [16, rows - 3) into a strided output: starts on a group, ends inside one.
        if (rows < 48) continue;
        const int64_t begin = 16, end = rows - 3, stride = rows;
        for (cpu::Isa isa : supported_isas()) {
          if (isa == cpu::Isa::kScalar) continue;
          cpu::set_max_isa(isa);
          std::vector<float> part(static_cast<size_t>(n_tokens * stride), -7.0f);
          matmul_rows(packed.view, begin, end, x.data(), n_tokens, part.data(), stride, &pool);
          for (int64_t t = 0; t < n_tokens; ++t)
            for (int64_t j = 0; j < stride; ++j)
              ASSERT_EQ(part[static_cast<size_t>(t * stride + j)],
                        j < end - begin ? want[static_cast<size_t>(t * rows + begin + j)] : -7.0f)
                  << what << " isa " << cpu::isa_name(isa) << " t " << t << " row " << begin + j;
        }
        cpu::set_max_isa(cpu::Isa::kAvx512);
      }
    }
  }
}

TEST(ActivationQuantization, FollowsTheDefinitionOnEveryIsa) {
  IsaGuard guard;
  for (int64_t block : {cpu::kActBlock32, cpu::kActBlock256}) {
    const int64_t k = block * 3, n_tokens = 2;
    auto x = activations(n_tokens * k, 77);
    std::fill(x.begin() + block, x.begin() + 2 * block, 0.0f);  // an all-zero block
    std::vector<uint8_t> canonical;
    for (cpu::Isa isa : supported_isas()) {
      cpu::set_max_isa(isa);
      std::vector<uint8_t> scratch(cpu::acts_bytes(n_tokens, k, block) + 64);
      void* base = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
      const cpu::QuantizedActs a = cpu::acts_view(base, n_tokens, k, block);
      cpu::quantize_acts(x.data(), 0, n_tokens, a);
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t b = 0; b < k / block; ++b) {
          float amax = 0;
          for (int64_t j = 0; j < block; ++j) amax = std::max(amax, std::fabs(x[static_cast<size_t>(t * k + b * block + j)]));
          const float id = amax != 0 ? 127.0f / amax : 0.0f;
          const float d = amax == 0 ? 0.0f : block == 32 ? fp16_to_f32(f32_to_fp16(amax / 127.0f)) : 1.0f / id;
          ASSERT_EQ(a.d[t * (k / block) + b], d) << "block " << block << " isa " << cpu::isa_name(isa);
          for (int64_t j = 0; j < block; ++j) {
            const int64_t i = t * k + b * block + j;
            ASSERT_EQ(a.q[i], static_cast<int8_t>(std::nearbyint(x[static_cast<size_t>(i)] * id)))
                << "element " << i << " isa " << cpu::isa_name(isa);
          }
        }
        for (int64_t g = 0; g < k / 16; ++g) {
          int sum = 0;
          for (int j = 0; j < 16; ++j) sum += a.q[t * k + 16 * g + j];
          ASSERT_EQ(a.bsum[t * (k / 16) + g], sum);
        }
      }
    }
  }
}

TEST(FastOps, SiluMulIsIdenticalOnEveryIsaAndAccurate) {
  IsaGuard guard;
  const int64_t n = 1003;
  auto g = gaussian(n, 3, 6.0f);
  g[0] = 100.0f;
  g[1] = -100.0f;
  g[2] = 0.0f;
  const auto u = gaussian(n, 4);
  std::vector<float> canonical;
  for (cpu::Isa isa : supported_isas()) {
    cpu::set_max_isa(isa);
    std::vector<float> out(static_cast<size_t>(n));
    silu_mul(g.data(), u.data(), out.data(), 1, n);
    for (int64_t i = 0; i < n; ++i) {
      const double gv = g[static_cast<size_t>(i)];
      const double want = gv / (1.0 + std::exp(-gv)) * u[static_cast<size_t>(i)];
      ASSERT_NEAR(out[static_cast<size_t>(i)], want, 1e-6 * std::fabs(want) + 1e-30) << i;
    }
    if (canonical.empty()) canonical = out;
    ASSERT_TRUE(same_bits(out, canonical)) << cpu::isa_name(isa);
  }
}

TEST(FastOps, PagedAttentionIsIdenticalOnEveryIsaAndThreadCount) {
  IsaGuard guard;
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  struct Case { int64_t block_size, n_heads, n_kv, hd, start, n_tokens, window; };
  const Case cases[] = {{16, 8, 2, 64, 0, 37, 0}, {7, 4, 4, 128, 30, 5, 0}, {16, 32, 4, 64, 200, 1, 0},
                        {5, 6, 3, 36, 11, 9, 8}, {16, 2, 1, 8, 0, 19, 0}, {3, 4, 1, 100, 40, 1, 17},
                        {16, 12, 12, 64, 0, 130, 0}, {16, 8, 2, 128, 20, 45, 33}, {6, 5, 5, 80, 0, 40, 0},
                        {16, 4, 1, 256, 0, 40, 0}, {16, 4, 1, 256, 70, 1, 0}, {16, 4, 1, 256, 30, 20, 24}};
  for (const Case& c : cases) {
    const int64_t total = c.start + c.n_tokens;
    const int64_t blocks = (total + c.block_size - 1) / c.block_size + 2;
    const int64_t row = c.n_kv * c.hd;
    std::vector<float> k(static_cast<size_t>(blocks * c.block_size * row)), v(k.size());
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(9));
    PagedKvLayer kv{k.data(), v.data(), blocks, c.block_size, c.n_kv, c.hd};
    const auto kk = gaussian(total * row, 1), vv = gaussian(total * row, 2);
    kv_write(kv, table.data(), 0, total, kk.data(), vv.data());
    // An fp16 cache of the same keys and values, and an fp32 cache holding them rounded to fp16:
    // the fp16 one must give the rounded fp32 one's results, bit for bit.
    std::vector<uint16_t> k16(k.size()), v16(k.size());
    PagedKvLayer kv16{nullptr, nullptr, blocks, c.block_size, c.n_kv, c.hd, k16.data(), v16.data()};
    kv_write(kv16, table.data(), 0, total, kk.data(), vv.data());
    std::vector<float> kr(k.size()), vr(k.size()), kkr(kk), vvr(vv);
    for (float& x : kkr) x = fp16_to_f32(f32_to_fp16(x));
    for (float& x : vvr) x = fp16_to_f32(f32_to_fp16(x));
    PagedKvLayer rounded{kr.data(), vr.data(), blocks, c.block_size, c.n_kv, c.hd};
    kv_write(rounded, table.data(), 0, total, kkr.data(), vvr.data());
    // An int8 cache, and an fp32 cache holding what it reads back (each row's values times the
    // row's scale, computed here): the int8 one must give that one's results, bit for bit.
    const int64_t row8 = c.hd + kInt8RowLead;
    std::vector<int8_t> k8(static_cast<size_t>(blocks * c.block_size * c.n_kv * row8)), v8(k8.size());
    PagedKvLayer kv8{nullptr, nullptr, blocks, c.block_size, c.n_kv, c.hd, nullptr, nullptr, k8.data(), v8.data()};
    kv_write(kv8, table.data(), 0, total, kk.data(), vv.data());
    std::vector<float> k8r(k.size()), v8r(k.size()), kkq(kk), vvq(vv);
    for (std::vector<float>* x : {&kkq, &vvq})
      for (size_t r = 0; r < x->size(); r += static_cast<size_t>(c.hd)) {
        float amax = 0;
        for (int64_t i = 0; i < c.hd; ++i) amax = std::max(amax, std::fabs((*x)[r + static_cast<size_t>(i)]));
        const float scale = amax / 127.0f;
        for (int64_t i = 0; i < c.hd; ++i) {
          float& e = (*x)[r + static_cast<size_t>(i)];
          const float held = std::nearbyint(e / scale) * scale;
          ASSERT_LE(std::fabs(held - e), 0.5001f * scale) << "int8 rounding of value " << e;
          e = held;
        }
      }
    PagedKvLayer dequantized{k8r.data(), v8r.data(), blocks, c.block_size, c.n_kv, c.hd};
    kv_write(dequantized, table.data(), 0, total, kkq.data(), vvq.data());
    const auto q = gaussian(c.n_tokens * c.n_heads * c.hd, 3);
    std::vector<float> canonical, canonical16, canonical8;
    for (cpu::Isa isa : supported_isas()) {
      cpu::set_max_isa(isa);
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> out(q.size(), NAN), out16(q.size(), NAN);
        AttentionArgs args{q.data(), out.data(), c.n_tokens, c.start, c.n_heads,
                           1.0f / std::sqrt(static_cast<float>(c.hd)), c.window, table.data()};
        paged_attention(kv, args, p);
        if (canonical.empty()) canonical = out;
        ASSERT_TRUE(same_bits(out, canonical))
            << "hd " << c.hd << " heads " << c.n_heads << "/" << c.n_kv << " isa " << cpu::isa_name(isa);
        if (canonical16.empty()) {
          paged_attention(rounded, args, p);
          canonical16 = out;
        }
        args.out = out16.data();
        paged_attention(kv16, args, p);
        ASSERT_TRUE(same_bits(out16, canonical16))
            << "fp16 cache: hd " << c.hd << " heads " << c.n_heads << "/" << c.n_kv << " isa " << cpu::isa_name(isa);
        if (canonical8.empty()) {
          paged_attention(dequantized, args, p);
          canonical8 = out16;
          ASSERT_FALSE(same_bits(canonical8, canonical16)) << "the int8 cache should hold other values than fp16";
        }
        std::vector<float> out8(q.size(), NAN);
        args.out = out8.data();
        paged_attention(kv8, args, p);
        ASSERT_TRUE(same_bits(out8, canonical8))
            << "int8 cache: hd " << c.hd << " heads " << c.n_heads << "/" << c.n_kv << " isa " << cpu::isa_name(isa);
      }
    }
  }
}

// The int8 cache's rows: [fp32 scale][head_dim int8], scale = max |x| / 127, values rounded half
// to even and read back as q * scale by kv_read_slot; a zero row reads back as zeros, a row with
// a NaN or an infinity as NaN (never as finite numbers that would hide it).
TEST(PagedKvInt8, RowsHoldTheirScaleAndReadBackWithinHalfAStep) {
  const int64_t hd = 12, n_kv = 2, bs = 4;
  const int64_t row = hd + kInt8RowLead;
  std::vector<int8_t> k8(static_cast<size_t>(3 * bs * n_kv * row), 0x55), v8(k8.size(), 0x55);
  PagedKvLayer kv{nullptr, nullptr, 3, bs, n_kv, hd, nullptr, nullptr, k8.data(), v8.data()};
  const int32_t table[] = {2, 0};
  std::vector<float> k(static_cast<size_t>(5 * n_kv * hd)), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
    v[i] = -0.5f * k[i];
  }
  for (int64_t i = 0; i < hd; ++i) {
    k[static_cast<size_t>(1 * n_kv * hd + i)] = 0.0f;            // position 1, head 0: a zero row
    k[static_cast<size_t>(1 * n_kv * hd + hd + i)] = 1.0f + i;  // head 1: amax 12 at the last value
  }
  k[static_cast<size_t>(2 * n_kv * hd + 3)] = NAN;        // position 2, head 0
  v[static_cast<size_t>(3 * n_kv * hd + hd + 5)] = INFINITY;  // position 3, head 1 (values)
  kv_write(kv, table, 0, 5, k.data(), v.data());
  // Position 1, head 1 sits in block 2, slot 1, row 1: its scale first, then 127 for the amax.
  const int8_t* r = k8.data() + ((2 * bs + 1) * n_kv + 1) * row;
  float scale;
  std::memcpy(&scale, r, sizeof scale);
  EXPECT_EQ(scale, 12.0f / 127.0f);
  EXPECT_EQ(r[kInt8RowLead + hd - 1], 127);
  EXPECT_EQ(r[kInt8RowLead], static_cast<int8_t>(std::nearbyint(1.0f / scale)));
  std::vector<float> got(static_cast<size_t>(n_kv * hd));
  for (int64_t p = 0; p < 5; ++p) {
    for (const bool values : {false, true}) {
      kv_read_slot(kv, values, table[p / bs], p % bs, got.data());
      const float* want = (values ? v.data() : k.data()) + p * n_kv * hd;
      for (int64_t h = 0; h < n_kv; ++h) {
        float amax = 0;
        bool finite = true;
        for (int64_t i = 0; i < hd; ++i) {
          amax = std::max(amax, std::fabs(want[h * hd + i]));
          finite = finite && std::isfinite(want[h * hd + i]);
        }
        for (int64_t i = 0; i < hd; ++i) {
          const float g = got[static_cast<size_t>(h * hd + i)];
          if (!finite) {
            EXPECT_TRUE(std::isnan(g)) << "position " << p << " head " << h << ": a non-finite row reads back NaN";
          } else {
            EXPECT_LE(std::fabs(g - want[h * hd + i]), amax / 127.0f * 0.5001f) << p << " " << h << " " << i;
            if (amax == 0) {
              EXPECT_EQ(g, 0.0f);
            }
          }
        }
      }
    }
  }
}

TEST(FastThreadPool, WakesAfterSleepingAndAfterSpinning) {
  // Jobs back to back (workers spinning) and after pauses longer than the spin time (workers
  // asleep on the condition variable) must both run every index exactly once.
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  for (int round = 0; round < 40; ++round) {
    if (round % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::vector<int> hits(1000, 0);
    pool.parallel_for(1000, 7, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (int h : hits) ASSERT_EQ(h, 1) << "round " << round;
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The per-CPU kernel choices: the vendor's default, the environment's override, and the
// description printed at start-up.
TEST(CpuInfo, PrefetchDefaultsAndOverride) {
  cpu::CpuInfo intel{.vendor = "GenuineIntel", .brand = "Xeon", .family = 6, .model = 143};
  cpu::CpuInfo amd{.vendor = "AuthenticAMD", .brand = "EPYC", .family = 25, .model = 17};
  EXPECT_EQ(cpu::choose_kernel_tuning(intel, nullptr).r16_prefetch_bytes, 2048u);
  EXPECT_EQ(cpu::choose_kernel_tuning(intel, nullptr).source, "Intel default");
  EXPECT_EQ(cpu::choose_kernel_tuning(amd, nullptr).r16_prefetch_bytes, 0u);
  // Float-weight kernels: rows ahead into L2 and fp32 panels on Intel, non-temporal and panels
  // as stored on AMD.
  EXPECT_TRUE(cpu::choose_kernel_tuning(intel, nullptr).float_prefetch_l2);
  EXPECT_TRUE(cpu::choose_kernel_tuning(intel, nullptr).float_panels_fp32);
  EXPECT_FALSE(cpu::choose_kernel_tuning(amd, nullptr).float_prefetch_l2);
  EXPECT_FALSE(cpu::choose_kernel_tuning(amd, nullptr).float_panels_fp32);
  cpu::KernelTuning t = cpu::choose_kernel_tuning(amd, nullptr);
  cpu::apply_float_overrides(&t, "l2", nullptr);
  EXPECT_TRUE(t.float_prefetch_l2);
  EXPECT_FALSE(t.float_panels_fp32);
  cpu::apply_float_overrides(&t, "nta", "fp32");
  EXPECT_FALSE(t.float_prefetch_l2);
  EXPECT_TRUE(t.float_panels_fp32);
  cpu::apply_float_overrides(&t, "T1", "half");  // malformed: kept (warnings on stderr)
  EXPECT_FALSE(t.float_prefetch_l2);
  EXPECT_TRUE(t.float_panels_fp32);
  EXPECT_EQ(cpu::choose_kernel_tuning(amd, "").r16_prefetch_bytes, 0u);
  EXPECT_EQ(cpu::choose_kernel_tuning(intel, "0").r16_prefetch_bytes, 0u);
  EXPECT_EQ(cpu::choose_kernel_tuning(amd, "4096").r16_prefetch_bytes, 4096u);
  EXPECT_EQ(cpu::choose_kernel_tuning(amd, "100").r16_prefetch_bytes, 128u);  // whole cache lines
  EXPECT_EQ(cpu::choose_kernel_tuning(amd, "4096").source, "TESSERA_CPU_PREFETCH");
  // Malformed or absurd values keep the default (with a warning on stderr).
  for (const char* bad : {"abc", "12kb", "-5", "99999999999"}) {
    EXPECT_EQ(cpu::choose_kernel_tuning(intel, bad).r16_prefetch_bytes, 2048u) << bad;
    EXPECT_EQ(cpu::choose_kernel_tuning(intel, bad).source, "Intel default") << bad;
  }
#if defined(__x86_64__)
  const cpu::CpuInfo& here = cpu::cpu_info();
  EXPECT_FALSE(here.vendor.empty());
  EXPECT_GT(here.family, 0);
  const std::string line = cpu::describe_cpu();
  EXPECT_NE(line.find(here.vendor), std::string::npos) << line;
  EXPECT_NE(line.find(std::string("isa ") + cpu::isa_name(cpu::active_isa())), std::string::npos) << line;
  EXPECT_NE(line.find("r16 prefetch"), std::string::npos) << line;
  EXPECT_NE(line.find("float panels"), std::string::npos) << line;
#endif
}

// The measured choice (kernels/cpu/kernel_tune.h): the cache file's lines per CPU key, the pick
// (the default unless clearly beaten), and a real measurement that returns every candidate.
TEST(KernelTune, CacheLinesAndThePick) {
  cpu::CpuInfo intel{.vendor = "GenuineIntel", .brand = "Xeon\tX", .family = 6, .model = 143};
  const std::string key = cpu::tuning_cache_key(intel, "avx512");
  EXPECT_EQ(key, "GenuineIntel/6/143/avx512/Xeon X");
  const std::string other = cpu::tuning_cache_key(intel, "avx2");
  EXPECT_FALSE(cpu::cached_r16_prefetch("", key).has_value());
  std::string text = cpu::with_cached_r16_prefetch("", key, 2048);
  text = cpu::with_cached_r16_prefetch(text, other, 0);
  EXPECT_EQ(cpu::cached_r16_prefetch(text, key), std::optional<size_t>(2048));
  EXPECT_EQ(cpu::cached_r16_prefetch(text, other), std::optional<size_t>(0));
  text = cpu::with_cached_r16_prefetch(text, key, 1024);  // replaced, not appended
  EXPECT_EQ(cpu::cached_r16_prefetch(text, key), std::optional<size_t>(1024));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  // A key that is a prefix of another does not match it; malformed values are ignored.
  EXPECT_FALSE(cpu::cached_r16_prefetch(key + "Z\tr16_prefetch_dram=64\n", key).has_value());
  EXPECT_FALSE(cpu::cached_r16_prefetch(key + "\tr16_prefetch=64\n", key).has_value());  // the cache-resident field
  for (const char* bad : {"abc", "100", "-64", "99999999999", ""})
    EXPECT_FALSE(cpu::cached_r16_prefetch(key + "\tr16_prefetch_dram=" + bad + "\n", key).has_value()) << bad;

  using T = cpu::PrefetchTiming;
  EXPECT_EQ(cpu::pick_r16_prefetch({T{0, 1.00}, T{2048, 0.60}}, 0, 0.05), 2048u);  // clearly faster
  EXPECT_EQ(cpu::pick_r16_prefetch({T{0, 1.00}, T{2048, 0.97}}, 0, 0.05), 0u);     // close: the default
  EXPECT_EQ(cpu::pick_r16_prefetch({T{0, 1.00}, T{2048, 0.97}}, 2048, 0.05), 2048u);
  EXPECT_EQ(cpu::pick_r16_prefetch({T{0, 0.5}, T{1024, 0.9}}, 4096, 0.05), 0u);     // default not timed
  EXPECT_EQ(cpu::pick_r16_prefetch({}, 4096, 0.05), 4096u);

  if (cpu::detected_isa() < cpu::Isa::kAvx2) GTEST_SKIP() << "the R16 kernels need AVX2";
  const size_t before = cpu::kernel_tuning().r16_prefetch_bytes;
  const auto timings = cpu::time_r16_prefetch({0, 2048}, 64, 512, 2);
  ASSERT_EQ(timings.size(), 2u);
  EXPECT_EQ(timings[0].bytes, 0u);
  EXPECT_EQ(timings[1].bytes, 2048u);
  for (const auto& t : timings) EXPECT_GT(t.seconds, 0.0);
  EXPECT_EQ(cpu::kernel_tuning().r16_prefetch_bytes, before);  // restored
}

// tune_kernels() with TESSERA_CPU_TUNE=cached measures once, writes the cache, and the
// description names the measurement; a cached value is then taken as it is.
TEST(KernelTune, MeasuresOnceAndCaches) {
  if (cpu::detected_isa() < cpu::Isa::kAvx2) GTEST_SKIP() << "the R16 kernels need AVX2";
  const std::string dir = ::testing::TempDir() + "/tessera-tune-" + std::to_string(::getpid());
  ASSERT_EQ(setenv("TESSERA_CACHE_DIR", dir.c_str(), 1), 0);
  ASSERT_EQ(setenv("TESSERA_CPU_TUNE", "cached", 1), 0);
  unsetenv("TESSERA_CPU_PREFETCH");
  EXPECT_EQ(cpu::tuning_cache_path(), dir + "/cpu-tuning.tsv");
  cpu::tune_kernels();
  std::ifstream f(cpu::tuning_cache_path());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string key = cpu::tuning_cache_key(cpu::cpu_info(), cpu::isa_name(cpu::active_isa()));
  const std::optional<size_t> cached = cpu::cached_r16_prefetch(ss.str(), key);
  ASSERT_TRUE(cached.has_value()) << ss.str();
  EXPECT_EQ(cpu::kernel_tuning().r16_prefetch_bytes, *cached);
  EXPECT_NE(cpu::describe_cpu().find("measure"), std::string::npos) << cpu::describe_cpu();
  cpu::tune_kernels();  // once per process: nothing changes
  EXPECT_EQ(cpu::kernel_tuning().r16_prefetch_bytes, *cached);
  std::filesystem::remove_all(dir);
  unsetenv("TESSERA_CACHE_DIR");
  unsetenv("TESSERA_CPU_TUNE");
}

}  // namespace
}  // namespace tessera
