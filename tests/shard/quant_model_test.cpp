// Weights quantized at load (--quant int8 / int4 / int4-sym) and pre-quantized AWQ / GPTQ
// checkpoints: conversion into I4_G128, equality with RTN at load on the same grid, greedy
// generation, tensor-parallel slicing on group boundaries, and the errors users see.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/vec.h"
#include "kernels/quant.h"
#include "kernels/weight_codec.h"
#include "model/int4_checkpoint.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "tools/testmodel/safetensors_writer.h"
#include "tools/testmodel/synthetic_model.h"
#include "model/weight_store.h"
#include "local/local_model.h"
#include "shard/tp_slice.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "tessera_quant_XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

SyntheticModelSpec small_spec() { return block_aligned_spec(QuantType::kF16, 77); }

const char* kLinears[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                          "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                          "mlp.down_proj.weight"};

std::vector<float> dequantize(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (int64_t r = 0; r < v.rows(); ++r) dequantize_row(v.type, v.row_ptr(r), out.data() + r * v.cols(), v.cols());
  return out;
}

struct Case {
  const char* packing;
  bool sym;
  WeightQuant rtn;
};

class PackedCheckpoint : public ::testing::TestWithParam<Case> {};

// The packed checkpoint, unpacked at load, holds exactly the bytes RTN at load makes from the
// float model of the same spec (so the packing and unpacking agree), and those values are
// within half a step of the float weights.
TEST_P(PackedCheckpoint, LoadsAsTheRtnGridOfTheFloatModel) {
  const Case c = GetParam();
  TempDir dir;
  SyntheticModelSpec spec = small_spec();
  ASSERT_TRUE(write_synthetic_hf(spec, dir.sub("f16")).is_ok());
  spec.hf_int4_packing = c.packing;
  spec.int4_sym = c.sym;
  ASSERT_TRUE(write_synthetic_hf(spec, dir.sub("packed")).is_ok());

  auto packed = WeightStore::open(dir.sub("packed"));
  ASSERT_TRUE(packed.is_ok()) << packed.status().to_string();
  EXPECT_EQ((*packed)->config().quantization.method,
            std::string(c.packing) == "awq" ? CheckpointQuant::kAwq : CheckpointQuant::kGptq);
  auto f16 = WeightStore::open(dir.sub("f16"));
  ASSERT_TRUE(f16.is_ok());
  auto wp = bind_model_weights(**packed);
  ASSERT_TRUE(wp.is_ok()) << wp.status().to_string();
  auto wr = bind_model_weights(**f16, WeightLoadOptions{.codec = &cpu_weight_codec(), .quant = c.rtn});
  ASSERT_TRUE(wr.is_ok()) << wr.status().to_string();
  for (int l = 0; l < 2; ++l) {
    for (const char* suffix : kLinears) {
      const std::string name = "model.layers." + std::to_string(l) + "." + suffix;
      auto pv = (*packed)->get(name);
      ASSERT_TRUE(pv.is_ok()) << name;
      ASSERT_EQ(pv->type, QuantType::kI4_G128) << name;
      auto fv = (*f16)->get(name);
      ASSERT_TRUE(fv.is_ok());
      ASSERT_EQ(pv->shape_string(), fv->shape_string()) << name;
      const std::vector<float> w = dequantize(*fv);
      const std::vector<float> q = dequantize(*pv);
      for (int64_t r = 0; r < pv->rows(); ++r) {
        for (int64_t g = 0; g < pv->cols() / 128; ++g) {
          Int4Group grp;
          unpack_int4_group(pv->row_ptr(r) + 68 * g, &grp);
          if (c.sym) {
            ASSERT_EQ(grp.zero, 8) << name;
          }
          const float d = fp16_to_f32(grp.scale_fp16);
          for (int64_t j = 0; j < 128; ++j) {
            const size_t i = static_cast<size_t>(r * pv->cols() + g * 128 + j);
            ASSERT_LE(std::fabs(q[i] - w[i]), 0.5f * d * 1.01f + 1e-7f) << name << " row " << r << " col " << g * 128 + j;
          }
        }
      }
    }
    const LayerWeights& a = wp->layers[static_cast<size_t>(l)];
    const LayerWeights& b = wr->layers[static_cast<size_t>(l)];
    for (auto [x, y] : {std::pair{a.wq, b.wq}, {a.wk, b.wk}, {a.wv, b.wv}, {a.wo, b.wo}, {a.w_gate, b.w_gate},
                        {a.w_up, b.w_up}, {a.w_down, b.w_down}}) {
      ASSERT_EQ(x.type, QuantType::kI4_G128);
      ASSERT_EQ(y.type, QuantType::kI4_G128);
      ASSERT_EQ(x.nbytes(), y.nbytes());
      EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes()), 0) << c.packing << " layer " << l;
    }
  }

  // Same quantized weights, same greedy tokens.
  auto mp = LocalModel::load({.path = dir.sub("packed"), .runtime = {.threads = 2}});
  ASSERT_TRUE(mp.is_ok()) << mp.status().to_string();
  auto mr = LocalModel::load({.path = dir.sub("f16"), .runtime = {.threads = 2, .quant = c.rtn}});
  ASSERT_TRUE(mr.is_ok()) << mr.status().to_string();
  GenerateOptions go;
  go.max_tokens = 12;
  go.ignore_eos = true;
  go.sampling.temperature = 0.0f;
  const std::vector<int32_t> prompt = {1, 17, 42, 300, 5, 77};
  auto a = generate(**mp, prompt, go);
  auto b = generate(**mr, prompt, go);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->ids, b->ids);
  EXPECT_EQ(a->prompt_last_logits, b->prompt_last_logits);
}

