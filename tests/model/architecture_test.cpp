// The architecture table (model/architecture.h), row by row: every row is found from each of its
// Hugging Face and GGUF names, and the configs parsed through those names carry the row's facts
// (biases, q/k norms, norm offset, tied head, sliding-window rule, tensor names, stop tokens).
#include "model/architecture.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/model_config.h"
#include "model/weight_store.h"
#include "tests/model/loader_test_util.h"

namespace tessera {
namespace {

using loader_test::GgufBuilder;
using loader_test::TempDir;

std::vector<std::string_view> names_of(const ArchitectureNames& names) {
  std::vector<std::string_view> out;
  for (std::string_view n : names)
    if (!n.empty()) out.push_back(n);
  return out;
}

// A small config.json that every architecture accepts; `name` goes in `architectures`, or in
// `model_type` when `by_model_type`.
nlohmann::json hf_config(std::string_view name, bool by_model_type = false) {
  nlohmann::json j = {{"hidden_size", 64},         {"num_hidden_layers", 6},   {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},  {"intermediate_size", 128}, {"vocab_size", 100},
                      {"max_position_embeddings", 256}};
  if (by_model_type) {
    j["model_type"] = std::string(name);
  } else {
    j["architectures"] = {std::string(name)};
  }
  return j;
}

Result<ModelConfig> parse(const nlohmann::json& j) { return parse_hf_config(j.dump(), "config.json"); }

GgufBuilder gguf_of(std::string_view name) {
  const std::string a(name);
  GgufBuilder b;
  b.kv_str("general.architecture", a)
      .kv_u32(a + ".embedding_length", 64)
      .kv_u32(a + ".block_count", 6)
      .kv_u32(a + ".attention.head_count", 4)
      .kv_u32(a + ".attention.head_count_kv", 2)
      .kv_u32(a + ".feed_forward_length", 128)
      .kv_u32(a + ".context_length", 256)
      .kv_u32(a + ".vocab_size", 100);
  return b;
}

// The file of GGUF name `name` that selects `row`: with the row's marker key (value 32) when it
// has one.
GgufBuilder gguf_for_row(std::string_view name, const ArchitectureTraits& row) {
  GgufBuilder b = gguf_of(name);
  if (!row.gguf_marker_key.empty()) b.kv_u32(std::string(name) + "." + std::string(row.gguf_marker_key), 32);
  return b;
}

Result<ModelConfig> config_of(const GgufBuilder& b, const TempDir& dir) {
  const std::string path = dir.file("m.gguf");
  loader_test::write_file(path, b.build());
  TESSERA_ASSIGN_OR_RETURN(auto g, GgufFile::open(path));
  return config_from_gguf(*g);
}

TEST(ArchitectureTable, OneRowPerArchitectureWithUniqueNames) {
  ASSERT_EQ(std::size(kArchitectureTable), static_cast<size_t>(Architecture::kCount));
  std::set<std::string_view> names, classes, model_types;
  std::set<std::pair<std::string_view, std::string_view>> gguf;  // (name, marker)
  for (size_t i = 0; i < std::size(kArchitectureTable); ++i) {
    const ArchitectureTraits& row = kArchitectureTable[i];
    const auto a = static_cast<Architecture>(i);
    EXPECT_EQ(&architecture_traits(a), &row);
    EXPECT_EQ(architecture_name(a), row.name);
    EXPECT_FALSE(row.display_name.empty()) << row.name;
    EXPECT_TRUE(names.insert(row.name).second) << row.name;
    for (std::string_view n : names_of(row.hf_classes)) EXPECT_TRUE(classes.insert(n).second) << n;
    for (std::string_view n : names_of(row.hf_model_types)) EXPECT_TRUE(model_types.insert(n).second) << n;
    for (std::string_view n : names_of(row.gguf_names))
      EXPECT_TRUE(gguf.insert({n, row.gguf_marker_key}).second) << n << " " << row.gguf_marker_key;
  }
  // Every GGUF name has a row without a marker: the one chosen when no marker key is present.
  for (const auto& [name, marker] : gguf) EXPECT_TRUE(gguf.count({name, ""})) << name;
}

TEST(ArchitectureTable, EveryRowRoundTripsThroughItsHfNames) {
  for (const ArchitectureTraits& row : kArchitectureTable) {
    for (bool by_model_type : {false, true}) {
      for (std::string_view name : names_of(by_model_type ? row.hf_model_types : row.hf_classes)) {
        auto c = parse(hf_config(name, by_model_type));
        ASSERT_TRUE(c.is_ok()) << name << ": " << c.status().to_string();
        EXPECT_TRUE(c->validate("config.json").is_ok()) << name << ": " << c->validate("config.json").to_string();
        EXPECT_EQ(c->arch, row.arch) << name;
        EXPECT_EQ(c->qkv_bias, row.qkv_bias) << name;
        EXPECT_EQ(c->qk_norm, row.qk_norm) << name;
        EXPECT_EQ(c->norm_weight_offset, row.hf_norm_weight_offset) << name;
        EXPECT_EQ(c->tie_embeddings, row.hf_tie_embeddings_default) << name;
      }
    }
  }
}

TEST(ArchitectureTable, EveryRowRoundTripsThroughItsGgufNames) {
  TempDir dir;
  for (const ArchitectureTraits& row : kArchitectureTable) {
    for (std::string_view name : names_of(row.gguf_names)) {
      auto c = config_of(gguf_for_row(name, row), dir);
      ASSERT_TRUE(c.is_ok()) << name << ": " << c.status().to_string();
      EXPECT_TRUE(c->validate("m.gguf").is_ok()) << name << ": " << c->validate("m.gguf").to_string();
      EXPECT_EQ(c->arch, row.arch) << name;
      EXPECT_EQ(c->qkv_bias, row.qkv_bias) << name;  // the file has no bias tensors
      EXPECT_EQ(c->qk_norm, row.qk_norm) << name;
      EXPECT_EQ(c->norm_weight_offset, 0.0f) << name;  // GGUF norms are stored as applied
      if (!row.gguf_marker_key.empty()) {
        // Without its marker the file belongs to the unmarked row of that name.
        auto plain = config_of(gguf_of(name), dir);
        ASSERT_TRUE(plain.is_ok()) << name << ": " << plain.status().to_string();
        EXPECT_NE(plain->arch, row.arch) << name;
        EXPECT_TRUE(architecture_traits(plain->arch).gguf_marker_key.empty()) << name;
      }
    }
  }
}

TEST(ArchitectureTable, LocalLayerRowsHaveHooks) {
  for (const ArchitectureTraits& row : kArchitectureTable) {
    if (row.sliding_window != SlidingWindowRule::kLocalLayers) continue;
    EXPECT_NE(row.hf_config_hook, nullptr) << row.name << ": kLocalLayers needs hf_config_hook";
    EXPECT_NE(row.gguf_config_hook, nullptr) << row.name << ": kLocalLayers needs gguf_config_hook";
  }
}

TEST(ArchitectureTable, SlidingWindowRule) {
  TempDir dir;
  for (const ArchitectureTraits& row : kArchitectureTable) {
    nlohmann::json j = hf_config(row.hf_classes[0]);
    j["sliding_window"] = 32;
    j["use_sliding_window"] = true;
    auto c = parse(j);
    ASSERT_TRUE(c.is_ok()) << row.name << ": " << c.status().to_string();
    const bool windowed = row.sliding_window != SlidingWindowRule::kNone;
    EXPECT_EQ(c->sliding_window, windowed ? 32 : 0) << row.name;
    EXPECT_EQ(c->local_layers.empty(), row.sliding_window != SlidingWindowRule::kLocalLayers) << row.name;
    j["use_sliding_window"] = false;
    c = parse(j);
    ASSERT_TRUE(c.is_ok()) << row.name << ": " << c.status().to_string();
    EXPECT_EQ(c->sliding_window, windowed && row.sliding_window != SlidingWindowRule::kOptIn ? 32 : 0) << row.name;

    // GGUF: the window key of the row's name (which may be another row's marker).
    const std::string name(row.gguf_names[0]);
    GgufBuilder b = gguf_for_row(name, row);
    if (row.gguf_marker_key != "attention.sliding_window") b.kv_u32(name + ".attention.sliding_window", 32);
    auto g = config_of(b, dir);
    ASSERT_TRUE(g.is_ok()) << row.name << ": " << g.status().to_string();
    const SlidingWindowRule rule = architecture_traits(g->arch).sliding_window;
    const bool read = rule == SlidingWindowRule::kEveryLayer || rule == SlidingWindowRule::kLocalLayers;
    EXPECT_EQ(g->sliding_window, read ? 32 : 0) << row.name;
  }
}

TEST(ArchitectureTable, GgufTensorNamesFollowTheRow) {
  for (const ArchitectureTraits& row : kArchitectureTable) {
    std::set<std::string_view> own;
    for (const auto& [g, hf] : row.gguf_layer_names) {
      own.insert(g);
      EXPECT_EQ(gguf_to_hf_name("blk.3." + std::string(g), row.arch), "model.layers.3." + std::string(hf)) << row.name;
    }
    // The common names where the row has none of its own.
    if (!own.count("ffn_norm.weight")) {
      EXPECT_EQ(gguf_to_hf_name("blk.3.ffn_norm.weight", row.arch), "model.layers.3.post_attention_layernorm.weight")
          << row.name;
    }
    EXPECT_EQ(gguf_to_hf_name("blk.3.attn_q.weight", row.arch), "model.layers.3.self_attn.q_proj.weight") << row.name;
  }
}

TEST(ArchitectureTable, UnmarkedEndOfTurnStopsGeneration) {
  TempDir dir;
  for (const ArchitectureTraits& row : kArchitectureTable) {
    const std::string name(row.gguf_names[0]);
    // Id 3 is the row's token, or Gemma's for a row that has none (and must not stop at it).
    const std::string_view eot = row.gguf_unmarked_end_of_turn.empty() ? "<end_of_turn>" : row.gguf_unmarked_end_of_turn;
    GgufBuilder b = gguf_for_row(name, row);
    b.kv_u32("tokenizer.ggml.eos_token_id", 1)
        .kv_str_array("tokenizer.ggml.tokens", {"<pad>", "<eos>", "<bos>", std::string(eot), "a"});
    const std::string path = dir.file("m.gguf");
    loader_test::write_file(path, b.build());
    auto g = GgufFile::open(path);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    auto ids = gguf_stop_token_ids(**g, 5);
    ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
    const std::vector<int32_t> expect =
        row.gguf_unmarked_end_of_turn.empty() ? std::vector<int32_t>{1} : std::vector<int32_t>{1, 3};
    EXPECT_EQ(*ids, expect) << row.name;
  }
}

TEST(ArchitectureTable, RefusalsListEverySupportedName) {
  TempDir dir;
  auto hf = parse(hf_config("GPTNeoXForCausalLM"));
  ASSERT_FALSE(hf.is_ok());
  auto type = parse(hf_config("gpt_neox", true));
  ASSERT_FALSE(type.is_ok());
  auto gguf = config_of(gguf_of("gptneox"), dir);
  ASSERT_FALSE(gguf.is_ok());
  EXPECT_EQ(hf.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(type.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(gguf.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(hf.status().message().find("config.json: unsupported architecture 'GPTNeoXForCausalLM'"), std::string::npos);
  EXPECT_NE(gguf.status().message().find(dir.file("m.gguf")), std::string::npos);
  for (const ArchitectureTraits& row : kArchitectureTable) {
    for (std::string_view n : names_of(row.hf_classes))
      EXPECT_NE(hf.status().message().find(n), std::string::npos) << n;
    for (std::string_view n : names_of(row.hf_model_types))
      EXPECT_NE(type.status().message().find(n), std::string::npos) << n;
    for (std::string_view n : names_of(row.gguf_names))
      EXPECT_NE(gguf.status().message().find(n), std::string::npos) << n;
  }
}

}  // namespace
}  // namespace tessera
