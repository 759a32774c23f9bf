#include "cli/flags.h"

#include <fmt/format.h>

#include <algorithm>

namespace tessera::cli {

namespace {

// One row of common/shard_options.h's table as a flag: a switch, or an option whose text the
// row's codec reads (a bad value is CLI11's validation error, naming the flag). The last of a
// repeated flag wins (a launcher's --shard-arg overrides what it derived).
template <typename Codec, typename T>
void add_row(CLI::App& app, const char* flag, const std::string& help, T& field) {
  T* f = &field;
  if constexpr (Codec::kSwitch) {
    app.add_flag_callback(flag, [f] { *f = Codec::kSets; }, help);
  } else {
    const std::string choices = Codec::describe();
    const std::string full = choices.empty() ? help : fmt::format("{}: {}", help, choices);
    app.add_option_function<std::string>(
           flag,
           [f, flag](const std::string& text) {
             Status s = Codec::parse(flag, text, *f);
             if (!s.is_ok()) throw CLI::ValidationError(flag, s.message());
           },
           full)
        ->default_str(Codec::format(field))
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
}

bool registers(ShardOptionScope scope, ShardFlagsFor who) {
  switch (who) {
    case ShardFlagsFor::kShard: return true;
    case ShardFlagsFor::kLauncher: return scope != ShardOptionScope::kDerived;
    case ShardFlagsFor::kCoordinator: return scope == ShardOptionScope::kPlanned;
  }
  return false;
}

}  // namespace

void add_shard_runtime_flags(CLI::App& app, ShardRuntimeOptions& o, ShardFlagsFor who,
                             std::initializer_list<std::string_view> skip) {
  using namespace shard_option_codec;
  o.sparse = measured_sparse_attention();
  auto wanted = [&](ShardOptionScope scope, std::string_view flag) {
    return registers(scope, who) && std::find(skip.begin(), skip.end(), flag) == skip.end();
  };
#define TESSERA_SHARD_FLAG(field, flag, codec, scope, help) \
  if (wanted(ShardOptionScope::scope, flag)) add_row<codec>(app, flag, help, o.field);
  TESSERA_SHARD_RUNTIME_OPTIONS(TESSERA_SHARD_FLAG)
#undef TESSERA_SHARD_FLAG
}

CLI::Option* add_kv_dtype_flag(CLI::App& app, KvDtypeFlag& flag, KvDtypeUse use) {
  const bool plan = use == KvDtypeUse::kPlan;
  if (plan) flag.value.reset();  // auto unless given
  auto* f = &flag;
  CLI::Option* o = app.add_option_function<std::string>(
      "--kv-dtype",
      [f](const std::string& s) {
        if (s == "auto") {
          f->value.reset();
          return;
        }
        f->value = parse_kv_dtype(s).value();  // the check below admitted only known names
      },
      plan ? fmt::format("KV cache elements to plan: auto (what the runtime stores by default: fp32), {} (a row "
                         "scale per token and head for int8; those some backend does not store yet are planned ahead)",
                         fmt::join(kv_dtype_names(), ", "))
           : fmt::format("KV cache elements: {}; the CPU stores {}, CUDA {}", fmt::join(kv_dtype_runtime_names(), ", "),
                         kv_dtypes_stored_text(KvBackend::kCpu), kv_dtypes_stored_text(KvBackend::kCuda)));
  if (plan)
    o->check(CLI::Validator(
        [](std::string& s) -> std::string {
          if (s == "auto") return "";
          Result<KvDtype> d = parse_kv_dtype(s);
          return d.is_ok() ? "" : d.status().message();
        },
        fmt::format("auto|{}", fmt::join(kv_dtype_names(), "|"))));
  else
    o->check(CLI::IsMember(kv_dtype_runtime_names()));
  o->default_str(plan ? "auto" : "fp32");
  return o;
}

CLI::Option* add_block_size_flag(CLI::App& app, int64_t& block_size) {
  return app
      .add_option("--block-size", block_size,
                  fmt::format("KV cache tokens per block ({}..{})", kMinBlockSize, kMaxBlockSize))
      ->check(CLI::Range(static_cast<int64_t>(kMinBlockSize), static_cast<int64_t>(kMaxBlockSize)))
      ->capture_default_str();
}

CLI::Option* add_window_pool_flag(CLI::App& app, bool& on) {
  auto* v = &on;
  return app
      .add_option_function<std::string>(
          "--kv-window-pool", [v](const std::string& s) { *v = s == "on"; },
          "on: the KV of layers with a sliding window shorter than the context (Gemma 3's local layers) lives in a "
          "pool of its own and holds only the window; off: every layer keeps its KV for the whole sequence")
      ->check(CLI::IsMember({"on", "off"}))
      ->default_str("on");
}

}  // namespace tessera::cli
