// measure_sparse_crossover (kernels/sparse_attention.h): where sparse decode attention starts to
// pay for one layer shape on this machine.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "common/check.h"
#include "kernels/paged_attention.h"
#include "kernels/sparse_attention.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

// The fastest of the repetitions: other work on the machine only ever adds time.
double min_us(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// Keys with a few large channels and a slowly drifting mean, as trained models' keys have
// (uniform noise would make every block's bound alike); deterministic.
void synthetic_rows(std::vector<float>& x, int64_t tokens, int64_t width, uint64_t seed) {
  x.resize(static_cast<size_t>(tokens * width));
  uint64_t s = seed;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t d = 0; d < width; ++d) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const float u = static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-53) - 0.5f;
      const float drift = std::sin(static_cast<float>(t) * 0.001f + static_cast<float>(d));
      x[static_cast<size_t>(t * width + d)] = u + (d % 16 == 0 ? 4.0f * drift : 0.25f * drift);
    }
}

}  // namespace

SparseCrossover measure_sparse_crossover(const SparseCrossoverShape& shape, const SparseSelectOptions& opt,
                                         int64_t max_context, double min_speedup, int reps, ThreadPool* pool) {
  TESSERA_CHECK(shape.n_heads > 0 && shape.n_kv_heads > 0 && shape.n_heads % shape.n_kv_heads == 0 &&
                    shape.head_dim > 0 && shape.block_size > 0 && reps > 0,
                "sparse crossover: bad shape ({} heads, {} KV heads, head_dim {}, block {}, reps {})", shape.n_heads,
                shape.n_kv_heads, shape.head_dim, shape.block_size, reps);
  SparseCrossover out;
  out.min_speedup = min_speedup;
  std::vector<int64_t> contexts;
  for (int64_t c = 1024; c < max_context; c *= 2) contexts.push_back(c);
  if (max_context > 0) contexts.push_back(max_context);
  if (contexts.empty()) return out;

  const int64_t bs = shape.block_size;
  const int64_t n_blocks = (contexts.back() + bs - 1) / bs;
  const int64_t row = shape.n_kv_heads * shape.head_dim;
  const size_t cache_elems = static_cast<size_t>(n_blocks * bs * row);
  // Uninitialized: pages are touched only up to the contexts measured (the loop stops early).
  std::unique_ptr<float[]> k32, v32;
  std::unique_ptr<uint16_t[]> k16, v16;
  std::unique_ptr<int8_t[]> k8, v8;
  PagedKvLayer kv;
  kv.num_blocks = n_blocks;
  kv.block_size = bs;
  kv.n_kv_heads = shape.n_kv_heads;
  kv.head_dim = shape.head_dim;
  if (shape.dtype == KvDtype::kF16) {
    k16.reset(new uint16_t[cache_elems]);
    v16.reset(new uint16_t[cache_elems]);
    kv.k16 = k16.get();
    kv.v16 = v16.get();
  } else if (shape.dtype == KvDtype::kInt8) {
    const size_t bytes = static_cast<size_t>(n_blocks * bs * shape.n_kv_heads) *
                         static_cast<size_t>(kv_row_bytes(KvDtype::kInt8, shape.head_dim));
    k8.reset(new int8_t[bytes]);
    v8.reset(new int8_t[bytes]);
    kv.k8 = k8.get();
    kv.v8 = v8.get();
  } else {
    k32.reset(new float[cache_elems]);
    v32.reset(new float[cache_elems]);
    kv.k = k32.get();
    kv.v = v32.get();
  }
  std::unique_ptr<float[]> kmin(new float[static_cast<size_t>(n_blocks * row)]);
  std::unique_ptr<float[]> kmax(new float[static_cast<size_t>(n_blocks * row)]);
  KvBlockSummaries sums{kmin.get(), kmax.get(), n_blocks, shape.n_kv_heads, shape.head_dim};
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  int64_t filled = 0;  // positions written so far, in pieces so the staging rows stay small
  std::vector<float> k, v;
  auto fill_to = [&](int64_t end) {
    constexpr int64_t kPiece = 1024;
    for (; filled < end; filled += std::min(kPiece, end - filled)) {
      const int64_t n = std::min(kPiece, end - filled);
      synthetic_rows(k, n, row, 0x51ED2700ull + static_cast<uint64_t>(filled));
      synthetic_rows(v, n, row, 0xBADC0DEull + static_cast<uint64_t>(filled));
      kv_write(kv, table.data(), filled, n, k.data(), v.data());
      kv_summary_update(kv, sums, table.data(), filled, n);
    }
  };
  std::vector<float> q, o(static_cast<size_t>(shape.n_heads * shape.head_dim));
  synthetic_rows(q, 1, shape.n_heads * shape.head_dim, 0x9E37ull);
  SparseScratch scratch;
  const auto t_start = Clock::now();
  for (int64_t c : contexts) {
    fill_to(c);
    AttentionArgs a;
    a.q = q.data();
    a.out = o.data();
    a.n_tokens = 1;
    a.start_pos = c - 1;
    a.n_heads = shape.n_heads;
    a.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    a.block_table = table.data();
    std::vector<double> dense, sparse;
    for (int r = 0; r <= reps; ++r) {
      const auto t0 = Clock::now();
      paged_attention(kv, a, pool);
      const auto t1 = Clock::now();
      sparse_decode_attention(kv, sums, a, opt, pool, scratch);
      const auto t2 = Clock::now();
      if (r == 0) continue;  // warm-up
      dense.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      sparse.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    }
    out.points.push_back({c, min_us(dense), min_us(sparse)});
    if (out.points.back().sparse_us * min_speedup <= out.points.back().dense_us) {
      out.threshold_tokens = c;
      break;
    }
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  return out;
}

std::string describe_sparse_crossover(const SparseCrossover& c) {
  std::string s;
  for (const SparseCrossoverPoint& p : c.points)
    s += fmt::format("{}{}: {:.0f}/{:.0f} us", s.empty() ? "" : ", ", p.context, p.dense_us, p.sparse_us);
  if (c.threshold_tokens > 0)
    s += fmt::format(" -> sparse from {} tokens (>= {:g}x faster)", c.threshold_tokens, c.min_speedup);
  else
    s += fmt::format(" -> never {:g}x faster: dense", c.min_speedup);
  return s + fmt::format(" (measured in {:.0f} ms)", c.seconds * 1e3);
}

}  // namespace tessera
