// Private interface between the paged attention driver (kernels/cpu/paged_attention.cpp: items,
// scheduling, scratch, the tiles' orchestration) and its per-ISA kernels
// (paged_attention_{scalar,avx2,avx512}.cpp): the structs the driver hands them and their entry
// points. Every path implements the canonical arithmetic stated at the top of
// paged_attention.cpp, bit for bit.
//
// The templates on the cache element type T are instantiated in each ISA file for float (fp32
// cache), uint16_t (fp16) and int8_t (int8). The AVX2 and AVX-512 entry points are only called
// when cpu::active_isa() allows them; off x86-64 their files hold stubs (the per-token items fall
// back to the scalar path, the prefill tiles are never used there).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/dtype.h"
#include "kernels/paged_attention.h"

namespace tessera::cpu::attention {

constexpr int kLanes = 16;
constexpr int kMaxGroup = 64;  // query heads per KV head handled in one item

// Cache elements: float (fp32 cache), uint16_t (fp16) or int8_t (int8), read as fp32. Rows are
// passed as a pointer to their first value: an int8 row's scale sits kInt8RowLead bytes before it.
template <typename T>
inline constexpr int64_t kRowLead = std::is_same_v<T, int8_t> ? kInt8RowLead : 0;
inline float row_scale(const int8_t* row) {
  float s;
  std::memcpy(&s, row - kInt8RowLead, sizeof(s));
  return s;
}
// Value i of a row, as attention reads it.
inline float widen_at(const float* row, int64_t i) { return row[i]; }
inline float widen_at(const uint16_t* row, int64_t i) { return fp16_to_f32(row[i]); }
inline float widen_at(const int8_t* row, int64_t i) { return static_cast<float>(row[i]) * row_scale(row); }

// ---- the three phases of one item, per ISA. Keys are visited block by block: `keys` lists
// the first float of each visible key's head row, in order.

template <typename T>
struct Item {
  const T* const* keys;    // [n] pointers to k rows of this KV head
  const T* const* values;  // [n] pointers to v rows
  int64_t n;
  int64_t hd;
  int64_t group;
  const float* q;              // group query heads, hd apart
  float* out;                  // group output heads, hd apart
  float scale;
  float* scores;               // [group][n]
  bool prefetch;               // keys are cold (decode); in prefill they stay in cache
};

// Scores, softmax and values of one item (group <= kMaxGroup) into it.out.
template <typename T>
void run_item_scalar(const Item<T>& it);
template <typename T>
void run_item_avx2(const Item<T>& it);
template <typename T>
void run_item_avx512(const Item<T>& it);

// ---- prefill tiles (AVX-512 and AVX2 only): several query rows (tokens x GQA heads) against one
// KV head, the keys transposed in blocks of 16 positions (paged_attention_avx512.cpp says how the
// scores keep the canonical arithmetic). hdp = 16 * nc, nc = ceil(head_dim / 16) <= 8.

struct TileScores {
  const float* q;   // [rows][hdp]
  const float* kt;  // [blocks][hdp][16]
  int64_t rows, blocks, hdp;
  float* s;         // [rows][ld], ld = 16 * blocks
  float scale;
};

struct TileValues {
  const float* p;        // weights, row r at p + r * ld, key position j at index j - base
  int64_t ld, base;
  const int64_t* first;  // per row: visible key positions first[r] .. last[r]
  const int64_t* last;
  float* o;              // [rows][hdp] accumulators
  int64_t hdp, hd;
};

// Scores of every row against every key block, times scale, into t.s.
void tile_scores_avx512(const TileScores& t);
void tile_scores_avx2(const TileScores& t);

// One row's scores s[0 .. n - 1] (its visible span) replaced by their weights p_j = e_j * inv.
void softmax_row_avx512(float* s, int64_t n);
void softmax_row_avx2(float* s, int64_t n);

// Rows 0 .. rows - 1 accumulate keys j0 .. j1 - 1 (one run inside a cache block), whose value
// rows start at v, `stride` elements apart. check: skip keys outside a row's span. The AVX2
// path needs head_dim % 8 == 0.
template <typename T>
void tile_values_avx512(const TileValues& t, bool check, int64_t rows, int64_t j0, int64_t j1, const T* v,
                        int64_t stride);
template <typename T>
void tile_values_avx2(const TileValues& t, bool check, int64_t rows, int64_t j0, int64_t j1, const T* v,
                      int64_t stride);

// dst[j][i] = rows[i][c + j] for 16 rows, 16 values from c on (zero for a null row or j >= n);
// n: the mask of the values to read (the __mmask16 of AVX-512).
template <typename T>
void transpose16_avx512(const T* const* rows, int64_t c, uint16_t n, float* dst);

}  // namespace tessera::cpu::attention
