// Gemma 3 on the CPU backend with the synthetic "gemma3-tiny" model (local and global layers, a
// window of 8 keys, head_dim 64 != hidden / heads, 1 KV head): its HF directory and its F32 GGUF
// give the same logits at TP 1 and TP 2, and those logits match a plain scalar reference written
// from the Gemma 3 equations and the generator's values (not from Tessera's loader or decoder).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "comm/device_comm.h"
#include "common/dtype.h"
#include "common/thread_pool.h"
#include "decoder/arch.h"
#include "model/weight_store.h"
#include "shard/cpu_backend.h"
#include "shard/tp_slice.h"
#include "tools/testmodel/synthetic_model.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBlockSize = 16;

SyntheticModelSpec gemma_spec() {
  SyntheticModelSpec s = synthetic_preset("gemma3-tiny").value();
  s.vocab = 512;
  return s;
}

// 40 tokens: five windows' worth, so local layers see only the last 8 keys at the end.
std::vector<int32_t> prompt_tokens() {
  std::vector<int32_t> p = {1};
  for (int32_t i = 1; i < 40; ++i) p.push_back(3 + (i * 53 + i * i * 7) % 500);
  return p;
}

// The HF directory and GGUF file of gemma_spec(), written once for the suite.
class Gemma3Forward : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path dir = fs::path(::testing::TempDir()) / ("tessera_gemma3_" + std::to_string(::getpid()));
    dir_ = new std::string(dir.string());
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    ASSERT_TRUE(write_synthetic_hf(gemma_spec(), hf_path()).is_ok());
    ASSERT_TRUE(write_synthetic_gguf(gemma_spec(), gguf_path()).is_ok());
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
    dir_ = nullptr;
  }
  static std::string hf_path() { return *dir_ + "/hf"; }
  static std::string gguf_path() { return *dir_ + "/m.gguf"; }

  static std::string* dir_;
};
std::string* Gemma3Forward::dir_ = nullptr;

// Tessera's CPU logits of every prompt position ([n, vocab]) at tensor parallelism `tp`, ranks as
// threads over in-process communicators. The prompt is prefilled in uneven chunks (the last
// one a single token, as a decode step), so windows and RoPE positions cross chunk boundaries.
// Every rank must return the same logits; rank 0's come back.
std::vector<float> tessera_logits(const std::string& path, int tp, const std::vector<int32_t>& prompt) {
  auto store = WeightStore::open(path);
  EXPECT_TRUE(store.is_ok()) << store.status().to_string();
  if (!store.is_ok()) return {};
  const ModelConfig& c = (*store)->config();
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t num_blocks = (n + kBlockSize - 1) / kBlockSize;
  std::vector<std::unique_ptr<DeviceComm>> comms = make_in_process_comms(tp);
  std::vector<std::vector<float>> out(static_cast<size_t>(tp));
  std::vector<Status> status(static_cast<size_t>(tp), Status::ok());
  std::vector<ShardWeights> weights;
  std::vector<ShardLayout> layouts;
  for (int r = 0; r < tp; ++r) {
    auto layout = plan_shard_layout(c, TpConfig{r, tp});
    EXPECT_TRUE(layout.is_ok()) << layout.status().to_string();
    if (!layout.is_ok()) return {};
    auto full = bind_model_weights(**store);
    EXPECT_TRUE(full.is_ok()) << full.status().to_string();
    if (!full.is_ok()) return {};
    auto w = slice_model_weights(std::move(full).value(), c, *layout);
    EXPECT_TRUE(w.is_ok()) << w.status().to_string();
    if (!w.is_ok()) return {};
    layouts.push_back(*layout);
    weights.push_back(std::move(w).value());
  }
  const int64_t cuts[] = {0, 11, 26, n - 1, n};
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<size_t>(r);
      ThreadPool pool(ThreadPoolOptions{.num_threads = 1});
      CpuBackend backend(c, layouts[i], std::move(weights[i]), &pool, comms[i].get(), {});
      status[i] = backend.configure_kv(kBlockSize, num_blocks, 0);
      std::vector<int32_t> table(static_cast<size_t>(num_blocks));
      for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(table.size() - 1 - b);
      std::vector<float> logits;
      for (size_t k = 0; k + 1 < std::size(cuts) && status[i].is_ok(); ++k) {
        const int64_t start = cuts[k], len = cuts[k + 1] - cuts[k];
        SequenceInput in{std::span<const int32_t>(prompt.data() + start, static_cast<size_t>(len)), start, table, true,
                         true};
        status[i] = backend.run(std::span<const SequenceInput>(&in, 1), logits);
        out[i].insert(out[i].end(), logits.begin(), logits.end());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t r = 0; r < out.size(); ++r) {
    EXPECT_TRUE(status[r].is_ok()) << "rank " << r << ": " << status[r].to_string();
    EXPECT_EQ(out[r], out[0]) << "rank " << r << " has other logits than rank 0";
  }
  EXPECT_EQ(static_cast<int64_t>(out[0].size()), n * c.vocab);
  return out[0];
}

