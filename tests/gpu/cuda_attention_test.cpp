// RoPE fused with the paged KV-cache write, and paged decode attention, against the CPU
// reference (kernels/rope.h, kernels/paged_attention.h: rope_apply, kv_write,
// paged_attention) over shape grids with odd sizes, GQA groups and sliding windows, with an
// fp32 and with an fp16 cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/paged_attention.h"
#include "kernels/rope.h"
#include "tests/gpu/gpu_test_util.h"

namespace tessera {
namespace {

using gpu_test::from_f16;
using gpu_test::gaussian;
using gpu_test::to_f16;
using CudaAttention = gpu_test::GpuTest;

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float atol, float rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " element " << i;
}

std::vector<float> inv_freq_for(int64_t head_dim, float theta) {
  std::vector<float> f(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i)
    f[static_cast<size_t>(i)] = std::pow(theta, -2.0f * static_cast<float>(i) / static_cast<float>(head_dim));
  return f;
}

struct RopeCase {
  int64_t n_tokens, n_heads, n_kv_heads, head_dim, block_size, num_blocks;
};

TEST_F(CudaAttention, RopeKvWriteMatchesCpu) {
  const RopeCase cases[] = {
      {1, 4, 2, 64, 16, 2}, {5, 3, 1, 6, 3, 4}, {7, 8, 8, 128, 16, 3}, {3, 6, 2, 2, 1, 5}, {33, 32, 8, 128, 16, 8},
  };
  for (const bool f16 : {false, true}) {
    std::mt19937 rng(11);
    for (const RopeCase& c : cases) {
      const std::string what = std::string(f16 ? "fp16" : "fp32") + " cache, n_tokens=" + std::to_string(c.n_tokens) +
                               " heads=" + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) +
                               " head_dim=" + std::to_string(c.head_dim) +
                               " block_size=" + std::to_string(c.block_size);
      const int64_t kv_row = c.n_kv_heads * c.head_dim;
      const int64_t cache_floats = c.num_blocks * c.block_size * kv_row;
      const std::vector<float> q = gaussian(c.n_tokens * c.n_heads * c.head_dim, 12);
      const std::vector<float> k = gaussian(c.n_tokens * kv_row, 13), v = gaussian(c.n_tokens * kv_row, 14);
      const std::vector<float> inv_freq = inv_freq_for(c.head_dim, 10000.0f);
      std::vector<int32_t> positions(static_cast<size_t>(c.n_tokens));
      for (auto& p : positions) p = static_cast<int32_t>(rng() % 5000);
      // Distinct random slots; the last token is padding (slot -1) when there are several.
      std::vector<int64_t> all_slots(static_cast<size_t>(c.num_blocks * c.block_size));
      std::iota(all_slots.begin(), all_slots.end(), 0);
      std::shuffle(all_slots.begin(), all_slots.end(), rng);
      ASSERT_LE(c.n_tokens, static_cast<int64_t>(all_slots.size())) << what;
      std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + c.n_tokens);
      if (c.n_tokens > 1) slots.back() = -1;

      // CPU reference: rotate q and k, then write each token with kv_write through a one-block
      // table (position slot % block_size of block slot / block_size).
      std::vector<float> want_q = q, rot_k = k;
      rope_apply(want_q.data(), positions.data(), c.n_tokens, c.n_heads, c.head_dim, inv_freq.data());
      rope_apply(rot_k.data(), positions.data(), c.n_tokens, c.n_kv_heads, c.head_dim, inv_freq.data());
      std::vector<float> want_kc(static_cast<size_t>(cache_floats), 7.0f),
          want_vc(static_cast<size_t>(cache_floats), 7.0f);
      std::vector<uint16_t> want_kc16 = to_f16(want_kc), want_vc16 = to_f16(want_vc);
      PagedKvLayer layer{want_kc.data(), want_vc.data(), c.num_blocks, c.block_size, c.n_kv_heads, c.head_dim};
      if (f16)
        layer = {nullptr,      nullptr,    c.num_blocks,     c.block_size,
                 c.n_kv_heads, c.head_dim, want_kc16.data(), want_vc16.data()};
      for (int64_t t = 0; t < c.n_tokens; ++t) {
        const int64_t slot = slots[static_cast<size_t>(t)];
        if (slot < 0) continue;
        const int32_t table[1] = {static_cast<int32_t>(slot / c.block_size)};
        kv_write(layer, table, slot % c.block_size, 1, rot_k.data() + t * kv_row, v.data() + t * kv_row);
      }

      TesseraCudaRopeKvArgs a{};
      a.q = to_device(q);
      a.k = to_device(k);
      a.v = to_device(v);
      a.positions = to_device(positions);
      a.slots = to_device(slots);
      a.inv_freq = to_device(inv_freq);
      a.k_cache =
          f16 ? static_cast<void*>(to_device(to_f16(std::vector<float>(static_cast<size_t>(cache_floats), 7.0f))))
              : to_device(std::vector<float>(static_cast<size_t>(cache_floats), 7.0f));
      a.v_cache =
          f16 ? static_cast<void*>(to_device(to_f16(std::vector<float>(static_cast<size_t>(cache_floats), 7.0f))))
              : to_device(std::vector<float>(static_cast<size_t>(cache_floats), 7.0f));
      a.kv_dtype = f16 ? TESSERA_CUDA_F16 : TESSERA_CUDA_F32;
      a.n_tokens = c.n_tokens;
      a.n_heads = c.n_heads;
      a.n_kv_heads = c.n_kv_heads;
      a.head_dim = c.head_dim;
      a.block_size = c.block_size;
      a.num_blocks = c.num_blocks;
      ASSERT_EQ(api_->rope_kv_write_f32(&a, nullptr), 0) << api_->last_error();
      // Angles up to 5000 rad: cosf/sinf on both sides are accurate to a few ulps of the result.
      expect_close(to_host(a.q, static_cast<int64_t>(q.size())), want_q, 2e-5f, 2e-5f, "rope q " + what);
      if (!f16) {
        expect_close(to_host(static_cast<float*>(a.k_cache), cache_floats), want_kc, 2e-5f, 2e-5f, "k cache " + what);
        expect_close(to_host(static_cast<float*>(a.v_cache), cache_floats), want_vc, 0.0f, 0.0f, "v cache " + what);
        continue;
      }
      // A key a few ulps of fp32 away from the CPU's may round to the neighbouring fp16 value
      // (2^-10 relative); the values are rounded from the same fp32 numbers: identical.
      expect_close(from_f16(to_host(static_cast<uint16_t*>(a.k_cache), cache_floats)), from_f16(want_kc16), 2e-5f,
                   1e-3f, "k cache " + what);
      EXPECT_EQ(to_host(static_cast<uint16_t*>(a.v_cache), cache_floats), want_vc16) << "v cache " + what;
    }
  }
}

