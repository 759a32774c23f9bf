// The CUDA forward pass (shard/cuda_forward.h) end to end on stories260K: greedy ids against
// llama2.c's reference (reference.json), last-prompt-position logits against the CPU
// ForwardPass, chunked prefill and batching invariances, input validation, and a synthetic
// model in F16 / INT8 / INT4 and GGUF Q8_0 / Q4_0 / Q4_K_M against the CPU on the same weights. Skips without a device or without the test data.
#include "shard/cuda_forward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "kernels/cuda/cuda_loader.h"
#include "kernels/weight_codec.h"
#include "local/local_model.h"
#include "tests/shard/stories_reference.h"
#include "tests/shard/test_block_allocator.h"
#include "tools/testmodel/synthetic_model.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

using test::load_cases;
using test::RefCase;
using test::stories_dir;

int32_t argmax(const float* x, int64_t n) { return static_cast<int32_t>(std::max_element(x, x + n) - x); }

// |got - want| <= tol * max(1, max |want|) for every element (fp16 weights: ~1e-2).
float max_rel_err(const std::vector<float>& got, const float* want, int64_t n) {
  float scale = 1.0f, err = 0.0f;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(want[i]));
  for (int64_t i = 0; i < n; ++i) err = std::max(err, std::fabs(got[static_cast<size_t>(i)] - want[i]));
  return err / scale;
}

// One model on the GPU plus a block allocator, at TP 1.
struct GpuModel {
  std::unique_ptr<WeightStore> store;
  ShardLayout layout;
  ShardWeights weights;
  std::unique_ptr<CudaForward> forward;
  std::unique_ptr<test::TestBlockAllocator> allocator;
  const ModelConfig& config() const { return store->config(); }
};

Result<std::unique_ptr<GpuModel>> load_gpu_model(const std::string& path, int64_t block_size,
                                                 WeightQuant quant = WeightQuant::kNone,
                                                 const std::function<void(CudaForwardOptions&)>& edit = {}) {
  auto m = std::make_unique<GpuModel>();
  TESSERA_ASSIGN_OR_RETURN(m->store, WeightStore::open(path));
  ModelWeights full;
  TESSERA_ASSIGN_OR_RETURN(full, bind_model_weights(*m->store, {.codec = &cpu_weight_codec(), .quant = quant}));
  TESSERA_ASSIGN_OR_RETURN(m->layout, plan_shard_layout(m->config(), {0, 1}));
  TESSERA_ASSIGN_OR_RETURN(m->weights, slice_model_weights(std::move(full), m->config(), m->layout));
  CudaForwardOptions o;
  o.block_size = block_size;
  o.max_tokens_per_step = 512;
  o.max_seqs_per_step = 16;
  o.max_logit_rows = 64;
  o.max_kv_blocks = 4096 / block_size + 64;  // a small pool: tests may run side by side
  if (edit) edit(o);
  TESSERA_ASSIGN_OR_RETURN(m->forward, CudaForward::create(m->config(), m->layout, m->weights.weights, nullptr, o));
  if (!o.defer_kv_pool) m->allocator = std::make_unique<test::TestBlockAllocator>(m->forward->num_kv_blocks());
  return m;
}

// Greedy generation: prefill in pieces of `chunk` tokens (0: whole prompt), then one token per
// step. Returns the generated ids; *prompt_logits gets the logits at the last prompt position.
std::vector<int32_t> greedy(GpuModel& m, const std::vector<int32_t>& prompt, int64_t max_tokens, int64_t chunk,
                            std::vector<float>* prompt_logits) {
  const int64_t vocab = m.config().vocab;
  std::vector<int32_t> table, out;
  std::vector<float> logits;
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t piece = chunk > 0 ? chunk : n;
  EXPECT_TRUE(m.allocator->ensure(table, n + max_tokens, m.forward->block_size()));
  for (int64_t p = 0; p < n; p += piece) {
    const int64_t len = std::min(piece, n - p);
    SequenceInput in{std::span<const int32_t>(prompt).subspan(static_cast<size_t>(p), static_cast<size_t>(len)), p,
                     table, p + len == n};
    Status s = m.forward->run({&in, 1}, logits);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    if (!s.is_ok()) return out;
  }
  if (prompt_logits) *prompt_logits = logits;
  int64_t pos = n;
  while (static_cast<int64_t>(out.size()) < max_tokens) {
    const int32_t next = argmax(logits.data(), vocab);
    out.push_back(next);
    if (static_cast<int64_t>(out.size()) == max_tokens) break;
    SequenceInput in{std::span<const int32_t>(&out.back(), 1), pos++, table, true};
    Status s = m.forward->run({&in, 1}, logits);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    if (!s.is_ok()) break;
  }
  m.allocator->release(table);
  return out;
}

// The CPU LocalModel's logits at the last prompt position (empty on failure, which is reported).
std::vector<float> cpu_prompt_logits(LocalModel& cpu, const std::vector<int32_t>& prompt) {
  GenerateOptions go;
  go.max_tokens = 1;
  go.sampling.temperature = 0.0f;
  go.ignore_eos = true;
  auto out = generate(cpu, prompt, go);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.is_ok() ? out->prompt_last_logits : std::vector<float>{};
}

class CudaForwardTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    Result<const CudaApi*> api = load_cuda_api_with_device();
    if (!api.is_ok()) GTEST_SKIP() << api.status().message();
    TESSERA_REQUIRE_TESTDATA(stories_dir() + "/reference.json");
  }
  std::string model_path() const { return stories_dir() + "/" + GetParam(); }

  // The model twice (block size 8, no split decode attention: its merge kernel would add a
  // launch a layer): models[0] replays CUDA graphs, models[1] runs every step eagerly.
  void load_graphed_and_eager(std::unique_ptr<GpuModel> (&models)[2]) {
    for (int k = 0; k < 2; ++k) {
      auto m = load_gpu_model(model_path(), 8, WeightQuant::kNone, [k](CudaForwardOptions& o) {
        o.cuda_graphs = k == 0;
        o.decode_split_keys = -1;
      });
      ASSERT_TRUE(m.is_ok()) << m.status().to_string();
      models[k] = std::move(*m);
    }
  }

  // Two copies of the model (block size 8): models[0] for run()'s logits, models[1] for the
  // device path under test; tables[k][i] holds the i-th reference prompt plus 12 tokens.
  void load_two(std::unique_ptr<GpuModel> (&models)[2], std::vector<std::vector<int32_t>> (&tables)[2],
                const std::vector<RefCase>& cases, size_t n_seqs) {
    for (int k = 0; k < 2; ++k) {
      auto m = load_gpu_model(model_path(), 8);
      ASSERT_TRUE(m.is_ok()) << m.status().to_string();
      models[k] = std::move(*m);
      tables[k].resize(n_seqs);
      for (size_t i = 0; i < n_seqs; ++i)
        ASSERT_TRUE(models[k]->allocator->ensure(tables[k][i], static_cast<int64_t>(cases[i].prompt.size()) + 12, 8));
    }
  }
};

