// The CPU forward pass against llama2.c's reference outputs for stories260K (HF and GGUF files),
// plus invariances: chunked prefill, block sizes, batching several sequences in one step.
#include "shard/forward.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <thread>

#include "comm/device_comm.h"
#include "common/env.h"
#include "tests/shard/stories_reference.h"
#include "tests/shard/test_block_allocator.h"
#include "local/local_model.h"
#include "shard/cpu_backend.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

using test::load_cases;
using test::RefCase;
using test::stories_dir;

// Greedy generation of a reference case's length (EOS ignored), the prompt prefilled in pieces of
// `chunk` tokens (0: one piece).
Result<GenerateOutput> greedy_case(LocalModel& model, const RefCase& c, int64_t chunk = 0) {
  GenerateOptions go;
  go.max_tokens = static_cast<int64_t>(c.greedy.size());
  go.sampling.temperature = 0.0f;
  go.ignore_eos = true;
  go.prefill_chunk = chunk;
  return generate(model, c.prompt, go);
}

// The largest difference between the last prompt position's logits and the reference's.
float max_logit_error(const GenerateOutput& out, const RefCase& c) {
  float max_err = 0;
  for (size_t i = 0; i < c.logits.size(); ++i) max_err = std::max(max_err, std::abs(out.prompt_last_logits[i] - c.logits[i]));
  return max_err;
}

class StoriesForwardTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_TESTDATA(stories_dir() + "/reference.json");
  }
  std::string model_path() const { return stories_dir() + "/" + GetParam(); }
};

TEST_P(StoriesForwardTest, GreedyIdsAndLogitsMatchReference) {
  auto model = LocalModel::load({.path = model_path(), .runtime = {.threads = 2}});
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  for (const RefCase& c : load_cases()) {
    auto out = greedy_case(**model, c);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(out->ids, c.greedy) << c.name;
    ASSERT_EQ(out->prompt_last_logits.size(), c.logits.size()) << c.name;
    EXPECT_LT(max_logit_error(*out, c), 1e-4f) << c.name;
  }
}

// An fp16 KV cache (half the memory): the reference greedy ids still, and prompt logits within
// the fp16 rounding of K and V; chunked prefill and decode read it the same way.
TEST_P(StoriesForwardTest, Fp16KvCacheKeepsTheReferenceIds) {
  auto model = LocalModel::load({.path = model_path(), .runtime = {.threads = 2, .kv_dtype = KvDtype::kF16}});
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  for (const RefCase& c : load_cases()) {
    for (const int64_t chunk : {0, 5}) {
      auto out = greedy_case(**model, c, chunk);
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      EXPECT_EQ(out->ids, c.greedy) << c.name << " chunk " << chunk;
      const float max_err = max_logit_error(*out, c);
      EXPECT_LT(max_err, 5e-2f) << c.name;
      EXPECT_GT(max_err, 0.0f) << c.name << ": the fp16 cache should round something";
    }
  }
}

// An int8 KV cache (a scale per token and KV head): prompt logits near the reference's (their
// error is ~8x the fp16 cache's on this model of 8-dim heads: 0.02-0.38 measured), the first 16
// greedy ids the reference's, and the same logits and ids bit for bit however the prompt is
// chunked (the rows are quantized one by one, and read the same way by prefill tiles and decode).
TEST_P(StoriesForwardTest, Int8KvCacheStaysNearTheReference) {
  auto model = LocalModel::load({.path = model_path(), .runtime = {.threads = 2, .kv_dtype = KvDtype::kInt8}});
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  for (const RefCase& c : load_cases()) {
    std::vector<float> first_logits;
    std::vector<int32_t> first_ids;
    for (const int64_t chunk : {0, 5}) {
      auto out = greedy_case(**model, c, chunk);
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      const float max_err = max_logit_error(*out, c);
      size_t agree = 0;
      while (agree < c.greedy.size() && out->ids[agree] == c.greedy[agree]) ++agree;
      EXPECT_LT(max_err, 0.5f) << c.name;
      EXPECT_GE(agree, 16u) << c.name << ": the greedy ids part from the reference's at token " << agree;
      EXPECT_GT(max_err, 0.0f) << c.name << ": the int8 cache should round something";
      if (chunk == 0) {
        first_logits = out->prompt_last_logits;
        first_ids = out->ids;
      } else {
        EXPECT_EQ(out->prompt_last_logits, first_logits) << c.name << ": chunked prefill reads the cache otherwise";
        EXPECT_EQ(out->ids, first_ids) << c.name;
      }
    }
  }
}

