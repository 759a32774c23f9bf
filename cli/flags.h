// The command-line flags that several executables share, each defined once here: the KV cache's
// element type and block size, and load-time weight quantization. `tessera serve / launch /
// generate / plan`, `tessera-coordinator`, `tessera-shard` and `tessera-bench-cpu` register
// them with these functions, so a flag's name, choices, help and parsing cannot drift apart
// between commands. Values are typed from the moment they are parsed.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "common/kv_config.h"
#include "kernels/gemm.h"
#include "kernels/sparse_attention.h"
#include "model/weight_store.h"

namespace tessera::cli {

// --kv-dtype. Runtime commands take what the backends store (fp32, fp16, int8 on the CPU; default fp32);
// `tessera plan` also takes bf16 and fp8 (planned ahead of the runtime) and "auto" (nullopt:
// what the runtime stores on the planned card).
enum class KvDtypeUse { kRuntime, kPlan };
struct KvDtypeFlag {
  std::optional<KvDtype> value = KvDtype::kF32;  // nullopt: auto (kPlan only)
  KvDtype runtime() const { return value.value_or(KvDtype::kF32); }
};
CLI::Option* add_kv_dtype_flag(CLI::App& app, KvDtypeFlag& flag, KvDtypeUse use);

// --matmul-precision auto|fp32|bf16: how float-weight matmuls compute on the CPU
// (kernels/gemm.h). The value keeps its default (auto) when absent.
CLI::Option* add_matmul_precision_flag(CLI::App& app, MatmulPrecision& precision);

// --sparse-attention auto|on|off, --sparse-threshold N, --sparse-top-blocks K: sparse decode
// attention for the global-attention layers on the CPU (kernels/sparse_attention.h). Sets
// `config` to auto (measure) first; a threshold given with auto means on from there; the
// threshold and the budget keep config's values when absent.
void add_sparse_attention_flags(CLI::App& app, SparseAttentionConfig& config);

// --block-size: tokens per KV block, common/kv_config.h's range; the value keeps its default
// when absent.
CLI::Option* add_block_size_flag(CLI::App& app, int64_t& block_size);

// --kv-window-pool on|off: whether the layers with a sliding window (Gemma 3's local layers) keep
// their KV in a pool of their own that holds only the window (common/kv_config.h); default on.
CLI::Option* add_window_pool_flag(CLI::App& app, bool& on);

// --quant / --quant-lm-head: round-to-nearest quantization of float weights at load.
// `who` starts the help text ("" for this process, "shards " for the shards a command starts).
// --imatrix FILE: with a GGUF --quant, the importance of each weight's input columns measured
// on real text (`tessera eval --save-imatrix`, model/importance.h): calibrated quantization.
struct QuantFlags {
  WeightQuant quant = WeightQuant::kNone;
  bool lm_head = false;
  std::string imatrix;
};
void add_quant_flags(CLI::App& app, QuantFlags& flags, const std::string& who = "");

}  // namespace tessera::cli