TEST_P(CudaForwardTest, GreedyIdsMatchReferenceAndLogitsMatchCpu) {
  auto gpu = load_gpu_model(model_path(), 16);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  auto cpu = LocalModel::load({.path = model_path(), .runtime = {.threads = 2}});
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  const int64_t vocab = (*gpu)->config().vocab;
  for (const RefCase& c : load_cases()) {
    std::vector<float> gpu_logits;
    const std::vector<int32_t> ids =
        greedy(**gpu, c.prompt, static_cast<int64_t>(c.greedy.size()), 0, &gpu_logits);
    EXPECT_EQ(ids, c.greedy) << c.name;
    ASSERT_EQ(static_cast<int64_t>(gpu_logits.size()), vocab) << c.name;
    EXPECT_LT(max_rel_err(gpu_logits, c.logits.data(), vocab), 1e-2f) << c.name << " vs reference.json";

    const std::vector<float> cpu_logits = cpu_prompt_logits(**cpu, c.prompt);
    ASSERT_EQ(static_cast<int64_t>(cpu_logits.size()), vocab) << c.name;
    EXPECT_LT(max_rel_err(gpu_logits, cpu_logits.data(), vocab), 1e-2f) << c.name << " vs CPU";
  }
}

// An fp16 KV cache (half the bytes a token): the reference's greedy ids, the last prompt
// position's logits within the fp16 tolerance of the CPU backend's fp16 cache, and not the
// fp32 cache's logits (the keys and values are stored rounded, not only billed as fp16), through
// eager decode steps, graph replays and split decode attention.
TEST_P(CudaForwardTest, Fp16KvMatchesTheCpuFp16Kv) {
  auto fp32 = load_gpu_model(model_path(), 16);
  ASSERT_TRUE(fp32.is_ok()) << fp32.status().to_string();
  auto cpu = LocalModel::load({.path = model_path(), .runtime = {.threads = 2, .kv_dtype = KvDtype::kF16}});
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  const int64_t vocab = (*fp32)->config().vocab;
  for (const int64_t split_keys : {int64_t{-1}, int64_t{16}})
    for (const bool graphs : {true, false}) {
      const std::string what = std::string(graphs ? "graphed" : "eager") + (split_keys > 0 ? ", split" : "");
      auto gpu = load_gpu_model(model_path(), 16, WeightQuant::kNone, [&](CudaForwardOptions& o) {
        o.kv_dtype = KvDtype::kF16;
        o.cuda_graphs = graphs;
        o.decode_split_keys = split_keys;
      });
      ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
      EXPECT_EQ((*gpu)->forward->kv_bytes_per_token() * 2, (*fp32)->forward->kv_bytes_per_token());
      EXPECT_EQ((*gpu)->forward->kv_bytes(),
                (*gpu)->forward->num_kv_blocks() * 16 * (*gpu)->forward->kv_bytes_per_token());
      for (const RefCase& c : load_cases()) {
        std::vector<float> logits16, logits32;
        EXPECT_EQ(greedy(**gpu, c.prompt, static_cast<int64_t>(c.greedy.size()), 0, &logits16), c.greedy)
            << c.name << " " << what;
        greedy(**fp32, c.prompt, 1, 0, &logits32);
        ASSERT_EQ(static_cast<int64_t>(logits16.size()), vocab);
        const std::vector<float> cpu_logits = cpu_prompt_logits(**cpu, c.prompt);
        ASSERT_EQ(static_cast<int64_t>(cpu_logits.size()), vocab) << c.name;
        EXPECT_LT(max_rel_err(logits16, cpu_logits.data(), vocab), 1e-2f) << c.name << " vs CPU fp16 KV";
        if (c.prompt.size() > 1) {
          EXPECT_NE(logits16, logits32) << c.name << ": fp16 KV gave the fp32 KV's logits";
        }
      }
    }
}

TEST_P(CudaForwardTest, ChunkedPrefillAndBlockSizesAgree) {
  const RefCase c = load_cases().back();
  const std::vector<int32_t> want(c.greedy.begin(), c.greedy.begin() + std::min<size_t>(16, c.greedy.size()));
  for (int64_t block_size : {1, 5, 16, 64}) {
    auto gpu = load_gpu_model(model_path(), block_size);
    ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
    for (int64_t chunk : {0, 1, 7, 16}) {
      EXPECT_EQ(greedy(**gpu, c.prompt, static_cast<int64_t>(want.size()), chunk, nullptr), want)
          << "block size " << block_size << " chunk " << chunk;
    }
  }
}

TEST_P(CudaForwardTest, BatchedPrefillAndDecodeMatchSingle) {
  auto gpu = load_gpu_model(model_path(), 8);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  GpuModel& m = **gpu;
  const std::vector<RefCase> cases = load_cases();
  const int64_t vocab = m.config().vocab;
  std::vector<std::vector<int32_t>> tables(cases.size());
  std::vector<SequenceInput> batch;
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(m.allocator->ensure(tables[i], static_cast<int64_t>(cases[i].prompt.size()) + 1, 8));
    batch.push_back({cases[i].prompt, 0, tables[i], true});
  }
  std::vector<float> logits;
  Status s = m.forward->run(batch, logits);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_EQ(static_cast<int64_t>(logits.size()), vocab * static_cast<int64_t>(cases.size()));
  // Then one batched decode step (every piece one token: the decode kernel) for all of them.
  std::vector<int32_t> next(cases.size());
  std::vector<SequenceInput> step;
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_LT(max_rel_err(std::vector<float>(logits.begin() + static_cast<int64_t>(i) * vocab,
                                             logits.begin() + static_cast<int64_t>(i + 1) * vocab),
                          cases[i].logits.data(), vocab),
              1e-2f)
        << cases[i].name;
    next[i] = argmax(&logits[i * static_cast<size_t>(vocab)], vocab);
    EXPECT_EQ(next[i], cases[i].greedy[0]) << cases[i].name;
  }
  for (size_t i = 0; i < cases.size(); ++i)
    step.push_back({std::span<const int32_t>(&next[i], 1), static_cast<int64_t>(cases[i].prompt.size()), tables[i],
                    true});
  s = m.forward->run(step, logits);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  for (size_t i = 0; i < cases.size(); ++i) {
    if (cases[i].greedy.size() > 1) {
      EXPECT_EQ(argmax(&logits[i * static_cast<size_t>(vocab)], vocab), cases[i].greedy[1]) << cases[i].name;
    }
  }
  for (auto& t : tables) m.allocator->release(t);
}