TEST_P(StoriesForwardTest, ChunkedPrefillAndBlockSizesAgree) {
  const RefCase c = load_cases().back();  // the longest prompts are last
  for (int64_t block_size : {16, 64}) {
    for (int64_t chunk : {0, 1, 7}) {
      auto model = LocalModel::load({.path = model_path(), .runtime = {.threads = 1}, .block_size = block_size});
      ASSERT_TRUE(model.is_ok()) << model.status().to_string();
      GenerateOptions go;
      go.max_tokens = 16;
      go.sampling.temperature = 0.0f;
      go.ignore_eos = true;
      go.prefill_chunk = chunk;
      auto out = generate(**model, c.prompt, go);
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      EXPECT_EQ(out->ids, std::vector<int32_t>(c.greedy.begin(), c.greedy.begin() + 16))
          << "block size " << block_size << " chunk " << chunk;
    }
  }
}

// Blocks smaller than the serving range (common/kv_config.h) through the CPU backend directly:
// the cache and the attention kernels give the reference logits for any block size and any
// prefill chunking.
TEST_P(StoriesForwardTest, TinyBlocksAndChunksKeepTheReferenceLogits) {
  const RefCase c = load_cases().back();
  auto store = WeightStore::open(model_path());
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  const ModelConfig& config = (*store)->config();
  for (int64_t block_size : {1, 5}) {
    for (int64_t chunk : {0, 1, 7}) {
      auto full = bind_model_weights(**store);
      ASSERT_TRUE(full.is_ok()) << full.status().to_string();
      auto layout = plan_shard_layout(config, TpConfig{});
      ASSERT_TRUE(layout.is_ok());
      auto weights = slice_model_weights(std::move(full).value(), config, *layout);
      ASSERT_TRUE(weights.is_ok());
      auto comm = make_single_rank_comm();
      ThreadPool pool(ThreadPoolOptions{.num_threads = 1});
      CpuBackend backend(config, *layout, std::move(weights).value(), &pool, comm.get(), {});
      const auto n = static_cast<int64_t>(c.prompt.size());
      ASSERT_TRUE(backend.configure_kv(block_size, (n + block_size - 1) / block_size, 0).is_ok());
      std::vector<int32_t> table(static_cast<size_t>((n + block_size - 1) / block_size));
      for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(table.size() - 1 - b);
      std::vector<float> logits;
      const int64_t step = chunk > 0 ? chunk : n;
      for (int64_t start = 0; start < n; start += step) {
        const int64_t len = std::min(step, n - start);
        SequenceInput in{std::span<const int32_t>(c.prompt.data() + start, static_cast<size_t>(len)), start, table,
                         start + len == n};
        ASSERT_TRUE(backend.run(std::span<const SequenceInput>(&in, 1), logits).is_ok());
      }
      ASSERT_EQ(logits.size(), c.logits.size());
      float max_err = 0;
      for (size_t i = 0; i < c.logits.size(); ++i) max_err = std::max(max_err, std::abs(logits[i] - c.logits[i]));
      EXPECT_LT(max_err, 1e-4f) << "block size " << block_size << " chunk " << chunk;
    }
  }
}

