// The window pool on the shard (common/kv_config.h, shard/kv_cache.h): the windowed layers of
// gemma3-tiny (a window of 24 here, so windows span blocks of 16) keep their KV in a pool of
// their own, addressed by window tables whose dead slots the plans release (-1) and hand to
// other sequences. The logits match the one-pool run bit for bit at TP 1 and TP 2; the hello's
// figures, the cache's layout and the executor's checks of window fields are tested too.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/device_comm.h"
#include "common/kv_config.h"
#include "common/thread_pool.h"
#include "model/weight_store.h"
#include "shard/cpu_backend.h"
#include "shard/kv_cache.h"
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

SyntheticModelSpec windowed_spec() {
  SyntheticModelSpec s = synthetic_preset("gemma3-tiny").value();
  s.vocab = 512;
  s.sliding_window = kWindow;
  return s;
}

SamplingParams seeded_sampling() {
  SamplingParams p;
  p.temperature = 1.0f;  // drawn on the host from the logits: the observer sees every row
  p.seed = 77;
  p.has_seed = true;
  return p;
}

// What one run of the plans gives: each sampled row's logits (rank 0) and the tokens.
struct PlanRun {
  std::vector<std::vector<float>> rows;
  std::vector<uint64_t> row_seqs;
  std::vector<StepResult> results;
};

