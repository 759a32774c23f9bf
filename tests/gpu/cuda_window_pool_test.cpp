// The window pool on the CUDA backend (shard/cuda_forward.h): gemma3-tiny with a window of 24
// through ShardExecutor over CudaBackend, the plans of tests/shard/window_pool_plans.h (dead
// window slots released, their ids handed to other sequences, copy-on-write in both pools).
// The logits match the one-pool run bit for bit, prefill, mixed and graphed decode steps alike
// (the window tables and window-pool slots are uploaded at the graphs' fixed offsets), with an
// fp32 and with an fp16 KV cache. On machines without a GPU it runs against the CPU stand-in of
// the CUDA library.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
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
  std::vector<size_t> rows_after;             // per step: rows.size() after it
  int64_t graphs = 0;
  int64_t window_bytes = 0;
};

Rows run_plans(const std::string& dir, const std::vector<StepPlan>& plans, int64_t num_window_blocks, KvDtype kv) {
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
  o.runtime.max_step_tokens = 64;
  o.runtime.max_step_seqs = 4;
  o.runtime.kv_dtype = kv;
  auto backend = CudaBackend::create(c, *layout, std::move(weights).value(), *comm, o);
  EXPECT_TRUE(backend.is_ok()) << backend.status().to_string();
  if (!backend.is_ok()) return out;
  auto m = (*backend)->memory();
  EXPECT_TRUE(m.is_ok());
  if (m.is_ok()) {
    EXPECT_EQ(m->kv_window, kWindow);
    EXPECT_EQ(m->kv_window_bytes_per_token * 7, m->kv_bytes_per_token * 6) << "6 of 7 layers are windowed";
    EXPECT_EQ(m->kv_dtype, kv);
    EXPECT_EQ(m->kv_bytes_per_token, static_cast<uint64_t>(7 * 2 * 64 * kv_dtype_bytes(kv)));
  }
  // Host sampling from the downloaded logits, so the observer sees every row.
  ShardExecutor executor(**backend, c, ShardExecutorOptions{.rank = 0, .device_sampling = false});
  executor.set_row_observer([&](uint64_t, std::span<const float> row) { out.rows.emplace_back(row.begin(), row.end()); });
  const Status s = executor.configure(kBlockSize, kNumBlocks, kv, num_window_blocks);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  if (!s.is_ok()) return out;
  for (const StepPlan& p : plans) {
    const StepResult r = executor.execute(p);
    EXPECT_TRUE(r.error.empty()) << r.error;
    std::vector<int32_t> ids;
    for (const StepToken& t : r.tokens) ids.push_back(t.token);
    out.tokens.push_back(std::move(ids));
    out.rows_after.push_back(out.rows.size());
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

  Rows fp32;
  for (const KvDtype kv : {KvDtype::kF32, KvDtype::kF16}) {
    const std::string what(kv_dtype_name(kv));
    const Rows want = run_plans(dir, one_pool, 0, kv);
    const Rows got = run_plans(dir, sc.plans, kNumWindowBlocks, kv);
    ASSERT_FALSE(want.rows.empty());
    ASSERT_EQ(got.rows.size(), want.rows.size());
    for (size_t i = 0; i < want.rows.size(); ++i) {
      ASSERT_EQ(got.rows[i].size(), want.rows[i].size());
      EXPECT_EQ(std::memcmp(got.rows[i].data(), want.rows[i].data(), want.rows[i].size() * sizeof(float)), 0)
          << what << " logits row " << i << " differs";
    }
    EXPECT_EQ(got.tokens, want.tokens) << what;
    EXPECT_GE(got.graphs, 1) << "the decode steps ran as graphs";
    // 1 global layer of 24 blocks and 6 windowed layers of 10, K and V, 1 KV head of 64.
    const int64_t layer_block = 2 * kBlockSize * 64 * kv_dtype_bytes(kv);
    EXPECT_EQ(got.window_bytes, (kNumBlocks + 6 * kNumWindowBlocks) * layer_block) << what;
    EXPECT_EQ(want.window_bytes, 7 * kNumBlocks * layer_block) << what;
    if (kv == KvDtype::kF32) {
      fp32 = want;
      continue;
    }
    // fp16 keys and values move the logits a little (they are stored, not only billed, as fp16),
    // up to the step where a sampled token first differs (a sequence's next input is its sample).
    ASSERT_EQ(want.rows.size(), fp32.rows.size());
    size_t same_rows = want.rows.size();
    for (size_t step = 0; step < want.tokens.size(); ++step)
      if (want.tokens[step] != fp32.tokens[step]) {
        same_rows = want.rows_after[step];
        break;
      }
    EXPECT_GE(same_rows, want.rows.size() / 4) << "fp16 and fp32 sampled the same tokens for a while";
    const std::vector<std::vector<float>>& fp32_rows = fp32.rows;
    float max_diff = 0.0f;
    for (size_t i = 0; i < same_rows; ++i)
      for (size_t j = 0; j < want.rows[i].size(); ++j)
        max_diff = std::max(max_diff, std::fabs(want.rows[i][j] - fp32_rows[i][j]));
    EXPECT_GT(max_diff, 0.0f) << "fp16 KV gave the fp32 logits";
    EXPECT_LT(max_diff, 0.05f) << "fp16 KV is far from fp32";
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace tessera
