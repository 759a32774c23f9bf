// Weight and activation formats, described by one traits table: THE place for every fact about
// a format (block geometry, ggml id, name, who produces it, which backend computes it and how);
// loaders, planner, kernels and backends read it instead of keeping their own lists.
//
// A QuantType stores a row of `k` elements as k / block_elems blocks of block_bytes each
// (plain types have block_elems == 1). Rows never share a block, so a row-major matrix of
// shape [rows, k] takes rows * row_bytes(type, k) bytes. GGUF types keep ggml's exact byte
// layout (so a memory-mapped GGUF tensor is used as is); the ggml type id is in the table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace tessera {

enum class QuantType : uint8_t {
  kF32 = 0,
  kF16,
  kBF16,
  kQ8_0,  // ggml: 32 elems, fp16 scale + 32 x int8                         (34 B)
  kQ4_0,  // ggml: 32 elems, fp16 scale + 16 B nibbles, value (q - 8) * d   (18 B)
  kQ5_0,  // ggml: 32 elems, fp16 scale + 4 B high bits + 16 B nibbles      (22 B)
  kQ4_K,  // ggml: 256 elems super-block, fp16 d, dmin, 12 B scales, 128 B   (144 B)
  kQ5_K,  // ggml: 256 elems, d, dmin, 12 B scales, 32 B high bits, 128 B   (176 B)
  kQ6_K,  // ggml: 256 elems, 128 B low, 64 B high, 16 x int8 scales, fp16 d (210 B)
  // Low-bit GGUF formats: integer-dot CPU kernels (kernels/cpu/qgemm.h, row at a time, no
  // 16-row re-lay); the CUDA backend reads their blocks as stored (kBlocks).
  kQ2_K,   // ggml: 256 elems, 16 B 4-bit scale|min, 64 B 2-bit levels, fp16 d, dmin   (84 B)
  kQ3_K,   // ggml: 256 elems, 32 B high-bit mask, 64 B 2-bit low, 12 B scales, fp16 d (110 B)
  kTQ1_0,  // ggml ternary: 256 elems, 48 B of 5 trits, 4 B of 4 trits, fp16 d         (54 B)
  kTQ2_0,  // ggml ternary: 256 elems, 64 B of 2-bit (trit + 1), fp16 d                 (66 B)
  kI8,    // plain int8 (activations, per-channel INT8 weight payloads)
  kI32,   // plain int32
  // Weight formats produced at load (RTN of a float checkpoint, or converted AWQ / GPTQ). Not
  // stored in files; never memory-mapped.
  kI8_CH,    // INT8 per output channel: k int8 levels, then one fp32 scale per row (row
             // trailer, 4 B); w = level * scale. block_elems 32 only fixes k % 32 == 0.
  kI4_G128,  // INT4 group-wise, 128 elems per group (68 B): fp16 scale d, uint8 zero z, one
             // reserved byte, then 4 sub-blocks of 16 B in Q4_0 order (byte j of sub-block s:
             // low nibble = element 32s + j, high nibble = element 32s + 16 + j);
             // w = (level - z) * d. Symmetric int4 is z = 8.
  // GGUF block matrices re-laid at load for the AVX-512 kernels (kernels/cpu/qgemm.h,
  // repack_r16): rows in groups of 16 (rows % 16 == 0), each block of a group's 16 rows one
  // contiguous piece, its fields transposed into the kernels' vectors. Same bytes per row as the
  // base format; only matmul reads them. Never in files.
  kQ8_0_R16,
  kQ4_0_R16,
  kQ5_0_R16,
  kQ4_K_R16,
  kQ5_K_R16,
  kQ6_K_R16,
  kI8_CH_R16,
  kI4_G128_R16,
  kCount,
};

