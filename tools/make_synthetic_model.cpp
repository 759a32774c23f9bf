// tessera-make-model: writes a deterministic synthetic model (see tools/testmodel/synthetic_model.h).
//
//   tessera-make-model --preset tiny --format gguf --type q8_0 --out /tmp/tiny-q8_0.gguf
//   tessera-make-model --preset 1.1b --format hf --type bf16 --out /tmp/tiny-llama-hf
//   tessera-make-model --preset tiny --arch qwen3 --layers 2 --format gguf --out /tmp/q3.gguf
//   tessera-make-model --preset gemma3-tiny --format hf --out /tmp/gemma3-tiny-hf
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/dtype.h"
#include "tools/testmodel/synthetic_model.h"

namespace {

using tessera::QuantType;

int fail(const std::string& message) {
  std::fprintf(stderr, "tessera-make-model: error: %s\n", message.c_str());
  return 1;
}

// "Weight type: f32 f16 bf16 (hf, gguf); q8_0 q4_0 ... q4_k_m (gguf); awq gptq (hf: ...)": the
// float formats go in both, the other formats of the list (and the q4_k_m mix) in GGUF only.
std::string weight_type_help(const std::vector<std::string>& names) {
  std::string both, gguf;
  for (const std::string& n : names) {
    if (n == "awq" || n == "gptq") continue;
    const auto t = tessera::quant_from_name(n);
    std::string& list = t && tessera::quant_traits(*t).is_float ? both : gguf;
    list += (list.empty() ? "" : " ") + n;
  }
  return fmt::format("Weight type: {} (hf, gguf); {} (gguf); awq gptq (hf: 4-bit packed linear layers, group 128, F16 "
                     "elsewhere)",
                     both, gguf);
}

uint64_t path_bytes(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return fs::file_size(path, ec);
  uint64_t total = 0;
  for (const auto& entry : fs::directory_iterator(path, ec))
    if (entry.is_regular_file(ec)) total += entry.file_size(ec);
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Writes Tessera's deterministic synthetic model (random weights, real tokenizer) as a "
               "Hugging Face directory or a GGUF file.",
               "tessera-make-model"};
  std::string preset = "tiny";
  std::optional<int64_t> hidden, layers, heads, kv_heads, head_dim, ffn, vocab, ctx, window;
  std::optional<std::string> arch;
  std::optional<uint64_t> seed;
  bool tie = false;
  std::string format;
  std::string type_name = "f32";
  std::string out;
  int shards = 1;
  // Coarse bounds here; validate_synthetic_spec() checks each field's real limits.
  const CLI::Range kSizeRange(int64_t{1}, int64_t{1} << 24);

  app.add_option("--preset", preset, "Base sizes")
      ->check(CLI::IsMember(tessera::synthetic_preset_names()))
      ->capture_default_str();
  app.add_option("--hidden", hidden, "Model width (d_model)")->check(kSizeRange);
  app.add_option("--layers", layers, "Decoder layers")->check(kSizeRange);
  app.add_option("--heads", heads, "Query heads")->check(kSizeRange);
  app.add_option("--kv-heads", kv_heads, "Key/value heads")->check(kSizeRange);
  app.add_option("--head-dim", head_dim, "Head dimension (default hidden / heads)")->check(kSizeRange);
  app.add_option("--ffn", ffn, "MLP intermediate size")->check(kSizeRange);
  app.add_option("--vocab", vocab, "Vocabulary size")->check(kSizeRange);
  app.add_option("--ctx", ctx, "Context length (max positions)")->check(kSizeRange);
  app.add_option("--arch", arch,
                 "llama, qwen2 (adds q/k/v biases), qwen3 (adds q/k norms) or gemma3 (q/k norms, post-norms, "
                 "GeGLU, tied head, sliding-window layers)")
      ->check(CLI::IsMember({"llama", "qwen2", "qwen3", "gemma3"}));
  app.add_option("--sliding-window", window,
                 "gemma3: the local layers' window in tokens (default: the preset's, else min(4096, ctx))")
      ->check(kSizeRange);
  app.add_option("--seed", seed, "Weight seed (default 1234)");
  app.add_flag("--tie", tie, "Tie the LM head to the token embedding (always with gemma3)");
  app.add_option("--format", format, "Output format")->required()->check(CLI::IsMember({"hf", "gguf"}));
  bool int4_sym = false;
  const std::vector<std::string> type_names = tessera::synthetic_weight_type_names();
  app.add_option("--type", type_name, weight_type_help(type_names))
      ->check(CLI::IsMember(type_names, CLI::ignore_case))
      ->capture_default_str();
  app.add_option("--shards", shards, "HF only: number of safetensors files")->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_flag("--int4-sym", int4_sym, "with --type awq|gptq: the symmetric grid (zero 8) instead of asymmetric");
  app.add_option("--out", out, "Output: a directory (hf) or a .gguf file (gguf)")->required();
  CLI11_PARSE(app, argc, argv);

