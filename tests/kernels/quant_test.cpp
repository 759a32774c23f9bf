// Byte layouts of every GGUF block format, checked against hand-built blocks whose expected
// values are derived in the test from the format description (not from the code under test),
// plus quantize -> dequantize round trips with per-format error bounds.
#include "kernels/quant.h"

#include "kernels/cpu/vec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace tessera {
namespace {

void put_f16(uint8_t* p, float f) {
  const uint16_t h = f32_to_fp16(f);
  std::memcpy(p, &h, 2);
}

std::vector<float> dequant(QuantType t, const std::vector<uint8_t>& bytes, int64_t k) {
  std::vector<float> out(static_cast<size_t>(k));
  dequantize_row(t, bytes.data(), out.data(), k);
  return out;
}

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng() & 0xFF);
  return v;
}

// ------------------------------------------------------------------ float formats

TEST(QuantFloat, F16RoundTripIsExactForRepresentableValues) {
  std::vector<float> src;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto hb = static_cast<uint16_t>(h);
    if ((hb & 0x7C00) == 0x7C00) continue;  // inf / nan
    src.push_back(fp16_to_f32(hb));
  }
  const auto k = static_cast<int64_t>(src.size());
  std::vector<uint8_t> bytes(row_bytes(QuantType::kF16, k));
  quantize_row(QuantType::kF16, src.data(), bytes.data(), k);
  const auto back = dequant(QuantType::kF16, bytes, k);
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(std::memcmp(&src[i], &back[i], 4), 0) << "element " << i << " value " << src[i];
  }
}

TEST(QuantFloat, F16AndBF16MatchScalarConversions) {
  const auto src = gaussian(1001, 7, 100.0f);
  const int64_t k = 1001;
  for (QuantType t : {QuantType::kF16, QuantType::kBF16}) {
    std::vector<uint8_t> bytes(row_bytes(t, k));
    quantize_row(t, src.data(), bytes.data(), k);
    const auto back = dequant(t, bytes, k);
    for (int64_t i = 0; i < k; ++i) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      const uint16_t want = t == QuantType::kF16 ? f32_to_fp16(src[i]) : f32_to_bf16(src[i]);
      ASSERT_EQ(h, want) << quant_name(t) << " element " << i;
      const float expect = t == QuantType::kF16 ? fp16_to_f32(h) : bf16_to_f32(h);
      ASSERT_EQ(back[i], expect);
    }
  }
}

TEST(QuantFloat, BF16RoundTripIsExactForRepresentableValues) {
  std::vector<float> src;
  for (uint32_t h = 0; h < 0x10000; h += 3) {
    const auto hb = static_cast<uint16_t>(h);
    if ((hb & 0x7F80) == 0x7F80) continue;
    src.push_back(bf16_to_f32(hb));
  }
  const auto k = static_cast<int64_t>(src.size());
  std::vector<uint8_t> bytes(row_bytes(QuantType::kBF16, k));
  quantize_row(QuantType::kBF16, src.data(), bytes.data(), k);
  const auto back = dequant(QuantType::kBF16, bytes, k);
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(std::memcmp(&src[i], &back[i], 4), 0) << i;
}

TEST(QuantFloat, F32IsCopied) {
  const auto src = gaussian(37, 3);
  std::vector<uint8_t> bytes(row_bytes(QuantType::kF32, 37));
  quantize_row(QuantType::kF32, src.data(), bytes.data(), 37);
  EXPECT_EQ(dequant(QuantType::kF32, bytes, 37), src);
}

// ------------------------------------------------------------------ hand-built blocks

TEST(QuantLayout, Q8_0) {
  std::vector<uint8_t> b(2 * 34);
  put_f16(b.data(), 0.5f);
  put_f16(b.data() + 34, -2.0f);
  for (int j = 0; j < 32; ++j) {
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
    b[36 + j] = static_cast<uint8_t>(static_cast<int8_t>(j == 0 ? -128 : 127 - j));
  }
  const auto x = dequant(QuantType::kQ8_0, b, 64);
  EXPECT_EQ(x[0], -8.0f);
  EXPECT_EQ(x[17], 0.5f);
  EXPECT_EQ(x[31], 7.5f);
  EXPECT_EQ(x[32], 256.0f);   // -2 * -128
  EXPECT_EQ(x[33], -252.0f);  // -2 * 126
  for (int j = 0; j < 32; ++j) EXPECT_EQ(x[j], 0.5f * static_cast<float>(j - 16)) << j;
}

TEST(QuantLayout, Q4_0) {
  // d = 2; byte j holds element j in its low nibble and element j + 16 in its high nibble.
  std::vector<uint8_t> b(18);
  put_f16(b.data(), 2.0f);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto x = dequant(QuantType::kQ4_0, b, 32);
  EXPECT_EQ(x[0], -16.0f);  // (0 - 8) * 2
  EXPECT_EQ(x[15], 14.0f);  // (15 - 8) * 2
  EXPECT_EQ(x[16], 14.0f);  // high nibble of byte 0 = 15
  EXPECT_EQ(x[31], -16.0f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(x[j], 2.0f * static_cast<float>(j - 8));
    EXPECT_EQ(x[j + 16], 2.0f * static_cast<float>(7 - j));
  }
}