class WindowPool : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path dir = fs::path(::testing::TempDir()) / ("tessera_window_pool_" + std::to_string(::getpid()));
    dir_ = new std::string(dir.string());
    fs::remove_all(*dir_);
    ASSERT_TRUE(write_synthetic_hf(windowed_spec(), *dir_).is_ok());
    SyntheticModelSpec tiny = synthetic_preset("tiny").value();
    tiny.vocab = 512;
    ASSERT_TRUE(write_synthetic_hf(tiny, *dir_ + "/llama").is_ok());
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
    dir_ = nullptr;
  }

  // Runs `plans` on `tp` CPU ranks (threads over in-process communicators), each an executor
  // configured with num_window_blocks (0: one pool). Every rank must give the same results.
  static PlanRun run_plans(const std::string& path, int tp, const std::vector<StepPlan>& plans,
                       int64_t num_window_blocks) {
    PlanRun run;
    auto store = WeightStore::open(path);
    EXPECT_TRUE(store.is_ok()) << store.status().to_string();
    if (!store.is_ok()) return run;
    const ModelConfig& c = (*store)->config();
    std::vector<std::unique_ptr<DeviceComm>> comms = make_in_process_comms(tp);
    std::vector<ShardLayout> layouts;
    std::vector<ShardWeights> weights;
    for (int r = 0; r < tp; ++r) {
      auto layout = plan_shard_layout(c, TpConfig{r, tp});
      EXPECT_TRUE(layout.is_ok());
      auto full = bind_model_weights(**store);
      EXPECT_TRUE(full.is_ok());
      if (!layout.is_ok() || !full.is_ok()) return run;
      auto w = slice_model_weights(std::move(full).value(), c, *layout);
      EXPECT_TRUE(w.is_ok());
      if (!w.is_ok()) return run;
      layouts.push_back(*layout);
      weights.push_back(std::move(w).value());
    }
    std::vector<std::vector<StepResult>> results(static_cast<size_t>(tp));
    std::vector<std::thread> threads;
    for (int r = 0; r < tp; ++r) {
      threads.emplace_back([&, r] {
        const auto i = static_cast<size_t>(r);
        ThreadPool pool(ThreadPoolOptions{.num_threads = 1});
        CpuBackend backend(c, layouts[i], std::move(weights[i]), &pool, comms[i].get(), {});
        ShardExecutor executor(backend, c, ShardExecutorOptions{.rank = r});
        if (r == 0)
          executor.set_row_observer([&](uint64_t id, std::span<const float> row) {
            run.rows.emplace_back(row.begin(), row.end());
            run.row_seqs.push_back(id);
          });
        const Status s = executor.configure(kBlockSize, kNumBlocks, KvDtype::kF32, num_window_blocks);
        EXPECT_TRUE(s.is_ok()) << s.to_string();
        if (!s.is_ok()) return;
        for (const StepPlan& p : plans) results[i].push_back(executor.execute(p));
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < tp; ++r)
      for (const StepResult& res : results[static_cast<size_t>(r)])
        EXPECT_TRUE(res.error.empty()) << "rank " << r << ": " << res.error;
    run.results = std::move(results[0]);
    return run;
  }

  static std::string* dir_;
};
std::string* WindowPool::dir_ = nullptr;

std::vector<StepPlan> one_pool(const std::vector<StepPlan>& plans) {
  std::vector<StepPlan> out;
  for (const StepPlan& p : plans) out.push_back(test::without_window(p));
  return out;
}

// Bit for bit: the same rows (sequence by sequence) and the same tokens.
void expect_identical(const PlanRun& got, const PlanRun& want, const char* what) {
  ASSERT_EQ(got.rows.size(), want.rows.size()) << what;
  ASSERT_FALSE(want.rows.empty()) << what;
  EXPECT_EQ(got.row_seqs, want.row_seqs) << what;
  for (size_t i = 0; i < want.rows.size(); ++i) {
    ASSERT_EQ(got.rows[i].size(), want.rows[i].size()) << what;
    EXPECT_EQ(std::memcmp(got.rows[i].data(), want.rows[i].data(), want.rows[i].size() * sizeof(float)), 0)
        << what << ": logits row " << i << " (sequence " << want.row_seqs[i] << ") differs";
  }
  ASSERT_EQ(got.results.size(), want.results.size()) << what;
  for (size_t s = 0; s < want.results.size(); ++s) {
    ASSERT_EQ(got.results[s].tokens.size(), want.results[s].tokens.size()) << what << " step " << s + 1;
    for (size_t t = 0; t < want.results[s].tokens.size(); ++t)
      EXPECT_EQ(got.results[s].tokens[t].token, want.results[s].tokens[t].token) << what << " step " << s + 1;
  }
}

TEST_F(WindowPool, LogitsMatchTheOnePoolRunAtTp1AndTp2) {
  const test::WindowScenario sc =
      test::window_scenario(kBlockSize, kWindow, kNumBlocks, kNumWindowBlocks, seeded_sampling(), 512, 40);
  // The plans do what they are meant to: window ids go to other sequences, and the pool holds
  // fewer blocks than the sequences' tables have slots.
  EXPECT_GE(sc.window_ids_reused, 6);
  EXPECT_LE(sc.window_high_water, kNumWindowBlocks);
  int64_t released = 0;
  for (const StepPlan& p : sc.plans)
    for (const ScheduledSequence& s : p.scheduled)
      released += std::count(s.append_window_blocks.begin(), s.append_window_blocks.end(), -1);
  EXPECT_EQ(released, 2) << "sequence B joins with its first two window slots released";
  for (int tp : {1, 2}) {
    const PlanRun want = run_plans(*dir_, tp, one_pool(sc.plans), 0);
    const PlanRun got = run_plans(*dir_, tp, sc.plans, kNumWindowBlocks);
    expect_identical(got, want, tp == 1 ? "TP 1" : "TP 2");
  }
}

// The hello's figures: the window and the windowed layers' share of the KV bytes (6 of 7
// layers), 0 and 0 for a model without windowed layers, which refuses a window pool.
TEST_F(WindowPool, BackendReportsTheWindowAndRefusesAPoolWithoutOne) {
  for (const bool windowed : {true, false}) {
    const std::string path = windowed ? *dir_ : *dir_ + "/llama";
    auto store = WeightStore::open(path);
    ASSERT_TRUE(store.is_ok());
    const ModelConfig& c = (*store)->config();
    auto layout = plan_shard_layout(c, TpConfig{});
    auto full = bind_model_weights(**store);
    ASSERT_TRUE(layout.is_ok() && full.is_ok());
    auto w = slice_model_weights(std::move(full).value(), c, *layout);
    ASSERT_TRUE(w.is_ok());
    auto comm = make_single_rank_comm();
    ThreadPool pool(ThreadPoolOptions{.num_threads = 1});
    CpuBackendOptions o;
    o.runtime.kv_dtype = KvDtype::kF16;
    o.runtime.sparse.enabled = windowed;  // key summaries for its one global layer, billed per block
    CpuBackend backend(c, *layout, std::move(w).value(), &pool, comm.get(), o);
    auto m = backend.memory();
    ASSERT_TRUE(m.is_ok());
    const uint64_t per_layer = 2ull * static_cast<uint64_t>(layout->n_kv_heads * c.head_dim) * 2;  // fp16
    EXPECT_EQ(m->kv_bytes_per_token, per_layer * static_cast<uint64_t>(c.n_layers));
    EXPECT_EQ(m->kv_summary_bytes_per_block,
              windowed ? 2ull * 4 * static_cast<uint64_t>(layout->n_kv_heads * c.head_dim) : 0u);
    if (windowed) {
      EXPECT_EQ(m->kv_window, kWindow);
      EXPECT_EQ(m->kv_window_bytes_per_token, 6 * per_layer);
      EXPECT_EQ(backend.kv_window(), kWindow);
      ASSERT_TRUE(backend.configure_kv(kBlockSize, 8, 4).is_ok());
      EXPECT_TRUE(backend.cache().shape().has_window_pool());
      EXPECT_EQ(backend.cache().layer(5).num_blocks, 8) << "the global layer";
      EXPECT_EQ(backend.cache().layer(0).num_blocks, 4);
      EXPECT_NE(backend.cache().summaries(5).kmin, nullptr);
      EXPECT_EQ(backend.cache().summaries(0).kmin, nullptr);
      EXPECT_EQ(backend.copy_block(3, 2, KvPool::kWindow).code(), StatusCode::kOk);
      EXPECT_EQ(backend.copy_block(3, 4, KvPool::kWindow).code(), StatusCode::kOutOfRange);
      EXPECT_EQ(backend.copy_block(3, 7, KvPool::kMain).code(), StatusCode::kOk);
    } else {
      EXPECT_EQ(m->kv_window, 0);
      EXPECT_EQ(m->kv_window_bytes_per_token, 0u);
      ShardExecutor executor(backend, c, ShardExecutorOptions{});
      const Status s = executor.configure(kBlockSize, 8, KvDtype::kF16, 4);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("no sliding-window layers"), std::string::npos) << s.message();
      EXPECT_EQ(backend.configure_kv(kBlockSize, 8, 4).code(), StatusCode::kInvalidArgument);
      EXPECT_TRUE(executor.configure(kBlockSize, 8, KvDtype::kF16).is_ok());
    }
  }
}