// max |got - want| / max(1, max |want|).
float max_rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  float scale = 1.0f, err = 0.0f;
  for (float w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
  return err / scale;
}

// ---------------------------------------------------------------------------------------------
// A scalar fp32-weights / double-accumulation reference of Gemma 3 (decoder-only, text), from the
// generator's values. `window_off` and `swap_rope_bases` break it on purpose, to show the
// comparison notices such mistakes.

struct ReferenceOptions {
  bool window_off = false;       // every layer attends over all keys
  bool swap_rope_bases = false;  // local layers with 1e6, global ones with 10,000
};

class Gemma3Reference {
 public:
  explicit Gemma3Reference(const SyntheticModelSpec& s) : s_(s), hd_(synthetic_head_dim(s)) {}

  // Logits of every position, [n, vocab].
  std::vector<float> logits(const std::vector<int32_t>& prompt, const ReferenceOptions& o) const {
    const auto n = static_cast<int64_t>(prompt.size());
    const int64_t H = s_.hidden, V = s_.vocab, q_dim = s_.n_heads * hd_, kv_dim = s_.n_kv_heads * hd_;
    const std::vector<float> embed = values("model.embed_tokens.weight");
    std::vector<double> x(static_cast<size_t>(n * H));
    const double embed_scale = std::sqrt(static_cast<float>(H));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < H; ++i) x[t * H + i] = embed[prompt[t] * H + i] * embed_scale;
    for (int64_t l = 0; l < s_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const bool local = (l + 1) % s_.sliding_window_pattern != 0;
      const double theta = (local != o.swap_rope_bases) ? 10000.0 : static_cast<double>(s_.rope_theta);
      const int64_t window = local && !o.window_off ? s_.sliding_window : n;

      // Attention block.
      std::vector<double> h = rms_norm(x, n, H, norm(p + "input_layernorm.weight"));
      std::vector<double> q = matmul(h, n, values(p + "self_attn.q_proj.weight"), q_dim, H);
      std::vector<double> k = matmul(h, n, values(p + "self_attn.k_proj.weight"), kv_dim, H);
      const std::vector<double> v = matmul(h, n, values(p + "self_attn.v_proj.weight"), kv_dim, H);
      q = rms_norm(q, n * s_.n_heads, hd_, norm(p + "self_attn.q_norm.weight"));
      k = rms_norm(k, n * s_.n_kv_heads, hd_, norm(p + "self_attn.k_norm.weight"));
      rope(q, n, s_.n_heads, theta);
      rope(k, n, s_.n_kv_heads, theta);
      std::vector<double> attn(static_cast<size_t>(n * q_dim));
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd_));  // query_pre_attn_scalar = head_dim
      const int64_t group = s_.n_heads / s_.n_kv_heads;
      for (int64_t t = 0; t < n; ++t) {
        const int64_t first = std::max<int64_t>(0, t - window + 1);  // keys (t - window, t]
        for (int64_t hq = 0; hq < s_.n_heads; ++hq) {
          const int64_t hk = hq / group;
          std::vector<double> score(static_cast<size_t>(t - first + 1));
          double m = -1e300;
          const double* qv = q.data() + (t * s_.n_heads + hq) * hd_;
          for (int64_t j = first; j <= t; ++j) {
            const double* kv = k.data() + (j * s_.n_kv_heads + hk) * hd_;
            double dot = 0;
            for (int64_t d = 0; d < hd_; ++d) dot += qv[d] * kv[d];
            score[j - first] = dot * scale;
            m = std::max(m, score[j - first]);
          }
          double sum = 0;
          for (double& e : score) sum += (e = std::exp(e - m));
          for (int64_t j = first; j <= t; ++j)
            for (int64_t d = 0; d < hd_; ++d)
              attn[(t * s_.n_heads + hq) * hd_ + d] += score[j - first] / sum * v[(j * s_.n_kv_heads + hk) * hd_ + d];
        }
      }
      std::vector<double> o_out = matmul(attn, n, values(p + "self_attn.o_proj.weight"), H, q_dim);
      o_out = rms_norm(o_out, n, H, norm(p + "post_attention_layernorm.weight"));
      for (size_t i = 0; i < x.size(); ++i) x[i] += o_out[i];

      // MLP block: GeGLU with the tanh GELU on the fp16 grid, as the CPU backend's contract says
      // (kernels/activation.h, gelu_tanh_mul_fp16_grid): the input and the GELU each rounded to fp16.
      h = rms_norm(x, n, H, norm(p + "pre_feedforward_layernorm.weight"));
      const std::vector<double> gate = matmul(h, n, values(p + "mlp.gate_proj.weight"), s_.ffn, H);
      std::vector<double> up = matmul(h, n, values(p + "mlp.up_proj.weight"), s_.ffn, H);
      for (size_t i = 0; i < up.size(); ++i) {
        const double g = fp16_to_f32(f32_to_fp16(static_cast<float>(gate[i])));
        const double gelu = 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
        up[i] *= g <= -10.0 ? 0.0 : g >= 10.0 ? g : fp16_to_f32(f32_to_fp16(static_cast<float>(gelu)));
      }
      std::vector<double> down = matmul(up, n, values(p + "mlp.down_proj.weight"), H, s_.ffn);
      down = rms_norm(down, n, H, norm(p + "post_feedforward_layernorm.weight"));
      for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
    }
    const std::vector<double> final_h = rms_norm(x, n, H, norm("model.norm.weight"));
    const std::vector<double> out = matmul(final_h, n, embed, V, H);  // tied LM head
    return std::vector<float>(out.begin(), out.end());
  }

 private:
  std::vector<float> values(const std::string& name) const {
    auto v = synthetic_tensor_values(s_, name);
    EXPECT_TRUE(v.is_ok()) << v.status().to_string();
    return v.is_ok() ? std::move(v).value() : std::vector<float>{};
  }
  // Gemma's (1 + w): the generator gives w - 1, as HF checkpoints store it.
  std::vector<float> norm(const std::string& name) const {
    std::vector<float> w = values(name);
    for (float& x : w) x += 1.0f;
    return w;
  }
  // rows of `dim`: x / sqrt(mean(x^2) + eps) * w.
  std::vector<double> rms_norm(const std::vector<double>& x, int64_t rows, int64_t dim,
                               const std::vector<float>& w) const {
    std::vector<double> y(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += x[r * dim + i] * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + static_cast<double>(s_.rms_eps));
      for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] * inv * w[static_cast<size_t>(i)];
    }
    return y;
  }
  // y[t, o] = sum_i x[t, i] * w[o, i]; w is [out, in] as HF stores it.
  static std::vector<double> matmul(const std::vector<double>& x, int64_t n, const std::vector<float>& w, int64_t out,
                                    int64_t in) {
    std::vector<double> y(static_cast<size_t>(n * out));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t i = 0; i < in; ++i) acc += x[t * in + i] * w[o * in + i];
        y[t * out + o] = acc;
      }
    return y;
  }
  // NEOX / HF rotate-half RoPE at position t: pairs (i, i + hd / 2), angle t * theta^(-2i / hd).
  void rope(std::vector<double>& x, int64_t n, int64_t heads, double theta) const {
    const int64_t half = hd_ / 2;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        double* v = x.data() + (t * heads + h) * hd_;
        for (int64_t i = 0; i < half; ++i) {
          const double exponent = static_cast<double>(2 * i) / static_cast<double>(hd_);
          const double angle = static_cast<double>(t) / std::pow(theta, exponent);
          const double c = std::cos(angle), s = std::sin(angle), a = v[i], b = v[i + half];
          v[i] = a * c - b * s;
          v[i + half] = b * c + a * s;
        }
      }
  }

  SyntheticModelSpec s_;
  int64_t hd_;
};

