// The decoder's architecture description on the CPU backend: Llama's description reproduces the
// reference logits, every feature of the description changes what runs, and descriptions that do
// not fit the model are refused with a message naming the layer and the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "comm/device_comm.h"
#include "common/thread_pool.h"
#include "shard/cpu_backend.h"
#include "tests/decoder/toy_model.h"
#include "tests/shard/stories_reference.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::max_abs_diff;
using test::ToyModel;

// The description is what runs: the same weights described as Llama give other logits, and each
// toy feature on its own moves them.
TEST(DecoderArch, EachDescribedFeatureChangesTheCpuLogits) {
  TESSERA_REQUIRE_TESTDATA(test::stories_dir() + "/reference.json");
  ToyModel m;
  auto store = WeightStore::open(test::stories_dir() + "/hf");
  ASSERT_TRUE(store.is_ok());
  m.store = std::move(store).value();
  const ModelConfig& c = m.store->config();
  m.layout = *plan_shard_layout(c, TpConfig{});
  const std::vector<int32_t> prompt = test::load_cases().back().prompt;
  auto logits_of = [&](const std::function<void(ArchSpec&)>& edit) {
    auto w = m.weights();
    EXPECT_TRUE(w.is_ok());
    CpuBackendOptions co;
    co.arch = describe_architecture(c, w->weights);
    if (edit) edit(*co.arch);
    auto comm = make_single_rank_comm();
    ThreadPool pool(ThreadPoolOptions{.num_threads = 1});
    CpuBackend cpu(c, m.layout, std::move(w).value(), &pool, comm.get(), co);
    EXPECT_TRUE(cpu.configure_kv(16, 8, 0).is_ok());
    std::vector<int32_t> table = {7, 6, 5, 4, 3, 2, 1, 0};
    SequenceInput in{prompt, 0, table, true};
    std::vector<float> logits;
    EXPECT_TRUE(cpu.run({&in, 1}, logits).is_ok());
    return logits;
  };
  const std::vector<float> llama = logits_of({});
  // Llama's description reproduces the reference (the decoder adds nothing of its own).
  const std::vector<float> ref = test::load_cases().back().logits;
  EXPECT_LT(max_abs_diff(llama, ref), 1e-4f);
  const std::pair<const char*, std::function<void(ArchSpec&)>> features[] = {
      {"post_norms", [](ArchSpec& a) { a.post_norms = true; }},
      {"gelu_tanh", [](ArchSpec& a) { a.activation = GluActivation::kGeluTanh; }},
      {"embed_scale", [](ArchSpec& a) { a.embed_scale = 2.0f; }},
      {"attn_scale", [](ArchSpec& a) { a.attn_scale = 0.25f; }},
      {"sliding_window", [](ArchSpec& a) { a.layers[0].sliding_window = 4; }},
      {"rope_table", [&](ArchSpec& a) {
         a.rope_inv_freq.push_back(std::vector<float>(static_cast<size_t>(c.head_dim / 2), 0.5f));
         a.layers[1].rope_table = 1;
       }},
  };
  for (const auto& [name, edit] : features)
    EXPECT_GT(max_abs_diff(logits_of(edit), llama), 1e-3f) << name << " did not change the logits";
}

TEST(DecoderArch, DescriptionsThatDoNotFitTheModelAreRefused) {
  TESSERA_REQUIRE_TESTDATA(test::stories_dir() + "/reference.json");
  auto store = WeightStore::open(test::stories_dir() + "/hf");
  ASSERT_TRUE(store.is_ok());
  const ModelConfig& c = (*store)->config();
  auto w = bind_model_weights(**store);
  ASSERT_TRUE(w.is_ok());
  ArchSpec a = describe_architecture(c, *w);
  ASSERT_TRUE(a.validate(c, &*w).is_ok());
  ArchSpec post = a;
  post.post_norms = true;  // the weights have no post norms
  Status s = post.validate(c, &*w);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("layer 0 needs post-attention norm"), std::string::npos) << s.message();
  ArchSpec table = a;
  table.layers[2].rope_table = 3;
  s = table.validate(c, &*w);
  EXPECT_NE(s.message().find("layer 2 uses RoPE table 3 of 1"), std::string::npos) << s.message();
  ArchSpec layers = a;
  layers.layers.pop_back();
  EXPECT_FALSE(layers.validate(c, &*w).is_ok());
  ArchSpec scale = a;
  scale.attn_scale = std::nanf("");
  EXPECT_FALSE(scale.validate(c, &*w).is_ok());
}

// Every row of the architecture table (model/architecture.h) gives the description it states:
// name, gated activation, post-norms, embedding scale; a local RoPE table where its config hook
// sets a local base.
TEST(DecoderArch, EachArchitectureRowGivesItsDescription) {
  for (const ArchitectureTraits& row : kArchitectureTable) {
    const nlohmann::json j = {{"architectures", {std::string(row.hf_classes[0])}},
                              {"hidden_size", 64},
                              {"num_hidden_layers", 6},
                              {"num_attention_heads", 4},
                              {"num_key_value_heads", 2},
                              {"intermediate_size", 128},
                              {"vocab_size", 100},
                              {"max_position_embeddings", 256}};
    auto c = parse_hf_config(j.dump(), "config.json");
    ASSERT_TRUE(c.is_ok()) << row.name << ": " << c.status().to_string();
    const ArchSpec a = describe_architecture(*c, ModelWeights{});
    EXPECT_EQ(a.name, row.name);
    EXPECT_EQ(a.activation, row.activation) << row.name;
    EXPECT_EQ(a.post_norms, row.post_norms) << row.name;
    EXPECT_EQ(a.embed_scale, row.embed_scale == EmbedScale::kSqrtHidden ? 8.0f : 1.0f) << row.name;
    const float scalar = c->query_pre_attn_scalar > 0.0f ? c->query_pre_attn_scalar : 16.0f;  // head_dim 16
    EXPECT_FLOAT_EQ(a.attn_scale, 1.0f / std::sqrt(scalar)) << row.name;
    EXPECT_EQ(a.rope_inv_freq.size(), c->rope_theta_local > 0.0f ? 2u : 1u) << row.name;
    ASSERT_EQ(a.layers.size(), 6u) << row.name;
    for (int64_t l = 0; l < 6; ++l)
      EXPECT_EQ(a.layers[static_cast<size_t>(l)].sliding_window, c->is_local_layer(l) ? c->sliding_window : 0)
          << row.name << " layer " << l;
    EXPECT_TRUE(a.validate(*c).is_ok()) << row.name << ": " << a.validate(*c).to_string();
  }
}

}  // namespace
}  // namespace tessera
