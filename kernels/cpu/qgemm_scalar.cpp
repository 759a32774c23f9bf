// The portable integer-dot kernels: the reading of the canonical arithmetic in qgemm.h that
// the SIMD paths must reproduce bit for bit. Also the activation quantizer dispatch.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/vec.h"

namespace tessera::cpu {
namespace {

// Signed levels of one 32-block of Q8_0 / Q4_0 / Q5_0 and its scale.
float levels_q32(QuantType type, const uint8_t* blk, int* w) {
  switch (type) {
    case QuantType::kQ8_0:
      for (int j = 0; j < 32; ++j) w[j] = static_cast<int8_t>(blk[2 + j]);
      break;
    case QuantType::kQ4_0:
      for (int j = 0; j < 16; ++j) {
        w[j] = (blk[2 + j] & 0xF) - 8;
        w[j + 16] = (blk[2 + j] >> 4) - 8;
      }
      break;
    case QuantType::kQ5_0: {
      uint32_t qh;
      std::memcpy(&qh, blk + 2, 4);
      for (int j = 0; j < 16; ++j) {
        w[j] = ((blk[6 + j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4)) - 16;
        w[j + 16] = ((blk[6 + j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4)) - 16;
      }
      break;
    }
    default: TESSERA_CHECK(false, "levels_q32: {}", quant_name(type));
  }
  return f16_at(blk);
}

// Unsigned levels (0..15 or 0..31) of a Q4_K / Q5_K super-block in element order.
void levels_k_affine(QuantType type, const uint8_t* sb, int* q) {
  const bool q5 = type == QuantType::kQ5_K;
  const uint8_t* qh = sb + 16;
  const uint8_t* qs = sb + (q5 ? 48 : 16);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      int lo = qs[32 * c + l] & 0xF, hi = qs[32 * c + l] >> 4;
      if (q5) {
        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      q[64 * c + l] = lo;
      q[64 * c + 32 + l] = hi;
    }
  }
}

// Levels (0..63) of a Q6_K super-block in element order.
void levels_q6_k(const uint8_t* sb, int* q) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = sb + 64 * h;
    const uint8_t* qh = sb + 128 + 32 * h;
    for (int l = 0; l < 32; ++l) {
      q[128 * h + l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
      q[128 * h + l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
      q[128 * h + l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
      q[128 * h + l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
    }
  }
}

float row_dot_q32(QuantType type, const uint8_t* row, size_t block_bytes, const int8_t* xq,
                  const float* xd, int64_t nb) {
  float acc = 0.0f;
  int w[32];
  for (int64_t b = 0; b < nb; ++b) {
    const float dw = levels_q32(type, row + b * block_bytes, w);
    int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += w[j] * xq[32 * b + j];
    acc = std::fma(static_cast<float>(isum), dw * xd[b], acc);
  }
  return acc;
}

float row_dot_k_affine(QuantType type, const uint8_t* row, size_t block_bytes, const int8_t* xq,
                       const float* xd, const int16_t* bsum, int64_t nb) {
  float acc = 0.0f;
  int q[256];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* sb = row + b * block_bytes;
    levels_k_affine(type, sb, q);
    const int8_t* x = xq + 256 * b;
    int32_t isum = 0, msum = 0;
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      k_scale_min(sb + 4, s, &sc, &m);
      int32_t part = 0;
      for (int j = 32 * s; j < 32 * s + 32; ++j) part += q[j] * x[j];
      isum += sc * part;
      msum += m * (bsum[16 * b + 2 * s] + bsum[16 * b + 2 * s + 1]);
    }
    acc = std::fma(static_cast<float>(isum), f16_at(sb) * xd[b], acc);
    acc = std::fma(static_cast<float>(-msum), f16_at(sb + 2) * xd[b], acc);
  }
  return acc;
}

float row_dot_q6_k(const uint8_t* row, const int8_t* xq, const float* xd, int64_t nb) {
  float acc = 0.0f;
  int q[256];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* sb = row + b * 210;
    levels_q6_k(sb, q);
    const int8_t* x = xq + 256 * b;
    const auto* sc = reinterpret_cast<const int8_t*>(sb + 192);
    int32_t isum = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t part = 0;
      for (int j = 16 * g; j < 16 * g + 16; ++j) part += (q[j] - 32) * x[j];
      isum += sc[g] * part;
    }
    acc = std::fma(static_cast<float>(isum), f16_at(sb + 208) * xd[b], acc);
  }
  return acc;
}

float row_dot_i8_ch(const uint8_t* row, int64_t k, const int8_t* xq, const float* xd, int64_t nb) {
  float s;
  std::memcpy(&s, row + k, 4);
  const auto* w = reinterpret_cast<const int8_t*>(row);
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += w[32 * b + j] * xq[32 * b + j];
    acc = std::fma(static_cast<float>(isum), s * xd[b], acc);
  }
  return acc;
}