INSTANTIATE_TEST_SUITE_P(Int4, PackedCheckpoint,
                         ::testing::Values(Case{"awq", false, WeightQuant::kInt4}, Case{"gptq", false, WeightQuant::kInt4},
                                           Case{"gptq", true, WeightQuant::kInt4Sym}),
                         [](const auto& info) {
                           return std::string(info.param.packing) + (info.param.sym ? "_sym" : "_asym");
                         });

// Hand-packed words, written straight from the format descriptions: AWQ puts output column
// ORDER[i] in nibble i (ORDER = 0 2 4 6 1 3 5 7); GPTQ puts input 8r + i of a column in nibble i
// and stores zero - 1.
TEST(PackedCheckpoint, HandPackedWordsFollowTheFormats) {
  constexpr int kOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  auto level = [](int n, int k) { return static_cast<uint32_t>((n * 3 + k) % 16); };
  auto zero = [](int n) { return static_cast<uint32_t>(n + 1); };
  auto bytes_of = [](const std::vector<uint32_t>& w) {
    std::vector<uint8_t> b(w.size() * 4);
    std::memcpy(b.data(), w.data(), b.size());
    return b;
  };
  std::vector<uint8_t> scales(16);
  for (int n = 0; n < 8; ++n) {
    const uint16_t h = f32_to_fp16(0.5f * static_cast<float>(n + 1));
    std::memcpy(scales.data() + 2 * n, &h, 2);
  }
  TempDir dir;
  for (const bool awq : {true, false}) {
    SafetensorsWriter st;
    std::vector<uint32_t> qw, qz(1, 0);
    if (awq) {
      for (int k = 0; k < 128; ++k) {
        uint32_t w = 0;
        for (int i = 0; i < 8; ++i) w |= level(kOrder[i], k) << (4 * i);
        qw.push_back(w);
      }
      for (int i = 0; i < 8; ++i) qz[0] |= zero(kOrder[i]) << (4 * i);
      ASSERT_TRUE(st.add_tensor("l.qweight", std::vector<int64_t>{128, 1}, QuantType::kI32, bytes_of(qw)).is_ok());
    } else {
      for (int r = 0; r < 16; ++r)
        for (int n = 0; n < 8; ++n) {
          uint32_t w = 0;
          for (int i = 0; i < 8; ++i) w |= level(n, 8 * r + i) << (4 * i);
          qw.push_back(w);
        }
      for (int i = 0; i < 8; ++i) qz[0] |= (zero(i) - 1) << (4 * i);
      ASSERT_TRUE(st.add_tensor("l.qweight", std::vector<int64_t>{16, 8}, QuantType::kI32, bytes_of(qw)).is_ok());
      ASSERT_TRUE(st.add_tensor("l.g_idx", std::vector<int64_t>{128}, QuantType::kI32,
                                bytes_of(std::vector<uint32_t>(128, 0))).is_ok());
    }
    ASSERT_TRUE(st.add_tensor("l.qzeros", std::vector<int64_t>{1, 1}, QuantType::kI32, bytes_of(qz)).is_ok());
    ASSERT_TRUE(st.add_tensor("l.scales", std::vector<int64_t>{1, 8}, QuantType::kF16, scales).is_ok());
    const std::string file = dir.sub(awq ? "awq.safetensors" : "gptq.safetensors");
    ASSERT_TRUE(st.write(file).is_ok());
    auto ck = SafetensorsCheckpoint::open(file);
    ASSERT_TRUE(ck.is_ok());
    QuantizationConfig q;
    q.method = awq ? CheckpointQuant::kAwq : CheckpointQuant::kGptq;
    auto lin = convert_int4_linear(**ck, "l", q);
    ASSERT_TRUE(lin.is_ok()) << lin.status().to_string();
    ASSERT_EQ(lin->out_features, 8);
    ASSERT_EQ(lin->in_features, 128);
    std::vector<float> row(128);
    for (int n = 0; n < 8; ++n) {
      dequantize_row(QuantType::kI4_G128, lin->bytes.data() + 68 * n, row.data(), 128);
      for (int k = 0; k < 128; ++k)
        ASSERT_EQ(row[k], (static_cast<float>(level(n, k)) - static_cast<float>(zero(n))) * 0.5f * (n + 1))
            << (awq ? "awq" : "gptq") << " n " << n << " k " << k;
    }
  }
}