// Sparse decode attention (kernels/sparse_attention.h) through the CPU backend: the prompt,
// then greedy decode steps, with 4-token blocks so that a short story spans many blocks.
struct DecodeRun {
  std::vector<std::vector<float>> logits;  // per decode step
  uint64_t sparse = 0, dense = 0;          // ForwardPass's counters
};
// At tp > 1 the ranks run as threads over in-process communicators; rank 0's logits and counters.
DecodeRun decode_with(const std::string& path, const RefCase& c, const SparseAttentionConfig& sparse, int64_t steps,
                      int tp = 1) {
  std::vector<DecodeRun> runs(static_cast<size_t>(tp));
  auto store = WeightStore::open(path);
  EXPECT_TRUE(store.is_ok());
  if (!store.is_ok()) return {};
  const ModelConfig& config = (*store)->config();
  std::vector<std::unique_ptr<DeviceComm>> comms = make_in_process_comms(tp);
  auto rank = [&](int r) {
    DecodeRun& out = runs[static_cast<size_t>(r)];
    auto full = bind_model_weights(**store);
    auto layout = plan_shard_layout(config, TpConfig{r, tp});
    auto weights = slice_model_weights(std::move(full).value(), config, *layout);
    ThreadPool pool(ThreadPoolOptions{.num_threads = tp == 1 ? 2 : 1});
    CpuBackendOptions options;
    options.runtime.sparse = sparse;
    CpuBackend backend(config, *layout, std::move(weights).value(), &pool, comms[static_cast<size_t>(r)].get(), options);
    const int64_t block = 4;
    const auto n = static_cast<int64_t>(c.prompt.size());
    const int64_t blocks = (n + steps + block - 1) / block;
    EXPECT_TRUE(backend.configure_kv(block, blocks, 0).is_ok());
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(table.size() - 1 - b);
    std::vector<float> logits;
    SequenceInput prefill{c.prompt, 0, table, true};
    EXPECT_TRUE(backend.run(std::span<const SequenceInput>(&prefill, 1), logits).is_ok());
    for (int64_t s = 0; s < steps; ++s) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      SequenceInput in{std::span<const int32_t>(&next, 1), n + s, table, true};
      EXPECT_TRUE(backend.run(std::span<const SequenceInput>(&in, 1), logits).is_ok());
      out.logits.push_back(logits);
    }
    out.sparse = backend.forward().sparse_attentions;
    out.dense = backend.forward().dense_global_decodes;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) threads.emplace_back(rank, r);
  for (std::thread& t : threads) t.join();
  return std::move(runs[0]);
}

TEST_P(StoriesForwardTest, SparseDecodeEqualsDenseWhenItSelectsEveryBlock) {
  const RefCase c = load_cases().back();
  const int64_t steps = 12;
  const DecodeRun dense = decode_with(model_path(), c, {}, steps);
  SparseAttentionConfig all;
  all.enabled = true;
  all.threshold_tokens = 1;
  all.select.top_blocks = 1 << 20;
  const DecodeRun covered = decode_with(model_path(), c, all, steps);
  ASSERT_EQ(covered.logits.size(), dense.logits.size());
  EXPECT_GT(covered.sparse, 0u);
  for (size_t s = 0; s < dense.logits.size(); ++s) EXPECT_EQ(covered.logits[s], dense.logits[s]) << "step " << s;
  // Few blocks selected: the path really attends to fewer keys (other logits), and a threshold
  // past the context keeps every decode dense.
  SparseAttentionConfig few = all;
  few.select.top_blocks = 1;
  few.select.recent_blocks = 1;
  const DecodeRun sparse = decode_with(model_path(), c, few, steps);
  EXPECT_NE(sparse.logits.back(), dense.logits.back());
  for (float v : sparse.logits.back()) ASSERT_TRUE(std::isfinite(v));
  few.threshold_tokens = static_cast<int64_t>(c.prompt.size()) + steps + 1;
  const DecodeRun below = decode_with(model_path(), c, few, steps);
  EXPECT_EQ(below.sparse, 0u);
  EXPECT_GT(below.dense, 0u);
  EXPECT_EQ(below.logits.back(), dense.logits.back());
}

// At TP 2 each rank scores blocks with its own query heads; the ranks combine their scores, so
// they attend to the blocks a TP 1 run selects. With few blocks selected, a rank-local choice
// would give visibly other logits; the combined one agrees with TP 1 to rounding (the o_proj
// and FFN partial sums add up in another order).
TEST_P(StoriesForwardTest, SparseDecodeAtTp2SelectsWhatTp1Selects) {
  const RefCase c = load_cases().back();
  const int64_t steps = 12;
  SparseAttentionConfig few;
  few.enabled = true;
  few.threshold_tokens = 1;
  few.select = {.sink_blocks = 1, .recent_blocks = 1, .top_blocks = 2};
  const DecodeRun one = decode_with(model_path(), c, few, steps, 1);
  const DecodeRun two = decode_with(model_path(), c, few, steps, 2);
  const DecodeRun dense = decode_with(model_path(), c, {}, steps, 1);
  ASSERT_EQ(two.logits.size(), one.logits.size());
  EXPECT_GT(two.sparse, 0u);
  float max_tp = 0, max_dense = 0;
  for (size_t s = 0; s < one.logits.size(); ++s)
    for (size_t v = 0; v < one.logits[s].size(); ++v) {
      max_tp = std::max(max_tp, std::abs(two.logits[s][v] - one.logits[s][v]));
      max_dense = std::max(max_dense, std::abs(dense.logits[s][v] - one.logits[s][v]));
    }
  EXPECT_LT(max_tp, 1e-3f);
  EXPECT_GT(max_dense, 100 * max_tp) << "the selection must change the logits for this test to mean anything";
}

