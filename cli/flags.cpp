#include "cli/flags.h"

#include <fmt/format.h>

namespace tessera::cli {

CLI::Option* add_matmul_precision_flag(CLI::App& app, MatmulPrecision& precision) {
  auto* p = &precision;
  return app
      .add_option_function<std::string>(
          "--matmul-precision", [p](const std::string& s) { parse_matmul_precision(s, p); },
          "CPU matmuls with float weights: auto (bf16 dot products for F16/BF16 weights where the CPU's "
          "AVX512_BF16 dot product outruns its fp32 fma, measured at start-up: Zen 4/5; else fp32), fp32 "
          "(fp32-accurate), bf16 (weights and activations rounded to bf16)")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
      ->default_str("auto");
}

void add_sparse_attention_flags(CLI::App& app, SparseAttentionConfig& config) {
  auto* c = &config;
  c->measure = true;  // auto unless told
  c->enabled = false;
  app.add_option_function<std::string>(
         "--sparse-attention",
         [c](const std::string& s) {
           c->measure = s == "auto";
           c->enabled = s == "on";
         },
         "CPU and CUDA shards: decodes of the global-attention layers from --sparse-threshold tokens of context "
         "attend to the blocks their query selects (per-block key bounds; the first block and the last two always): "
         "auto (CPU: the threshold measured at start-up, the shortest context where it makes a layer's decode "
         "attention 2x as fast, dense when none; CUDA: off until measured on a device), on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->default_str("auto");
  // Defined after --sparse-attention, so its callback runs after that one's: a threshold given
  // with auto replaces the measurement.
  app.add_option_function<int64_t>(
         "--sparse-threshold",
         [c](int64_t t) {
           c->threshold_tokens = t;
           if (c->measure) {
             c->measure = false;
             c->enabled = true;
           }
         },
         "context tokens from which a decode attends sparsely (with auto: instead of the measured one)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->default_str(std::to_string(config.threshold_tokens));
  app.add_option("--sparse-top-blocks", config.select.top_blocks,
                 "blocks a sparse decode selects besides the first and the last two")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
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
      plan ? "KV cache elements to plan: auto (what the runtime stores by default: fp32; fp16 or int8 with "
             "`--kv-dtype`), fp32, fp16, int8 (a scale per token and head), bf16 or fp8 (these two plan ahead)"
           : "KV cache elements: fp32, fp16 (half the memory; CPU and CUDA backends) or int8 (head_dim + 4 bytes "
             "per token and head, ~0.27x of fp32 at head_dim 256; CPU backend)");
  if (plan)
    o->check(CLI::Validator(
        [](std::string& s) -> std::string {
          if (s == "auto") return "";
          Result<KvDtype> d = parse_kv_dtype(s);
          return d.is_ok() ? "" : d.status().message();
        },
        "auto|fp32|fp16|int8|bf16|fp8"));
  else
    o->check(CLI::IsMember({"fp32", "fp16", "int8"}));
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

void add_quant_flags(CLI::App& app, QuantFlags& flags, const std::string& who) {
  auto* f = &flags;
  std::vector<std::string> names;
  for (WeightQuant q : all_weight_quants()) names.emplace_back(weight_quant_name(q));
  app.add_option_function<std::string>(
         "--quant", [f](const std::string& s) { f->quant = parse_weight_quant(s).value(); },
         who + "convert the linear weights at load (float ones rounded to nearest, quantized ones re-quantized "
               "from their dequantized values): none, int8, int4 (asymmetric, groups of 128), int4-sym, the GGUF "
               "formats q8_0, q4_0, q5_0 (columns a multiple of 32), q4_k, q5_k, q6_k, q3_k, q2_k, tq2_0, tq1_0 "
               "(a multiple of 256), or f32 (widen to fp32: the reference precision)")
      ->check(CLI::IsMember(names))
      ->default_str("none");
  app.add_flag("--quant-lm-head", flags.lm_head, "with --quant: " + who + "quantize the LM head too");
  app.add_option("--imatrix", flags.imatrix,
                 "with a GGUF --quant: " + who + "quantize with this importance file (`tessera eval --save-imatrix`): "
                 "calibrated, the error weighted by the activations' mean square per input column")
      ->check(CLI::ExistingFile);
}

}  // namespace tessera::cli