TEST(PackedCheckpointErrors, ActOrderGidxIsRefusedNamingTheTensor) {
  TempDir dir;
  SyntheticModelSpec spec = small_spec();
  spec.hf_int4_packing = "gptq";
  spec.gptq_act_order = true;
  ASSERT_TRUE(write_synthetic_hf(spec, dir.sub("m")).is_ok());
  auto s = WeightStore::open(dir.sub("m"));
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find(".g_idx"), std::string::npos) << s.status().to_string();
  EXPECT_NE(s.status().message().find("act-order"), std::string::npos) << s.status().to_string();
}

TEST(PackedCheckpointErrors, QuantizationConfigIsValidated) {
  const std::string base =
      R"({"architectures":["LlamaForCausalLM"],"hidden_size":256,"num_hidden_layers":1,"num_attention_heads":4,)"
      R"("intermediate_size":512,"vocab_size":512,"max_position_embeddings":64,"quantization_config":)";
  auto ok = parse_hf_config(base + R"({"quant_method":"gptq","bits":4,"group_size":128,"sym":true,"desc_act":false}})", "c");
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->quantization.method, CheckpointQuant::kGptq);
  EXPECT_TRUE(ok->quantization.sym);
  auto awq = parse_hf_config(base + R"({"quant_method":"awq","w_bit":4,"q_group_size":128,"zero_point":true,"version":"gemm"}})", "c");
  ASSERT_TRUE(awq.is_ok()) << awq.status().to_string();
  EXPECT_EQ(awq->quantization.method, CheckpointQuant::kAwq);
  EXPECT_FALSE(awq->quantization.sym);
  auto g64 = parse_hf_config(base + R"({"quant_method":"awq","bits":4,"group_size":64}})", "c");
  ASSERT_FALSE(g64.is_ok());
  EXPECT_NE(g64.status().message().find("group_size is 64"), std::string::npos);
  auto b8 = parse_hf_config(base + R"({"quant_method":"gptq","bits":8,"group_size":128}})", "c");
  ASSERT_FALSE(b8.is_ok());
  auto other = parse_hf_config(base + R"({"quant_method":"bitsandbytes"}})", "c");
  ASSERT_FALSE(other.is_ok());
  EXPECT_NE(other.status().message().find("bitsandbytes"), std::string::npos);
}