TEST_P(CudaForwardTest, RejectsBadInputWithoutCrashing) {
  auto gpu = load_gpu_model(model_path(), 16);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  GpuModel& m = **gpu;
  std::vector<int32_t> table;
  ASSERT_TRUE(m.allocator->ensure(table, 4, 16));
  std::vector<float> logits;
  const std::vector<int32_t> bad_id = {1, 512};
  SequenceInput in{bad_id, 0, table, true};
  Status s = m.forward->run({&in, 1}, logits);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.to_string();
  const std::vector<int32_t> bad_block = {static_cast<int32_t>(m.forward->num_kv_blocks())};
  const std::vector<int32_t> one = {1};
  in = {one, 0, bad_block, true};
  EXPECT_FALSE(m.forward->run({&in, 1}, logits).is_ok());
  // 17 sequences: more than max_seqs_per_step (16) of the workspace.
  std::vector<SequenceInput> too_many(17, SequenceInput{one, 0, table, true});
  s = m.forward->run(too_many, logits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  // Still works afterwards: the first greedy token of prompt {1}.
  in = {one, 0, table, true};
  s = m.forward->run({&in, 1}, logits);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(argmax(logits.data(), m.config().vocab), 403);
}

// Decode steps replayed from CUDA graphs (batches padded to buckets 1, 2, 4) give the logits
// of the same steps run eagerly, one graph per bucket is captured once, and a graphed step
// costs a handful of launches instead of several per layer.
TEST_P(CudaForwardTest, DecodeGraphsMatchEagerSteps) {
  std::unique_ptr<GpuModel> owned[2];
  ASSERT_NO_FATAL_FAILURE(load_graphed_and_eager(owned));
  GpuModel* models[2] = {owned[0].get(), owned[1].get()};
  const int64_t vocab = models[0]->config().vocab;
  const std::vector<RefCase> cases = load_cases();
  ASSERT_GE(cases.size(), 3u);
  const size_t n_seqs = 3;
  std::vector<std::vector<int32_t>> tables[2];
  std::vector<float> logits[2];
  for (int m = 0; m < 2; ++m) {
    tables[m].resize(n_seqs);
    std::vector<SequenceInput> prefill;
    for (size_t i = 0; i < n_seqs; ++i) {
      ASSERT_TRUE(models[m]->allocator->ensure(tables[m][i], static_cast<int64_t>(cases[i].prompt.size()) + 16, 8));
      prefill.push_back({cases[i].prompt, 0, tables[m][i], true});
    }
    Status s = models[m]->forward->run(prefill, logits[m]);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_FALSE(models[m]->forward->last_step().graphed);
  }
  std::vector<int32_t> next(n_seqs);
  std::vector<int64_t> pos(n_seqs);
  for (size_t i = 0; i < n_seqs; ++i) {
    next[i] = argmax(&logits[0][i * static_cast<size_t>(vocab)], vocab);
    pos[i] = static_cast<int64_t>(cases[i].prompt.size());
  }
  // 3 sequences (bucket 4, one padding row), then 2 (bucket 2), then 1 (bucket 1), then 3 again.
  const size_t widths[] = {3, 3, 3, 2, 2, 1, 1, 3, 3};
  int64_t eager_launches = 0;
  for (size_t k = 0; k < std::size(widths); ++k) {
    const size_t w = widths[k];
    for (int m = 0; m < 2; ++m) {
      std::vector<SequenceInput> step;
      for (size_t i = 0; i < w; ++i)
        step.push_back({std::span<const int32_t>(&next[i], 1), pos[i], tables[m][i], true});
      Status s = models[m]->forward->run(step, logits[m]);
      ASSERT_TRUE(s.is_ok()) << "step " << k << ": " << s.to_string();
    }
    const CudaStepStats& g = models[0]->forward->last_step();
    EXPECT_TRUE(g.graphed) << "step " << k;
    EXPECT_EQ(g.bucket, w == 3 ? 4 : static_cast<int64_t>(w)) << "step " << k;
    EXPECT_EQ(g.captured, k == 0 || k == 3 || k == 5) << "step " << k;
    EXPECT_EQ(g.launches, 4) << "step " << k;  // metadata, KV slots, the graph, the logits
    EXPECT_FALSE(models[1]->forward->last_step().graphed);
    eager_launches = models[1]->forward->last_step().launches;
    ASSERT_EQ(logits[0].size(), w * static_cast<size_t>(vocab));
    ASSERT_EQ(logits[1].size(), logits[0].size());
    for (size_t i = 0; i < w; ++i) {
      const std::vector<float> row(logits[0].begin() + static_cast<int64_t>(i) * vocab,
                                   logits[0].begin() + static_cast<int64_t>(i + 1) * vocab);
      EXPECT_LT(max_rel_err(row, &logits[1][i * static_cast<size_t>(vocab)], vocab), 1e-3f)
          << "step " << k << " sequence " << i;
      next[i] = argmax(&logits[0][i * static_cast<size_t>(vocab)], vocab);
      EXPECT_EQ(next[i], argmax(&logits[1][i * static_cast<size_t>(vocab)], vocab)) << "step " << k;
      ++pos[i];
    }
  }
  EXPECT_EQ(models[0]->forward->graphs_captured(), 3);
  EXPECT_EQ(models[1]->forward->graphs_captured(), 0);
  // 16 a layer + 8 a step: the count `tessera plan` uses (plan/planner.cpp).
  EXPECT_EQ(eager_launches, 16 * models[0]->config().n_layers + 8);
  for (int m = 0; m < 2; ++m)
    for (auto& t : tables[m]) models[m]->allocator->release(t);
}

// Speculative verification steps (each sequence's last known token and k drafts, every row's
// logits) replayed from CUDA graphs of (bucket, rows per sequence) give the logits of the same
// steps run eagerly, beside plain decodes in the same step; the argmaxes on the device (the
// greedy graph of the same key) are the logits' argmaxes, and verifying the drafts with them
// keeps llama2.c's reference ids. Drafts are the reference's next ids with some changed, so
// some are rejected and the next step rewrites their KV slots.
TEST_P(CudaForwardTest, VerificationGraphsMatchEagerSteps) {
  std::unique_ptr<GpuModel> owned[2];
  ASSERT_NO_FATAL_FAILURE(load_graphed_and_eager(owned));
  GpuModel* models[2] = {owned[0].get(), owned[1].get()};
  const int64_t vocab = models[0]->config().vocab;
  const std::vector<RefCase> cases = load_cases();
  ASSERT_GE(cases.size(), 3u);
  const size_t n_seqs = 3;
  std::vector<std::vector<int32_t>> tables[2];
  std::vector<float> logits[2];
  std::vector<int32_t> ids;
  for (int m = 0; m < 2; ++m) {
    tables[m].resize(n_seqs);
    std::vector<SequenceInput> prefill;
    for (size_t i = 0; i < n_seqs; ++i) {
      ASSERT_TRUE(models[m]->allocator->ensure(tables[m][i], static_cast<int64_t>(cases[i].prompt.size()) + 64, 8));
      prefill.push_back({cases[i].prompt, 0, tables[m][i], true});
    }
    Status s = models[m]->forward->run(prefill, logits[m]);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
  std::vector<std::vector<int32_t>> out(n_seqs);  // verified ids; the last one is not in the KV yet
  std::vector<int64_t> pos(n_seqs);               // position of out.back()
  for (size_t i = 0; i < n_seqs; ++i) {
    out[i].push_back(argmax(&logits[0][i * static_cast<size_t>(vocab)], vocab));
    pos[i] = static_cast<int64_t>(cases[i].prompt.size());
  }
  // Drafts per sequence and step (0: a plain decode piece); rows per sequence 4, 2, 1, 4, 4, 16.
  const std::vector<std::vector<int64_t>> schedule = {{2, 0, 3}, {1, 1, 1}, {0, 0, 0}, {3, 0}, {2, 3, 1}, {8}};
  const int64_t want_q[] = {4, 2, 1, 4, 4, 16};
  const int64_t want_bucket[] = {4, 4, 4, 2, 4, 1};
  const bool want_captured[] = {true, true, true, true, false, true};
  int64_t kept = 0, rejected = 0;
  for (size_t step = 0; step < schedule.size(); ++step) {
    const size_t w = schedule[step].size();
    std::vector<std::vector<int32_t>> pieces(w);
    for (size_t i = 0; i < w; ++i) {
      const int64_t k = schedule[step][i];
      const std::vector<int32_t>& ref = cases[i].greedy;
      pieces[i].push_back(out[i].back());
      for (int64_t j = 0; j < k; ++j) {
        const size_t at = out[i].size() + static_cast<size_t>(j);
        int32_t d = at < ref.size() ? ref[at] : 1;
        if ((step + i + static_cast<size_t>(j)) % 4 == 3) d = (d + 7) % static_cast<int32_t>(vocab);  // a wrong guess
        pieces[i].push_back(d);
      }
    }
    for (int m = 0; m < 2; ++m) {
      std::vector<SequenceInput> batch;
      for (size_t i = 0; i < w; ++i) {
        SequenceInput in{pieces[i], pos[i], tables[m][i], true};
        in.all_logits = pieces[i].size() > 1;
        batch.push_back(in);
      }
      Status s = models[m]->forward->run(batch, logits[m]);
      ASSERT_TRUE(s.is_ok()) << "step " << step << ": " << s.to_string();
      if (m == 0) {
        const CudaStepStats& g = models[0]->forward->last_step();
        EXPECT_TRUE(g.graphed) << "step " << step;
        EXPECT_EQ(g.graph_tokens, want_q[step]) << "step " << step;
        EXPECT_EQ(g.bucket, want_bucket[step]) << "step " << step;
        EXPECT_EQ(g.captured, want_captured[step]) << "step " << step;
        // The same step again with the argmax on the device: the same KV is written again.
        s = models[0]->forward->run_greedy(batch, ids);
        ASSERT_TRUE(s.is_ok()) << "step " << step << ": " << s.to_string();
        EXPECT_TRUE(models[0]->forward->last_step().graphed);
      } else {
        EXPECT_FALSE(models[1]->forward->last_step().graphed);
      }
    }
    ASSERT_EQ(logits[1].size(), logits[0].size());
    ASSERT_EQ(ids.size() * static_cast<size_t>(vocab), logits[0].size());
    size_t row = 0;
    for (size_t i = 0; i < w; ++i) {
      const auto k = static_cast<int64_t>(pieces[i].size()) - 1;
      int64_t accepted = 0;
      for (int64_t j = 0; j <= k; ++j, ++row) {
        const float* g = &logits[0][row * static_cast<size_t>(vocab)];
        const std::vector<float> got(g, g + vocab);
        EXPECT_LT(max_rel_err(got, &logits[1][row * static_cast<size_t>(vocab)], vocab), 1e-3f)
            << "step " << step << " sequence " << i << " row " << j;
        const int32_t id = argmax(g, vocab);
        EXPECT_EQ(id, argmax(&logits[1][row * static_cast<size_t>(vocab)], vocab));
        EXPECT_EQ(ids[row], id) << "step " << step << " sequence " << i << " row " << j;
        if (j == accepted) {  // still verifying: this row's token is emitted
          out[i].push_back(id);
          if (j < k && id == pieces[i][static_cast<size_t>(j + 1)]) ++accepted;
        }
      }
      kept += accepted;
      rejected += k - accepted;
      pos[i] += accepted + 1;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(rejected, 0);
  for (size_t i = 0; i < n_seqs; ++i) {
    const size_t n = std::min(out[i].size(), cases[i].greedy.size());
    EXPECT_EQ(std::vector<int32_t>(out[i].begin(), out[i].begin() + static_cast<int64_t>(n)),
              std::vector<int32_t>(cases[i].greedy.begin(), cases[i].greedy.begin() + static_cast<int64_t>(n)))
        << cases[i].name;
  }
  // A logits and a greedy graph for each of the 5 keys (bucket, rows).
  EXPECT_EQ(models[0]->forward->graphs_captured(), 10);
  EXPECT_EQ(models[1]->forward->graphs_captured(), 0);
  for (int m = 0; m < 2; ++m)
    for (auto& t : tables[m]) models[m]->allocator->release(t);
}

// run_greedy (the argmax on the device, only ids back) picks the argmax of run()'s logits, for a
// batched prefill and for graphed decode steps of several bucket sizes.
TEST_P(CudaForwardTest, GreedyOnTheDeviceMatchesTheLogitsArgmax) {
  const std::vector<RefCase> cases = load_cases();
  const size_t n_seqs = std::min<size_t>(3, cases.size());
  std::unique_ptr<GpuModel> m[2];
  std::vector<std::vector<int32_t>> tables[2];
  ASSERT_NO_FATAL_FAILURE(load_two(m, tables, cases, n_seqs));
  const int64_t vocab = m[0]->config().vocab;
  std::vector<float> logits;
  std::vector<int32_t> ids, next(n_seqs);
  std::vector<int64_t> pos(n_seqs);
  for (size_t w : {n_seqs, n_seqs, n_seqs - 1, size_t{1}, n_seqs, size_t{1}}) {
    std::vector<SequenceInput> in[2];
    const bool prefill = pos[0] == 0;
    for (int k = 0; k < 2; ++k)
      for (size_t i = 0; i < w; ++i)
        in[k].push_back(prefill ? SequenceInput{cases[i].prompt, 0, tables[k][i], true}
                                : SequenceInput{std::span<const int32_t>(&next[i], 1), pos[i], tables[k][i], true});
    Status s = m[0]->forward->run(in[0], logits);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    s = m[1]->forward->run_greedy(in[1], ids);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    ASSERT_EQ(ids.size(), w);
    EXPECT_EQ(m[1]->forward->last_step().graphed, !prefill);
    for (size_t i = 0; i < w; ++i) {
      EXPECT_EQ(ids[i], argmax(&logits[i * static_cast<size_t>(vocab)], vocab)) << "sequence " << i;
      pos[i] = prefill ? static_cast<int64_t>(cases[i].prompt.size()) : pos[i] + 1;
      next[i] = ids[i];
    }
  }
  EXPECT_EQ(m[1]->forward->graphs_captured(), 3);  // greedy graphs of buckets 4, 2, 1
}

// run_sampled (penalties, temperature, top-k / top-p / min-p, bans, the seeded draw and the
// logprobs on the device) gives what the host Sampler gives on run()'s logits, for a batched
// prefill (eager) and graphed decode steps, with a greedy-with-logprobs row in the batch.
TEST_P(CudaForwardTest, SampledOnTheDeviceMatchesTheHostSampler) {
  const std::vector<RefCase> cases = load_cases();
  const size_t n_seqs = std::min<size_t>(3, cases.size());
  std::unique_ptr<GpuModel> m[2];
  std::vector<std::vector<int32_t>> tables[2];
  ASSERT_NO_FATAL_FAILURE(load_two(m, tables, cases, n_seqs));
  const int64_t vocab = m[0]->config().vocab;
  std::vector<SamplingParams> params(3);
  params[0] = {.temperature = 0.8f, .top_k = 20, .seed = 3, .has_seed = true, .n_logprobs = 3, .return_logprob = true};
  // Sequence 1's logprobs come from its penalised logits with its bans (the host's most likely
  // token of each step): a penalty or ban the device misses moves them.
  params[1] = {.temperature = 1.0f,
               .top_p = 0.9f,
               .min_p = 0.05f,
               .repetition_penalty = 1.3f,
               .presence_penalty = 0.4f,
               .frequency_penalty = 0.2f,
               .seed = 5,
               .has_seed = true,
               .n_logprobs = 2,
               .return_logprob = true};
  params[2] = {.temperature = 0.0f, .n_logprobs = 2};
  std::vector<int32_t> banned[3] = {{}, {5, 17, 400}, {}};
  std::vector<std::unique_ptr<Sampler>> host, device;
  for (size_t i = 0; i < n_seqs; ++i) {
    host.push_back(std::make_unique<Sampler>(params[i]));
    device.push_back(std::make_unique<Sampler>(params[i]));
    host[i]->add_prompt_tokens(cases[i].prompt);
    device[i]->add_prompt_tokens(cases[i].prompt);
  }
  std::vector<float> logits;
  std::vector<SampledToken> sampled;
  std::vector<int32_t> next(n_seqs);
  std::vector<int64_t> pos(n_seqs);
  int64_t compared = 0, expected = 0;
  for (size_t w : {n_seqs, n_seqs, n_seqs, n_seqs - 1, size_t{1}, n_seqs, n_seqs, size_t{1}}) {
    expected += static_cast<int64_t>(w);
    std::vector<SequenceInput> in[2];
    const bool prefill = pos[0] == 0;
    for (int k = 0; k < 2; ++k)
      for (size_t i = 0; i < w; ++i)
        in[k].push_back(prefill ? SequenceInput{cases[i].prompt, 0, tables[k][i], true}
                                : SequenceInput{std::span<const int32_t>(&next[i], 1), pos[i], tables[k][i], true});
    Status s = m[0]->forward->run(in[0], logits);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    if (w > 1) banned[1] = {5, 17, argmax(&logits[static_cast<size_t>(vocab)], vocab)};
    std::vector<TesseraCudaSampleRow> rows;
    std::vector<TesseraCudaPenalty> penalties;
    for (size_t i = 0; i < w; ++i) rows.push_back(device_sample_row(*device[i], banned[i], penalties));
    s = m[1]->forward->run_sampled(in[1], rows, penalties, sampled);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    ASSERT_EQ(sampled.size(), w);
    EXPECT_EQ(m[1]->forward->last_step().graphed, !prefill);
    for (size_t i = 0; i < w; ++i) {
      float* row = &logits[i * static_cast<size_t>(vocab)];
      for (const int32_t id : banned[i]) row[id] = -INFINITY;
      const SampledToken want = host[i]->sample(row, vocab);
      const SampledToken& got = sampled[i];
      ASSERT_EQ(got.id, want.id) << "sequence " << i << " position " << pos[i];
      EXPECT_NEAR(got.logprob, want.logprob, 1e-4) << "sequence " << i;
      ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size()) << "sequence " << i;
      for (size_t j = 0; j < want.top_logprobs.size(); ++j) {
        EXPECT_EQ(got.top_logprobs[j].first, want.top_logprobs[j].first) << "sequence " << i << " top " << j;
        EXPECT_NEAR(got.top_logprobs[j].second, want.top_logprobs[j].second, 1e-4);
      }
      device[i]->accept(got.id);
      pos[i] = prefill ? static_cast<int64_t>(cases[i].prompt.size()) : pos[i] + 1;
      next[i] = want.id;
      ++compared;
    }
  }
  EXPECT_EQ(compared, expected);
  // A request the device cannot serve is refused before anything runs.
  std::vector<TesseraCudaSampleRow> rows(1);
  rows[0].n_logprobs = TESSERA_CUDA_MAX_TOP_LOGPROBS + 1;
  const Status s = m[1]->forward->run_sampled({}, rows, {}, sampled);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("n_logprobs"), std::string::npos) << s.to_string();
}

// Decode attention split over the sequence (pieces of 16 keys here, so every step of these
// prompts uses several): the reference greedy ids, graphed and eager.
TEST_P(CudaForwardTest, SplitDecodeAttentionGivesTheReferenceIds) {
  for (const bool graphs : {true, false}) {
    auto gpu = load_gpu_model(model_path(), 16, WeightQuant::kNone, [&](CudaForwardOptions& o) {
      o.decode_split_keys = 16;
      o.cuda_graphs = graphs;
    });
    ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
    for (const RefCase& c : load_cases())
      EXPECT_EQ(greedy(**gpu, c.prompt, static_cast<int64_t>(c.greedy.size()), 0, nullptr), c.greedy)
          << c.name << (graphs ? " graphed" : " eager");
  }
}

// The shard's order: weights and workspace first, the KV pool when the coordinator has chosen
// the block size and count; copy-on-write block copies on the device.
TEST_P(CudaForwardTest, DeferredKvPoolAndBlockCopies) {
  auto gpu =
      load_gpu_model(model_path(), 16, WeightQuant::kNone, [](CudaForwardOptions& o) { o.defer_kv_pool = true; });
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  CudaForward& f = *(*gpu)->forward;
  const int64_t vocab = (*gpu)->config().vocab;
  const std::vector<int32_t> one = {1};
  const std::vector<int32_t> table0 = {0};
  std::vector<float> logits;
  SequenceInput early{one, 0, table0, true};
  EXPECT_EQ(f.run({&early, 1}, logits).code(), StatusCode::kInvalidArgument);
  Result<int64_t> free_bytes = f.free_device_bytes();
  ASSERT_TRUE(free_bytes.is_ok()) << free_bytes.status().to_string();
  EXPECT_GT(*free_bytes, 0);
  EXPECT_EQ(f.configure_kv(8, 0).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(f.configure_kv(8, 32).is_ok());
  EXPECT_EQ(f.num_kv_blocks(), 32);
  EXPECT_EQ(f.block_size(), 8);
  EXPECT_EQ(f.kv_bytes(), 32 * 8 * f.kv_bytes_per_token());
  EXPECT_EQ(f.configure_kv(8, 32).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.copy_block(0, 32).code(), StatusCode::kOutOfRange);

  // A prompt of 20 tokens fills blocks 0, 1 and 4 of 8 tokens each (block 4 holds 4 of them).
  // Sequence B shares blocks 0 and 1 and gets a copy of block 4 in block 9: its next step must
  // see exactly what A's sees.
  const RefCase c = load_cases().back();
  std::vector<int32_t> prompt;
  while (prompt.size() < 20) prompt.insert(prompt.end(), c.prompt.begin(), c.prompt.end());
  prompt.resize(20);
  const std::vector<int32_t> table_a = {0, 1, 4}, table_b = {0, 1, 9};
  SequenceInput a{prompt, 0, table_a, true};
  ASSERT_TRUE(f.run({&a, 1}, logits).is_ok());
  const int32_t next = argmax(logits.data(), vocab);
  ASSERT_TRUE(f.copy_block(4, 9).is_ok());
  std::vector<float> logits_a, logits_b;
  a = {std::span<const int32_t>(&next, 1), 20, table_a, true};
  SequenceInput b{std::span<const int32_t>(&next, 1), 20, table_b, true};
  ASSERT_TRUE(f.run({&a, 1}, logits_a).is_ok());
  ASSERT_TRUE(f.run({&b, 1}, logits_b).is_ok());
  EXPECT_EQ(logits_a, logits_b);
  // Without the copy (block 10 was never written) the same step sees other keys.
  const std::vector<int32_t> table_c = {0, 1, 10};
  SequenceInput no_copy{std::span<const int32_t>(&next, 1), 20, table_c, true};
  ASSERT_TRUE(f.run({&no_copy, 1}, logits).is_ok());
  EXPECT_NE(logits, logits_a);
}

// Prompt logprobs of more rows than max_logit_rows (64 here): the LM head runs in pieces and
// the rows equal those of the same prompt prefilled in chunks of 50.
TEST_P(CudaForwardTest, AllLogitsBeyondMaxLogitRows) {
  auto whole = load_gpu_model(model_path(), 16);
  auto chunked = load_gpu_model(model_path(), 16);
  ASSERT_TRUE(whole.is_ok() && chunked.is_ok());
  const int64_t vocab = (*whole)->config().vocab;
  const RefCase c = load_cases().front();
  std::vector<int32_t> prompt;
  while (prompt.size() < 150) prompt.insert(prompt.end(), c.prompt.begin(), c.prompt.end());
  prompt.resize(150);
  std::vector<int32_t> t1, t2;
  ASSERT_TRUE((*whole)->allocator->ensure(t1, 150, 16));
  ASSERT_TRUE((*chunked)->allocator->ensure(t2, 150, 16));
  std::vector<float> all, piece, pieces;
  SequenceInput in{prompt, 0, t1, true, true};
  Status s = (*whole)->forward->run({&in, 1}, all);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_EQ(all.size(), 150 * static_cast<size_t>(vocab));
  for (int64_t p = 0; p < 150; p += 50) {
    SequenceInput part{std::span<const int32_t>(prompt).subspan(static_cast<size_t>(p), 50), p, t2, true, true};
    s = (*chunked)->forward->run({&part, 1}, piece);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    pieces.insert(pieces.end(), piece.begin(), piece.end());
  }
  ASSERT_EQ(pieces.size(), all.size());
  for (int64_t r = 0; r < 150; r += 7) {
    const std::vector<float> row(all.begin() + r * vocab, all.begin() + (r + 1) * vocab);
    EXPECT_LT(max_rel_err(row, &pieces[static_cast<size_t>(r * vocab)], vocab), 1e-2f) << "row " << r;
  }
}

// The synthetic model of the tests below: hidden 256, FFN 512 (whole INT4 groups and K-quant
// super-blocks), 2 layers, 4 heads over 2 KV heads, vocabulary 512, context 512.
SyntheticModelSpec small_spec(uint32_t seed) {
  SyntheticModelSpec spec;
  spec.hidden = 256;
  spec.n_layers = 2;
  spec.n_heads = 4;
  spec.n_kv_heads = 2;
  spec.ffn = 512;
  spec.vocab = 512;
  spec.max_positions = 512;
  spec.weight_type = QuantType::kF16;
  spec.seed = seed;
  return spec;
}

// 8 greedy tokens after `prompt` on the GPU and on the CPU model, and the logits at the last
// prompt position of each.
struct GpuCpuRun {
  std::vector<int32_t> gpu_ids;
  std::vector<float> gpu_logits;
  GenerateOutput cpu;
};

Result<GpuCpuRun> run_gpu_and_cpu(GpuModel& gpu, LocalModel& cpu, const std::vector<int32_t>& prompt) {
  GpuCpuRun r;
  r.gpu_ids = greedy(gpu, prompt, 8, 0, &r.gpu_logits);
  GenerateOptions go;
  go.max_tokens = 8;
  go.sampling.temperature = 0.0f;
  go.ignore_eos = true;
  TESSERA_ASSIGN_OR_RETURN(r.cpu, generate(cpu, prompt, go));
  return r;
}

// GPU vs CPU on a synthetic model (hidden 256, FFN 512: whole INT4 groups) in F16, INT8
// (W8A16 kernel) and INT4 (W4A16 kernel, repacked at upload): last-prompt-position logits
// correlate with the CPU's on the same quantized weights, and the greedy tokens agree.
TEST(CudaForwardSynthetic, MatchesCpuInF16Int8Int4) {
  if (auto api = load_cuda_api_with_device(); !api.is_ok()) {
    GTEST_SKIP() << api.status().message();
  }
  const std::string dir = ::testing::TempDir() + "tessera_cuda_forward_synthetic";
  const SyntheticModelSpec spec = small_spec(77);
  ASSERT_TRUE(write_synthetic_hf(spec, dir).is_ok());
  // Prompts of 40 and 300 tokens: the prefill GEMMs of INT8 / INT4 take the tensor-core kernels
  // (9..256 tokens), then dequantize + cuBLAS (> 256); the decode steps the W8A16 / W4A16 FMA
  // kernels.
  for (const size_t prompt_len : {size_t{40}, size_t{300}})
  for (WeightQuant q : {WeightQuant::kNone, WeightQuant::kInt8, WeightQuant::kInt4}) {
    std::vector<int32_t> prompt(prompt_len);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(1 + (i * 37) % 511);
    const std::string what = std::string(weight_quant_name(q)) + ", prompt of " + std::to_string(prompt_len);
    auto gpu = load_gpu_model(dir, 16, q);
    ASSERT_TRUE(gpu.is_ok()) << what << ": " << gpu.status().to_string();
    auto cpu = LocalModel::load({.path = dir, .runtime = {.threads = 2, .quant = q}});
    ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
    const int64_t vocab = (*gpu)->config().vocab;
    auto run = run_gpu_and_cpu(**gpu, **cpu, prompt);
    ASSERT_TRUE(run.is_ok()) << run.status().to_string();
    const std::vector<int32_t>& gpu_ids = run->gpu_ids;
    const std::vector<float>& gpu_logits = run->gpu_logits;
    const GenerateOutput* out = &run->cpu;
    ASSERT_EQ(static_cast<int64_t>(gpu_logits.size()), vocab);
    double ma = 0, mb = 0, sab = 0, saa = 0, sbb = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      ma += out->prompt_last_logits[static_cast<size_t>(i)];
      mb += gpu_logits[static_cast<size_t>(i)];
    }
    ma /= static_cast<double>(vocab);
    mb /= static_cast<double>(vocab);
    for (int64_t i = 0; i < vocab; ++i) {
      const double x = out->prompt_last_logits[static_cast<size_t>(i)] - ma, y = gpu_logits[static_cast<size_t>(i)] - mb;
      sab += x * y;
      saa += x * x;
      sbb += y * y;
    }
    const double corr = sab / std::sqrt(saa * sbb);
    std::printf("%s: GPU/CPU logits correlation %.6f, max rel err %.4f\n", what.c_str(), corr,
                max_rel_err(gpu_logits, out->prompt_last_logits.data(), vocab));
    // The CPU's INT8 / INT4 paths may also quantize activations, so only F16 gets the tight bound.
    EXPECT_GT(corr, q == WeightQuant::kNone ? 0.9999 : 0.999) << what;
    if (q == WeightQuant::kNone) {
      EXPECT_LT(max_rel_err(gpu_logits, out->prompt_last_logits.data(), vocab), 1e-2f);
    }
    ASSERT_FALSE(gpu_ids.empty());
    ASSERT_FALSE(out->ids.empty());
    EXPECT_EQ(gpu_ids.front(), out->ids.front()) << what;
    EXPECT_EQ(gpu_ids, out->ids) << what << " (greedy agreement over 8 tokens)";
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// GPU vs CPU on synthetic GGUF files in Q8_0, Q4_0, a Q4_K_M-like mix (Q4_K, Q6_K for the
// LM head and some attn_v / ffn_down) and the low-bit Q2_K, Q3_K, TQ1_0, TQ2_0: the block matrices stay in their blocks on the device
// (weight_bytes_per_step() is their byte count, weight_bytes() below the f16 size), decode steps
// and short prompts take the GGUF block GEMM, a 40-token prompt the f16 expansion + cuBLAS, and
// the greedy tokens equal the CPU LocalModel's.
TEST(CudaForwardSynthetic, GgufBlocksMatchCpu) {
  if (auto api = load_cuda_api_with_device(); !api.is_ok()) {
    GTEST_SKIP() << api.status().message();
  }
  SyntheticModelSpec spec = small_spec(91);
  const struct {
    const char* name;
    QuantType type;
    bool q4_k_m;
  } files[] = {{"q8_0", QuantType::kQ8_0, false},  {"q4_0", QuantType::kQ4_0, false},
               {"q4_k_m", QuantType::kQ4_K, true}, {"q2_k", QuantType::kQ2_K, false},
               {"q3_k", QuantType::kQ3_K, false},  {"tq1_0", QuantType::kTQ1_0, false},
               {"tq2_0", QuantType::kTQ2_0, false}};
  for (const auto& f : files) {
    spec.weight_type = f.type;
    spec.gguf_mixed_q4_k_m = f.q4_k_m;
    const std::string path = ::testing::TempDir() + "tessera_cuda_forward_" + f.name + ".gguf";
    ASSERT_TRUE(write_synthetic_gguf(spec, path).is_ok()) << f.name;
    auto gpu = load_gpu_model(path, 16);
    ASSERT_TRUE(gpu.is_ok()) << f.name << ": " << gpu.status().to_string();
    auto cpu = LocalModel::load({.path = path, .runtime = {.threads = 2}});
    ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();

    // Device bytes: the block matrices' own bytes, well below an f16 copy.
    const ModelWeights& w = (*gpu)->weights.weights;
    auto block_bytes = [](const TensorView& v) { return v.rows() * static_cast<int64_t>(row_bytes(v.type, v.cols())); };
    int64_t step_bytes = block_bytes(w.lm_head), f16_bytes = 2 * (w.embed.numel() + w.lm_head.numel());
    bool saw_q6_k = w.lm_head.type == QuantType::kQ6_K;
    for (const LayerWeights& l : w.layers)
      for (const TensorView* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
        EXPECT_TRUE(m->type == f.type || (f.q4_k_m && m->type == QuantType::kQ6_K)) << f.name << " " << quant_name(m->type);
        saw_q6_k = saw_q6_k || m->type == QuantType::kQ6_K;
        step_bytes += block_bytes(*m);
        f16_bytes += 2 * m->numel();
      }
    EXPECT_EQ(saw_q6_k, f.q4_k_m) << f.name;
    EXPECT_EQ((*gpu)->forward->weight_bytes_per_step(), step_bytes) << f.name;
    EXPECT_LT((*gpu)->forward->weight_bytes(), f16_bytes) << f.name;
    std::printf("%s: device weights %lld bytes (f16 would be %lld), %lld per decode step\n", f.name,
                static_cast<long long>((*gpu)->forward->weight_bytes()), static_cast<long long>(f16_bytes),
                static_cast<long long>(step_bytes));

    for (const size_t prompt_len : {size_t{5}, size_t{40}}) {
      std::vector<int32_t> prompt(prompt_len);
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(1 + (i * 53 + 7) % 511);
      const std::string what = std::string(f.name) + ", prompt of " + std::to_string(prompt_len);
      auto run = run_gpu_and_cpu(**gpu, **cpu, prompt);
      ASSERT_TRUE(run.is_ok()) << run.status().to_string();
      const std::vector<int32_t>& gpu_ids = run->gpu_ids;
      const std::vector<float>& gpu_logits = run->gpu_logits;
      const GenerateOutput* out = &run->cpu;
      ASSERT_EQ(gpu_logits.size(), out->prompt_last_logits.size()) << what;
      std::printf("%s: max rel err of the last prompt logits vs CPU %.4f\n", what.c_str(),
                  max_rel_err(gpu_logits, out->prompt_last_logits.data(), static_cast<int64_t>(gpu_logits.size())));
      EXPECT_EQ(gpu_ids, out->ids) << what << " (greedy agreement over 8 tokens)";
    }
    std::error_code ec;
    fs::remove(path, ec);
  }
}

// The low-bit GGUF formats made at load (--quant q2_k / q3_k / tq1_0 / tq2_0 of a float
// checkpoint) stay in their blocks on the device like a GGUF file's, and the greedy tokens of a
// 5-token prompt (decode-size GEMMs only) and a 40-token one (the f16 expansion + cuBLAS) equal
// the CPU's on the same quantized weights.
TEST(CudaForwardSynthetic, LowBitQuantAtLoadMatchesCpu) {
  if (auto api = load_cuda_api_with_device(); !api.is_ok()) {
    GTEST_SKIP() << api.status().message();
  }
  const SyntheticModelSpec spec = small_spec(93);
  const std::string dir = ::testing::TempDir() + "tessera_cuda_forward_low_bit_hf";
  ASSERT_TRUE(write_synthetic_hf(spec, dir).is_ok());
  for (const WeightQuant q : {WeightQuant::kQ2_K, WeightQuant::kQ3_K, WeightQuant::kTQ1_0, WeightQuant::kTQ2_0}) {
    auto gpu = load_gpu_model(dir, 16, q);
    ASSERT_TRUE(gpu.is_ok()) << weight_quant_name(q) << ": " << gpu.status().to_string();
    auto cpu = LocalModel::load({.path = dir, .runtime = {.threads = 2, .quant = q}});
    ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
    const ModelWeights& w = (*gpu)->weights.weights;
    int64_t f16_bytes = 0;
    for (const LayerWeights& l : w.layers)
      for (const TensorView* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
        EXPECT_EQ(m->type, weight_quant_type(q)) << weight_quant_name(q);
        f16_bytes += 2 * m->numel();
      }
    EXPECT_LT((*gpu)->forward->weight_bytes_per_step(), f16_bytes + 2 * w.lm_head.numel()) << weight_quant_name(q);
    for (const size_t prompt_len : {size_t{5}, size_t{40}}) {
      std::vector<int32_t> prompt(prompt_len);
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(1 + (i * 29 + 3) % 511);
      const std::string what = std::string(weight_quant_name(q)) + ", prompt of " + std::to_string(prompt_len);
      auto run = run_gpu_and_cpu(**gpu, **cpu, prompt);
      ASSERT_TRUE(run.is_ok()) << run.status().to_string();
      std::printf("%s: max rel err of the last prompt logits vs CPU %.4f\n", what.c_str(),
                  max_rel_err(run->gpu_logits, run->cpu.prompt_last_logits.data(),
                              static_cast<int64_t>(run->gpu_logits.size())));
      EXPECT_EQ(run->gpu_ids, run->cpu.ids) << what << " (greedy agreement over 8 tokens)";
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// On a machine without a usable device the forward pass refuses cleanly (the shard then runs
// the CPU path); skipped where a device exists.
TEST(CudaForwardCreateWithoutDevice, ReturnsUnavailable) {
  if (load_cuda_api_with_device().is_ok()) {
    GTEST_SKIP() << "a CUDA device is present";
  }
  ModelConfig config;
  ShardLayout layout;
  ModelWeights weights;
  auto f = CudaForward::create(config, layout, weights, nullptr, CudaForwardOptions{});
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), StatusCode::kUnavailable) << f.status().to_string();
  EXPECT_NE(f.status().message().find("no CUDA device"), std::string::npos) << f.status().message();
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaForwardTest, ::testing::Values("hf", "stories260K-f32.gguf", "stories260K.ggml-org.gguf"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace_if(n.begin(), n.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                           return n;
                         });

}  // namespace
}  // namespace tessera