float row_dot_i4_g128(const uint8_t* row, const int8_t* xq, const float* xd, const int16_t* bsum, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* grp = row + 68 * (b / 4);
    const uint8_t* nib = grp + 4 + 16 * (b % 4);
    const int z = grp[2];
    const int8_t* x = xq + 32 * b;
    int32_t isum = -z * (bsum[2 * b] + bsum[2 * b + 1]);
    for (int j = 0; j < 16; ++j) isum += (nib[j] & 0xF) * x[j] + (nib[j] >> 4) * x[16 + j];
    acc = std::fma(static_cast<float>(isum), f16_at(grp) * xd[b], acc);
  }
  return acc;
}

// ---- the low-bit formats (qgemm.h): unsigned levels u of a 256-superblock in element order.

// Q2_K / Q3_K / TQ2_0's 2-bit plane (64 B): element 128h + 32s + l in bits 2s, 2s + 1 of byte
// 32h + l.
void levels_plane2(const uint8_t* qs, int* u) {
  for (int e = 0; e < 256; ++e) u[e] = (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
}

// TQ1_0: bytes 0-31 hold elements 32p + l (digits p < 5), bytes 32-47 elements 160 + 16p + l,
// the 4 bytes at 48 elements 240 + 4p + l (p < 4).
void levels_tq1_0(const uint8_t* sb, int* u) {
  for (int p = 0; p < 5; ++p)
    for (int l = 0; l < 32; ++l) u[32 * p + l] = tq1_digit(sb[l], p);
  for (int p = 0; p < 5; ++p)
    for (int l = 0; l < 16; ++l) u[160 + 16 * p + l] = tq1_digit(sb[32 + l], p);
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 4; ++l) u[240 + 4 * p + l] = tq1_digit(sb[48 + l], p);
}

int32_t dot16(const int* u, const int8_t* x) {
  int32_t s = 0;
  for (int j = 0; j < 16; ++j) s += u[j] * x[j];
  return s;
}

float row_dot_low_bit(QuantType type, const uint8_t* row, const int8_t* xq, const float* xd, const int16_t* bsum,
                      int64_t nb) {
  const size_t bb = static_cast<size_t>(quant_traits(type).block_bytes);
  float acc = 0.0f;
  int u[256];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* sb = row + static_cast<size_t>(b) * bb;
    const int8_t* x = xq + 256 * b;
    const int16_t* bs = bsum + 16 * b;
    int32_t isum = 0;
    switch (type) {
      case QuantType::kQ2_K: {  // scales[16] | qs[64] | d | dmin
        levels_plane2(sb + 16, u);
        int32_t msum = 0;
        for (int s = 0; s < 16; ++s) {
          isum += (sb[s] & 0xF) * dot16(u + 16 * s, x + 16 * s);
          msum += (sb[s] >> 4) * bs[s];
        }
        acc = std::fma(static_cast<float>(isum), f16_at(sb + 80) * xd[b], acc);
        acc = std::fma(static_cast<float>(-msum), f16_at(sb + 82) * xd[b], acc);
        continue;
      }
      case QuantType::kQ3_K: {  // hmask[32] | qs[64] | scales[12] | d
        levels_plane2(sb + 32, u);
        for (int e = 0; e < 256; ++e) u[e] |= ((sb[e % 32] >> (e / 32)) & 1) << 2;
        for (int s = 0; s < 16; ++s) isum += q3_k_scale(sb + 96, s) * (dot16(u + 16 * s, x + 16 * s) - 4 * bs[s]);
        acc = std::fma(static_cast<float>(isum), f16_at(sb + 108) * xd[b], acc);
        continue;
      }
      case QuantType::kTQ2_0: levels_plane2(sb, u); break;  // qs[64] | d
      default: levels_tq1_0(sb, u); break;                   // qs[48] | qh[4] | d
    }
    for (int s = 0; s < 16; ++s) isum += dot16(u + 16 * s, x + 16 * s) - bs[s];
    acc = std::fma(static_cast<float>(isum), f16_at(sb + bb - 2) * xd[b], acc);
  }
  return acc;
}

}  // namespace

