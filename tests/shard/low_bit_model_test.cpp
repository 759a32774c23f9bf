// Models with the low-bit GGUF formats Q2_K, Q3_K, TQ1_0, TQ2_0: a GGUF file written with them
// (tessera-make-model --type q2_k ...) loads and computes what the same model with its weights
// dequantized to F32 computes; --quant q2_k / q3_k / tq1_0 / tq2_0 quantizes a float checkpoint
// into them at load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/quant.h"
#include "local/local_model.h"
#include "model/weight_store.h"
#include "tests/model/loader_test_util.h"
#include "tools/testmodel/synthetic_model.h"

namespace tessera {
namespace {

using loader_test::TempDir;

// Every matrix dimension a multiple of 256, so every matrix takes the format itself.
SyntheticModelSpec small_spec() { return block_aligned_spec(QuantType::kF32, 91); }

constexpr QuantType kLowBit[] = {QuantType::kQ2_K, QuantType::kQ3_K, QuantType::kTQ1_0, QuantType::kTQ2_0};

GenerateOutput run(const LocalModelOptions& options, const std::vector<int32_t>& prompt) {
  auto m = LocalModel::load(options);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (!m.is_ok()) return {};
  GenerateOptions go;
  go.max_tokens = 8;
  go.ignore_eos = true;
  go.sampling.temperature = 0.0f;
  auto g = generate(**m, prompt, go);
  EXPECT_TRUE(g.is_ok()) << g.status().to_string();
  return g.is_ok() ? std::move(*g) : GenerateOutput{};
}

double correlation(const std::vector<float>& a, const std::vector<float>& b) {
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ma += a[i];
    mb += b[i];
  }
  ma /= static_cast<double>(a.size());
  mb /= static_cast<double>(b.size());
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

// The quantized GGUF against an F32 GGUF holding exactly its dequantized matrices
// (SyntheticModelSpec::grid_type): the CPU computes the blocks with the integer-dot kernels
// (kernels/cpu/qgemm.h), whose activations are rounded to int8 per 256 elements, so the two
// differ by that rounding only (a wrong level or scale would move the logits by far more).
TEST(LowBitGguf, ComputesWhatItsDequantizedF32ModelComputes) {
  TempDir dir;
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 19; ++i) prompt.push_back(1 + (i * 37) % 500);
  for (const QuantType type : kLowBit) {
    SCOPED_TRACE(std::string(quant_name(type)));
    SyntheticModelSpec low = small_spec();
    low.weight_type = type;
    SyntheticModelSpec ref = small_spec();
    ref.grid_type = type;
    const std::string low_path = dir.file(std::string(quant_name(type)) + ".gguf");
    const std::string ref_path = dir.file(std::string(quant_name(type)) + "-f32.gguf");
    ASSERT_TRUE(write_synthetic_gguf(low, low_path).is_ok());
    ASSERT_TRUE(write_synthetic_gguf(ref, ref_path).is_ok());
    {
      auto m = LocalModel::load({.path = low_path, .runtime = {.threads = 2}});
      ASSERT_TRUE(m.is_ok()) << m.status().to_string();
      const ModelWeights& w = (*m)->weights();
      EXPECT_EQ(w.embed.type, type);
      EXPECT_EQ(w.layers[1].w_down.type, type);
      EXPECT_EQ(w.layers[0].wq.type, type);
    }
    const GenerateOutput got = run({.path = low_path, .runtime = {.threads = 2}}, prompt);
    const GenerateOutput want = run({.path = ref_path, .runtime = {.threads = 2}}, prompt);
    ASSERT_EQ(got.prompt_last_logits.size(), want.prompt_last_logits.size());
    ASSERT_FALSE(want.prompt_last_logits.empty());
    float max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < want.prompt_last_logits.size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(want.prompt_last_logits[i]));
      max_diff = std::max(max_diff, std::fabs(got.prompt_last_logits[i] - want.prompt_last_logits[i]));
    }
    const double corr = correlation(got.prompt_last_logits, want.prompt_last_logits);
    // Measured (2026-12-03): max difference / max |logit| Q2_K 0.013, Q3_K 0.015, TQ 0.009;
    // correlation 0.99986 or more. The random model's later greedy tokens sit on near-ties,
    // so only the first (from these logits) is compared.
    std::printf("  %-5s max |logit difference| %.3g (max |logit| %.3g), correlation %.6f\n",
                std::string(quant_name(type)).c_str(), max_diff, max_abs, corr);
    EXPECT_LE(max_diff, 0.04f * max_abs);
    EXPECT_GT(corr, 0.999);
    ASSERT_FALSE(got.ids.empty());
    ASSERT_FALSE(want.ids.empty());
    EXPECT_EQ(got.ids[0], want.ids[0]);
  }
}