TEST(QuantLayout, Q5_0) {
  // qh (little-endian u32) bit j is the fifth bit of element j.
  std::vector<uint8_t> b(22);
  put_f16(b.data(), 0.25f);
  const uint32_t qh = 0x8001'0003u;  // elements 0, 1, 16, 31 have the high bit
  std::memcpy(b.data() + 2, &qh, 4);
  for (int j = 0; j < 16; ++j) b[6 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto x = dequant(QuantType::kQ5_0, b, 32);
  EXPECT_EQ(x[0], 0.0f);            // (0 | 16) - 16
  EXPECT_EQ(x[1], 0.25f);           // (1 | 16) - 16
  EXPECT_EQ(x[2], -3.5f);           // 2 - 16
  EXPECT_EQ(x[16], 0.25f * 15.0f);  // (15 | 16) - 16
  EXPECT_EQ(x[17], 0.25f * -2.0f);  // 14 - 16
  EXPECT_EQ(x[31], 0.0f);           // (0 | 16) - 16
  for (int e = 0; e < 32; ++e) {
    const int nib = e < 16 ? (b[6 + e] & 0xF) : (b[6 + e - 16] >> 4);
    const int q = nib | static_cast<int>(((qh >> e) & 1u) << 4);
    EXPECT_EQ(x[e], 0.25f * static_cast<float>(q - 16)) << e;
  }
}

// The 12 scale bytes of Q4_K / Q5_K, built bit by bit from the description: sub-blocks 0-3
// keep scale and min in bits 0-5 of bytes s and 4+s; sub-blocks 4-7 keep the low 4 bits of
// scale / min in the low / high nibble of byte 4+s and their top 2 bits in bits 6-7 of bytes
// s-4 (scale) and s (min).
void pack_k_scales(uint8_t* out, const int* sc, const int* m) {
  std::memset(out, 0, 12);
  for (int s = 0; s < 4; ++s) {
    out[s] = static_cast<uint8_t>(sc[s]);
    out[s + 4] = static_cast<uint8_t>(m[s]);
  }
  for (int s = 4; s < 8; ++s) {
    out[s + 4] = static_cast<uint8_t>((sc[s] & 15) + 16 * (m[s] & 15));
    out[s - 4] = static_cast<uint8_t>(out[s - 4] + 64 * (sc[s] / 16));
    out[s] = static_cast<uint8_t>(out[s] + 64 * (m[s] / 16));
  }
}

const int kScK[8] = {1, 2, 3, 4, 33, 40, 63, 17};
const int kMinK[8] = {0, 5, 10, 63, 20, 1, 7, 48};

TEST(QuantLayout, KScalePackingBytes) {
  uint8_t s[12];
  pack_k_scales(s, kScK, kMinK);
  // Worked by hand: byte 1 = scale1 (2) | top bits of scale5 (40 = 0b10'1000 -> 2) << 6.
  EXPECT_EQ(s[1], 2 + (2 << 6));
  // byte 4 = min0 (0) | top bits of min4 (20 = 0b01'0100 -> 1) << 6.
  EXPECT_EQ(s[4], 0 + (1 << 6));
  // byte 9 = scale5 low nibble (8) | min5 low nibble (1) << 4.
  EXPECT_EQ(s[9], 8 + (1 << 4));
}

TEST(QuantLayout, Q4_K) {
  std::vector<uint8_t> b(144);
  put_f16(b.data(), 0.5f);       // d
  put_f16(b.data() + 2, 0.25f);  // dmin
  pack_k_scales(b.data() + 4, kScK, kMinK);
  const auto qs = random_bytes(128, 11);
  std::memcpy(b.data() + 16, qs.data(), 128);
  const auto x = dequant(QuantType::kQ4_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    // Sub-block s = e / 32; chunk c = e / 64 uses bytes 32c .. 32c+31: the even sub-block
    // takes their low nibbles, the odd one their high nibbles.
    const int s = e / 32;
    const uint8_t byte = qs[static_cast<size_t>(32 * (e / 64) + e % 32)];
    const int q = s % 2 == 0 ? byte & 15 : byte >> 4;
    const float want = 0.5f * static_cast<float>(kScK[s]) * static_cast<float>(q) -
                       0.25f * static_cast<float>(kMinK[s]);
    ASSERT_EQ(x[e], want) << "element " << e;
  }
  // Spot values: element 32 is the high nibble of byte 0 in sub-block 1 (scale 2, min 5).
  EXPECT_EQ(x[32], 0.5f * 2 * static_cast<float>(qs[0] >> 4) - 0.25f * 5);
  // Element 200: chunk 3, sub-block 6 (scale 63, min 7), low nibble of byte 96 + 8.
  EXPECT_EQ(x[200], 0.5f * 63 * static_cast<float>(qs[104] & 15) - 0.25f * 7);
}

TEST(QuantLayout, Q5_K) {
  std::vector<uint8_t> b(176);
  put_f16(b.data(), 0.125f);
  put_f16(b.data() + 2, 1.0f);
  pack_k_scales(b.data() + 4, kScK, kMinK);
  const auto qh = random_bytes(32, 12);
  const auto qs = random_bytes(128, 13);
  std::memcpy(b.data() + 16, qh.data(), 32);
  std::memcpy(b.data() + 48, qs.data(), 128);
  const auto x = dequant(QuantType::kQ5_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    // As Q4_K, plus the fifth bit of element e: bit (e / 32) of qh[e % 32].
    const int s = e / 32;
    const uint8_t byte = qs[static_cast<size_t>(32 * (e / 64) + e % 32)];
    const int lo = s % 2 == 0 ? byte & 15 : byte >> 4;
    const int q = lo + 16 * ((qh[static_cast<size_t>(e % 32)] >> s) & 1);
    const float want = 0.125f * static_cast<float>(kScK[s]) * static_cast<float>(q) -
                       1.0f * static_cast<float>(kMinK[s]);
    ASSERT_EQ(x[e], want) << "element " << e;
  }
}

TEST(QuantLayout, Q5_KSpotValues) {
  std::vector<uint8_t> b(176, 0);
  put_f16(b.data(), 1.0f);
  put_f16(b.data() + 2, 1.0f);
  int sc[8] = {1, 1, 1, 1, 1, 1, 1, 1}, m[8] = {};
  pack_k_scales(b.data() + 4, sc, m);
  b[16 + 5] = 0x08;   // qh[5] bit 3: element 3 * 32 + 5 = 101 gets +16
  b[48 + 69] = 0x7A;  // qs[69]: chunk 2, l = 5 -> element 133 (low, 10), element 165 (high, 7)
  const auto x = dequant(QuantType::kQ5_K, b, 256);
  EXPECT_EQ(x[101], 16.0f);
  EXPECT_EQ(x[133], 10.0f);
  EXPECT_EQ(x[165], 7.0f);
  float total = 0;
  for (float v : x) total += v;
  EXPECT_EQ(total, 33.0f);
}

TEST(QuantLayout, Q6_K) {
  std::vector<uint8_t> b(210);
  const auto ql = random_bytes(128, 21);
  const auto qh = random_bytes(64, 22);
  std::memcpy(b.data(), ql.data(), 128);
  std::memcpy(b.data() + 128, qh.data(), 64);
  int8_t scales[16];
  for (int i = 0; i < 16; ++i) scales[i] = static_cast<int8_t>(i * 17 - 128);
  std::memcpy(b.data() + 192, scales, 16);
  put_f16(b.data() + 208, 0.0625f);
  const auto x = dequant(QuantType::kQ6_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    // Half h = e / 128 uses ql[64h .. 64h+63] and qh[32h .. 32h+31]. Within the half, group
    // g = r / 32 at lane l = r % 32: low 4 bits from ql[64h + l] (g 0: low nibble, g 2: high)
    // or ql[64h + 32 + l] (g 1: low, g 3: high); top 2 bits are bits 2g, 2g+1 of qh[32h + l].
    const int h = e / 128, r = e % 128, g = r / 32, l = r % 32;
    const uint8_t lb = ql[static_cast<size_t>(64 * h + (g % 2) * 32 + l)];
    const int low = g < 2 ? lb & 15 : lb >> 4;
    const int high = (qh[static_cast<size_t>(32 * h + l)] >> (2 * g)) & 3;
    const int q = low + 16 * high - 32;
    const float want = 0.0625f * static_cast<float>(scales[e / 16]) * static_cast<float>(q);
    ASSERT_EQ(x[e], want) << "element " << e;
  }
}

TEST(QuantLayout, Q6_KSpotValues) {
  std::vector<uint8_t> b(210, 0);
  for (int i = 0; i < 16; ++i) b[192 + i] = 1;
  put_f16(b.data() + 208, 1.0f);
  // All levels 0 -> every element is -32, except the ones set below.
  b[0] = 0x21;        // ql[0]: element 0 low 1, element 64 low 2
  b[128] = 0b11100100;  // qh[0]: element 0 top 0, element 32 top 1, element 64 top 2, 96 top 3
  b[64 + 32 + 3] = 0xF0;  // ql[96 + 3]: half 1, element 128 + 96 + 3 = 227 low 15
  const auto x = dequant(QuantType::kQ6_K, b, 256);
  EXPECT_EQ(x[0], 1.0f - 32.0f);
  EXPECT_EQ(x[32], 16.0f - 32.0f);
  EXPECT_EQ(x[64], 2.0f + 32.0f - 32.0f);
  EXPECT_EQ(x[96], 48.0f - 32.0f);
  EXPECT_EQ(x[227], 15.0f - 32.0f);
  EXPECT_EQ(x[1], -32.0f);
  EXPECT_EQ(x[195], -32.0f);
}

TEST(QuantLayout, BlocksAreIndependentAcrossTheRow) {
  // Block b of a row decodes the same as that block alone.
  for (QuantType t : {QuantType::kQ8_0, QuantType::kQ4_0, QuantType::kQ5_0, QuantType::kQ4_K,
                      QuantType::kQ5_K, QuantType::kQ6_K}) {
    const QuantTraits& tr = quant_traits(t);
    const int64_t k = 3 * tr.block_elems;
    auto bytes = random_bytes(row_bytes(t, k), 5);
    // Keep fp16 scales finite: clear the exponent's top bit in every half of the block.
    for (size_t i = 1; i < bytes.size(); i += 2) bytes[i] &= 0x3F;
    const auto x = dequant(t, bytes, k);
    for (int blk = 0; blk < 3; ++blk) {
      std::vector<uint8_t> one(bytes.begin() + blk * tr.block_bytes,
                               bytes.begin() + (blk + 1) * tr.block_bytes);
      const auto y = dequant(t, one, tr.block_elems);
      for (int i = 0; i < tr.block_elems; ++i)
        ASSERT_EQ(std::memcmp(&y[i], &x[blk * tr.block_elems + i], 4), 0) << quant_name(t);
    }
  }
}

// ------------------------------------------------------------------ independent golden values

// Pseudo-random blocks (64-bit LCG, top byte) whose fp16 scale fields are forced into
// +-[1/8, 1/4): the high byte of each scale becomes (b & 0x83) | 0x30.
std::vector<uint8_t> golden_blocks(QuantType t, uint64_t seed, int n_blocks) {
  const QuantTraits& tr = quant_traits(t);
  std::vector<uint8_t> b(static_cast<size_t>(tr.block_bytes * n_blocks));
  uint64_t s = seed;
  for (auto& byte : b) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    byte = static_cast<uint8_t>(s >> 56);
  }
  std::vector<int> halves;
  switch (t) {
    case QuantType::kQ4_K:
    case QuantType::kQ5_K: halves = {0, 2}; break;
    case QuantType::kQ6_K: halves = {208}; break;
    default: halves = {0}; break;
  }
  for (int blk = 0; blk < n_blocks; ++blk)
    for (int h : halves) {
      uint8_t& hi = b[static_cast<size_t>(blk * tr.block_bytes + h + 1)];
      hi = static_cast<uint8_t>((hi & 0x83) | 0x30);
    }
  return b;
}

