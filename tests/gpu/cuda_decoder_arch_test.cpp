// One layer graph, two backends: a toy architecture description that differs from Llama in
// every way the decoder can vary (post-norms before the residual adds, GeGLU instead of SwiGLU,
// a sliding-window layer every other layer, a second RoPE table on the other layers, embedding
// and attention scales) runs through the CPU backend and the CUDA backend with matching logits,
// prefill and decode. On machines without a GPU it runs against the CPU stand-in of the CUDA
// library (the cuda_forward_fake_backend CTest). Weights: stories260K plus post-norm weights.
// Then Gemma 3 itself: the synthetic gemma3-tiny model through CudaForward's own description.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "comm/device_comm.h"
#include "common/thread_pool.h"
#include "kernels/cuda/cuda_loader.h"
#include "shard/cpu_backend.h"
#include "shard/cuda_forward.h"
#include "tests/shard/stories_reference.h"
#include "tests/decoder/toy_model.h"
#include "tools/testmodel/synthetic_model.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

using test::max_abs_diff;
using test::max_rel_err;
using test::toy_arch;
using test::ToyModel;

class CudaForwardToyArch : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<const CudaApi*> api = load_cuda_api_with_device();
    if (!api.is_ok()) GTEST_SKIP() << api.status().message();
    TESSERA_REQUIRE_TESTDATA(test::stories_dir() + "/reference.json");
    auto store = WeightStore::open(test::stories_dir() + "/hf");
    ASSERT_TRUE(store.is_ok()) << store.status().to_string();
    model_.store = std::move(store).value();
    auto layout = plan_shard_layout(model_.store->config(), TpConfig{});
    ASSERT_TRUE(layout.is_ok());
    model_.layout = *layout;
  }
  ToyModel model_;
};

TEST_F(CudaForwardToyArch, CpuAndCudaBackendsAgreeOnAToyArchitecture) {
  const ModelConfig& c = model_.store->config();
  const int64_t vocab = c.vocab, block_size = 16, num_blocks = 16;
  auto cpu_weights = model_.weights();
  ASSERT_TRUE(cpu_weights.is_ok()) << cpu_weights.status().to_string();
  const ArchSpec arch = toy_arch(c, cpu_weights->weights);
  ASSERT_TRUE(arch.validate(c, &cpu_weights->weights).is_ok());

  auto comm = make_single_rank_comm();
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2});
  CpuBackendOptions co;
  co.arch = arch;
  CpuBackend cpu(c, model_.layout, std::move(cpu_weights).value(), &pool, comm.get(), co);
  ASSERT_TRUE(cpu.configure_kv(block_size, num_blocks, 0).is_ok());

  auto gpu_weights = model_.weights();
  ASSERT_TRUE(gpu_weights.is_ok());
  CudaForwardOptions go;
  go.block_size = block_size;
  go.max_kv_blocks = num_blocks;
  go.max_tokens_per_step = 128;
  go.max_seqs_per_step = 4;
  go.max_logit_rows = 8;
  auto gpu = CudaForward::create(c, model_.layout, gpu_weights->weights, nullptr, go, arch);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  ASSERT_GE((*gpu)->num_kv_blocks(), num_blocks);

  // The longest reference prompt (longer than the 4-key window), then decode steps fed with the
  // CPU's greedy tokens, through eager steps and graph replays alike.
  std::vector<test::RefCase> cases = test::load_cases();
  const test::RefCase ref = *std::max_element(cases.begin(), cases.end(), [](const auto& a, const auto& b) {
    return a.prompt.size() < b.prompt.size();
  });
  std::vector<int32_t> prompt = ref.prompt;
  prompt.insert(prompt.end(), ref.greedy.begin(), ref.greedy.end());  // real text, past the window
  ASSERT_GT(prompt.size(), 16u);
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  for (int64_t b = 0; b < num_blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(num_blocks - 1 - b);
  std::vector<float> cpu_logits, gpu_logits;
  SequenceInput in{prompt, 0, table, true};
  ASSERT_TRUE(cpu.run({&in, 1}, cpu_logits).is_ok());
  Status s = (*gpu)->run({&in, 1}, gpu_logits);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_EQ(cpu_logits.size(), static_cast<size_t>(vocab));
  EXPECT_LT(max_rel_err(gpu_logits, cpu_logits), 1e-2f) << "prefill";
  std::vector<int32_t> next(1);
  for (int64_t step = 0; step < 6; ++step) {
    next[0] = static_cast<int32_t>(std::max_element(cpu_logits.begin(), cpu_logits.end()) - cpu_logits.begin());
    SequenceInput d{next, static_cast<int64_t>(prompt.size()) + step, table, true};
    ASSERT_TRUE(cpu.run({&d, 1}, cpu_logits).is_ok());
    s = (*gpu)->run({&d, 1}, gpu_logits);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_LT(max_rel_err(gpu_logits, cpu_logits), 1e-2f) << "decode step " << step;
  }
}

// Counts the calls that reach two entry points of the loaded CUDA table, the GeGLU activation
// and the in-place scale (Gemma's embedding scale), remembering the last scale factor: the
// guard swaps counting wrappers into the process-wide table (a test-only edit; one thread) and
// puts the library's pointers back. A graph capture calls the table (the op is recorded then);
// a replay runs the recorded ops without calling it again.
class OpCounter {
 public:
  explicit OpCounter(const CudaApi* api) : api_(const_cast<CudaApi*>(api)) {
    gelu_next_ = api_->gelu_tanh_mul_f32;
    scale_next_ = api_->scale_f32;
    gelu_calls_ = scale_calls_ = 0;
    last_scale_ = 0.0f;
    api_->gelu_tanh_mul_f32 = &gelu;
    api_->scale_f32 = &scale;
  }
  ~OpCounter() {
    api_->gelu_tanh_mul_f32 = gelu_next_;
    api_->scale_f32 = scale_next_;
  }
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;