// --quant: float weights rounded into the format at load; the logits follow the float model's
// as far as the bit width allows.
TEST(LowBitGguf, QuantAtLoadFromAFloatCheckpoint) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_hf(small_spec(), dir.file("hf")).is_ok());
  const std::vector<int32_t> prompt = {1, 17, 42, 300, 5, 77, 9, 123};
  const GenerateOutput ref = run({.path = dir.file("hf"), .runtime = {.threads = 2}}, prompt);
  struct Case {
    WeightQuant quant;
    QuantType type;
    double min_corr;
  };
  // Measured (2026-12-03): q3_k 0.980, q2_k 0.936, tq2_0 = tq1_0 0.856.
  for (const Case& c : {Case{WeightQuant::kQ3_K, QuantType::kQ3_K, 0.95}, Case{WeightQuant::kQ2_K, QuantType::kQ2_K, 0.88},
                        Case{WeightQuant::kTQ2_0, QuantType::kTQ2_0, 0.75}, Case{WeightQuant::kTQ1_0, QuantType::kTQ1_0, 0.75}}) {
    const std::string name(weight_quant_name(c.quant));
    SCOPED_TRACE(name);
    ASSERT_EQ(parse_weight_quant(name).value(), c.quant);
    EXPECT_EQ(weight_quant_type(c.quant), c.type);
    auto m = LocalModel::load({.path = dir.file("hf"), .runtime = {.threads = 2, .quant = c.quant}});
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_EQ((*m)->weights().layers[0].wq.type, c.type);
    EXPECT_EQ((*m)->weights().layers[1].w_down.type, c.type);
    EXPECT_EQ((*m)->weights().embed.type, QuantType::kF32) << "the embedding stays as stored";
    const GenerateOutput got = run({.path = dir.file("hf"), .runtime = {.threads = 2, .quant = c.quant}}, prompt);
    const double corr = correlation(ref.prompt_last_logits, got.prompt_last_logits);
    std::printf("  --quant %-5s: logits correlation with F32 %.4f\n", name.c_str(), corr);
    EXPECT_GT(corr, c.min_corr);
  }
  // Columns that do not fill a super-block take the 32-block fallback (Q4_0 for Q2_K); columns
  // that fill no 32-block either are refused, naming the tensor.
  SyntheticModelSpec odd = small_spec();
  odd.ffn = 384;
  ASSERT_TRUE(write_synthetic_hf(odd, dir.file("odd")).is_ok());
  auto fb = LocalModel::load({.path = dir.file("odd"), .runtime = {.threads = 2, .quant = WeightQuant::kQ2_K}});
  ASSERT_TRUE(fb.is_ok()) << fb.status().to_string();
  EXPECT_EQ(quant_traits((*fb)->weights().layers[0].w_down.type).r16_base, QuantType::kQ4_0);
  EXPECT_EQ(quant_traits((*fb)->weights().layers[0].w_up.type).r16_base, QuantType::kQ2_K);
  odd.ffn = 272;
  ASSERT_TRUE(write_synthetic_hf(odd, dir.file("odder")).is_ok());
  auto kept = LocalModel::load({.path = dir.file("odder"), .runtime = {.threads = 2, .quant = WeightQuant::kQ2_K}});
  ASSERT_TRUE(kept.is_ok()) << kept.status().to_string();  // by default such a matrix stays as stored
  EXPECT_TRUE(quant_traits((*kept)->weights().layers[0].w_down.type).is_float);
  auto m = LocalModel::load(
      {.path = dir.file("odder"), .runtime = {.threads = 2, .quant = WeightQuant::kQ2_K}, .keep_unquantizable = false});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("down_proj.weight"), std::string::npos) << m.status().to_string();
  EXPECT_NE(m.status().message().find("q2_k"), std::string::npos) << m.status().to_string();
}

}  // namespace
}  // namespace tessera