struct GoldenCase {
  QuantType type;
  uint64_t seed;
  std::vector<std::pair<int, float>> samples;  // element index, expected value
};

// Every 7th element (and the last) of three blocks per format, as dequantized by the gguf
// Python package's reference implementation (gguf 0.19.0, gguf.quants.dequantize), an
// implementation independent of this one.
const GoldenCase kGolden[] = {
    {QuantType::kQ8_0, 1268, {{0, 1.036084e+01f}, {7, -1.1773682e+01f}, {14, 3.2966309e+00f}, {21, 1.8366943e+01f}, {28, 2.8256836e+01f}, {35, 9.057617e+00f}, {42, 1.6174316e+00f}, {49, -1.843872e+01f}, {56, 1.4395142e+01f}, {63, 6.954956e+00f}, {70, -1.6729492e+01f}, {77, 1.288623e+01f}, {84, -2.7128906e+00f}, {91, -2.19292e+01f}, {95, -1.1303711e+01f}}},
    {QuantType::kQ4_0, 1252, {{0, -6.269531e-01f}, {7, 1.5673828e-01f}, {14, -1.5673828e-01f}, {21, -1.5673828e-01f}, {28, -6.269531e-01f}, {35, 9.686279e-01f}, {42, -5.8117676e-01f}, {49, 5.8117676e-01f}, {56, 1.1623535e+00f}, {63, -5.8117676e-01f}, {70, -6.939697e-01f}, {77, 4.1638184e-01f}, {84, -1.3879395e-01f}, {91, -5.551758e-01f}, {95, -9.715576e-01f}}},
    {QuantType::kQ5_0, 1256, {{0, -2.543213e+00f}, {7, 1.8496094e+00f}, {14, 3.0056152e+00f}, {21, 2.0808105e+00f}, {28, -6.936035e-01f}, {35, -2.0043945e-01f}, {42, -4.008789e-01f}, {49, 3.0065918e+00f}, {56, 2.605713e+00f}, {63, -1.6035156e+00f}, {70, 1.7224121e-01f}, {77, 2.2391357e+00f}, {84, -1.3779297e+00f}, {91, -1.7224121e-01f}, {95, -3.4448242e-01f}}},
    {QuantType::kQ4_K, 1378, {{0, -5.974402e+01f}, {7, -4.669995e+01f}, {14, -3.8003906e+01f}, {21, -3.3655884e+01f}, {28, -6.409204e+01f}, {35, -6.97478e+01f}, {42, -5.37583e+01f}, {49, -4.8428467e+01f}, {56, -2.1779297e+01f}, {63, -2.1779297e+01f}, {70, -7.777551e+01f}, {77, -5.8139282e+01f}, {84, -1.3957764e+01f}, {91, -5.3230225e+01f}, {98, -8.171924e+01f}, {105, -5.142334e+01f}, {112, -8.929321e+01f}, {119, -5.142334e+01f}, {126, -3.627539e+01f}, {133, -1.0573926e+02f}, {140, -7.207715e+01f}, {147, -1.0573926e+02f}, {154, -1.8217773e+01f}, {161, -2.6408447e+01f}, {168, -2.96344e+01f}, {175, -2.96344e+01f}, {182, -4.2538208e+01f}, {189, -2.96344e+01f}, {196, -1.2278076e+01f}, {203, -4.1311646e+01f}, {210, -1.872998e+01f}, {217, -5.4215454e+01f}, {224, -2.7597656e+00f}, {231, -2.7597656e+00f}, {238, -9.533057e+01f}, {245, -2.7597656e+00f}, {252, -9.533057e+01f}, {259, 5.8740723e+01f}, {266, 5.266284e+01f}, {273, 4.050708e+01f}, {280, 3.44292e+01f}, {287, 4.658496e+01f}, {294, 1.7667969e+02f}, {301, 1.9093933e+02f}, {308, 5.563965e+00f}, {315, 1.7667969e+02f}, {322, 2.7141968e+01f}, {329, 3.765503e+00f}, {336, 6.805078e+01f}, {343, 7.38949e+01f}, {350, 7.973901e+01f}, {357, 2.1431763e+01f}, {364, 3.6656494e+00f}, {371, 4.8080933e+01f}, {378, 9.2496216e+01f}, {385, 1.3626013e+02f}, {392, 1.3626013e+02f}, {399, 1.4724707e+02f}, {406, 3.7377686e+01f}, {413, 1.0329932e+02f}, {420, -8.502441e+00f}, {427, -8.502441e+00f}, {434, -8.502441e+00f}, {441, -8.502441e+00f}, {448, 6.0843506e+00f}, {455, 2.2447876e+01f}, {462, 3.746704e+00f}, {469, 3.746704e+00f}, {476, 2.4785522e+01f}, {483, -8.695679e+00f}, {490, 6.4940186e+01f}, {497, 1.5849609e+01f}, {504, 2.0758667e+01f}, {511, 5.512207e+01f}, {518, 1.8083496e+01f}, {525, 1.8083496e+01f}, {532, 4.4604492e+01f}, {539, 9.243164e+00f}, {546, 2.0470703e+01f}, {553, 5.9101562e+00f}, {560, -1.3701172e+00f}, {567, 2.7750977e+01f}, {574, 2.289746e+01f}, {581, 7.894043e+00f}, {588, 1.8641113e+01f}, {595, 2.9388184e+01f}, {602, 2.4014648e+01f}, {609, -8.4375e+00f}, {616, 6.644531e+01f}, {623, 1.6523438e+01f}, {630, 1.08046875e+02f}, {637, 9.972656e+01f}, {644, -3.569336e+00f}, {651, 9.777832e+00f}, {658, 7.8710938e+00f}, {665, 5.9643555e+00f}, {672, 6.726416e+01f}, {679, 4.7503418e+01f}, {686, -1.8984375e+00f}, {693, 4.7503418e+01f}, {700, 2.7742676e+01f}, {707, 3.577246e+01f}, {714, 9.424805e+00f}, {721, 2.9185547e+01f}, {728, -1.03359375e+01f}, {735, 8.846777e+01f}, {742, 1.0088867e+01f}, {749, 1.0751953e+00f}, {756, 1.0088867e+01f}, {763, -1.24453125e+01f}, {767, -1.1782227e+00f}}},
    {QuantType::kQ5_K, 1410, {{0, -1.6428223e+00f}, {7, -1.4517456e+01f}, {14, -7.1605225e+00f}, {21, -3.1070557e+01f}, {28, -4.2105957e+01f}, {35, -3.6078857e+01f}, {42, -1.7869019e+02f}, {49, -1.7869019e+02f}, {56, -9.946167e+01f}, {63, 3.5354004e+00f}, {70, -1.6526245e+01f}, {77, -5.8121216e+01f}, {84, -1.0584106e+01f}, {91, -4.623694e+01f}, {98, -5.3921875e+01f}, {105, -1.2522754e+02f}, {112, -1.0740112e+02f}, {119, -1.8269043e+01f}, {126, -1.2522754e+02f}, {133, -2.6379395e+00f}, {140, -1.1126709e+01f}, {147, -7.5897217e+00f}, {154, -8.297119e+00f}, {161, -1.2894409e+01f}, {168, -9.1839966e+01f}, {175, -3.9209595e+01f}, {182, -1.2894409e+01f}, {189, -1.7280273e+01f}, {196, -1.3372302e+02f}, {203, -1.0401233e+02f}, {210, 2.946167e+00f}, {217, -3.8648804e+01f}, {224, -4.2488525e+01f}, {231, -1.06861694e+02f}, {238, -1.2777832e+01f}, {245, -7.7151e+01f}, {252, -5.239209e+01f}, {259, -3.0567383e+01f}, {266, -2.9350098e+01f}, {273, -1.4742676e+01f}, {280, -2.9350098e+01f}, {287, -2.9350098e+01f}, {294, -9.33252e+00f}, {301, -3.773584e+01f}, {308, -1.229458e+02f}, {315, -1.1158447e+02f}, {322, -2.1234863e+01f}, {329, -2.840332e+00f}, {336, -1.8935547e+01f}, {343, -1.8935547e+01f}, {350, -2.8132812e+01f}, {357, -1.09961426e+02f}, {364, -1.229458e+02f}, {371, -1.229458e+02f}, {378, -6.451611e+01f}, {385, -1.2984375e+01f}, {392, -5.4913086e+01f}, {399, -9.2648926e+01f}, {406, -4.598633e+00f}, {413, -5.0720215e+01f}, {420, -3.2460938e+00f}, {427, -3.2460938e+00f}, {434, -1.6230469e+00f}, {441, 1.6230469e+00f}, {448, -5.680664e+01f}, {455, -8.994385e+01f}, {462, -1.3254883e+02f}, {469, -1.4675049e+02f}, {476, -9.4677734e+01f}, {483, -8.548047e+01f}, {490, -5.6265625e+01f}, {497, -1.0982617e+02f}, {504, -7.5742188e+00f}, {511, -8.548047e+01f}, {518, -3.35083e+00f}, {525, -4.587378e+01f}, {532, -1.7525146e+01f}, {539, -2.2305273e+02f}, {546, -3.3628955e+02f}, {553, -6.3556152e+01f}, {560, -2.4537842e+02f}, {567, -1.0901172e+02f}, {574, -3.0598584e+02f}, {581, -1.3891113e+01f}, {588, -8.4273926e+01f}, {595, -4.3217285e+01f}, {602, -7.254346e+01f}, {609, -1.1545239e+02f}, {616, -1.5650903e+02f}, {623, -2.899431e+02f}, {630, -4.360327e+01f}, {637, -2.3862231e+02f}, {644, -7.938623e+01f}, {651, -1.4379883e+01f}, {658, -1.3046265e+02f}, {665, -4.2239746e+01f}, {672, -1.2360425e+02f}, {679, -4.5401123e+01f}, {686, -5.713159e+01f}, {693, -1.4119873e+01f}, {700, -9.2323e+01f}, {707, -1.7756592e+02f}, {714, -2.0469263e+02f}, {721, -1.4139697e+02f}, {728, -1.4139697e+02f}, {735, -2.4990381e+02f}, {742, -1.7716333e+02f}, {749, -2.1235474e+02f}, {756, -1.000415e+01f}, {763, -1.0678052e+02f}, {767, -2.1235474e+02f}}},
    {QuantType::kQ6_K, 1444, {{0, -1.822478e+02f}, {7, -2.5312195e+02f}, {14, 9.11239e+01f}, {21, 1.9755859e+00f}, {28, 1.975586e+01f}, {35, 6.1243164e+01f}, {42, -2.2966187e+02f}, {49, -2.4102148e+02f}, {56, -2.4102148e+02f}, {63, 2.7114917e+02f}, {70, 1.2347412e+01f}, {77, -5.4328613e+01f}, {84, -2.9238672e+02f}, {91, 1.4619336e+02f}, {98, 2.7855762e+02f}, {105, 3.249839e+02f}, {112, 9.095104e+02f}, {119, -2.5089941e+02f}, {126, -5.0179883e+02f}, {133, -7.77887e+01f}, {140, -7.4084473e+00f}, {147, 4.9982324e+02f}, {154, 5.225425e+02f}, {161, 8.593799e+01f}, {168, 3.7239795e+02f}, {175, -8.880259e+02f}, {182, 7.5368604e+02f}, {189, -8.0752075e+02f}, {196, -2.2966187e+02f}, {203, 2.2966187e+02f}, {210, 4.3956787e+02f}, {217, -3.516543e+02f}, {224, 9.013611e+01f}, {231, -3.6054443e+02f}, {238, -3.6054443e+01f}, {245, 2.667041e+01f}, {252, -9.3346436e+01f}, {259, 3.7408594e+02f}, {266, -1.7003906e+01f}, {273, -1.59943e+02f}, {280, -1.9040833e+02f}, {287, 1.0662866e+02f}, {294, 2.2955273e+02f}, {301, 3.825879e+01f}, {308, -1.0096069e+02f}, {315, 1.4134497e+02f}, {322, 1.8598022e+02f}, {329, -6.642151e+01f}, {336, 2.3433508e+02f}, {343, -1.12828e+02f}, {350, -8.679077e+01f}, {357, 3.1014417e+02f}, {364, 4.7433813e+02f}, {371, -2.072351e+02f}, {378, -4.144702e+01f}, {385, -1.9660767e+02f}, {392, -3.538938e+02f}, {399, 1.179646e+02f}, {406, -4.0384277e+01f}, {413, -1.6153711e+02f}, {420, 3.825879e+02f}, {427, 5.5262695e+02f}, {434, -9.210449e+00f}, {441, -4.144702e+01f}, {448, -1.7287305e+02f}, {455, 1.2965479e+02f}, {462, -5.8344653e+02f}, {469, 2.1042334e+02f}, {476, -5.3562305e+02f}, {483, -3.1085266e+02f}, {490, 4.5591724e+02f}, {497, -2.9668274e+02f}, {504, 3.560193e+02f}, {511, 3.3228467e+02f}, {518, 0.0f}, {525, -1.01832275e+02f}, {532, -1.5767578e+01f}, {539, 2.6279297e+00f}, {546, -5.60625e+01f}, {553, -9.110156e+01f}, {560, -1.4716406e+02f}, {567, 1.195708e+02f}, {574, -9.197754e+01f}, {581, 4.1608887e+01f}, {588, 1.08183105e+02f}, {595, 1.419082e+02f}, {602, -2.4833936e+02f}, {609, -2.5228125e+02f}, {616, -2.733047e+02f}, {623, -5.466094e+02f}, {630, -9.460547e+01f}, {637, 5.60625e+01f}, {644, -6.657422e+01f}, {651, 9.460547e+01f}, {658, -6.3070312e+01f}, {665, 7.0078125e+00f}, {672, -1.456311e+02f}, {679, -2.912622e+02f}, {686, 2.0804443e+01f}, {693, -2.8710132e+02f}, {700, -9.986133e+01f}, {707, 3.4644873e+02f}, {714, 6.9289746e+02f}, {721, -4.4324414e+02f}, {728, 1.20884766e+02f}, {735, -2.2162207e+02f}, {742, 2.6804883e+02f}, {749, 2.6804883e+02f}, {756, 2.8907227e+02f}, {763, 4.5769775e+02f}, {767, 4.817871e+02f}}},
};