  int gelu_calls() const { return gelu_calls_; }
  int scale_calls() const { return scale_calls_; }
  float last_scale() const { return last_scale_; }

 private:
  static int gelu(const float* gate, const float* up, float* out, int64_t n, int64_t dim, void* stream) {
    ++gelu_calls_;
    return gelu_next_(gate, up, out, n, dim, stream);
  }
  static int scale(float* x, float s, int64_t n, void* stream) {
    ++scale_calls_;
    last_scale_ = s;
    return scale_next_(x, s, n, stream);
  }

  CudaApi* api_;
  static inline decltype(CudaApi::gelu_tanh_mul_f32) gelu_next_ = nullptr;
  static inline decltype(CudaApi::scale_f32) scale_next_ = nullptr;
  static inline int gelu_calls_ = 0, scale_calls_ = 0;
  static inline float last_scale_ = 0.0f;
};

// gemma3-tiny (7 layers, 6 local with a window of 8, head_dim 64, 1 KV head, tied head):
// CudaForward::create describes it itself (GeGLU, post-norms, embedding scale, two RoPE tables),
// and its logits follow the CPU backend's through a 40-token prefill and decode steps, eager,
// captured and replayed.
TEST(CudaForwardGemma3, SyntheticModelRunsGemmaOpsAndMatchesCpu) {
  Result<const CudaApi*> api = load_cuda_api_with_device();
  if (!api.is_ok()) GTEST_SKIP() << api.status().message();
  const std::string dir = ::testing::TempDir() + "tessera_cuda_gemma3_" + std::to_string(::getpid());
  SyntheticModelSpec spec = synthetic_preset("gemma3-tiny").value();
  spec.vocab = 512;
  ASSERT_TRUE(write_synthetic_hf(spec, dir).is_ok());
  auto store = WeightStore::open(dir);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  const ModelConfig& c = (*store)->config();
  ASSERT_EQ(c.arch, Architecture::kGemma3);
  auto layout = plan_shard_layout(c, TpConfig{});
  ASSERT_TRUE(layout.is_ok());
  auto slice = [&]() -> Result<ShardWeights> {
    TESSERA_ASSIGN_OR_RETURN(ModelWeights full, bind_model_weights(**store));
    return slice_model_weights(std::move(full), c, *layout);
  };
  const int64_t block_size = 16, num_blocks = 8;
  auto cpu_weights = slice();
  ASSERT_TRUE(cpu_weights.is_ok()) << cpu_weights.status().to_string();
  auto comm = make_single_rank_comm();
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2});
  CpuBackend cpu(c, *layout, std::move(cpu_weights).value(), &pool, comm.get(), {});
  ASSERT_TRUE(cpu.configure_kv(block_size, num_blocks, 0).is_ok());

  auto gpu_weights = slice();
  ASSERT_TRUE(gpu_weights.is_ok());
  CudaForwardOptions go;
  go.block_size = block_size;
  go.max_kv_blocks = num_blocks;
  go.max_tokens_per_step = 64;
  go.max_seqs_per_step = 4;
  go.max_logit_rows = 8;
  auto gpu = CudaForward::create(c, *layout, gpu_weights->weights, nullptr, go);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();

  std::vector<int32_t> prompt = {1};
  for (int32_t i = 1; i < 40; ++i) prompt.push_back(3 + (i * 53 + i * i * 7) % 500);
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  for (int64_t b = 0; b < num_blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(num_blocks - 1 - b);
  std::vector<float> cpu_logits, gpu_logits;
  SequenceInput in{prompt, 0, table, true};
  ASSERT_TRUE(cpu.run({&in, 1}, cpu_logits).is_ok());
  {
    OpCounter ops(*api);
    Status s = (*gpu)->run({&in, 1}, gpu_logits);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(ops.gelu_calls(), 7) << "one GeGLU per layer";
    EXPECT_EQ(ops.scale_calls(), 1) << "the embedding scale";
    EXPECT_FLOAT_EQ(ops.last_scale(), std::sqrt(128.0f));
  }
  ASSERT_EQ(cpu_logits.size(), static_cast<size_t>(c.vocab));
  EXPECT_LT(max_rel_err(gpu_logits, cpu_logits), 1e-2f) << "prefill";

  std::vector<int32_t> next(1);
  for (int64_t step = 0; step < 4; ++step) {
    next[0] = static_cast<int32_t>(std::max_element(cpu_logits.begin(), cpu_logits.end()) - cpu_logits.begin());
    SequenceInput d{next, static_cast<int64_t>(prompt.size()) + step, table, true};
    ASSERT_TRUE(cpu.run({&d, 1}, cpu_logits).is_ok());
    OpCounter ops(*api);
    Status s = (*gpu)->run({&d, 1}, gpu_logits);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    const CudaStepStats& st = (*gpu)->last_step();
    // An eager step or the capture calls the ops (the capture records them); a replay does not.
    const bool replayed = st.graphed && !st.captured;
    EXPECT_EQ(ops.gelu_calls(), replayed ? 0 : 7) << "decode step " << step;
    EXPECT_EQ(ops.scale_calls(), replayed ? 0 : 1) << "decode step " << step;
    if (step >= 1) {
      EXPECT_TRUE(replayed) << "decode step " << step << " should replay the captured graph";
    }
    EXPECT_LT(max_rel_err(gpu_logits, cpu_logits), 1e-2f) << "decode step " << step;
  }
  EXPECT_GE((*gpu)->graphs_captured(), 1);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace tessera