// max |got - want| over the standard deviation of `want`.
float err_over_std(const std::vector<float>& got, const std::vector<float>& want) {
  double sum = 0, sq = 0, err = 0;
  for (float w : want) sum += w, sq += static_cast<double>(w) * w;
  const double mean = sum / static_cast<double>(want.size());
  const double std = std::sqrt(sq / static_cast<double>(want.size()) - mean * mean);
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
  return static_cast<float>(err / std);
}

TEST_F(Gemma3Forward, DescriptionFollowsTheConfig) {
  auto store = WeightStore::open(gguf_path());
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  auto w = bind_model_weights(**store);
  ASSERT_TRUE(w.is_ok());
  const ModelConfig& c = (*store)->config();
  const ArchSpec a = describe_architecture(c, *w);
  ASSERT_TRUE(a.validate(c, &*w).is_ok()) << a.validate(c, &*w).to_string();
  EXPECT_TRUE(a.post_norms);
  EXPECT_EQ(a.activation, GluActivation::kGeluTanh);
  EXPECT_FLOAT_EQ(a.embed_scale, std::sqrt(128.0f));
  EXPECT_FLOAT_EQ(a.attn_scale, 0.125f);
  ASSERT_EQ(a.rope_inv_freq.size(), 2u);
  ASSERT_EQ(a.layers.size(), 7u);
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const bool global = l == 5;
    EXPECT_EQ(a.layers[l].sliding_window, global ? 0 : 8) << l;
    EXPECT_EQ(a.layers[l].rope_table, global ? 0 : 1) << l;
    EXPECT_TRUE(a.layers[l].qk_norm) << l;
  }
}