// Runs with the AVX2 decoders (when the CPU has them) and with the portable ones.
class QuantGolden : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!GetParam() && !cpu::has_avx2()) GTEST_SKIP() << "CPU has no AVX2/FMA/F16C";
    cpu::set_force_scalar(GetParam());
  }
  void TearDown() override { cpu::set_force_scalar(false); }
};

TEST_P(QuantGolden, MatchesIndependentReferenceDequantizer) {
  for (const GoldenCase& g : kGolden) {
    const int64_t k = 3 * quant_traits(g.type).block_elems;
    const auto bytes = golden_blocks(g.type, g.seed, 3);
    const auto x = dequant(g.type, bytes, k);
    for (const auto& [i, want] : g.samples)
      ASSERT_EQ(x[static_cast<size_t>(i)], want) << quant_name(g.type) << " element " << i;
  }
}

TEST_P(QuantGolden, SimdAndScalarDecodersAgreeBitForBit) {
  for (QuantType t : {QuantType::kF16, QuantType::kBF16, QuantType::kQ8_0, QuantType::kQ4_0,
                      QuantType::kQ5_0, QuantType::kQ4_K, QuantType::kQ5_K, QuantType::kQ6_K}) {
    const int n_blocks = quant_traits(t).block_elems == 1 ? 999 : 5;
    const int64_t k = static_cast<int64_t>(n_blocks) * quant_traits(t).block_elems;
    const auto bytes = golden_blocks(t, 99, n_blocks);
    const auto mine = dequant(t, bytes, k);
    cpu::set_force_scalar(!GetParam());
    const auto other = dequant(t, bytes, k);
    cpu::set_force_scalar(GetParam());
    ASSERT_EQ(std::memcmp(mine.data(), other.data(), mine.size() * 4), 0) << quant_name(t);
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, QuantGolden, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Scalar" : "Simd"; });

// ------------------------------------------------------------------ round trips

double relative_rms_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(a[i]) * a[i];
  }
  return std::sqrt(num / den);
}