bool is_low_bit(QuantType type) {
  switch (type) {
    case QuantType::kQ2_K:
    case QuantType::kQ3_K:
    case QuantType::kTQ1_0:
    case QuantType::kTQ2_0: return true;
    default: return false;
  }
}

// The R16 layouts (below) answer as their base formats.
int64_t kernel_block_elems(QuantType type) {
  switch (r16_base(type)) {
    case QuantType::kI8_CH:
    case QuantType::kI4_G128:
      return 32;
    default: return quant_traits(type).block_elems;
  }
}

namespace {
// The fields of a block as the AVX-512 kernels read them for 16 rows at once: fp16 values
// (2 bytes) or runs of dwords, at byte x of the block (qgemm.h, the R16 layouts).
struct BlockField {
  int x;
  int bytes;
  bool half;
};
const std::vector<BlockField>& r16_fields(QuantType base) {
  static const std::vector<BlockField> q8_0{{0, 2, true}, {2, 32, false}}, q4_0{{0, 2, true}, {2, 16, false}},
      q5_0{{0, 2, true}, {2, 4, false}, {6, 16, false}}, q4_k{{0, 144, false}}, q5_k{{0, 176, false}},
      q6_k{{0, 208, false}, {208, 2, true}},
      i8_ch{{0, 32, false}},  // + the row's fp32 scale (a dword after the blocks)
      i4_g128{{0, 68, false}}, none;
  switch (base) {
    case QuantType::kQ8_0:
      return q8_0;
    case QuantType::kQ4_0:
      return q4_0;
    case QuantType::kQ5_0:
      return q5_0;
    case QuantType::kQ4_K:
      return q4_k;
    case QuantType::kQ5_K:
      return q5_k;
    case QuantType::kQ6_K:
      return q6_k;
    case QuantType::kI8_CH:
      return i8_ch;
    case QuantType::kI4_G128:
      return i4_g128;
    default:
      return none;
  }
}
}  // namespace

// The re-lays and their bases are columns of the format table (common/dtype.h).
bool is_r16(QuantType type) { return r16_base(type) != type; }

QuantType r16_base(QuantType type) { return quant_traits(type).r16_base; }

std::optional<QuantType> r16_of(QuantType type, int64_t rows) {
  if (rows <= 0 || rows % kQRowGroup != 0) return std::nullopt;
  const QuantType r16 = quant_traits(type).r16;
  if (r16 == QuantType::kCount) return std::nullopt;
  return r16;
}

namespace {
// Calls piece(row_offset, group_offset, bytes) for every piece of row r of a 16-row group: row
// byte x of a field (an fp16 value or a dword) sits at 16 * x + 2r or + 4r of the group; the
// blocks follow each other in a row, and a row trailer (I8_CH's scale) is one more dword after
// them.
template <typename Piece>
void for_each_r16_piece(QuantType type, int64_t k, int64_t r, Piece&& piece) {
  const QuantType base = r16_base(type);
  const std::vector<BlockField>& fields = r16_fields(base);
  TESSERA_CHECK(!fields.empty(), "16-row layout: {} has none", quant_name(type));
  const QuantTraits& tr = quant_traits(base);
  TESSERA_CHECK(k % tr.block_elems == 0 && r >= 0 && r < kQRowGroup, "16-row layout: row {} of {} cols", r, k);
  const auto bb = static_cast<size_t>(tr.block_bytes);
  const size_t rb = row_bytes(base, k);
  const int64_t nb = k / tr.block_elems;
  const auto lane = static_cast<size_t>(r);
  constexpr auto kG = static_cast<size_t>(kQRowGroup);
  for (int64_t b = 0; b < nb; ++b) {
    for (const BlockField& f : fields) {
      const size_t x0 = static_cast<size_t>(b) * bb + static_cast<size_t>(f.x);
      if (f.half) {
        piece(x0, kG * x0 + 2 * lane, size_t{2});
        continue;
      }
      for (size_t x = x0; x < x0 + static_cast<size_t>(f.bytes); x += 4) piece(x, kG * x + 4 * lane, size_t{4});
    }
  }
  for (size_t x = static_cast<size_t>(nb) * bb; x < rb; x += 4) piece(x, kG * x + 4 * lane, size_t{4});
}
}  // namespace

