// The command-line flags that several executables share, each defined once here: the
// shard-runtime options (from common/shard_options.h's table), the KV cache's element type as
// `tessera plan` takes it, the block size and the window pool. `tessera serve / launch /
// generate / plan`, `tessera-coordinator`, `tessera-shard` and the benchmarks register them
// with these functions, so a flag's name, choices, help and parsing cannot drift apart between
// commands. Values are typed from the moment they are parsed.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "common/kv_config.h"
#include "common/shard_options.h"

namespace tessera::cli {

// --kv-dtype as a flag of its own, for commands that take no other shard option (the commands
// that run shards take it from add_shard_runtime_flags). kRuntime: what some backend stores
// (common/kv_config.h's table; default fp32); kPlan (`tessera plan`): every type, also those
// planned ahead of the runtime, and "auto" (nullopt: what the runtime stores on the planned card).
enum class KvDtypeUse { kRuntime, kPlan };
struct KvDtypeFlag {
  std::optional<KvDtype> value = KvDtype::kF32;  // nullopt: auto (kPlan only)
  KvDtype runtime() const { return value.value_or(KvDtype::kF32); }
};
CLI::Option* add_kv_dtype_flag(CLI::App& app, KvDtypeFlag& flag, KvDtypeUse use);

// The shard-runtime options (common/shard_options.h), one flag per row of its table. `who`
// picks the rows: a shard takes them all; a command that starts shards (serve, launch,
// generate, the benchmarks) takes every row but those it derives itself (the workspace limits
// from its scheduler); `tessera-coordinator`, which starts none, takes only what it plans with
// (--kv-dtype). Registering sets `options.sparse` to auto (the command line's default: measured
// at start-up), as shard_runtime_argv assumes of a shard given no --sparse-attention.
// `skip` leaves out flags the command defines otherwise (a benchmark's --threads list).
enum class ShardFlagsFor { kShard, kLauncher, kCoordinator };
void add_shard_runtime_flags(CLI::App& app, ShardRuntimeOptions& options, ShardFlagsFor who,
                             std::initializer_list<std::string_view> skip = {});

// --block-size: tokens per KV block, common/kv_config.h's range; the value keeps its default
// when absent.
CLI::Option* add_block_size_flag(CLI::App& app, int64_t& block_size);

// --kv-window-pool on|off: whether the layers with a sliding window (Gemma 3's local layers) keep
// their KV in a pool of their own that holds only the window (common/kv_config.h); default on.
CLI::Option* add_window_pool_flag(CLI::App& app, bool& on);

}  // namespace tessera::cli