// Through the engine: a step's sparse and dense global decodes and the threshold in effect
// reach the metrics (what /metrics shows); auto resolves at load to a measured threshold or off.
TEST_P(StoriesForwardTest, SparseDecodesReachTheMetricsAndAutoResolves) {
  const RefCase c = load_cases().back();
  LocalModelOptions o{.path = model_path(), .runtime = {.threads = 2}, .block_size = 16};
  o.runtime.sparse.enabled = true;
  o.runtime.sparse.threshold_tokens = 40;
  o.runtime.sparse.select = {.sink_blocks = 1, .recent_blocks = 1, .top_blocks = 1};
  auto loaded = LocalModel::load(o);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  GenerateOptions go;
  go.max_tokens = 48;
  go.ignore_eos = true;
  go.speculation.mode = SpecMode::kOff;  // one-token decodes only
  ASSERT_TRUE(generate(**loaded, c.prompt, go).is_ok());
  const MetricsRegistry& m = (*loaded)->metrics();
  EXPECT_EQ(m.value("tessera_sparse_attention_threshold_tokens"), 40.0);
  const double n_global = static_cast<double>((*loaded)->config().n_layers);  // no sliding window
  // Every decode of the 47 after the prompt counts once per layer, sparse from position 39 on.
  EXPECT_EQ(m.value("tessera_sparse_attention_decodes_total") + m.value("tessera_dense_global_decodes_total"),
            47.0 * n_global);
  EXPECT_GT(m.value("tessera_sparse_attention_decodes_total"), 0.0);
  EXPECT_EQ((*loaded)->forward().sparse_attentions, static_cast<uint64_t>(m.value("tessera_sparse_attention_decodes_total")));

  LocalModelOptions a{.path = model_path(), .runtime = {.threads = 2}, .block_size = 16};
  a.runtime.sparse.measure = true;
  a.runtime.sparse.select.top_blocks = 2;
  auto measured = LocalModel::load(a);
  ASSERT_TRUE(measured.is_ok()) << measured.status().to_string();
  const SparseAttentionConfig& in_effect = (*measured)->forward().sparse_attention();
  EXPECT_FALSE(in_effect.measure);
  if (in_effect.enabled) {
    EXPECT_GE(in_effect.threshold_tokens, 1);
    EXPECT_LE(in_effect.threshold_tokens, (*measured)->config().max_positions);
  }
  ASSERT_TRUE(generate(**measured, c.prompt, go).is_ok());
  EXPECT_EQ((*measured)->metrics().value("tessera_sparse_attention_threshold_tokens"),
            in_effect.enabled ? static_cast<double>(in_effect.threshold_tokens) : 0.0);
}

TEST_P(StoriesForwardTest, BatchedSequencesMatchSingle) {
  auto loaded = LocalModel::load({.path = model_path(), .runtime = {.threads = 2}, .block_size = 16});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  LocalModel& m = **loaded;
  const std::vector<RefCase> cases = load_cases();
  // All cases in one step, each in its own blocks.
  std::vector<std::vector<int32_t>> tables(cases.size());
  std::vector<SequenceInput> batch;
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(m.ensure_blocks(tables[i], static_cast<int64_t>(cases[i].prompt.size())));
    batch.push_back({cases[i].prompt, 0, tables[i], true});
  }
  std::vector<float> logits;
  ASSERT_TRUE(m.forward().run(batch, logits).is_ok());
  const int64_t vocab = m.config().vocab;
  ASSERT_EQ(static_cast<int64_t>(logits.size()), vocab * static_cast<int64_t>(cases.size()));
  for (size_t i = 0; i < cases.size(); ++i)
    for (int64_t v = 0; v < vocab; ++v)
      EXPECT_NEAR(logits[i * vocab + v], cases[i].logits[v], 1e-4f) << cases[i].name << " logit " << v;
  for (auto& t : tables) m.release_blocks(t);
}