TEST_F(Gemma3Forward, HfAndGgufAgreeAtTp1AndTp2) {
  const std::vector<int32_t> prompt = prompt_tokens();
  const std::vector<float> hf1 = tessera_logits(hf_path(), 1, prompt);
  const std::vector<float> gguf1 = tessera_logits(gguf_path(), 1, prompt);
  const std::vector<float> hf2 = tessera_logits(hf_path(), 2, prompt);
  const std::vector<float> gguf2 = tessera_logits(gguf_path(), 2, prompt);
  ASSERT_FALSE(hf1.empty());
  std::printf("gemma3-tiny: GGUF vs HF %.3g (TP 1), %.3g (TP 2); TP 2 vs TP 1 %.3g\n", max_rel_err(gguf1, hf1),
              max_rel_err(gguf2, hf2), max_rel_err(hf2, hf1));
  // The same weights bit for bit, the same kernels: the formats agree (all but) exactly.
  EXPECT_LT(max_rel_err(gguf1, hf1), 1e-6f) << "TP 1";
  EXPECT_LT(max_rel_err(gguf2, hf2), 1e-6f) << "TP 2";
  // TP 2 sums the attention and MLP outputs of two ranks: only rounding differs, and the GELU's
  // fp16 grid turns a last-bit difference of its input into an fp16 step now and then (measured
  // 1.1e-4).
  EXPECT_LT(max_rel_err(hf2, hf1), 1e-3f) << "HF, TP 2 vs TP 1";
  EXPECT_LT(max_rel_err(gguf2, hf1), 1e-3f) << "GGUF TP 2 vs HF TP 1";
}

TEST_F(Gemma3Forward, CpuLogitsMatchAScalarReference) {
  const std::vector<int32_t> prompt = prompt_tokens();
  const Gemma3Reference reference(gemma_spec());
  const std::vector<float> want = reference.logits(prompt, {});
  // Of the logits' standard deviation. Measured 7e-4: the reference runs in double and Tessera
  // in float, so a GELU input near an fp16 rounding boundary lands on the neighbouring grid
  // point now and then (one fp16 step, 2^-11 relative); with the exact GELU it was 1.4e-6.
  constexpr float kTolerance = 3e-3f;
  for (const std::string& path : {hf_path(), gguf_path()}) {
    for (int tp : {1, 2}) {
      const std::vector<float> got = tessera_logits(path, tp, prompt);
      ASSERT_EQ(got.size(), want.size()) << path;
      std::printf("gemma3-tiny %s TP %d: max |Tessera - reference| = %.3g logit std\n",
                  fs::path(path).filename().c_str(), tp, err_over_std(got, want));
      EXPECT_LT(err_over_std(got, want), kTolerance) << path << " TP " << tp;
    }
  }
  // The comparison can fail: a reference without the window, or with the RoPE bases of local
  // and global layers swapped, is far from Tessera's logits.
  const std::vector<float> got = tessera_logits(gguf_path(), 1, prompt);
  ReferenceOptions no_window;
  no_window.window_off = true;
  const float window_err = err_over_std(got, reference.logits(prompt, no_window));
  EXPECT_GT(window_err, 30 * kTolerance) << "window";
  ReferenceOptions swapped;
  swapped.swap_rope_bases = true;
  const float rope_err = err_over_std(got, reference.logits(prompt, swapped));
  EXPECT_GT(rope_err, 30 * kTolerance) << "RoPE bases";
  std::printf("gemma3-tiny: a reference without the window is %.3g logit std away, one with swapped RoPE bases %.3g\n",
              window_err, rope_err);
  // Positions inside the first window see every key on every layer: there the window cannot matter.
  const int64_t vocab = gemma_spec().vocab;
  const std::vector<float> first(got.begin(), got.begin() + 8 * vocab);
  const std::vector<float> nw = reference.logits(prompt, no_window);
  EXPECT_LT(err_over_std(first, std::vector<float>(nw.begin(), nw.begin() + 8 * vocab)), kTolerance);
}

}  // namespace
}  // namespace tessera
