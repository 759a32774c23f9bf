// THE table of architectures: one row per architecture Tessera loads, holding every fact that
// differs between them. The config parsers (model/model_config.cpp), the GGUF tensor names
// (model/weight_store.cpp), the decoder's description (decoder/arch.cpp), the built-in chat
// templates (template/builtin_chat_template.cpp) and the memory planner read the row; none of
// them switches on the architecture.
//
// Adding an architecture that needs no new op: an enum value and a row here (and, for tests, a
// tools/testmodel preset). Facts that need code (Gemma 3's layer pattern) are a hook the row
// names, defined with the other config code in model/model_config.cpp; a built-in chat template
// is a .jinja file the row names (template/builtin_chat_template.h). tests/model/
// architecture_test.cpp checks every row's names and config facts, tests/decoder/ its
// description, tests/template/ its template.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace tessera {

class GgufFile;
struct ModelConfig;
// A parsed config.json object. Defined in model/model_config.cpp, the one file that uses the
// JSON library; hooks that take it are defined there too.
struct HfConfigJson;

enum class Architecture : uint8_t { kLlama, kMistral, kQwen2, kQwen3, kGemma3, kCount };

// The MLP's gated activation: out = act(gate) * up.
enum class GluActivation : uint8_t {
  kSilu,      // SwiGLU (Llama, Mistral, Qwen): silu(x) = x / (1 + e^-x)
  kGeluTanh,  // GeGLU (Gemma): 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
};

// What the embedding rows are multiplied by.
enum class EmbedScale : uint8_t {
  kNone,        // 1
  kSqrtHidden,  // sqrt(hidden) (Gemma)
};

// Where the sliding window comes from and which layers use it.
enum class SlidingWindowRule : uint8_t {
  kNone,         // full attention everywhere; a window in the file is ignored (Llama)
  kEveryLayer,   // HF `sliding_window`, GGUF `<arch>.attention.sliding_window`; every layer (Mistral)
  kOptIn,        // HF `sliding_window` only when `use_sliding_window` is true; never from GGUF (Qwen)
  kLocalLayers,  // the row's config hooks set the window and the local layers (Gemma 3)
};

// Config fields that need code: they run after the common fields are parsed and may refuse the
// file. An HF hook's errors name `source` and the field; a GGUF hook's name the file and the key
// (`prefix` is "<general.architecture>.").
using HfConfigHook = Status (*)(const HfConfigJson& json, std::string_view source, ModelConfig* config);
using GgufConfigHook = Status (*)(const GgufFile& gguf, const std::string& prefix, ModelConfig* config);

// Gemma 3 (model/model_config.cpp). HF: the local RoPE base, query_pre_attn_scalar, the window
// (default 4096) and `layer_types` or `sliding_window_pattern`; softcapping is refused. GGUF:
// what llama.cpp assumes for "gemma3" files (5 local layers to 1 global unless
// `gemma3.attention.sliding_window_pattern` says otherwise, local base 10,000, the 27B's scale).
Status gemma3_hf_config(const HfConfigJson& json, std::string_view source, ModelConfig* config);
Status gemma3_gguf_config(const GgufFile& gguf, const std::string& prefix, ModelConfig* config);

// Names a file may give one architecture; empty entries are unused.
using ArchitectureNames = std::array<std::string_view, 3>;
// A per-layer GGUF tensor suffix and its Hugging Face counterpart ("ffn_norm.weight",
// "post_attention_layernorm.weight").
using TensorNamePair = std::pair<std::string_view, std::string_view>;