TEST_P(StoriesForwardTest, RejectsBadInputWithoutCrashing) {
  auto loaded = LocalModel::load({.path = model_path(), .runtime = {.threads = 1}});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  GenerateOptions go;
  go.max_tokens = 2;
  auto bad = generate(**loaded, {1, 512}, go);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(bad.status().message().find("512"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(generate(**loaded, {1, -3}, go).is_ok());
  EXPECT_FALSE(generate(**loaded, {}, go).is_ok());
  std::vector<int32_t> too_long(static_cast<size_t>((*loaded)->config().max_positions + 1), 5);
  EXPECT_FALSE(generate(**loaded, too_long, go).is_ok());
  // The model still works afterwards.
  go.sampling.temperature = 0.0f;
  auto ok = generate(**loaded, {1}, go);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->ids, (std::vector<int32_t>{403, 407}));
}

INSTANTIATE_TEST_SUITE_P(Formats, StoriesForwardTest,
                         ::testing::Values("hf", "stories260K-f32.gguf", "stories260K.ggml-org.gguf"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// stories260K's HF weights on one CPU shard (one thread) with an executor over it; nullptr (and
// a failure) when it cannot be loaded.
struct StoriesShard {
  std::unique_ptr<WeightStore> store;
  std::unique_ptr<DeviceComm> comm;
  ThreadPool pool{ThreadPoolOptions{.num_threads = 1}};
  std::unique_ptr<CpuBackend> backend;
  ShardExecutor executor;

  static std::unique_ptr<StoriesShard> open(const CpuBackendOptions& options = {}) {
    auto store = WeightStore::open(stories_dir() + "/hf");
    EXPECT_TRUE(store.is_ok()) << store.status().to_string();
    if (!store.is_ok()) return nullptr;
    const ModelConfig& c = (*store)->config();
    auto full = bind_model_weights(**store);
    auto layout = plan_shard_layout(c, TpConfig{});
    EXPECT_TRUE(full.is_ok() && layout.is_ok());
    if (!full.is_ok() || !layout.is_ok()) return nullptr;
    auto weights = slice_model_weights(std::move(full).value(), c, *layout);
    EXPECT_TRUE(weights.is_ok());
    if (!weights.is_ok()) return nullptr;
    return std::unique_ptr<StoriesShard>(new StoriesShard(std::move(store).value(), make_single_rank_comm(), *layout,
                                                          std::move(weights).value(), options));
  }

 private:
  StoriesShard(std::unique_ptr<WeightStore> s, std::unique_ptr<DeviceComm> cm, const ShardLayout& layout,
               ShardWeights weights, const CpuBackendOptions& options)
      : store(std::move(s)),
        comm(std::move(cm)),
        backend(std::make_unique<CpuBackend>(store->config(), layout, std::move(weights), &pool, comm.get(), options)),
        executor(*backend, store->config(), ShardExecutorOptions{}) {}
};

// The configure message carries the KV dtype the coordinator planned with; a shard that stores
// another refuses it, naming both.
TEST(ShardExecutorTest, ConfigureRefusesAnotherKvDtype) {
  TESSERA_REQUIRE_TESTDATA(stories_dir() + "/reference.json");
  CpuBackendOptions o;
  o.runtime.kv_dtype = KvDtype::kF16;
  auto shard = StoriesShard::open(o);
  ASSERT_TRUE(shard);
  ShardExecutor& executor = shard->executor;
  Status s = executor.configure(16, 8, KvDtype::kF32);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("the coordinator planned a fp32 KV cache, this shard stores fp16"), std::string::npos)
      << s.message();
  EXPECT_FALSE(executor.configured());
  EXPECT_TRUE(executor.configure(16, 8, KvDtype::kF16).is_ok());
}

// Structured outputs' jump-forward: forced drafts are taken without their rows' logits, and the
// row after them is what decoding them one step at a time (each masked to its one token) gives:
// the same token and logprob. A plan that marks drafts forced without giving any is refused.
TEST(ShardExecutorTest, ForcedDraftsEqualTokensForcedOneStepAtATime) {
  TESSERA_REQUIRE_TESTDATA(stories_dir() + "/reference.json");
  auto shard = StoriesShard::open();
  ASSERT_TRUE(shard);
  ShardExecutor& executor = shard->executor;
  const ModelConfig& c = shard->store->config();
  constexpr int32_t kBlock = 16;
  ASSERT_TRUE(executor.configure(kBlock, 32, KvDtype::kF32).is_ok());
  test::TestBlockAllocator blocks(32);
  const std::vector<int32_t> prompt = load_cases().front().prompt;
  const std::vector<int32_t> forced = {50, 300, 7, 120, 33};
  const auto words = static_cast<size_t>((c.vocab + 31) / 32);
  auto only = [&](int32_t id) {
    std::vector<uint32_t> m(words, 0u);
    m[static_cast<size_t>(id) / 32] = 1u << (id % 32);
    return m;
  };
  SamplingParams sp;
  sp.temperature = 0.0f;
  sp.return_logprob = true;
  uint64_t step = 0;
  // Prefill; returns the first sampled token.
  auto start = [&](uint64_t id, std::vector<int32_t>& table) {
    StepPlan p;
    p.step_id = ++step;
    p.new_sequences.push_back({id, prompt, sp});
    const std::vector<int32_t> before = table;
    EXPECT_TRUE(blocks.ensure(table, static_cast<int64_t>(prompt.size()) + 1, kBlock));
    ScheduledSequence q{id, 0, static_cast<int32_t>(prompt.size()), true};
    q.append_blocks.assign(table.begin() + static_cast<std::ptrdiff_t>(before.size()), table.end());
    p.scheduled.push_back(q);
    StepResult r = executor.execute(p);
    EXPECT_TRUE(r.error.empty()) << r.error;
    return r.tokens;
  };
  // Sequence 1: each forced token in a step of its own, masked to it; then a free row.
  std::vector<int32_t> table1;
  ASSERT_EQ(start(1, table1).size(), 1u);
  int64_t pos = static_cast<int64_t>(prompt.size());
  std::vector<StepToken> one_by_one;
  for (size_t i = 0; i <= forced.size(); ++i) {
    StepPlan p;
    p.step_id = ++step;
    const size_t had = table1.size();
    ASSERT_TRUE(blocks.ensure(table1, pos + 2, kBlock));
    ScheduledSequence q{1, pos, 1, true};
    q.append_blocks.assign(table1.begin() + static_cast<std::ptrdiff_t>(had), table1.end());
    if (i < forced.size()) q.token_mask = only(forced[i]);
    p.scheduled.push_back(q);
    StepResult r = executor.execute(p);
    ASSERT_TRUE(r.error.empty()) << r.error;
    ASSERT_EQ(r.tokens.size(), 1u);
    one_by_one.push_back(r.tokens[0]);
    ++pos;
  }
  // Sequence 2: the same forced tokens as one step's forced drafts.
  std::vector<int32_t> table2;
  ASSERT_EQ(start(2, table2).size(), 1u);
  const auto p0 = static_cast<int64_t>(prompt.size());
  StepPlan p;
  p.step_id = ++step;
  ASSERT_TRUE(blocks.ensure(table2, p0 + static_cast<int64_t>(forced.size()) + 2, kBlock));
  ScheduledSequence q{2, p0, static_cast<int32_t>(forced.size()) + 1, true};
  q.append_blocks.assign(table2.begin() + 1, table2.end());
  q.draft_tokens = forced;
  q.forced_drafts = true;
  p.scheduled.push_back(q);
  StepResult r = executor.execute(p);
  ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_EQ(r.tokens.size(), forced.size() + 1);
  for (size_t i = 0; i < forced.size(); ++i) {
    EXPECT_EQ(r.tokens[i].token, forced[i]);
    EXPECT_EQ(one_by_one[i].token, forced[i]);
    EXPECT_EQ(r.tokens[i].logprob, 0.0f);
  }
  EXPECT_EQ(r.tokens.back().token, one_by_one.back().token);
  EXPECT_NEAR(r.tokens.back().logprob, one_by_one.back().logprob, 1e-4);
  EXPECT_LT(one_by_one.back().logprob, 0.0f) << "the free row is a real draw";

  StepPlan bad;
  bad.step_id = ++step;
  ScheduledSequence b{2, p0 + static_cast<int64_t>(forced.size()) + 1, 1, true};
  b.forced_drafts = true;
  bad.scheduled.push_back(b);
  r = executor.execute(bad);
  EXPECT_NE(r.error.find("forced_drafts without proposed draft tokens"), std::string::npos) << r.error;
}

// Masks that follow the plan (mask_follows, StepMasks): the executor runs the forward pass, then
// asks for them and samples under them, as with masks inside the plan; a late mask that does not
// match the plan (another step, another sequence, a wrong length, none at all) fails the step,
// naming the mismatch.
TEST(ShardExecutorTest, MasksThatFollowThePlanConstrainAsMasksInIt) {
  TESSERA_REQUIRE_TESTDATA(stories_dir() + "/reference.json");
  auto shard = StoriesShard::open();
  ASSERT_TRUE(shard);
  ShardExecutor& executor = shard->executor;
  const ModelConfig& c = shard->store->config();
  ASSERT_TRUE(executor.configure(16, 8, KvDtype::kF32).is_ok());
  const std::vector<int32_t> prompt = load_cases().front().prompt;
  const auto words = static_cast<size_t>((c.vocab + 31) / 32);
  // Allows only ids 40..47 (not the unconstrained argmax, checked below).
  std::vector<uint32_t> mask(words, 0u);
  mask[1] = 0xff00u;
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 5;
  sp.has_seed = true;
  uint64_t step = 0;
  std::vector<int32_t> got;
  for (uint64_t id : {1, 2, 3}) {
    StepPlan p;
    p.step_id = ++step;
    p.new_sequences.push_back({id, prompt, sp});
    ScheduledSequence q{id, 0, static_cast<int32_t>(prompt.size()), true};
    for (int b = 0; b < 2; ++b) q.append_blocks.push_back(static_cast<int32_t>(2 * (id - 1) + b));
    if (id == 1) q.token_mask = mask;  // in the plan
    if (id == 2) q.mask_follows = true;  // after it
    p.scheduled.push_back(q);
    bool asked = false;
    StepResult r = executor.execute(p, [&]() -> Result<StepMasks> {
      asked = true;
      return StepMasks{p.step_id, {{id, mask}}};
    });
    ASSERT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(asked, id == 2);
    ASSERT_EQ(r.tokens.size(), 1u);
    got.push_back(r.tokens[0].token);
  }
  EXPECT_GE(got[0], 40);
  EXPECT_LT(got[0], 48);
  EXPECT_EQ(got[1], got[0]) << "the same seeded draw under the same mask";
  EXPECT_NE(got[2], got[0]) << "unconstrained, the draw is another token";

  struct Case {
    const char* name;
    std::function<Result<StepMasks>(uint64_t step)> source;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"another step", [&](uint64_t s) -> Result<StepMasks> { return StepMasks{s + 1, {{4, mask}}}; },
       "arrived during step"},
      {"another sequence", [&](uint64_t s) -> Result<StepMasks> { return StepMasks{s, {{9, mask}}}; },
       "is for sequence 9"},
      {"too short", [&](uint64_t s) -> Result<StepMasks> { return StepMasks{s, {{4, {1u}}}}; },
       "a token mask of 1 words"},
      {"none", [&](uint64_t s) -> Result<StepMasks> { return StepMasks{s, {}}; }, "0 token masks arrived"},
      {"lost", [&](uint64_t) -> Result<StepMasks> { return Status::deadline_exceeded("never arrived"); },
       "never arrived"},
      {"no source", nullptr, "no way to receive them"},
  };
  for (const Case& k : cases) {
    StepPlan p;
    p.step_id = ++step;
    p.new_sequences.push_back({4, prompt, sp});
    ScheduledSequence q{4, 0, static_cast<int32_t>(prompt.size()), true};
    q.append_blocks = {6, 7};
    q.mask_follows = true;
    p.scheduled.push_back(q);
    ShardExecutor::MaskSource source;
    if (k.source) source = [&] { return k.source(p.step_id); };
    StepResult r = executor.execute(p, source);
    EXPECT_NE(r.error.find(k.error), std::string::npos) << k.name << ": " << r.error;
    executor.drop(4);
  }
  StepPlan p;
  p.step_id = ++step;
  p.new_sequences.push_back({5, prompt, sp});
  ScheduledSequence q{5, 0, static_cast<int32_t>(prompt.size()), false};
  q.append_blocks = {6, 7};
  q.mask_follows = true;
  p.scheduled.push_back(q);
  StepResult r = executor.execute(p);
  EXPECT_NE(r.error.find("mask_follows on a piece that does not sample"), std::string::npos) << r.error;
}

}  // namespace
}  // namespace tessera
