// Importance matrices (model/importance.h): the accumulator's means, the file's round trip and
// its load errors, and the load path that uses them (WeightLoadOptions::importance): a matrix
// of the wrong length is refused naming the tensor, a right one changes the quantized bytes
// and lowers the importance-weighted error. Also the --quant modes this landed with
// (weight_quant_type_for's fallbacks, keep_unquantizable).
#include "model/importance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/quant.h"
#include "kernels/weight_codec.h"
#include "model/weight_store.h"
#include "tests/model/loader_test_util.h"
#include "tools/testmodel/synthetic_model.h"

namespace tessera {
namespace {

using loader_test::TempDir;
// The message `text` holds `part` (printed whole when it does not).
#define EXPECT_CONTAINS(text, part)                                                  \
  EXPECT_NE(std::string(text).find(part), std::string::npos)                         \
      << "expected \"" << (part) << "\" in:\n" << (text)

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(out.good()) << path;
  out << text;
}

TEST(ImportanceAccumulator, MeansOfSquaresPerColumn) {
  ImportanceAccumulator acc;
  const float a[] = {1, 2, 3,    //
                     -1, 0, 3};  // two tokens of three columns
  const float b[] = {2, -2, 0};
  acc.add("w", a, 2, 3);
  acc.add("w", b, 1, 3);
  const float c[] = {0.5f, 4};
  acc.add("v", c, 1, 2);
  EXPECT_EQ(acc.tokens("w"), 3);
  EXPECT_EQ(acc.tokens("v"), 1);
  EXPECT_EQ(acc.tokens("nothing"), 0);
  const ImportanceMatrix m = acc.matrix();
  ASSERT_EQ(m.columns.size(), 2u);
  const std::vector<float>& w = m.columns.at("w");
  ASSERT_EQ(w.size(), 3u);
  EXPECT_FLOAT_EQ(w[0], (1 + 1 + 4) / 3.0f);
  EXPECT_FLOAT_EQ(w[1], (4 + 0 + 4) / 3.0f);
  EXPECT_FLOAT_EQ(w[2], (9 + 9 + 0) / 3.0f);
  EXPECT_FLOAT_EQ(m.columns.at("v")[0], 0.25f);
  EXPECT_FLOAT_EQ(m.columns.at("v")[1], 16.0f);
  EXPECT_EQ(m.tokens, 3) << "the most tokens any weight saw";
  EXPECT_TRUE(ImportanceAccumulator().matrix().columns.empty());
}

TEST(ImportanceFile, SaveLoadRoundTrip) {
  TempDir dir;
  ImportanceMatrix m;
  m.model = "stories260K-f32.gguf";
  m.model_sha256 = std::string(64, 'f');
  m.source = "corpus abc calibration text";
  m.tokens = 8192;
  m.columns["model.layers.0.self_attn.q_proj.weight"] = {0.0f, 1.5f, 1e-7f, 3.25e6f};
  m.columns["model.layers.1.mlp.down_proj.weight"] = {0.125f};
  const std::string path = dir.file("imatrix.json");
  ASSERT_TRUE(save_importance(m, path).is_ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto got = load_importance(path);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->model, m.model);
  EXPECT_EQ(got->model_sha256, m.model_sha256);
  EXPECT_EQ(got->source, m.source);
  EXPECT_EQ(got->tokens, m.tokens);
  EXPECT_EQ(got->columns, m.columns) << "floats survive the JSON text bit for bit";
  std::ifstream in(path);
  EXPECT_EQ(nlohmann::json::parse(in).at("format"), "tessera-importance-1");
}

TEST(ImportanceFile, LoadErrorsNameTheFileAndTheTensor) {
  TempDir dir;
  auto missing = load_importance(dir.file("none.json"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(missing.status().message(), dir.file("none.json"));

  struct Case {
    const char* name;
    const char* text;
    std::vector<std::string> says;
  };
  const Case cases[] = {
      {"not-json.json", "imatrix: yes", {"not JSON"}},
      {"truncated.json", R"({"format": "tessera-importance-1", "tensors": {"w": [1, 2)", {"not JSON"}},
      {"format.json", R"({"format": "tessera-eval-1", "tensors": {}})", {"'format'"}},
      {"negative.json", R"({"format": "tessera-importance-1", "tensors": {"model.layers.0.mlp.up_proj.weight": [1, -0.5]}})",
       {"'model.layers.0.mlp.up_proj.weight'", "-0.5", "non-negative"}},
      {"string.json", R"({"format": "tessera-importance-1", "tensors": {"w": [1, "2"]}})", {"'w'", "\"2\""}},
      {"empty-array.json", R"({"format": "tessera-importance-1", "tensors": {"w": []}})", {"'w'", "non-empty array"}},
      {"not-array.json", R"({"format": "tessera-importance-1", "tensors": {"w": 3}})", {"'w'", "non-empty array"}},
      {"tensors-array.json", R"({"format": "tessera-importance-1", "tensors": [1]})", {"'tensors'"}},
      {"no-tensors.json", R"({"format": "tessera-importance-1"})", {"tensors"}},
      {"huge.json", R"({"format": "tessera-importance-1", "tensors": {"w": [1e400]}})", {"not JSON"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(c.name);
    write_text(path, c.text);
    auto r = load_importance(path);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(r.status().message(), path);
    for (const std::string& s : c.says) EXPECT_CONTAINS(r.status().message(), s);
  }
}

// ---- the load path

// Every matrix dimension a multiple of 256, so q2_k keeps its own format everywhere.
SyntheticModelSpec small_spec() { return block_aligned_spec(QuantType::kF32, 77); }

const char* const kLinear[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                               "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                               "mlp.down_proj.weight"};

// A strongly uneven importance per column (a few columns matter 100x more), as activations
// with outlier channels give.
std::vector<float> uneven_importance(int64_t cols, int seed) {
  std::vector<float> v(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) v[static_cast<size_t>(j)] = (j * 7 + seed) % 13 == 0 ? 100.0f : 0.01f + (j % 5);
  return v;
}

std::vector<float> dequantized(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.rows() * t.cols()));
  for (int64_t r = 0; r < t.rows(); ++r) dequantize_row(t.type, t.row_ptr(r), out.data() + r * t.cols(), t.cols());
  return out;
}

double weighted_error(const std::vector<float>& want, const std::vector<float>& got, const std::vector<float>& imp) {
  const size_t cols = imp.size();
  double e = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(want[i]) - got[i];
    e += imp[i % cols] * d * d;
  }
  return e;
}

TEST(ImportanceLoad, AWrongLengthIsRefusedNamingTheTensor) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_hf(small_spec(), dir.file("hf")).is_ok());
  auto store = WeightStore::open(dir.file("hf"));
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  ImportanceMatrix m;
  m.model = "another-model.gguf";
  m.columns["model.layers.1.mlp.down_proj.weight"] = std::vector<float>(100, 1.0f);  // 512 columns there
  WeightLoadOptions o;
  o.codec = &cpu_weight_codec();
  o.quant = WeightQuant::kQ2_K;
  o.importance = &m;
  o.threads = 2;
  auto w = bind_model_weights(**store, o);
  ASSERT_FALSE(w.is_ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(w.status().message(), "'model.layers.1.mlp.down_proj.weight'");
  EXPECT_CONTAINS(w.status().message(), "100 columns");
  EXPECT_CONTAINS(w.status().message(), "512");
  EXPECT_CONTAINS(w.status().message(), "another-model.gguf");

  // The same for a 32-block format.
  o.quant = WeightQuant::kQ4_0;
  w = bind_model_weights(**store, o);
  ASSERT_FALSE(w.is_ok());
  EXPECT_CONTAINS(w.status().message(), "'model.layers.1.mlp.down_proj.weight'");
}

TEST(ImportanceLoad, WeightsTheQuantizationWhereItIsGiven) {
  TempDir dir;
  const SyntheticModelSpec spec = small_spec();
  ASSERT_TRUE(write_synthetic_hf(spec, dir.file("hf")).is_ok());
  auto store = WeightStore::open(dir.file("hf"));
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  auto f32 = bind_model_weights(**store);
  ASSERT_TRUE(f32.is_ok()) << f32.status().to_string();

  ImportanceMatrix m;
  m.model = "hf";
  for (int64_t l = 0; l < spec.n_layers; ++l)
    for (const char* suffix : kLinear) {
      const std::string name = "model.layers." + std::to_string(l) + "." + suffix;
      auto t = (*store)->get(name);
      ASSERT_TRUE(t.is_ok()) << t.status().to_string();
      m.columns[name] = uneven_importance(t->cols(), static_cast<int>(l));
    }
  // The layer-1 o_proj is left out: quantized as without importance.
  m.columns.erase("model.layers.1.self_attn.o_proj.weight");

  for (const WeightQuant q : {WeightQuant::kQ2_K, WeightQuant::kQ4_0}) {
    const std::string qname(weight_quant_name(q));
    SCOPED_TRACE(qname);
    WeightLoadOptions plain;
    plain.codec = &cpu_weight_codec();
    plain.quant = q;
    plain.threads = 2;
    WeightLoadOptions weighted = plain;
    weighted.importance = &m;
    auto a = bind_model_weights(**store, plain);
    auto b = bind_model_weights(**store, weighted);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    const QuantType type = weight_quant_type(q);
    double err_plain = 0, err_weighted = 0;
    for (int64_t l = 0; l < spec.n_layers; ++l) {
      const LayerWeights& la = a->layers[static_cast<size_t>(l)];
      const LayerWeights& lb = b->layers[static_cast<size_t>(l)];
      const LayerWeights& lf = f32->layers[static_cast<size_t>(l)];
      const TensorView* pa[] = {&la.wq, &la.wk, &la.wv, &la.wo, &la.w_gate, &la.w_up, &la.w_down};
      const TensorView* pb[] = {&lb.wq, &lb.wk, &lb.wv, &lb.wo, &lb.w_gate, &lb.w_up, &lb.w_down};
      const TensorView* pf[] = {&lf.wq, &lf.wk, &lf.wv, &lf.wo, &lf.w_gate, &lf.w_up, &lf.w_down};
      for (size_t i = 0; i < 7; ++i) {
        const std::string name = "model.layers." + std::to_string(l) + "." + kLinear[i];
        SCOPED_TRACE(name);
        ASSERT_EQ(pa[i]->type, type);
        ASSERT_EQ(pb[i]->type, type);
        ASSERT_EQ(pa[i]->nbytes(), pb[i]->nbytes());
        const bool same = std::memcmp(pa[i]->data, pb[i]->data, pa[i]->nbytes()) == 0;
        auto it = m.columns.find(name);
        if (it == m.columns.end()) {
          EXPECT_TRUE(same) << "no importance given: the plain encoder's bytes";
          continue;
        }
        EXPECT_FALSE(same) << "the importance changed nothing";
        const std::vector<float> want = dequantized(*pf[i]);
        err_plain += weighted_error(want, dequantized(*pa[i]), it->second);
        err_weighted += weighted_error(want, dequantized(*pb[i]), it->second);
      }
    }
    std::printf("  %-5s importance-weighted squared error: plain %.4g, weighted %.4g (%.1f%%)\n", qname.c_str(),
                err_plain, err_weighted, 100.0 * err_weighted / err_plain);
    EXPECT_LT(err_weighted, err_plain) << "weighting by importance must lower the weighted error";
    // The embedding stays as stored either way.
    EXPECT_EQ(b->embed.type, QuantType::kF32);
  }
}

TEST(WeightQuantModes, NamesRoundTripAndFallbacks) {
  for (const WeightQuant q : all_weight_quants()) {
    const std::string name(weight_quant_name(q));
    auto p = parse_weight_quant(name);
    ASSERT_TRUE(p.is_ok()) << name;
    EXPECT_EQ(*p, q) << name;
  }
  for (const char* name : {"f32", "q8_0", "q4_0", "q5_0", "q4_k", "q5_k", "q6_k"})
    EXPECT_TRUE(parse_weight_quant(name).is_ok()) << name;
  auto bad = parse_weight_quant("q7_0");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_CONTAINS(bad.status().message(), "q4_k");

  struct Case {
    WeightQuant q;
    int64_t cols;
    QuantType want;
  };
  const Case cases[] = {
      {WeightQuant::kF32, 64, QuantType::kF32},    {WeightQuant::kQ8_0, 64, QuantType::kQ8_0},
      {WeightQuant::kQ4_0, 96, QuantType::kQ4_0},  {WeightQuant::kQ5_0, 640, QuantType::kQ5_0},
      {WeightQuant::kQ4_K, 512, QuantType::kQ4_K}, {WeightQuant::kQ4_K, 640, QuantType::kQ5_0},
      {WeightQuant::kQ5_K, 256, QuantType::kQ5_K}, {WeightQuant::kQ5_K, 640, QuantType::kQ5_0},
      {WeightQuant::kQ6_K, 768, QuantType::kQ6_K}, {WeightQuant::kQ6_K, 640, QuantType::kQ8_0},
      {WeightQuant::kQ2_K, 640, QuantType::kQ4_0}, {WeightQuant::kQ3_K, 640, QuantType::kQ4_0},
      {WeightQuant::kTQ2_0, 640, QuantType::kQ4_0}, {WeightQuant::kTQ1_0, 256, QuantType::kTQ1_0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(weight_quant_name(c.q)) + " cols " + std::to_string(c.cols));
    EXPECT_EQ(weight_quant_type_for(c.q, c.cols), c.want);
  }
}

// stories260K's shape in small: an FFN width (172) that fills no 32-block. --quant refuses it
// naming the tensor when keep_unquantizable is off; by default (on) the matrix stays as stored
// and the rest is quantized.
TEST(WeightQuantModes, KeepUnquantizableLeavesOddMatricesAsStored) {
  TempDir dir;
  SyntheticModelSpec s = small_spec();
  s.hidden = 64;
  s.ffn = 172;
  s.n_heads = 8;
  s.n_kv_heads = 4;
  ASSERT_TRUE(write_synthetic_hf(s, dir.file("odd")).is_ok());
  auto store = WeightStore::open(dir.file("odd"));
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  WeightLoadOptions o;
  o.codec = &cpu_weight_codec();
  o.quant = WeightQuant::kQ4_0;
  o.threads = 2;
  o.keep_unquantizable = false;
  auto refused = bind_model_weights(**store, o);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(refused.status().message(), "mlp.down_proj.weight");
  EXPECT_CONTAINS(refused.status().message(), "172");

  o.keep_unquantizable = true;
  auto kept = bind_model_weights(**store, o);
  ASSERT_TRUE(kept.is_ok()) << kept.status().to_string();
  for (const LayerWeights& l : kept->layers) {
    EXPECT_EQ(l.wq.type, QuantType::kQ4_0);
    EXPECT_EQ(l.w_up.type, QuantType::kQ4_0);
    EXPECT_EQ(l.w_down.type, QuantType::kF32) << "172 columns: kept as stored";
  }
}

}  // namespace
}  // namespace tessera
