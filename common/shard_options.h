// How a shard runs the model: ONE options struct and ONE table of its flags, shared by every
// process that runs a shard or starts one. `tessera-shard` parses it from its command line;
// `tessera serve` / `launch` / `generate`, `tessera-coordinator`, the in-process shard of the
// local engine (local/) and the benchmarks embed it; the launchers turn it back into the shard's
// argv (shard_runtime_argv). The flags themselves are registered from the table by
// cli/flags.h's add_shard_runtime_flags, so a flag's name, help, parsing and the argv that
// carries it to a shard cannot drift apart.
//
// A new shard-side option is a field and a row here, plus the code that reads it (a backend,
// usually: the backends take the whole struct). A value of a type no codec reads yet needs a
// codec in shard_options.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/kv_config.h"
#include "common/status.h"

namespace tessera {

// How matmuls with float weights (F32, F16, BF16) compute on the CPU (kernels/gemm.h applies it,
// process-wide):
//   kFp32: fp32 fma on the widened weights (kernels/cpu/fgemm.h): fp32-accurate.
//   kBf16: weights and activations rounded to bf16, VDPBF16PS with fp32 accumulation
//          (kernels/cpu/fgemm_bf16.h): twice the multiply-adds per instruction; needs
//          AVX512_BF16 (Zen 4/5, Intel Cooper Lake and later).
//   kAuto: kBf16 for 16-bit weights (F16, BF16) where the CPU's bf16 dot product outruns its
//          fp32 fma (measured at start-up: Zen 4/5), else kFp32 (also on Intel Xeons with
//          AVX512_BF16, where VDPBF16PS has half the fma's rate).
enum class MatmulPrecision { kAuto, kFp32, kBf16 };
// "auto", "fp32", "bf16".
const char* matmul_precision_name(MatmulPrecision p);
// Parses a name; false for anything else.
bool parse_matmul_precision(const std::string& text, MatmulPrecision* out);

// Which blocks a sparse decode attends to (kernels/sparse_attention.h selects them).
struct SparseSelectOptions {
  int64_t sink_blocks = 1;    // first blocks, always attended (>= 0)
  int64_t recent_blocks = 2;  // last blocks, always attended, the current one included (>= 1)
  int64_t top_blocks = 128;   // highest-scoring blocks in between (>= 0; bench/long_quality.sh chose 128)
};

// Sparse decode attention (kernels/sparse_attention.h): a decode piece of a global-attention
// layer whose context reaches threshold_tokens attends to the selected blocks only.
struct SparseAttentionConfig {
  bool enabled = false;             // needs a cache with key summaries (shard/kv_cache.h)
  int64_t threshold_tokens = 8192;  // a decode at position p goes sparse when p + 1 >= this
  SparseSelectOptions select;
  // `--sparse-attention auto`: the backend measures the threshold at start-up
  // (measure_sparse_crossover) and sets enabled and threshold_tokens from it.
  bool measure = false;
};
// `--sparse-attention auto`: measured by the backend at start-up.
inline SparseAttentionConfig measured_sparse_attention() {
  SparseAttentionConfig c;
  c.measure = true;
  return c;
}

struct ShardRuntimeOptions {
  std::string device = "auto";  // cpu | cuda | auto (CUDA when a driver and a device are present)
  int threads = 0;              // CPU threads per shard; 0: the cores it is bound to
  WeightQuant quant = WeightQuant::kNone;  // round-to-nearest conversion of the linear weights at load
  bool quant_lm_head = false;              // with quant: the LM head too
  std::string imatrix;                     // with a GGUF quant: calibrated by this importance file
  KvDtype kv_dtype = KvDtype::kF32;        // the KV cache's elements (the coordinator plans with it)
  MatmulPrecision matmul_precision = MatmulPrecision::kAuto;
  // Off by default for an engine built in code (tests, the local engine); the command line's
  // default is auto (measured_sparse_attention(): add_shard_runtime_flags sets it).
  SparseAttentionConfig sparse;
  // The CUDA workspace holds steps of at most this many tokens / sequences: the coordinator
  // passes its scheduler's max_step_tokens / max_batch (not a flag of the commands that start shards).
  int64_t max_step_tokens = 8192;
  int64_t max_step_seqs = 256;
  bool cuda_graphs = true;       // CUDA: decode and verification steps as CUDA graph replays
  // CUDA: sample on the device (only ids and logprobs cross to the host) when a step allows it
  // (no prompt logprobs, <= 20 top logprobs); off: every non-greedy step reads the logits.
  bool device_sampling = true;
  // TP over MPI: fail a collective (and exit) when a peer has not joined it for this long (0: wait for ever).
  int64_t collective_timeout_ms = 120000;
};

// Who registers a row as a flag (cli/flags.h add_shard_runtime_flags):
enum class ShardOptionScope : uint8_t {
  kShard,    // the shard, and the commands that start shards (they pass it on)
  kPlanned,  // those, and `tessera-coordinator`, which plans with it and checks every shard's hello
  kDerived,  // only the shard: the command that starts it derives the value (the scheduler's limits)
};

// X(field, flag, codec, scope, help): `field` a member of ShardRuntimeOptions (or a part of
// one), `codec` how its text is read and written (shard_options.cpp: Text, Count, Switch,
// NoSwitch, Device, Quant, KvDtypeRuntime, Precision, SparseMode, SparseThreshold).
#define TESSERA_SHARD_RUNTIME_OPTIONS(X)                                                                             \
  X(device, "--device", Device, kShard, "shard device: cpu, cuda or auto (CUDA when a driver and a device are present)") \
  X(threads, "--threads", Count, kShard, "CPU threads per shard (0: the cores it is bound to)")                       \
  X(quant, "--quant", Quant, kShard,                                                                                 \
    "convert the linear weights at load (float ones rounded to nearest, quantized ones re-quantized from their "     \
    "dequantized values)")                                                                                           \
  X(quant_lm_head, "--quant-lm-head", Switch, kShard, "with --quant: quantize the LM head too")                       \
  X(imatrix, "--imatrix", Text, kShard,                                                                              \
    "with a GGUF --quant: quantize with this importance file (`tessera eval --save-imatrix`): calibrated, the "      \
    "error weighted by the activations' mean square per input column")                                              \
  X(kv_dtype, "--kv-dtype", KvDtypeRuntime, kPlanned, "KV cache elements")                                           \
  X(matmul_precision, "--matmul-precision", Precision, kShard,                                                      \
    "CPU matmuls with float weights: auto (bf16 dot products for F16/BF16 weights where the CPU's AVX512_BF16 dot "  \
    "product outruns its fp32 fma, measured at start-up: Zen 4/5; else fp32), fp32 (fp32-accurate), bf16 (weights " \
    "and activations rounded to bf16)")                                                                              \
  X(sparse, "--sparse-attention", SparseMode, kShard,                                                                \
    "decodes of the global-attention layers from --sparse-threshold tokens of context attend to the blocks their "   \
    "query selects (per-block key bounds; the first block and the last two always): auto (CPU: the threshold "      \
    "measured at start-up, the shortest context where it makes a layer's decode attention 2x as fast, dense when "   \
    "none; CUDA: off until measured on a device), on or off")                                                        \
  X(sparse, "--sparse-threshold", SparseThreshold, kShard,                                                           \
    "context tokens from which a decode attends sparsely (with auto: instead of the measured one)")                  \
  X(sparse.select.top_blocks, "--sparse-top-blocks", Count, kShard,                                                 \
    "blocks a sparse decode selects besides the first and the last two")                                             \
  X(max_step_tokens, "--max-step-tokens", Count, kDerived,                                                           \
    "CUDA: tokens of the largest step the workspace holds (the coordinator's max_step_tokens)")                      \
  X(max_step_seqs, "--max-step-seqs", Count, kDerived, "CUDA: sequences of the largest step (the coordinator's max_batch)") \
  X(cuda_graphs, "--no-cuda-graphs", NoSwitch, kShard,                                                               \
    "CUDA: run decode and verification steps eagerly instead of as CUDA graph replays")                              \
  X(device_sampling, "--no-device-sampling", NoSwitch, kShard,                                                       \
    "CUDA: sample on the host from downloaded logits instead of on the device")                                      \
  X(collective_timeout_ms, "--collective-timeout-ms", Count, kShard,                                                 \
    "TP over MPI: fail a collective (and exit) when a peer has not joined it for this long (0: wait for ever)")

// What a shard started with no flags runs with: the struct's defaults, with sparse attention auto.
ShardRuntimeOptions shard_command_line_defaults();

// The shard's argv for these options: every row whose value differs from what a shard assumes
// when the flag is absent (shard_command_line_defaults), in table order ("--kv-dtype", "fp16",
// "--no-cuda-graphs", ...). Parsed back by the shard, it gives the same options.
std::vector<std::string> shard_runtime_argv(const ShardRuntimeOptions& options);

// InvalidArgument naming the option: a device other than cpu/cuda/auto, a negative count.
Status validate_shard_runtime_options(const ShardRuntimeOptions& options);

// The codecs the table names: each reads a flag's text into its field (InvalidArgument naming
// the flag and listing what it takes) and writes it back. A Switch / NoSwitch takes no text.
namespace shard_option_codec {
#define TESSERA_SHARD_CODEC(Name, T)                                                   \
  struct Name {                                                                        \
    using Value = T;                                                                   \
    static Status parse(std::string_view flag, std::string_view text, T& value);       \
    static std::string format(const T& value);                                         \
    static std::vector<std::string> choices(); /* empty: any text */                   \
    static std::string describe();             /* the choices for --help */            \
    static constexpr bool kSwitch = false;                                             \
  };
TESSERA_SHARD_CODEC(Text, std::string)
TESSERA_SHARD_CODEC(Device, std::string)
TESSERA_SHARD_CODEC(Quant, WeightQuant)
TESSERA_SHARD_CODEC(KvDtypeRuntime, KvDtype)
TESSERA_SHARD_CODEC(Precision, MatmulPrecision)
TESSERA_SHARD_CODEC(SparseMode, SparseAttentionConfig)
TESSERA_SHARD_CODEC(SparseThreshold, SparseAttentionConfig)
#undef TESSERA_SHARD_CODEC
// A whole number >= 0 (int or int64_t fields).
struct Count {
  template <typename T>
  static Status parse(std::string_view flag, std::string_view text, T& value);
  template <typename T>
  static std::string format(const T& value) { return std::to_string(value); }
  static std::vector<std::string> choices() { return {}; }
  static std::string describe() { return ""; }
  static constexpr bool kSwitch = false;
};
// A flag that sets its bool (--quant-lm-head); NoSwitch clears it (--no-cuda-graphs).
// (Their text form, "true" / "false", appears only in validation.)
struct Switch {
  static Status parse(std::string_view flag, std::string_view text, bool& value);
  static std::string format(const bool& value) { return value ? "true" : "false"; }
  static std::vector<std::string> choices() { return {}; }
  static std::string describe() { return ""; }
  static constexpr bool kSwitch = true;
  static constexpr bool kSets = true;
};
struct NoSwitch : Switch {
  static constexpr bool kSets = false;
};
Status parse_count(std::string_view flag, std::string_view text, int64_t* value);
template <typename T>
Status Count::parse(std::string_view flag, std::string_view text, T& value) {
  int64_t v = 0;
  TESSERA_RETURN_IF_ERROR(parse_count(flag, text, &v));
  value = static_cast<T>(v);
  return Status::ok();
}
}  // namespace shard_option_codec

}  // namespace tessera