struct AttentionCase {
  int64_t n_seqs, n_heads, n_kv_heads, head_dim, block_size, max_len, sliding_window;
};

TEST_F(CudaAttention, PagedDecodeAttentionMatchesCpu) {
  const AttentionCase cases[] = {
      {1, 1, 1, 1, 1, 1, 0},      {3, 8, 2, 64, 16, 40, 0},   {2, 6, 3, 33, 5, 23, 0},
      {4, 4, 4, 128, 16, 70, 7},  {5, 32, 8, 128, 16, 100, 0}, {1, 2, 1, 256, 8, 300, 0},
      {3, 12, 4, 80, 7, 50, 64},
  };
  for (const bool f16 : {false, true}) {
    std::mt19937 rng(21);
    for (const AttentionCase& c : cases) {
      const std::string what = std::string(f16 ? "fp16" : "fp32") + " cache, seqs=" + std::to_string(c.n_seqs) +
                               " heads=" + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) +
                               " head_dim=" + std::to_string(c.head_dim) +
                               " block_size=" + std::to_string(c.block_size) +
                               " window=" + std::to_string(c.sliding_window);
      // Lengths in [1, max_len], the first sequence always max_len.
      std::vector<int32_t> lens(static_cast<size_t>(c.n_seqs));
      for (int64_t s = 0; s < c.n_seqs; ++s)
        lens[static_cast<size_t>(s)] =
            s == 0 ? static_cast<int32_t>(c.max_len) : static_cast<int32_t>(1 + rng() % c.max_len);
      const int64_t max_blocks = (c.max_len + c.block_size - 1) / c.block_size;
      const int64_t num_blocks = c.n_seqs * max_blocks + 3;  // spare blocks stay unused
      // Each sequence gets distinct random blocks; unused table entries hold -1.
      std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
      std::iota(pool.begin(), pool.end(), 0);
      std::shuffle(pool.begin(), pool.end(), rng);
      std::vector<int32_t> tables(static_cast<size_t>(c.n_seqs * max_blocks), -1);
      size_t next = 0;
      for (int64_t s = 0; s < c.n_seqs; ++s) {
        const int64_t need = (lens[static_cast<size_t>(s)] + c.block_size - 1) / c.block_size;
        for (int64_t b = 0; b < need; ++b) tables[static_cast<size_t>(s * max_blocks + b)] = pool[next++];
      }
      const int64_t cache_floats = num_blocks * c.block_size * c.n_kv_heads * c.head_dim;
      const std::vector<float> k_cache = gaussian(cache_floats, 22), v_cache = gaussian(cache_floats, 23);
      const std::vector<float> q = gaussian(c.n_seqs * c.n_heads * c.head_dim, 24, 2.0f);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

      std::vector<float> want(q.size());
      std::vector<float> kc = k_cache, vc = v_cache;  // PagedKvLayer wants mutable pointers
      std::vector<uint16_t> kc16 = to_f16(k_cache), vc16 = to_f16(v_cache);
      PagedKvLayer layer{kc.data(), vc.data(), num_blocks, c.block_size, c.n_kv_heads, c.head_dim};
      if (f16) layer = {nullptr, nullptr, num_blocks, c.block_size, c.n_kv_heads, c.head_dim, kc16.data(), vc16.data()};
      for (int64_t s = 0; s < c.n_seqs; ++s) {
        AttentionArgs args;
        args.q = q.data() + s * c.n_heads * c.head_dim;
        args.out = want.data() + s * c.n_heads * c.head_dim;
        args.n_tokens = 1;
        args.start_pos = lens[static_cast<size_t>(s)] - 1;
        args.n_heads = c.n_heads;
        args.scale = scale;
        args.sliding_window = c.sliding_window;
        args.block_table = tables.data() + s * max_blocks;
        paged_attention(layer, args, nullptr);
      }

      TesseraCudaDecodeAttentionArgs a{};
      a.q = to_device(q);
      a.out = alloc<float>(static_cast<int64_t>(q.size()));
      a.k_cache = f16 ? static_cast<const void*>(to_device(kc16)) : to_device(k_cache);
      a.v_cache = f16 ? static_cast<const void*>(to_device(vc16)) : to_device(v_cache);
      a.kv_dtype = f16 ? TESSERA_CUDA_F16 : TESSERA_CUDA_F32;
      a.block_tables = to_device(tables);
      a.seq_lens = to_device(lens);
      a.n_seqs = c.n_seqs;
      a.n_heads = c.n_heads;
      a.n_kv_heads = c.n_kv_heads;
      a.head_dim = c.head_dim;
      a.block_size = c.block_size;
      a.max_blocks_per_seq = max_blocks;
      a.scale = scale;
      a.sliding_window = c.sliding_window;
      ASSERT_EQ(api_->paged_decode_attention_f32(&a, nullptr), 0) << api_->last_error();
      expect_close(to_host(a.out, static_cast<int64_t>(q.size())), want, 5e-5f, 1e-4f, "decode attention " + what);
      // Split over the sequence: pieces of 1, 7 and 64 keys, one piece more than the longest
      // visible span needs (an empty piece must not count).
      for (int64_t split_keys : {1, 7, 64}) {
        const int64_t span = c.sliding_window > 0 ? std::min(c.sliding_window, c.max_len) : c.max_len;
        a.n_splits = (span + split_keys - 1) / split_keys + 1;
        a.split_keys = split_keys;
        a.partial = alloc<float>(c.n_seqs * c.n_heads * a.n_splits * (c.head_dim + 2));
        a.out = alloc<float>(static_cast<int64_t>(q.size()));
        ASSERT_EQ(api_->paged_decode_attention_f32(&a, nullptr), 0) << api_->last_error();
        expect_close(to_host(a.out, static_cast<int64_t>(q.size())), want, 5e-5f, 1e-4f,
                     "split decode attention (" + std::to_string(split_keys) + " keys a piece) " + what);
      }
    }
  }
}

