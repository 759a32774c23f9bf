// Sparse decode attention in the CUDA forward pass (CudaForwardOptions::sparse) on stories260K
// (every layer global), against the CPU backend's (CpuBackend with CpuBackendOptions::runtime.sparse, i.e.
// ForwardPass::set_sparse_attention): the same decode steps (teacher-forced with the CPU's greedy
// tokens) give the same logits within the forward passes' rounding, graphed and eager, fp32 and
// fp16 KV; a selection that covers every block gives exactly the dense logits; the counters
// match the CPU's. Skips without a device or without the test data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/device_comm.h"
#include "common/thread_pool.h"
#include "kernels/cuda/cuda_loader.h"
#include "shard/cpu_backend.h"
#include "shard/cuda_forward.h"
#include "tests/shard/stories_reference.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBlock = 4;   // small blocks: a short story spans many
// Decode steps after the prompt. The CUDA forward's activations round differently from the CPU's
// (f16 GEMM inputs), which can flip a near tie between two blocks' scores; on this model that
// first happens at position 40, so the steps stay below it (positions 5 .. 28: sparse from 16).
constexpr int64_t kSteps = 24;

struct DecodeRun {
  std::vector<int32_t> tokens;             // the token fed at each decode step
  std::vector<std::vector<float>> logits;  // per decode step
  uint64_t sparse = 0, dense = 0;
};

std::vector<int32_t> reversed_table(int64_t blocks) {
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(table.size() - 1 - b);
  return table;
}

// The CPU backend: prompt, then kSteps greedy decode steps (its own argmax tokens).
DecodeRun cpu_decode(const std::string& path, const std::vector<int32_t>& prompt, const SparseAttentionConfig& sparse,
                     KvDtype kv_dtype) {
  DecodeRun out;
  auto store = WeightStore::open(path);
  EXPECT_TRUE(store.is_ok()) << store.status().to_string();
  if (!store.is_ok()) return out;
  const ModelConfig& config = (*store)->config();
  auto full = bind_model_weights(**store);
  auto layout = plan_shard_layout(config, TpConfig{0, 1});
  auto weights = slice_model_weights(std::move(full).value(), config, *layout);
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2});
  CpuBackendOptions options;
  options.runtime.sparse = sparse;
  options.runtime.kv_dtype = kv_dtype;
  std::vector<std::unique_ptr<DeviceComm>> comms = make_in_process_comms(1);
  CpuBackend backend(config, *layout, std::move(weights).value(), &pool, comms[0].get(), options);
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t blocks = (n + kSteps + kBlock - 1) / kBlock;
  EXPECT_TRUE(backend.configure_kv(kBlock, blocks, 0).is_ok());
  const std::vector<int32_t> table = reversed_table(blocks);
  std::vector<float> logits;
  SequenceInput prefill{prompt, 0, table, true};
  EXPECT_TRUE(backend.run(std::span<const SequenceInput>(&prefill, 1), logits).is_ok());
  for (int64_t s = 0; s < kSteps; ++s) {
    const auto next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.tokens.push_back(next);
    SequenceInput in{std::span<const int32_t>(&out.tokens.back(), 1), n + s, table, true};
    EXPECT_TRUE(backend.run(std::span<const SequenceInput>(&in, 1), logits).is_ok());
    out.logits.push_back(logits);
  }
  const ShardBackend::SparseStats st = backend.sparse_stats();
  out.sparse = st.sparse;
  out.dense = st.dense;
  return out;
}

// CudaForward over the same table, fed `tokens` (the CPU's) at the decode steps.
DecodeRun gpu_decode(const std::string& path, const std::vector<int32_t>& prompt, const std::vector<int32_t>& tokens,
                     const SparseAttentionConfig& sparse, KvDtype kv_dtype, bool graphs) {
  DecodeRun out;
  auto store = WeightStore::open(path);
  EXPECT_TRUE(store.is_ok()) << store.status().to_string();
  if (!store.is_ok()) return out;
  const ModelConfig& config = (*store)->config();
  auto full = bind_model_weights(**store);
  auto layout = plan_shard_layout(config, TpConfig{0, 1});
  auto weights = slice_model_weights(std::move(full).value(), config, *layout);
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t blocks = (n + kSteps + kBlock - 1) / kBlock;
  CudaForwardOptions o;
  o.block_size = kBlock;
  o.max_tokens_per_step = 256;
  o.max_seqs_per_step = 4;
  o.max_logit_rows = 16;
  o.max_kv_blocks = blocks;
  o.kv_dtype = kv_dtype;
  o.cuda_graphs = graphs;
  o.decode_split_keys = 16;  // split decode attention over the (compacted) keys too
  o.sparse = sparse;
  auto forward = CudaForward::create(config, *layout, weights->weights, nullptr, o);
  EXPECT_TRUE(forward.is_ok()) << forward.status().to_string();
  if (!forward.is_ok()) return out;
  CudaForward& f = **forward;
  EXPECT_EQ(f.kv_summary_bytes(),
            sparse.enabled ? f.num_kv_blocks() * f.kv_summary_bytes_per_block() : 0);
  const std::vector<int32_t> table = reversed_table(blocks);
  std::vector<float> logits;
  SequenceInput prefill{prompt, 0, table, true};
  Status s = f.run(std::span<const SequenceInput>(&prefill, 1), logits);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  for (int64_t i = 0; i < static_cast<int64_t>(tokens.size()); ++i) {
    SequenceInput in{std::span<const int32_t>(&tokens[static_cast<size_t>(i)], 1), n + i, table, true};
    s = f.run(std::span<const SequenceInput>(&in, 1), logits);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    if (!s.is_ok()) break;
    EXPECT_EQ(f.last_step().graphed, graphs);
    out.logits.push_back(logits);
  }
  out.tokens = tokens;
  out.sparse = f.sparse_attentions();
  out.dense = f.dense_global_decodes();
  return out;
}