struct RoundTripCase {
  QuantType type;
  double max_rel_rms;
};

class QuantRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(QuantRoundTrip, GaussianErrorWithinBound) {
  const auto [type, bound] = GetParam();
  const int64_t k = 4096;
  for (uint32_t seed : {1u, 2u, 3u}) {
    for (float sigma : {1e-3f, 1.0f, 30.0f}) {
      const auto src = gaussian(k, seed, sigma);
      std::vector<uint8_t> bytes(row_bytes(type, k));
      quantize_row(type, src.data(), bytes.data(), k);
      std::vector<float> back(static_cast<size_t>(k));
      dequantize_row(type, bytes.data(), back.data(), k);
      const double err = relative_rms_error(src, back);
      EXPECT_LT(err, bound) << quant_name(type) << " seed " << seed << " sigma " << sigma;
      if (seed == 1 && sigma == 1.0f)
        std::printf("  %-5s relative RMS error %.4f%%\n", std::string(quant_name(type)).c_str(),
                    100 * err);
    }
  }
}

TEST_P(QuantRoundTrip, DegenerateRows) {
  const QuantType type = GetParam().type;
  const int64_t k = 512;
  std::vector<std::vector<float>> rows;
  rows.emplace_back(k, 0.0f);                                        // all zero
  rows.emplace_back(k, -0.75f);                                      // constant negative
  rows.emplace_back(k, 3.0f);                                        // constant positive
  auto outlier = gaussian(k, 9, 0.01f);
  outlier[77] = 50.0f;
  rows.push_back(outlier);                                           // one outlier
  auto negative = gaussian(k, 10);
  for (auto& v : negative) v = -std::fabs(v) - 1.0f;                 // all below zero
  rows.push_back(negative);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<uint8_t> bytes(row_bytes(type, k));
    quantize_row(type, rows[r].data(), bytes.data(), k);
    std::vector<float> back(static_cast<size_t>(k));
    dequantize_row(type, bytes.data(), back.data(), k);
    double max_abs = 0;
    for (float v : rows[r]) max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_TRUE(std::isfinite(back[i])) << quant_name(type) << " row " << r << " elem " << i;
      // No format may move a value by more than its range (a loose sanity bound).
      ASSERT_LE(std::fabs(back[i] - rows[r][i]), 0.5 * max_abs + 1e-6)
          << quant_name(type) << " row " << r << " elem " << i;
    }
    if (r == 0) {
      for (int64_t i = 0; i < k; ++i) ASSERT_EQ(back[i], 0.0f) << quant_name(type);
    }
  }
}