TEST(LoadTimeQuant, KeepsEmbeddingAndNormsAndQuantizesLinears) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_hf(small_spec(), dir.sub("m")).is_ok());
  auto s = WeightStore::open(dir.sub("m"));
  ASSERT_TRUE(s.is_ok());
  auto w8 = bind_model_weights(**s, WeightLoadOptions{.codec = &cpu_weight_codec(), .quant = WeightQuant::kInt8});
  ASSERT_TRUE(w8.is_ok());
  EXPECT_EQ(w8->embed.type, QuantType::kF16);
  EXPECT_EQ(w8->lm_head.type, QuantType::kF16);
  EXPECT_EQ(w8->layers[0].wq.type, QuantType::kI8_CH);
  EXPECT_EQ(w8->layers[1].w_down.type, QuantType::kI8_CH);
  auto w4 = bind_model_weights(
      **s, WeightLoadOptions{.codec = &cpu_weight_codec(), .quant = WeightQuant::kInt4, .quantize_lm_head = true});
  ASSERT_TRUE(w4.is_ok());
  EXPECT_EQ(w4->lm_head.type, QuantType::kI4_G128);
  EXPECT_EQ(w4->embed.type, QuantType::kF16);
  // The quantized weights are the RTN of the stored values.
  auto q = (*s)->get("model.layers.0.mlp.up_proj.weight");
  ASSERT_TRUE(q.is_ok());
  const auto ref = dequantize(*q);
  const auto got = dequantize(w8->layers[0].w_up);
  for (int64_t r = 0; r < q->rows(); ++r) {
    float amax = 0;
    for (int64_t c = 0; c < q->cols(); ++c) amax = std::max(amax, std::fabs(ref[static_cast<size_t>(r * q->cols() + c)]));
    for (int64_t c = 0; c < q->cols(); ++c) {
      const size_t i = static_cast<size_t>(r * q->cols() + c);
      ASSERT_LE(std::fabs(got[i] - ref[i]), 0.5f * amax / 127 * 1.001f) << r << "," << c;
    }
  }
  EXPECT_FALSE(parse_weight_quant("int3").is_ok());
  EXPECT_EQ(*parse_weight_quant("int4-sym"), WeightQuant::kInt4Sym);
}

// The quantized models compute nearly the float model's logits (a wrong scale, zero or nibble
// order would decorrelate them).
TEST(LoadTimeQuant, LogitsStayCloseToTheFloatModel) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_hf(small_spec(), dir.sub("m")).is_ok());
  const std::vector<int32_t> prompt = {1, 17, 42, 300, 5, 77, 9, 123};
  GenerateOptions go;
  go.max_tokens = 1;
  go.sampling.temperature = 0.0f;
  auto logits = [&](WeightQuant q) {
    auto m = LocalModel::load({.path = dir.sub("m"), .runtime = {.threads = 2, .quant = q}});
    EXPECT_TRUE(m.is_ok());
    auto out = generate(**m, prompt, go);
    EXPECT_TRUE(out.is_ok());
    return out->prompt_last_logits;
  };
  const std::vector<float> ref = logits(WeightQuant::kNone);
  for (auto [q, min_corr] : {std::pair{WeightQuant::kInt8, 0.999}, {WeightQuant::kInt4, 0.95}, {WeightQuant::kInt4Sym, 0.95}}) {
    const std::vector<float> got = logits(q);
    ASSERT_EQ(got.size(), ref.size());
    double sab = 0, saa = 0, sbb = 0, ma = 0, mb = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ma += ref[i];
      mb += got[i];
    }
    ma /= static_cast<double>(ref.size());
    mb /= static_cast<double>(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      sab += (ref[i] - ma) * (got[i] - mb);
      saa += (ref[i] - ma) * (ref[i] - ma);
      sbb += (got[i] - mb) * (got[i] - mb);
    }
    const double corr = sab / std::sqrt(saa * sbb);
    std::printf("%s: logits correlation with F16 %.5f\n", std::string(weight_quant_name(q)).c_str(), corr);
    EXPECT_GT(corr, min_corr) << weight_quant_name(q);
  }
}