// max |a - b| over every step's logits.
float max_diff(const DecodeRun& a, const DecodeRun& b) {
  float d = 0.0f;
  EXPECT_EQ(a.logits.size(), b.logits.size());
  for (size_t s = 0; s < std::min(a.logits.size(), b.logits.size()); ++s)
    for (size_t v = 0; v < a.logits[s].size(); ++v) d = std::max(d, std::fabs(a.logits[s][v] - b.logits[s][v]));
  return d;
}

SparseAttentionConfig sparse_config(int64_t threshold, int64_t sink, int64_t recent, int64_t top) {
  SparseAttentionConfig c;
  c.enabled = true;
  c.threshold_tokens = threshold;
  c.select = {.sink_blocks = sink, .recent_blocks = recent, .top_blocks = top};
  return c;
}

class CudaSparseForward : public ::testing::TestWithParam<bool> {  // param: CUDA graphs
 protected:
  void SetUp() override {
    Result<const CudaApi*> api = load_cuda_api_with_device();
    if (!api.is_ok()) GTEST_SKIP() << api.status().message();
    TESSERA_REQUIRE_TESTDATA(test::stories_dir() + "/reference.json");
  }
  std::string model() const { return test::stories_dir() + "/hf"; }
};

// A real selection (few blocks, threshold inside the decode): the CUDA forward attends to the
// blocks the CPU selects. The selection must change the logits visibly for this to mean
// anything: the CUDA-vs-CPU difference stays far below the sparse-vs-dense one.
TEST_P(CudaSparseForward, MatchesTheCpuSparseForward) {
  const bool graphs = GetParam();
  const std::vector<int32_t> prompt = test::load_cases().back().prompt;
  const auto n = static_cast<int64_t>(prompt.size());
  for (const KvDtype kv : {KvDtype::kF32, KvDtype::kF16}) {
    const std::string what = std::string(kv_dtype_name(kv)) + (graphs ? " graphed" : " eager");
    const SparseAttentionConfig few = sparse_config(n + 4, 1, 1, 2);
    const DecodeRun cpu = cpu_decode(model(), prompt, few, kv);
    ASSERT_EQ(cpu.logits.size(), static_cast<size_t>(kSteps)) << what;
    const DecodeRun gpu = gpu_decode(model(), prompt, cpu.tokens, few, kv, graphs);
    const DecodeRun gpu_dense = gpu_decode(model(), prompt, cpu.tokens, SparseAttentionConfig{}, kv, graphs);
    const float vs_cpu = max_diff(gpu, cpu), vs_dense = max_diff(gpu, gpu_dense);
    EXPECT_LT(vs_cpu, 0.05f) << what;  // the dense passes differ by ~0.01
    EXPECT_GT(vs_dense, 10 * vs_cpu) << what << ": the selection must change the logits for this test to mean anything";
    EXPECT_EQ(gpu.sparse, cpu.sparse) << what;
    EXPECT_EQ(gpu.dense, cpu.dense) << what;
    EXPECT_GT(gpu.sparse, 0u) << what;
    EXPECT_GT(gpu.dense, 0u) << what;  // the steps before the threshold
  }
}

// top_blocks covering every block: exactly the dense logits (the compacted tables are the
// dense ones), with the counters still counting sparse decodes.
TEST_P(CudaSparseForward, CoveringSelectionEqualsDense) {
  const bool graphs = GetParam();
  const std::vector<int32_t> prompt = test::load_cases().back().prompt;
  const std::vector<int32_t> tokens = cpu_decode(model(), prompt, {}, KvDtype::kF32).tokens;
  const DecodeRun dense = gpu_decode(model(), prompt, tokens, SparseAttentionConfig{}, KvDtype::kF32, graphs);
  const DecodeRun all = gpu_decode(model(), prompt, tokens, sparse_config(1, 1, 2, 1 << 20), KvDtype::kF32, graphs);
  ASSERT_EQ(all.logits.size(), dense.logits.size());
  for (size_t s = 0; s < dense.logits.size(); ++s) EXPECT_EQ(all.logits[s], dense.logits[s]) << "step " << s;
  EXPECT_GT(all.sparse, 0u);
  EXPECT_EQ(dense.sparse + dense.dense, 0u);  // sparse off: nothing counted
}

// Bad sparse options are refused at create(), naming the field and value.
TEST_P(CudaSparseForward, RefusesBadOptions) {
  auto store = WeightStore::open(model());
  ASSERT_TRUE(store.is_ok());
  const ModelConfig& config = (*store)->config();
  auto full = bind_model_weights(**store);
  auto layout = plan_shard_layout(config, TpConfig{0, 1});
  auto weights = slice_model_weights(std::move(full).value(), config, *layout);
  CudaForwardOptions o;
  o.max_kv_blocks = 64;
  o.sparse = sparse_config(1, 1, 0, 4);
  auto bad = CudaForward::create(config, *layout, weights->weights, nullptr, o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("recent_blocks 0"), std::string::npos) << bad.status().to_string();
  o.sparse = {};
  o.sparse.measure = true;
  bad = CudaForward::create(config, *layout, weights->weights, nullptr, o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("sparse.measure"), std::string::npos) << bad.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(Graphs, CudaSparseForward, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Graphed" : "Eager"; });

}  // namespace
}  // namespace tessera