// The two pools of one allocation: each layer in its own, blocks copied within a pool only.
TEST(KvCacheWindowPool, LayersLiveInTheirPoolAndCopiesStayInIt) {
  KvCacheShape shape{3, 2, 4, 16, 5, KvDtype::kF32};
  shape.window_layers = {true, false, true};
  shape.num_window_blocks = 3;
  auto cache = KvCache::create(shape);
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  EXPECT_EQ(KvCache::bytes_per_block(shape, KvPool::kMain), 2u * 1 * 16 * 2 * 4 * 4);
  EXPECT_EQ(KvCache::bytes_per_block(shape, KvPool::kWindow), 2u * 2 * 16 * 2 * 4 * 4);
  EXPECT_EQ(shape.pool_of(1), KvPool::kMain);
  EXPECT_EQ(shape.pool_of(2), KvPool::kWindow);
  const size_t block = 16 * 2 * 4;
  PagedKvLayer l0 = cache->layer(0), l1 = cache->layer(1), l2 = cache->layer(2);
  EXPECT_EQ(l0.num_blocks, 3);
  EXPECT_EQ(l1.num_blocks, 5);
  EXPECT_EQ(l2.num_blocks, 3);
  // Disjoint arrays: fill each with its own value, every block, then read them back.
  int tag = 1;
  for (PagedKvLayer* l : {&l0, &l1, &l2}) {
    std::fill(l->k, l->k + block * static_cast<size_t>(l->num_blocks), static_cast<float>(tag++));
    std::fill(l->v, l->v + block * static_cast<size_t>(l->num_blocks), static_cast<float>(tag++));
  }
  tag = 1;
  for (PagedKvLayer* l : {&l0, &l1, &l2}) {
    EXPECT_EQ(l->k[block * static_cast<size_t>(l->num_blocks) - 1], static_cast<float>(tag++));
    EXPECT_EQ(l->v[0], static_cast<float>(tag++));
  }
  l0.k[2 * block] = 100.0f;  // window block 2
  l1.k[2 * block] = 200.0f;  // main block 2
  ASSERT_TRUE(cache->copy_block(2, 0, KvPool::kWindow).is_ok());
  EXPECT_EQ(l0.k[0], 100.0f);
  EXPECT_EQ(l1.k[0], 3.0f) << "the main pool is untouched";
  ASSERT_TRUE(cache->copy_block(2, 4, KvPool::kMain).is_ok());
  EXPECT_EQ(l1.k[4 * block], 200.0f);
  EXPECT_EQ(cache->copy_block(0, 3, KvPool::kWindow).code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(cache->copy_block(0, 4, KvPool::kMain).is_ok());

  shape.window_layers = {true, false};
  EXPECT_EQ(KvCache::create(shape).status().code(), StatusCode::kInvalidArgument);
  shape.window_layers = {false, false, false};
  EXPECT_EQ(KvCache::create(shape).status().code(), StatusCode::kInvalidArgument);
  shape.num_window_blocks = 0;  // no window pool: the marks do not matter
  EXPECT_TRUE(KvCache::create(shape).is_ok());
  EXPECT_EQ(KvCache::bytes_per_block(shape, KvPool::kMain), 2u * 3 * 16 * 2 * 4 * 4);
}

// An int8 cache: rows of head_dim + 4 bytes (the scale first), laid out and copied per pool like
// the others; what kv_write stores in one pool's block is read back from the copy.
TEST(KvCacheWindowPool, Int8RowsCarryTheirScalesThroughCopies) {
  KvCacheShape shape{3, 2, 4, 16, 5, KvDtype::kInt8};
  shape.window_layers = {true, false, true};
  shape.num_window_blocks = 3;
  auto cache = KvCache::create(shape);
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  EXPECT_EQ(kv_bytes_per_token(3, 2, 4, KvDtype::kInt8), 2u * 3 * 2 * (4 + 4));
  EXPECT_EQ(KvCache::bytes_per_block(shape, KvPool::kMain), 2u * 1 * 16 * 2 * 8);
  EXPECT_EQ(KvCache::bytes_per_block(shape, KvPool::kWindow), 2u * 2 * 16 * 2 * 8);
  const std::vector<float> k = {1, -2, 3, 0.5f, 40, 0, -8, 2}, v = {-1, 1, 0.25f, 0, 7, 7, -7, 3.5f};
  std::vector<float> got(8);
  for (const auto& [layer, pool] : {std::pair{int64_t{1}, KvPool::kMain}, std::pair{int64_t{2}, KvPool::kWindow}}) {
    const PagedKvLayer l = cache->layer(layer);
    ASSERT_NE(l.k8, nullptr);
    ASSERT_EQ(l.k, nullptr);
    const int32_t src = 2, dst = 0;
    kv_write(l, &src, 5, 1, k.data(), v.data());  // slot 5 of block 2
    ASSERT_TRUE(cache->copy_block(src, dst, pool).is_ok());
    kv_read_slot(l, false, dst, 5, got.data());
    for (size_t i = 0; i < 8; ++i)
      EXPECT_NEAR(got[i], k[i], (i < 4 ? 3.0f : 40.0f) / 254.0f + 1e-6f) << kv_pool_name(pool) << " key " << i;
    kv_read_slot(l, true, dst, 5, got.data());
    for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(got[i], v[i], 7.0f / 254.0f + 1e-6f) << kv_pool_name(pool) << " value " << i;
  }
}

// Key summaries (sparse attention) exist for the global layers only, with or without a window
// pool, and a block copy carries them.
TEST(KvCacheSummaries, OnlyTheGlobalLayersKeepThem) {
  for (int64_t window_blocks : {0, 3}) {
    KvCacheShape shape{3, 2, 4, 16, 5, KvDtype::kF32};
    shape.window_layers = {true, false, true};
    shape.num_window_blocks = window_blocks;
    shape.key_summaries = true;
    auto cache = KvCache::create(shape);
    ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
    EXPECT_EQ(cache->summaries(0).kmin, nullptr) << window_blocks;
    EXPECT_EQ(cache->summaries(2).kmin, nullptr) << window_blocks;
    const KvBlockSummaries s = cache->summaries(1);
    ASSERT_NE(s.kmin, nullptr);
    EXPECT_EQ(s.num_blocks, 5);
    EXPECT_EQ(s.kmax, s.kmin + 5 * 2 * 4);
    s.kmin[2 * 8 + 3] = 7.0f;
    s.kmax[2 * 8 + 3] = 9.0f;
    ASSERT_TRUE(cache->copy_block(2, 4, KvPool::kMain).is_ok());
    EXPECT_EQ(s.kmin[4 * 8 + 3], 7.0f);
    EXPECT_EQ(s.kmax[4 * 8 + 3], 9.0f);
  }
  KvCacheShape plain{2, 2, 4, 16, 5, KvDtype::kF16};
  plain.key_summaries = true;  // no marks: every layer is global
  auto cache = KvCache::create(plain);
  ASSERT_TRUE(cache.is_ok());
  EXPECT_NE(cache->summaries(0).kmin, nullptr);
  EXPECT_NE(cache->summaries(1).kmin, cache->summaries(0).kmin);
  EXPECT_EQ(key_summary_bytes_per_block(3, 1, 256), 2u * 4 * 3 * 256);
}

// The executor's checks of a plan's window fields, each naming the sequence, the field and the
// value; a rejected plan runs nothing. Every case breaks one thing in a valid plan of sequence
// 5: a 56-token prompt, the piece [0, 40) then [40, 56). With a window of 24 the queries from
// 40 on see keys from 17 on: slot 0 ([0, 16)) may be released then, slot 1 may not.
TEST_F(WindowPool, ExecutorRejectsBadWindowFields) {
  struct Case {
    const char* name;
    int64_t num_window_blocks;  // 0: the executor has no window pool
    void (*edit)(StepPlan& first, StepPlan& second);
    const char* message;  // "": the plan is valid
  };
  const Case cases[] = {
      {"valid", kNumWindowBlocks, [](StepPlan&, StepPlan&) {}, ""},
      // A plan releases a slot it sent already only on the coordinator's side; resending the
      // tables (reset_blocks) may say -1 of it.
      {"slot 0 released when no query reads it", kNumWindowBlocks,
       [](StepPlan&, StepPlan& b) {
         b.scheduled[0].reset_blocks = true;
         b.scheduled[0].append_blocks = {7, 8, 9, 10};
         b.scheduled[0].append_window_blocks = {-1, 4, 5, 2};
       },
       ""},
      {"slot 1 released but read from 40 on", kNumWindowBlocks,
       [](StepPlan&, StepPlan& b) {
         b.scheduled[0].reset_blocks = true;
         b.scheduled[0].append_blocks = {7, 8, 9, 10};
         b.scheduled[0].append_window_blocks = {-1, -1, 5, 2};
       },
       "sequence 5: window table slot 1 is released (-1), but positions [40, 56) read it"},
      {"a released slot the first piece reads", kNumWindowBlocks,
       [](StepPlan& a, StepPlan&) { a.scheduled[0].append_window_blocks = {-1, 4, 5}; },
       "sequence 5: window table slot 0 is released (-1), but positions [0, 40) read it"},
      {"lengths differ", kNumWindowBlocks, [](StepPlan& a, StepPlan&) { a.scheduled[0].append_window_blocks = {3}; },
       "sequence 5: append_window_blocks has 1 entries, append_blocks 3"},
      {"a reset with the old window entries", kNumWindowBlocks,
       [](StepPlan&, StepPlan& b) {
         b.scheduled[0].reset_blocks = true;
         b.scheduled[0].append_blocks = {7, 8, 9, 10};
       },
       "sequence 5: append_window_blocks has 1 entries, append_blocks 4"},
      {"window entries without a window pool", 0,
       [](StepPlan& a, StepPlan&) { a.scheduled[0].append_window_blocks = {3, 4, 5}; },
       "sequence 5: append_window_blocks has 3 entries but no window pool is configured"},
      {"id outside the pool", kNumWindowBlocks,
       [](StepPlan& a, StepPlan&) { a.scheduled[0].append_window_blocks = {3, 4, kNumWindowBlocks}; },
       "sequence 5: append_window_blocks entry 10 is outside the window pool (0..9"},
      {"id below -1", kNumWindowBlocks, [](StepPlan& a, StepPlan&) { a.scheduled[0].append_window_blocks = {-2, 4, 5}; },
       "sequence 5: append_window_blocks entry -2 is outside the window pool"},
      {"window copies without a window pool", 0, [](StepPlan& a, StepPlan&) { a.window_block_copies = {{0, 1}}; },
       "window_block_copies: 1 copies but no window pool is configured"},
      {"window copy outside the pool", kNumWindowBlocks,
       [](StepPlan& a, StepPlan&) { a.window_block_copies = {{1, 12}}; },
       "window_block_copies: copy 1 -> 12 outside the window pool (0..9)"},
  };
  auto store = WeightStore::open(*dir_);
  ASSERT_TRUE(store.is_ok());
  const ModelConfig& c = (*store)->config();
  auto layout = plan_shard_layout(c, TpConfig{});
  ASSERT_TRUE(layout.is_ok());
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    auto full = bind_model_weights(**store);
    ASSERT_TRUE(full.is_ok());
    auto w = slice_model_weights(std::move(full).value(), c, *layout);
    ASSERT_TRUE(w.is_ok());
    auto comm = make_single_rank_comm();
    ThreadPool pool(ThreadPoolOptions{.num_threads = 1});
    CpuBackend backend(c, *layout, std::move(w).value(), &pool, comm.get(), {});
    ShardExecutor executor(backend, c, ShardExecutorOptions{});
    ASSERT_TRUE(executor.configure(kBlockSize, kNumBlocks, KvDtype::kF32, k.num_window_blocks).is_ok());
    std::vector<int32_t> prompt(56);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + i * 7);
    StepPlan a, b;
    a.step_id = 1;
    a.new_sequences.push_back({5, prompt, seeded_sampling()});
    a.scheduled.push_back({5, 0, 40, false, {7, 8, 9}});
    if (k.num_window_blocks > 0) a.scheduled[0].append_window_blocks = {3, 4, 5};
    b.step_id = 2;
    b.scheduled.push_back({5, 40, 16, true, {10}});
    b.scheduled[0].append_window_blocks = {2};
    if (k.num_window_blocks == 0) b.scheduled[0].append_window_blocks.clear();
    k.edit(a, b);
    const StepResult ra = executor.execute(a);
    const StepResult rb = ra.error.empty() ? executor.execute(b) : StepResult{};
    const std::string error = !ra.error.empty() ? ra.error : rb.error;
    if (*k.message == '\0') {
      EXPECT_TRUE(error.empty()) << error;
      EXPECT_EQ(rb.tokens.size(), 1u);
    } else {
      EXPECT_NE(error.find(k.message), std::string::npos) << error;
    }
  }
}

}  // namespace
}  // namespace tessera