void repack_r16(QuantType type, const uint8_t* src, int64_t rows, int64_t k, uint8_t* dst) {
  TESSERA_CHECK(rows % kQRowGroup == 0, "repack_r16: {} rows", rows);
  const size_t rb = row_bytes(r16_base(type), k);
  for (int64_t g = 0; g < rows / kQRowGroup; ++g) {
    uint8_t* group = dst + static_cast<size_t>(g * kQRowGroup) * rb;
    for (int64_t r = 0; r < kQRowGroup; ++r) {
      const uint8_t* row = src + static_cast<size_t>(g * kQRowGroup + r) * rb;
      for_each_r16_piece(type, k, r, [&](size_t at, size_t to, size_t n) { std::memcpy(group + to, row + at, n); });
    }
  }
}

void unpack_r16_row(QuantType type, const uint8_t* data, int64_t row, int64_t k, uint8_t* dst) {
  const uint8_t* group = data + static_cast<size_t>(row - row % kQRowGroup) * row_bytes(r16_base(type), k);
  for_each_r16_piece(type, k, row % kQRowGroup,
                     [&](size_t at, size_t from, size_t n) { std::memcpy(dst + at, group + from, n); });
}

bool has_qdot(QuantType type) { return quant_traits(type).cpu == CpuMatmul::kIntDot; }

int64_t act_block(QuantType type) {
  switch (r16_base(type)) {
    case QuantType::kQ4_K:
    case QuantType::kQ5_K:
    case QuantType::kQ6_K:
    case QuantType::kQ2_K:
    case QuantType::kQ3_K:
    case QuantType::kTQ1_0:
    case QuantType::kTQ2_0:
      return kActBlock256;
    default: return kActBlock32;
  }
}

namespace {
constexpr size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }
}  // namespace

size_t acts_bytes(int64_t n_tokens, int64_t k, int64_t block) {
  const auto n = static_cast<size_t>(n_tokens);
  const auto kk = static_cast<size_t>(k);
  // + 64 bytes of slack after q: the SIMD kernels may read one vector past a row's end.
  return align64(n * kk + 64) + align64(n * (kk / static_cast<size_t>(block)) * 4) +
         align64(n * (kk / 16) * 2);
}

QuantizedActs acts_view(void* scratch, int64_t n_tokens, int64_t k, int64_t block) {
  TESSERA_CHECK(k % block == 0, "activation row of {} is not a multiple of {}", k, block);
  auto* p = static_cast<uint8_t*>(scratch);
  const auto n = static_cast<size_t>(n_tokens);
  const auto kk = static_cast<size_t>(k);
  QuantizedActs a;
  a.k = k;
  a.block = block;
  a.q = reinterpret_cast<const int8_t*>(p);
  p += align64(n * kk + 64);
  a.d = reinterpret_cast<const float*>(p);
  p += align64(n * (kk / static_cast<size_t>(block)) * 4);
  a.bsum = reinterpret_cast<const int16_t*>(p);
  return a;
}

int packed_aux_per_block(QuantType type) {
  switch (type) {
    case QuantType::kQ4_K: case QuantType::kQ5_K: return 4;
    case QuantType::kQ6_K: return 16;
    case QuantType::kQ2_K: case QuantType::kQ3_K: return 8;
    default: return 1;
  }
}

size_t packed_acts_bytes(const QMatmulArgs& a) {
  const auto n = static_cast<size_t>(a.n_tokens);
  const auto nb = static_cast<size_t>(a.k / a.acts.block);
  const auto n_aux = static_cast<size_t>(packed_aux_per_block(a.type));
  // + 64 bytes of slack after q, as in acts_bytes.
  return align64(n * static_cast<size_t>(a.k) + 64) + align64(nb * n * 4) + align64(nb * n * n_aux * 4);
}

