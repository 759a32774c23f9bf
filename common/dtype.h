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
#include <string>
#include <string_view>

#include "common/block_geometry.h"
#include "common/status.h"

namespace tessera {

enum class QuantType : uint8_t {
  kF32 = 0,
  kF16,
  kBF16,
  // The GGUF block formats kQ8_0, kQ4_0, ... kTQ2_0: one per entry of common/block_geometry.h's
  // list, in its order (their layouts are described there).
#define TESSERA_GGUF_QUANT_TYPE(name, elems, bytes) k##name,
  TESSERA_GGUF_BLOCK_FORMATS(TESSERA_GGUF_QUANT_TYPE)
#undef TESSERA_GGUF_QUANT_TYPE
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
static_assert(static_cast<int>(QuantType::kBF16) + 1 == blocks::kFirstQuantType,
              "common/block_geometry.h: the GGUF formats' QuantType values start right after kBF16");

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
  bool quant_at_load;         // made only at load, never read from a file (I8_CH, I4_G128)
  CpuMatmul cpu;              // how the CPU backend computes with it
  CudaWeightForm cuda;        // how the CUDA backend holds it
  QuantType r16;              // its 16-row re-laid variant (kernels/cpu/qgemm.h), or kCount
  QuantType r16_base;         // for a 16-row re-lay, the format it re-lays; else `type` itself
  // Made at load (`--quant`, WeightQuant below):
  std::string_view load_name; // the --quant mode that makes it ("q4_k"), or "" (none does)
  int load_order;             // that mode's place in --quant's list (1, 2, ...), or 0
  QuantType load_fallback;    // what that mode makes of a matrix whose columns fill no block of
                              // this format (the nearest 32-element format with at least as many
                              // bits), or kCount: none (the matrix stays as stored, or fails)
  // GGUF files written by tessera-make-model (tools/testmodel/synthetic_model.h):
  int file_type;              // general.file_type of a file of it throughout (llama.cpp's
                              // LLAMA_FTYPE_MOSTLY_*), or -1: no such file is written
  QuantType file_fallback;    // the format such a file stores a matrix in whose columns fill no
                              // block of this one (llama.cpp's choice, among Tessera's formats),
                              // or kCount: F16
  // `tessera plan`: how the format stores weights, or "" for one it does not list (plain
  // integers, the 16-row re-lays).
  std::string_view layout;
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

// ---- INT4 group-wise weights (I4_G128): one group unpacked, and the grids it is rounded to ----

inline constexpr int64_t kInt4Group = 128;  // elements per I4_G128 group (its block_elems)

// One I4_G128 group unpacked; the value of a level is (level - zero) * d, d widened from fp16.
struct Int4Group {
  uint16_t scale_fp16 = 0;          // d
  uint8_t zero = 0;                 // z, 0..15
  uint8_t levels[kInt4Group] = {};  // 0..15
};
// Writes the 68 bytes of one I4_G128 block (layout at QuantType::kI4_G128): the loaders'
// conversion of AWQ / GPTQ checkpoints, which computes nothing. The same bytes as
// kernels/quant.h's pack_int4_group.
void write_int4_group(const Int4Group& g, uint8_t* dst);

// The round-to-nearest grids of I4_G128 (defined in kernels/quant.h): asymmetric (a zero per
// group) and symmetric (zero 8, GPTQ's).
enum class Int4Grid { kAsymmetric, kSymmetric };

// ---- `--quant`: weights converted at load ----
//
// Round to nearest. A mode makes one format: each format whose row of the table has a
// load_name ("int8" -> I8_CH, "int4" -> I4_G128 on the asymmetric grid, "q4_k" -> Q4_K, ...;
// "f32" widens every linear weight to fp32, the reference a quantized file is measured
// against: its own weights computed in fp32), and "int4-sym" makes I4_G128 on the symmetric
// grid. A GGUF format needs columns that fill its blocks (32 or 256 elements), else the mode
// makes its load_fallback. Float matrices are rounded directly; matrices stored quantized (GGUF
// blocks, AWQ / GPTQ) are re-quantized from their dequantized values unless already in the
// target format. The embedding and norms always stay as stored; the LM head too unless
// quantize_lm_head. The arithmetic is the kernels' (common/weight_codec.h).
//
// The mode that makes format T has the value of T + 1 (weight_quant_making), so a format
// added to the table is a mode with no line here. The enumerators name the modes for code that
// picks one (the GGUF formats' from common/block_geometry.h's list).
enum class WeightQuant : uint8_t {
  kNone = 0,  // the weights as stored
  kF32 = 1 + static_cast<int>(QuantType::kF32),
#define TESSERA_GGUF_WEIGHT_QUANT(name, elems, bytes) k##name = 1 + static_cast<int>(QuantType::k##name),
  TESSERA_GGUF_BLOCK_FORMATS(TESSERA_GGUF_WEIGHT_QUANT)
#undef TESSERA_GGUF_WEIGHT_QUANT
  kInt8 = 1 + static_cast<int>(QuantType::kI8_CH),
  kInt4 = 1 + static_cast<int>(QuantType::kI4_G128),
  kInt4Sym = 1 + static_cast<int>(QuantType::kCount),  // I4_G128 on the symmetric grid
};

// The mode that makes `t` (whose row has a load_name); kNone when none does.
WeightQuant weight_quant_making(QuantType t);
// The format a --quant mode produces (kNone: kF32, never used).
QuantType weight_quant_type(WeightQuant q);
// The format it produces for a matrix of `cols` columns: weight_quant_type(q), or, when `cols`
// does not fill its 256-element super-blocks, the format's load_fallback: the nearest 32-block
// format with at least as many bits (Q2_K / Q3_K / TQ1_0 / TQ2_0 -> Q4_0, Q4_K / Q5_K -> Q5_0,
// Q6_K -> Q8_0; llama.cpp's quantizer makes the same kind of substitution). Gemma-3-270M's
// q/k/v/gate/up weights (640 columns) take the fallback; its o and down projections keep the
// format.
QuantType weight_quant_type_for(WeightQuant q, int64_t cols);

// "none", "int8", "int4", "int4-sym", "q2_k", "q3_k", "tq1_0", "tq2_0", "f32", "q8_0", "q4_0",
// "q5_0", "q4_k", "q5_k", "q6_k" (the table's load_name; "?" for a value that is no mode).
std::string_view weight_quant_name(WeightQuant q);
// Parses those names; InvalidArgument lists them.
Result<WeightQuant> parse_weight_quant(std::string_view name);
// Every mode: kNone, then in the table's load_order (int4-sym right after int4). For flag
// choices and checks.
std::span<const WeightQuant> all_weight_quants();
// Their names in that order, comma-separated: "none, int8, int4, int4-sym, q2_k, ..., q6_k".
std::string weight_quant_names_text();
// What each mode does, for --quant's help: "none, int8, int4 (asymmetric, groups of 128),
// int4-sym, the GGUF formats q8_0, q4_0, q5_0 (columns a multiple of 32), q2_k, ..., q6_k (a
// multiple of 256), or f32 (widen to fp32: the reference precision)".
std::string weight_quant_help();

}  // namespace tessera