// Greedy generation of `max_tokens` after `prompt` with the 16-row layouts
// (TESSERA_CPU_REPACK=1, out[1]) and with the file's (out[0]); `inspect` sees each loaded model.
// The re-laid model is loaded and run under each SIMD path this CPU has (AVX2, AVX-512: both
// re-lay and read the groups), which must agree with each other; out[1] is the last.
void generate_with_both_layouts(const LocalModelOptions& options, const std::vector<int32_t>& prompt,
                                std::optional<GenerateOutput> (&out)[2],
                                const std::function<void(const LocalModel&, bool repacked)>& inspect = {}) {
  GenerateOptions go;
  go.max_tokens = 10;
  go.ignore_eos = true;
  go.sampling.temperature = 0.0f;
  std::vector<cpu::Isa> isas = {cpu::Isa::kAvx2};
  if (cpu::detected_isa() >= cpu::Isa::kAvx512) isas.push_back(cpu::Isa::kAvx512);
  for (const int repack : {1, 0}) {
    ASSERT_EQ(setenv("TESSERA_CPU_REPACK", repack ? "1" : "0", 1), 0);
    for (const cpu::Isa isa : isas) {
      if (repack == 0 && isa != isas.back()) continue;
      cpu::set_max_isa(isa);
      auto m = LocalModel::load(options);
      cpu::set_max_isa(cpu::Isa::kAvx512);
      ASSERT_TRUE(m.is_ok()) << m.status().to_string();
      if (inspect) inspect(**m, repack == 1);
      cpu::set_max_isa(isa);
      auto g = generate(**m, prompt, go);
      cpu::set_max_isa(cpu::Isa::kAvx512);
      ASSERT_TRUE(g.is_ok()) << g.status().to_string();
      if (out[repack]) {
        EXPECT_EQ(g->ids, out[repack]->ids) << cpu::isa_name(isa);
        EXPECT_EQ(g->prompt_last_logits, out[repack]->prompt_last_logits) << cpu::isa_name(isa);
      }
      out[repack] = std::move(*g);
    }
  }
  unsetenv("TESSERA_CPU_REPACK");
}