TEST_P(QuantRoundTrip, QuantizingDequantizedDataIsStable) {
  // A second round trip may not add noticeable error: the dequantized values are on (or very
  // near) the grid the quantizer searches.
  const QuantType type = GetParam().type;
  const int64_t k = 1024;
  const auto src = gaussian(k, 4);
  std::vector<uint8_t> bytes(row_bytes(type, k));
  std::vector<float> once(static_cast<size_t>(k)), twice(static_cast<size_t>(k));
  quantize_row(type, src.data(), bytes.data(), k);
  dequantize_row(type, bytes.data(), once.data(), k);
  quantize_row(type, once.data(), bytes.data(), k);
  dequantize_row(type, bytes.data(), twice.data(), k);
  EXPECT_LT(relative_rms_error(once, twice), GetParam().max_rel_rms / 4) << quant_name(type);
}

// Bounds on Gaussian data. Q4_0 / Q5_0 (one symmetric scale per 32) sit near 8.3% / 4.0%
// even with an optimal scale per block, so their bounds are 9% / 4.5%; the K-quants' affine
// sub-blocks do better (Q4_K ~7.1%, Q5_K ~3.5%, Q6_K ~1.7%).
INSTANTIATE_TEST_SUITE_P(
    AllFormats, QuantRoundTrip,
    ::testing::Values(RoundTripCase{QuantType::kF16, 1e-3}, RoundTripCase{QuantType::kBF16, 5e-3},
                      RoundTripCase{QuantType::kQ8_0, 0.01}, RoundTripCase{QuantType::kQ6_K, 0.02},
                      RoundTripCase{QuantType::kQ5_0, 0.045}, RoundTripCase{QuantType::kQ5_K, 0.04},
                      RoundTripCase{QuantType::kQ4_0, 0.09}, RoundTripCase{QuantType::kQ4_K, 0.08}),
    [](const auto& info) { return std::string(quant_name(info.param.type)); });

TEST(Quant, CanQuantize) {
  EXPECT_TRUE(can_quantize(QuantType::kQ4_K));
  EXPECT_TRUE(can_quantize(QuantType::kF32));
  EXPECT_FALSE(can_quantize(QuantType::kI8));
  EXPECT_FALSE(can_quantize(QuantType::kI32));
}

TEST(Quant, IntegerTypesDequantizeToTheirValues) {
  const int8_t i8[4] = {-128, -1, 0, 127};
  float out[4];
  dequantize_row(QuantType::kI8, i8, out, 4);
  EXPECT_EQ(out[0], -128.0f);
  EXPECT_EQ(out[3], 127.0f);
  const int32_t i32[2] = {-70000, 5};
  dequantize_row(QuantType::kI32, i32, out, 2);
  EXPECT_EQ(out[0], -70000.0f);
  EXPECT_EQ(out[1], 5.0f);
}

}  // namespace
}  // namespace tessera
