// The GGUF block formats that Tessera computes with (ggml's published layouts), as one list:
// QuantType's enumerators of these formats (common/dtype.h), the CUDA ABI's TESSERA_CUDA_GGUF_*
// values (kernels/cuda/cuda_api.h) and the geometry constants below are generated from it, and
// the format table (common/dtype.cpp) builds its rows from the constants. Device code that cannot
// read that table at compile time (kernels/cuda/gguf_gemm.cu) includes this header too, so each
// size is written once. No standard library: nvcc includes it.
//
// Adding a GGUF format: its line here (at the end) and its row in common/dtype.cpp's table; the
// lists of formats elsewhere (loaders, --quant, the planner, the test-model writer, help texts)
// read the table. What remains is its arithmetic: the kernels (kernels/cpu, kernels/cuda).
#pragma once

// X(name, elements per block, bytes per block), in QuantType order.
#define TESSERA_GGUF_BLOCK_FORMATS(X)                                                                  \
  X(Q8_0, 32, 34)   /* fp16 scale + 32 x int8 */                                                       \
  X(Q4_0, 32, 18)   /* fp16 scale + 16 B nibbles, value (q - 8) * d */                                 \
  X(Q5_0, 32, 22)   /* fp16 scale + 4 B high bits + 16 B nibbles */                                    \
  X(Q4_K, 256, 144) /* super-block: fp16 d, dmin, 12 B scales, 128 B nibbles */                        \
  X(Q5_K, 256, 176) /* d, dmin, 12 B scales, 32 B high bits, 128 B nibbles */                          \
  X(Q6_K, 256, 210) /* 128 B low, 64 B high, 16 x int8 scales, fp16 d */                               \
  X(Q2_K, 256, 84)  /* 16 B scale|min nibbles, 64 B 2-bit levels, fp16 d, dmin */                      \
  X(Q3_K, 256, 110) /* 32 B high bits, 64 B 2-bit low, 12 B 6-bit scales, fp16 d */                    \
  X(TQ1_0, 256, 54) /* ternary: 48 B of 5 trits + 4 B of 4 trits (base 3), fp16 d */                   \
  X(TQ2_0, 256, 66) /* ternary: 64 B of 2-bit trits (trit + 1), fp16 d */

namespace tessera::blocks {

struct Geometry {
  int elems;  // elements per block
  int bytes;  // bytes per block
};

// kQ8_0{32, 34}, kQ4_0{32, 18}, ...: one constant per format of the list.
#define TESSERA_BLOCK_GEOMETRY(name, elems, bytes) inline constexpr Geometry k##name{elems, bytes};
TESSERA_GGUF_BLOCK_FORMATS(TESSERA_BLOCK_GEOMETRY)
#undef TESSERA_BLOCK_GEOMETRY

// A format's position in the list (kIndexQ8_0 = 0, ...), and QuantType's value of the first:
// the formats take consecutive QuantType values in list order, right after kBF16.
enum ListIndex : int {
#define TESSERA_BLOCK_INDEX(name, elems, bytes) kIndex##name,
  TESSERA_GGUF_BLOCK_FORMATS(TESSERA_BLOCK_INDEX)
#undef TESSERA_BLOCK_INDEX
  kListSize
};
inline constexpr int kFirstQuantType = 3;

}  // namespace tessera::blocks