TEST_F(CudaAttention, RejectsBadShapes) {
  TesseraCudaDecodeAttentionArgs a{};
  a.n_seqs = 1;
  a.n_heads = 6;
  a.n_kv_heads = 4;  // not a divisor
  a.head_dim = 64;
  a.block_size = 16;
  a.max_blocks_per_seq = 1;
  EXPECT_NE(api_->paged_decode_attention_f32(&a, nullptr), 0);
  EXPECT_NE(std::string(api_->last_error()).find("n_kv_heads"), std::string::npos) << api_->last_error();
  a.n_kv_heads = 2;
  a.head_dim = 257;
  EXPECT_NE(api_->paged_decode_attention_f32(&a, nullptr), 0);
  a.head_dim = 64;
  a.n_splits = 4;  // a split without its partial buffer
  a.split_keys = 16;
  EXPECT_NE(api_->paged_decode_attention_f32(&a, nullptr), 0);
  TesseraCudaRopeKvArgs r{};
  r.n_tokens = 1;
  r.head_dim = 5;  // odd
  r.block_size = 1;
  EXPECT_NE(api_->rope_kv_write_f32(&r, nullptr), 0);
  r.head_dim = 4;
  r.kv_dtype = 2;  // neither fp32 nor fp16
  EXPECT_NE(api_->rope_kv_write_f32(&r, nullptr), 0);
  EXPECT_NE(std::string(api_->last_error()).find("kv_dtype"), std::string::npos) << api_->last_error();
  a.n_splits = 0;
  a.kv_dtype = -1;
  EXPECT_NE(api_->paged_decode_attention_f32(&a, nullptr), 0);
  EXPECT_NE(std::string(api_->last_error()).find("kv_dtype"), std::string::npos) << api_->last_error();
}

}  // namespace
}  // namespace tessera