  auto base = tessera::synthetic_preset(preset);
  if (!base.is_ok()) return fail(base.status().message());
  tessera::SyntheticModelSpec spec = *base;
  if (hidden) spec.hidden = *hidden;
  if (layers) spec.n_layers = *layers;
  if (heads) spec.n_heads = *heads;
  if (kv_heads) spec.n_kv_heads = *kv_heads;
  if (head_dim) spec.head_dim = *head_dim;
  if (ffn) spec.ffn = *ffn;
  if (vocab) spec.vocab = *vocab;
  if (ctx) spec.max_positions = *ctx;
  if (seed) spec.seed = *seed;
  if (arch) spec.arch = *arch;
  spec.qkv_bias = spec.arch == "qwen2";
  spec.qk_norm = spec.arch == "qwen3" || spec.arch == "gemma3";
  spec.tie_embeddings = tie || spec.arch == "gemma3";
  if (spec.arch != "gemma3") {
    if (window) return fail("--sliding-window applies to --arch gemma3 only");
    spec.sliding_window = 0;
  } else if (window) {
    spec.sliding_window = *window;
  } else if (spec.sliding_window == 0) {
    spec.sliding_window = std::min<int64_t>(4096, spec.max_positions);
  }
  spec.hf_shards = shards;
  for (char& c : type_name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (type_name == "awq" || type_name == "gptq") {
    if (format != "hf") return fail("--type " + type_name + " writes a Hugging Face checkpoint; use --format hf");
    spec.hf_int4_packing = type_name;
    spec.int4_sym = int4_sym;
    spec.weight_type = QuantType::kF16;
  } else if (type_name == "q4_k_m") {
    if (format != "gguf") return fail("--type q4_k_m is a GGUF mix; use --format gguf");
    spec.gguf_mixed_q4_k_m = true;
    spec.weight_type = QuantType::kQ4_K;
  } else {
    const auto t = tessera::quant_from_name(type_name);
    if (!t) return fail(fmt::format("unknown --type '{}'", type_name));
    spec.weight_type = *t;
  }
  if (format == "hf" && !tessera::quant_traits(spec.weight_type).is_float)
    return fail(fmt::format("--format hf holds f32, f16 or bf16 weights, not {}; use --format gguf", type_name));
  if (format == "gguf" && shards != 1) return fail("--shards applies to --format hf only");
  if (tessera::Status s = tessera::validate_synthetic_spec(spec); !s.is_ok()) return fail(s.message());

  const auto start = std::chrono::steady_clock::now();
  const tessera::Status status =
      format == "hf" ? tessera::write_synthetic_hf(spec, out) : tessera::write_synthetic_gguf(spec, out);
  if (!status.is_ok()) return fail(status.to_string());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s: %s, %s, hidden %lld, layers %lld, heads %lld/%lld, ffn %lld, vocab %lld, ctx %lld, %s, "
              "seed %llu, %.1f MiB in %.2f s\n",
              out.c_str(), format.c_str(), spec.arch.c_str(), static_cast<long long>(spec.hidden),
              static_cast<long long>(spec.n_layers), static_cast<long long>(spec.n_heads),
              static_cast<long long>(spec.n_kv_heads), static_cast<long long>(spec.ffn),
              static_cast<long long>(spec.vocab), static_cast<long long>(spec.max_positions), type_name.c_str(),
              static_cast<unsigned long long>(spec.seed), static_cast<double>(path_bytes(out)) / (1024.0 * 1024.0),
              seconds);
  return 0;
}