// GGUF block matrices re-laid at load for the AVX2 and AVX-512 kernels (16-row groups; the
// default there) give exactly the logits and tokens of the file's layout (TESSERA_CPU_REPACK=0), for a
// prompt (prefill tiles) and decode: Q8_0, Q4_0 and a Q4_K_M mix (Q4_K, Q6_K).
TEST(CpuRepack, InterleavedGgufMatricesGiveTheFileLayoutsResults) {
  if (cpu::detected_isa() < cpu::Isa::kAvx2) GTEST_SKIP() << "the 16-row layouts need AVX2";
  TempDir dir;
  for (const QuantType type : {QuantType::kQ8_0, QuantType::kQ4_0, QuantType::kQ4_K}) {
    SyntheticModelSpec spec = small_spec();
    spec.weight_type = type;
    spec.gguf_mixed_q4_k_m = type == QuantType::kQ4_K;
    const std::string path = dir.sub(std::string(quant_name(type)) + ".gguf");
    ASSERT_TRUE(write_synthetic_gguf(spec, path).is_ok());
    std::vector<int32_t> prompt;
    for (int32_t i = 0; i < 37; ++i) prompt.push_back(1 + (i * 29) % 500);
    std::optional<GenerateOutput> out[2];
    ASSERT_NO_FATAL_FAILURE(generate_with_both_layouts({.path = path, .runtime = {.threads = 2}}, prompt, out));
    EXPECT_EQ(out[1]->ids, out[0]->ids) << quant_name(type);
    EXPECT_EQ(out[1]->prompt_last_logits, out[0]->prompt_last_logits) << quant_name(type);
  }
  // The load-time formats (I8_CH with its row scale, I4_G128), re-laid in the buffers the load
  // owns, the LM head quantized too.
  ASSERT_TRUE(write_synthetic_hf(small_spec(), dir.sub("hf")).is_ok());
  for (const WeightQuant q : {WeightQuant::kInt8, WeightQuant::kInt4}) {
    const std::vector<int32_t> prompt = {1, 17, 42, 300, 5, 77, 9, 11, 400, 3, 2, 8, 13, 21, 34, 55, 89, 144, 233};
    std::optional<GenerateOutput> out[2];
    ASSERT_NO_FATAL_FAILURE(generate_with_both_layouts(
        {.path = dir.sub("hf"), .runtime = {.threads = 2, .quant = q, .quant_lm_head = true}}, prompt, out,
        [](const LocalModel& m, bool repacked) {
          if (!repacked) return;
          EXPECT_TRUE(cpu::is_r16(m.weights().layers[0].wq.type)) << quant_name(m.weights().layers[0].wq.type);
          EXPECT_TRUE(cpu::is_r16(m.weights().lm_head.type)) << quant_name(m.weights().lm_head.type);
        }));
    EXPECT_EQ(out[1]->ids, out[0]->ids) << weight_quant_name(q);
    EXPECT_EQ(out[1]->prompt_last_logits, out[0]->prompt_last_logits) << weight_quant_name(q);
  }
}

// A tied embedding in a block format is re-laid once for the LM head and looked up out of the
// 16-row groups: one copy of the matrix (head and embedding share it), the file layout's tokens
// and logits.
TEST(CpuRepack, TiedEmbeddingIsReLaidOnceAndStillLooksUpRows) {
  if (cpu::detected_isa() < cpu::Isa::kAvx2) GTEST_SKIP() << "the 16-row layouts need AVX2";
  TempDir dir;
  for (const QuantType type : {QuantType::kQ8_0, QuantType::kQ4_K}) {
    SyntheticModelSpec spec = small_spec();
    spec.weight_type = type;
    spec.tie_embeddings = true;
    const std::string path = dir.sub(std::string(quant_name(type)) + "-tied.gguf");
    ASSERT_TRUE(write_synthetic_gguf(spec, path).is_ok());
    std::vector<int32_t> prompt;
    for (int32_t i = 0; i < 21; ++i) prompt.push_back(1 + (i * 37) % 500);
    std::optional<GenerateOutput> out[2];
    ASSERT_NO_FATAL_FAILURE(
        generate_with_both_layouts({.path = path, .runtime = {.threads = 2}}, prompt, out, [](const LocalModel& m, bool repacked) {
          const ModelWeights& w = m.weights();
          EXPECT_EQ(w.lm_head.data, w.embed.data);
          EXPECT_EQ(cpu::is_r16(w.embed.type), repacked) << quant_name(w.embed.type);
          EXPECT_EQ(w.lm_head.type, w.embed.type);
        }));
    EXPECT_EQ(out[1]->ids, out[0]->ids) << quant_name(type);
    EXPECT_EQ(out[1]->prompt_last_logits, out[0]->prompt_last_logits) << quant_name(type);
  }
  // Every row comes back out of the groups as the file has it.
  const int64_t rows = 48, k = 256;
  std::vector<uint8_t> file(static_cast<size_t>(rows) * row_bytes(QuantType::kQ6_K, k)), laid(file.size()),
      row(row_bytes(QuantType::kQ6_K, k));
  for (size_t i = 0; i < file.size(); ++i) file[i] = static_cast<uint8_t>(i * 131 + i / 7);
  cpu::repack_r16(QuantType::kQ6_K, file.data(), rows, k, laid.data());
  ASSERT_NE(laid, file);
  for (int64_t r = 0; r < rows; ++r) {
    cpu::unpack_r16_row(QuantType::kQ6_K_R16, laid.data(), r, k, row.data());
    ASSERT_TRUE(std::equal(row.begin(), row.end(), file.begin() + static_cast<std::ptrdiff_t>(r * row.size()))) << r;
  }
}