// Gemma 2 / 3 norms: GGUF's ffn_norm is the pre-FFN norm there, and HF's post_attention_layernorm
// is the norm of the attention output (before its residual add).
inline constexpr TensorNamePair kGemmaGgufNormNames[] = {
    {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
};

struct ArchitectureTraits {
  Architecture arch;
  std::string_view name;          // "llama", "gemma3": logs, ArchSpec::name, "builtin:<name>"
  std::string_view display_name;  // "Gemma 3": in messages about the architecture

  // ---- Hugging Face config.json ----
  ArchitectureNames hf_classes;      // `architectures[0]`
  ArchitectureNames hf_model_types;  // `model_type`, read when `architectures` is absent
  // Added to every RMSNorm weight of an HF checkpoint (Gemma stores w - 1 and applies 1 + w).
  // GGUF files hold w: llama.cpp's converter added the offset.
  float hf_norm_weight_offset = 0.0f;
  bool hf_tie_embeddings_default = false;  // `tie_word_embeddings` when absent
  HfConfigHook hf_config_hook = nullptr;

  // ---- GGUF ----
  ArchitectureNames gguf_names;  // `general.architecture`
  // Set: this row is chosen over the unmarked row of the same GGUF name only when the file has
  // the key `<general.architecture>.<gguf_marker_key>` (Mistral converts to "llama" files; its
  // window tells it apart).
  std::string_view gguf_marker_key;
  // llama.cpp's converter interleaved the two rotate-half halves of every Q and K head (the
  // loader undoes it, model/weight_store.h's unpermute_gguf_qk_rows).
  bool gguf_qk_permuted = false;
  // Per-layer tensor names that differ from the common GGUF -> HF table (model/weight_store.cpp);
  // consulted first.
  std::span<const TensorNamePair> gguf_layer_names;
  // An end-of-turn token the files leave unmarked (no tokenizer.ggml.eot_token_id): generation
  // also stops at it, found by its string in tokenizer.ggml.tokens. Empty: none.
  std::string_view gguf_unmarked_end_of_turn;
  GgufConfigHook gguf_config_hook = nullptr;

  // ---- the layers (decoder/arch.h's ArchSpec is filled from these) ----
  GluActivation activation = GluActivation::kSilu;
  // A norm after attention and after the MLP, before each residual add (the layer's
  // post_attention_layernorm, pre_feedforward_layernorm and post_feedforward_layernorm).
  bool post_norms = false;
  EmbedScale embed_scale = EmbedScale::kNone;
  // q/k/v projection biases always (an HF `attention_bias` is not read); without it, HF
  // `attention_bias: true` is refused (o_proj would carry one too). A GGUF file's biases are
  // used whenever present.
  bool qkv_bias = false;
  bool qk_norm = false;  // RMSNorm over each head of q and k before RoPE
  SlidingWindowRule sliding_window = SlidingWindowRule::kNone;
  // The softmax scale is not a row fact: 1 / sqrt(query_pre_attn_scalar) when a hook sets it,
  // else 1 / sqrt(head_dim).

  // ---- chat ----
  // The built-in chat template used when a model file carries none
  // (template/builtin_chat_template.h); empty: none.
  std::string_view builtin_chat_template;
};

inline constexpr ArchitectureTraits kArchitectureTable[] = {
    {.arch = Architecture::kLlama,
     .name = "llama",
     .display_name = "Llama",
     .hf_classes = {"LlamaForCausalLM"},
     .hf_model_types = {"llama"},
     .gguf_names = {"llama"},
     .gguf_qk_permuted = true},
    {.arch = Architecture::kMistral,
     .name = "mistral",
     .display_name = "Mistral",
     .hf_classes = {"MistralForCausalLM"},
     .hf_model_types = {"mistral"},
     .gguf_names = {"llama"},
     .gguf_marker_key = "attention.sliding_window",
     .gguf_qk_permuted = true,
     .sliding_window = SlidingWindowRule::kEveryLayer},
    {.arch = Architecture::kQwen2,
     .name = "qwen2",
     .display_name = "Qwen2",
     .hf_classes = {"Qwen2ForCausalLM"},
     .hf_model_types = {"qwen2"},
     .gguf_names = {"qwen2"},
     .qkv_bias = true,
     .sliding_window = SlidingWindowRule::kOptIn},
    {.arch = Architecture::kQwen3,
     .name = "qwen3",
     .display_name = "Qwen3",
     .hf_classes = {"Qwen3ForCausalLM"},
     .hf_model_types = {"qwen3"},
     .gguf_names = {"qwen3"},
     .qk_norm = true,
     .sliding_window = SlidingWindowRule::kOptIn},
    {.arch = Architecture::kGemma3,
     .name = "gemma3",
     .display_name = "Gemma 3",
     .hf_classes = {"Gemma3ForCausalLM"},
     .hf_model_types = {"gemma3_text"},
     .hf_norm_weight_offset = 1.0f,
     .hf_tie_embeddings_default = true,
     .hf_config_hook = gemma3_hf_config,
     .gguf_names = {"gemma3"},
     .gguf_layer_names = kGemmaGgufNormNames,
     .gguf_unmarked_end_of_turn = "<end_of_turn>",
     .gguf_config_hook = gemma3_gguf_config,
     .activation = GluActivation::kGeluTanh,
     .post_norms = true,
     .embed_scale = EmbedScale::kSqrtHidden,
     .qk_norm = true,
     .sliding_window = SlidingWindowRule::kLocalLayers,
     .builtin_chat_template = "gemma3"},
};

namespace architecture_detail {
constexpr bool table_is_complete() {
  if (std::size(kArchitectureTable) != static_cast<size_t>(Architecture::kCount)) return false;
  for (size_t i = 0; i < std::size(kArchitectureTable); ++i) {
    const ArchitectureTraits& r = kArchitectureTable[i];
    if (static_cast<size_t>(r.arch) != i || r.name.empty() || r.hf_classes[0].empty() || r.gguf_names[0].empty())
      return false;
  }
  return true;
}
}  // namespace architecture_detail
static_assert(architecture_detail::table_is_complete(),
              "kArchitectureTable: one row per Architecture, in enum order, each with a name, an HF class and a "
              "GGUF name");
// (A kLocalLayers row also needs both config hooks, which compute its local layers. Comparing a
// function pointer with null is not a constant expression under -fsanitize=undefined, so
// ArchitectureTable.LocalLayerRowsHaveHooks checks that at run time.)

// The row of `a` (a valid Architecture; kCount is not one).
const ArchitectureTraits& architecture_traits(Architecture a);
inline std::string_view architecture_name(Architecture a) { return architecture_traits(a).name; }

// The row that names `name` in the given column; nullptr when none does.
const ArchitectureTraits* find_architecture_by_hf_class(std::string_view name);
const ArchitectureTraits* find_architecture_by_model_type(std::string_view name);
// The row of a GGUF file whose general.architecture is `name`: among the rows with that GGUF
// name, the one whose marker key the file has, else the one without a marker. nullptr when none.
const ArchitectureTraits* find_architecture_by_gguf(std::string_view name, const GgufFile& gguf);

// Every name of a column, in table order, without repeats, joined by ", " (for messages:
// "LlamaForCausalLM, MistralForCausalLM, ...").
std::string architecture_names_list(ArchitectureNames ArchitectureTraits::*column);

}  // namespace tessera
