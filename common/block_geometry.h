// The block geometry of the GGUF block formats that Tessera computes with (ggml's published
// layouts), as plain constants: the format table (common/dtype.cpp) builds its rows from them,
// and device code that cannot read that table at compile time (kernels/cuda/gguf_gemm.cu)
// includes this header too, so each size is written once. No standard library: nvcc includes it.
#pragma once

namespace tessera::blocks {

struct Geometry {
  int elems;  // elements per block
  int bytes;  // bytes per block
};

inline constexpr Geometry kQ8_0{32, 34};   // fp16 scale + 32 x int8
inline constexpr Geometry kQ4_0{32, 18};   // fp16 scale + 16 B nibbles
inline constexpr Geometry kQ5_0{32, 22};   // fp16 scale + 4 B high bits + 16 B nibbles
inline constexpr Geometry kQ4_K{256, 144}; // fp16 d, dmin, 12 B scales, 128 B nibbles
inline constexpr Geometry kQ5_K{256, 176}; // d, dmin, 12 B scales, 32 B high bits, 128 B nibbles
inline constexpr Geometry kQ6_K{256, 210}; // 128 B low, 64 B high, 16 x int8 scales, fp16 d
inline constexpr Geometry kQ2_K{256, 84};   // 16 B scale|min nibbles, 64 B 2-bit levels, fp16 d, dmin
inline constexpr Geometry kQ3_K{256, 110};  // 32 B high bits, 64 B 2-bit low, 12 B 6-bit scales, fp16 d
inline constexpr Geometry kTQ1_0{256, 54};  // 48 B of 5 trits + 4 B of 4 trits (base 3), fp16 d
inline constexpr Geometry kTQ2_0{256, 66};  // 64 B of 2-bit trits, fp16 d

}  // namespace tessera::blocks