PackedActs pack_acts(const QMatmulArgs& a, void* scratch) {
  const int64_t n = a.n_tokens, k = a.k, blk = a.acts.block, nb = k / blk;
  const int n_aux = packed_aux_per_block(a.type);
  auto* p = static_cast<uint8_t*>(scratch);
  auto* q = reinterpret_cast<int8_t*>(p);
  p += align64(static_cast<size_t>(n * k) + 64);
  auto* d = reinterpret_cast<float*>(p);
  p += align64(static_cast<size_t>(nb * n) * 4);
  auto* aux = reinterpret_cast<int32_t*>(p);
  int offset = 0;  // the q32 formats' level offset (see qgemm.h)
  switch (a.type) {
    case QuantType::kQ8_0: case QuantType::kI8_CH: offset = 128; break;
    case QuantType::kQ4_0: offset = 8; break;
    case QuantType::kQ5_0: offset = 16; break;
    default: break;
  }
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t t = 0; t < n; ++t) {
      const int64_t i = b * n + t;
      std::memcpy(q + i * blk, a.acts.q + t * k + b * blk, static_cast<size_t>(blk));
      d[i] = a.acts.d[t * nb + b];
      const int16_t* bs = a.acts.bsum + t * (k / 16) + b * (blk / 16);
      int32_t* x = aux + i * n_aux;
      switch (a.type) {
        case QuantType::kQ4_K:
        case QuantType::kQ5_K:
          for (int j = 0; j < 4; ++j) {
            const int lo = bs[4 * j] + bs[4 * j + 1], hi = bs[4 * j + 2] + bs[4 * j + 3];  // |.| <= 4064
            x[j] = static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFFu) | (static_cast<uint32_t>(hi) << 16));
          }
          break;
        case QuantType::kQ6_K:
          for (int g = 0; g < 16; ++g) x[g] = -32 * bs[g];
          break;
        case QuantType::kI4_G128: x[0] = bs[0] + bs[1]; break;
        case QuantType::kQ2_K:
        case QuantType::kQ3_K:
          for (int j = 0; j < 8; ++j)
            x[j] = static_cast<int32_t>((static_cast<uint32_t>(bs[2 * j]) & 0xFFFFu) |
                                        (static_cast<uint32_t>(bs[2 * j + 1]) << 16));
          break;
        case QuantType::kTQ1_0:
        case QuantType::kTQ2_0:
          x[0] = 0;
          for (int g = 0; g < 16; ++g) x[0] += bs[g];
          break;
        default: x[0] = -offset * (bs[0] + bs[1]); break;
      }
    }
  }
  PackedActs pa;
  pa.q = q;
  pa.d = d;
  pa.aux = aux;
  pa.n = static_cast<int>(n);
  pa.n_aux = n_aux;
  pa.block = blk;
  return pa;
}

void quantize_acts_scalar(const float* x, int64_t t0, int64_t t1, const QuantizedActs& acts) {
  const int64_t k = acts.k, blk = acts.block, nb = k / blk;
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * k;
    auto* q = const_cast<int8_t*>(acts.q) + t * k;
    auto* d = const_cast<float*>(acts.d) + t * nb;
    auto* bs = const_cast<int16_t*>(acts.bsum) + t * (k / 16);
    for (int64_t b = 0; b < nb; ++b) {
      float amax = 0.0f;
      for (int64_t j = 0; j < blk; ++j) amax = std::max(amax, std::fabs(xt[b * blk + j]));
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      d[b] = act_scale(amax, id, blk);
      for (int64_t j = 0; j < blk; ++j)
        q[b * blk + j] = static_cast<int8_t>(std::nearbyint(xt[b * blk + j] * id));
    }
    for (int64_t g = 0; g < k / 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += q[16 * g + j];
      bs[g] = static_cast<int16_t>(s);
    }
  }
}

void quantize_acts(const float* x, int64_t t0, int64_t t1, const QuantizedActs& acts) {
  switch (active_isa()) {
    case Isa::kAvx512: return quantize_acts_avx512(x, t0, t1, acts);
    case Isa::kAvx2: return quantize_acts_avx2(x, t0, t1, acts);
    case Isa::kScalar: break;
  }
  quantize_acts_scalar(x, t0, t1, acts);
}

void qmatmul_scalar(const QMatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t nb = a.k / a.acts.block;
  const size_t block_bytes = static_cast<size_t>(quant_traits(a.type).block_bytes);
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const int8_t* xq = a.acts.q + t * a.k;
    const float* xd = a.acts.d + t * nb;
    const int16_t* bs = a.acts.bsum + t * (a.k / 16);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = a.w + static_cast<size_t>(r) * a.row_bytes;
      float v;
      switch (a.type) {
        case QuantType::kQ4_K:
        case QuantType::kQ5_K: v = row_dot_k_affine(a.type, row, block_bytes, xq, xd, bs, nb); break;
        case QuantType::kQ6_K: v = row_dot_q6_k(row, xq, xd, nb); break;
        case QuantType::kI8_CH: v = row_dot_i8_ch(row, a.k, xq, xd, nb); break;
        case QuantType::kI4_G128: v = row_dot_i4_g128(row, xq, xd, bs, nb); break;
        case QuantType::kQ2_K:
        case QuantType::kQ3_K:
        case QuantType::kTQ1_0:
        case QuantType::kTQ2_0: v = row_dot_low_bit(a.type, row, xq, xd, bs, nb); break;
        default: v = row_dot_q32(a.type, row, block_bytes, xq, xd, nb); break;
      }
      a.y[t * a.y_stride + r] = v;
    }
  }
}

}  // namespace tessera::cpu
