// The window pool on the CUDA backend (shard/cuda_forward.h): gemma3-tiny with a window of 24
// through ShardExecutor over CudaBackend, the plans of tests/shard/window_pool_plans.h (dead
// window slots released, their ids handed to other sequences, copy-on-write in both pools).
// The logits match the one-pool run bit for bit, prefill, mixed and graphed decode steps alike
// (the window tables and window-pool slots are uploaded at the graphs' fixed offsets). On
// machines without a GPU it runs against the CPU stand-in of the CUDA library.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/device_comm.h"
#include "kernels/cuda/cuda_loader.h"
#include "model/weight_store.h"
#include "shard/cuda_backend.h"
#include "shard/shard_executor.h"
#include "shard/tp_slice.h"
#include "tests/shard/window_pool_plans.h"
#include "tools/testmodel/synthetic_model.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

using test::kBlockSize;
using test::kNumBlocks;
using test::kNumWindowBlocks;
using test::kWindow;

struct Rows {
  std::vector<std::vector<float>> rows;
  std::vector<std::vector<int32_t>> tokens;  // per step
  int64_t graphs = 0;
  int64_t window_bytes = 0;
};

Rows run_plans(const std::string& dir, const std::vector<StepPlan>& plans, int64_t num_window_blocks) {
  Rows out;
  auto store = WeightStore::open(dir);
  EXPECT_TRUE(store.is_ok()) << store.status().to_string();
  if (!store.is_ok()) return out;
  const ModelConfig& c = (*store)->config();
  auto layout = plan_shard_layout(c, TpConfig{});
  auto full = bind_model_weights(**store);
  EXPECT_TRUE(layout.is_ok() && full.is_ok());
  if (!layout.is_ok() || !full.is_ok()) return out;
  auto weights = slice_model_weights(std::move(full).value(), c, *layout);
  EXPECT_TRUE(weights.is_ok());
  if (!weights.is_ok()) return out;
  auto comm = make_single_rank_comm();
  CudaBackendOptions o;
  o.max_step_tokens = 64;
  o.max_step_seqs = 4;
  auto backend = CudaBackend::create(c, *layout, std::move(weights).value(), *comm, o);
  EXPECT_TRUE(backend.is_ok()) << backend.status().to_string();
  if (!backend.is_ok()) return out;
  auto m = (*backend)->memory();
  EXPECT_TRUE(m.is_ok());
  if (m.is_ok()) {
    EXPECT_EQ(m->kv_window, kWindow);
    EXPECT_EQ(m->kv_window_bytes_per_token * 7, m->kv_bytes_per_token * 6) << "6 of 7 layers are windowed";
  }
  // Host sampling from the downloaded logits, so the observer sees every row.
  ShardExecutor executor(**backend, c, ShardExecutorOptions{.rank = 0, .device_sampling = false});
  executor.set_row_observer([&](uint64_t, std::span<const float> row) { out.rows.emplace_back(row.begin(), row.end()); });
  const Status s = executor.configure(kBlockSize, kNumBlocks, KvDtype::kF32, num_window_blocks);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  if (!s.is_ok()) return out;
  for (const StepPlan& p : plans) {
    const StepResult r = executor.execute(p);
    EXPECT_TRUE(r.error.empty()) << r.error;
    std::vector<int32_t> ids;
    for (const StepToken& t : r.tokens) ids.push_back(t.token);
    out.tokens.push_back(std::move(ids));
  }
  out.graphs = (*backend)->forward().graphs_captured();
  out.window_bytes = (*backend)->forward().kv_bytes();
  return out;
}

TEST(CudaForwardWindowPool, LogitsMatchTheOnePoolRunWithReleasedAndReusedBlocks) {
  Result<const CudaApi*> api = load_cuda_api_with_device();
  if (!api.is_ok()) GTEST_SKIP() << api.status().message();
  const std::string dir = ::testing::TempDir() + "tessera_cuda_window_pool_" + std::to_string(::getpid());
  SyntheticModelSpec spec = synthetic_preset("gemma3-tiny").value();
  spec.vocab = 512;
  spec.sliding_window = kWindow;
  ASSERT_TRUE(write_synthetic_hf(spec, dir).is_ok());
  SamplingParams sampling;
  sampling.temperature = 1.0f;
  sampling.seed = 77;
  sampling.has_seed = true;
  const test::WindowScenario sc =
      test::window_scenario(kBlockSize, kWindow, kNumBlocks, kNumWindowBlocks, sampling, 512, 40);
  EXPECT_GE(sc.window_ids_reused, 6);
  std::vector<StepPlan> one_pool;
  for (const StepPlan& p : sc.plans) one_pool.push_back(test::without_window(p));

  const Rows want = run_plans(dir, one_pool, 0);
  const Rows got = run_plans(dir, sc.plans, kNumWindowBlocks);
  ASSERT_FALSE(want.rows.empty());
  ASSERT_EQ(got.rows.size(), want.rows.size());
  for (size_t i = 0; i < want.rows.size(); ++i) {
    ASSERT_EQ(got.rows[i].size(), want.rows[i].size());
    EXPECT_EQ(std::memcmp(got.rows[i].data(), want.rows[i].data(), want.rows[i].size() * sizeof(float)), 0)
        << "logits row " << i << " differs";
  }
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GE(got.graphs, 1) << "the decode steps ran as graphs";
  // 1 global layer of 24 blocks and 6 windowed layers of 10, K and V, 1 KV head of 64 fp32.
  const int64_t layer_block = 2 * kBlockSize * 64 * 4;
  EXPECT_EQ(got.window_bytes, (kNumBlocks + 6 * kNumWindowBlocks) * layer_block);
  EXPECT_EQ(want.window_bytes, 7 * kNumBlocks * layer_block);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace tessera