// Row-parallel O / down slices keep whole groups (and I8_CH's row scales); a split inside a
// group is an error naming the tensor.
TEST(TpSlice, QuantizedRowParallelSlicesFollowGroups) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_hf(small_spec(), dir.sub("m")).is_ok());
  auto s = WeightStore::open(dir.sub("m"));
  ASSERT_TRUE(s.is_ok());
  const ModelConfig& c = (*s)->config();
  for (WeightQuant wq : {WeightQuant::kInt8, WeightQuant::kInt4}) {
    auto full = bind_model_weights(**s, WeightLoadOptions{.codec = &cpu_weight_codec(), .quant = wq});
    ASSERT_TRUE(full.is_ok());
    const std::vector<float> down = dequantize(full->layers[1].w_down);
    const std::vector<float> wo = dequantize(full->layers[0].wo);
    for (int rank = 0; rank < 2; ++rank) {
      auto layout = plan_shard_layout(c, TpConfig{rank, 2});
      ASSERT_TRUE(layout.is_ok());
      auto again = bind_model_weights(**s, WeightLoadOptions{.codec = &cpu_weight_codec(), .quant = wq});
      auto sw = slice_model_weights(std::move(*again), c, *layout);
      ASSERT_TRUE(sw.is_ok()) << sw.status().to_string();
      const TensorView& d = sw->weights.layers[1].w_down;
      ASSERT_EQ(d.cols(), c.ffn / 2);
      const std::vector<float> part = dequantize(d);
      for (int64_t r = 0; r < d.rows(); ++r)
        for (int64_t k = 0; k < d.cols(); ++k)
          ASSERT_EQ(part[static_cast<size_t>(r * d.cols() + k)], down[static_cast<size_t>(r * c.ffn + layout->ffn_begin + k)]);
      const TensorView& o = sw->weights.layers[0].wo;
      const std::vector<float> opart = dequantize(o);
      const int64_t q0 = layout->head_begin * c.head_dim;
      for (int64_t r = 0; r < o.rows(); ++r)
        for (int64_t k = 0; k < o.cols(); ++k)
          ASSERT_EQ(opart[static_cast<size_t>(r * o.cols() + k)], wo[static_cast<size_t>(r * c.hidden + q0 + k)]);
    }
  }
  // TP 4: O's 256 input columns split in 64s, inside the groups of 128.
  auto full = bind_model_weights(**s, WeightLoadOptions{.codec = &cpu_weight_codec(), .quant = WeightQuant::kInt4});
  auto layout = plan_shard_layout(c, TpConfig{1, 4});
  ASSERT_TRUE(layout.is_ok()) << layout.status().to_string();
  auto sw = slice_model_weights(std::move(*full), c, *layout);
  ASSERT_FALSE(sw.is_ok());
  EXPECT_NE(sw.status().message().find("o_proj.weight"), std::string::npos) << sw.status().to_string();
  EXPECT_NE(sw.status().message().find("quantization groups"), std::string::npos) << sw.status().to_string();
}

}  // namespace
}  // namespace tessera