// How the CPU backend's matmul reads a weight of this type (kernels/cpu/gemm.cpp).
enum class CpuMatmul : uint8_t {
  kFloat,   // the float kernels, as stored (kernels/cpu/fgemm.h)
  kIntDot,  // an integer-dot kernel, as stored (kernels/cpu/qgemm.h); the R16 layouts on AVX-512 or AVX2
  kWiden,   // widened to fp32 one row at a time (dequantize_row), then the F32 kernel (I8, I32)
};

// How the CUDA backend holds a weight matrix of this type (shard/cuda_forward.cpp's upload).
// Whatever the form, a matrix whose op reads only f16 (the embedding) is expanded to f16.
enum class CudaWeightForm : uint8_t {
  kNone,      // never uploaded: the CPU's 16-row re-lays (CudaForward::supports refuses them)
  kF16,       // f16 on the device: F16 copied as stored, the others expanded to f16 at upload
  kBlocks,    // the stored blocks as they are, read by kernels/cuda/gguf_gemm.cu; the
              // TESSERA_CUDA_GGUF_* values of kernels/cuda/cuda_api.h are exactly these types
  kRepacked,  // split at upload into int levels + scales (+ zeros) for kernels/cuda/quant_gemm.cu
};

// Every per-format fact lives in this one table (common/dtype.cpp); other modules read it.
struct QuantTraits {
  QuantType type;
  std::string_view name;      // "F32", "Q4_K", ... as printed to users (ggml's name for GGUF types)
  int block_elems;            // elements per block
  int block_bytes;            // bytes per block
  int row_extra_bytes;        // per-row trailer after the blocks (I8_CH's fp32 scale), else 0
  int ggml_type;              // ggml type id in GGUF files, or -1
  bool is_float;              // F32/F16/BF16
  bool quant_at_load;         // produced at load from a float checkpoint (--quant int8 / int4)
  CpuMatmul cpu;              // how the CPU backend computes with it
  CudaWeightForm cuda;        // how the CUDA backend holds it
  QuantType r16;              // its 16-row re-laid variant (kernels/cpu/qgemm.h), or kCount
  QuantType r16_base;         // for a 16-row re-lay, the format it re-lays; else `type` itself
};

const QuantTraits& quant_traits(QuantType t);
inline std::string_view quant_name(QuantType t) { return quant_traits(t).name; }
std::optional<QuantType> quant_from_ggml(int ggml_type);
std::optional<QuantType> quant_from_name(std::string_view name);  // case-insensitive

// Block geometry of a ggml type id (ggml.h's enum ggml_type) as GGUF files store it, for every
// type known to exist, including those Tessera cannot compute with (Q4_1, Q8_K, IQ*, MXFP4,
// ...), so that their tensors are still bounds-checked. For a type with a QuantType
// the sizes are that type's row of the table above.
struct GgmlTypeInfo {
  int id;
  std::string_view name;          // ggml's name: "Q2_K"
  int block_elems;
  int block_bytes;
  std::optional<QuantType> type;  // the QuantType that reads it, if any
};
std::optional<GgmlTypeInfo> ggml_type_info(int ggml_type);  // nullopt: an unknown id
std::span<const int> ggml_type_ids();                       // every known id, ascending

// Bytes of one row of k elements; k must be a multiple of block_elems (callers validate).
inline size_t row_bytes(QuantType t, int64_t k) {
  const QuantTraits& tr = quant_traits(t);
  return static_cast<size_t>(k / tr.block_elems) * static_cast<size_t>(tr.block_bytes) +
         static_cast<size_t>(tr.row_extra_bytes);
}

// Bytes of the blocks of k elements of a row, without the row trailer: the byte offset of
// element k within a row (k a multiple of block_elems).
inline size_t row_block_bytes(QuantType t, int64_t k) {
  const QuantTraits& tr = quant_traits(t);
  return static_cast<size_t>(k / tr.block_elems) * static_cast<size_t>(tr.block_bytes);
}

// ---- scalar conversions (exact round-to-nearest-even) ----
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_bf16(float f);

}  // namespace tessera
