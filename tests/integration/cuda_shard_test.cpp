// The shard's CUDA backend wired end to end: `tessera generate --device cuda` starts a
// tessera-shard that uploads the model with CudaForward, reports device memory in its hello,
// gets its KV pool from the coordinator's plan and decodes through CUDA graphs. On machines
// without a GPU this runs against the CPU stand-in of libtessera_cuda.so
// (tests/gpu/fake_cuda_backend.cpp) named by TESSERA_FAKE_CUDA_LIBRARY (CTest entry
// cuda_shard_fake_backend); elsewhere it skips. That checks the wiring, not the kernels: the
// `gpu` tests do that on a device.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "tests/integration/process_util.h"
#include "tests/testdata.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using namespace tessera::testing;

class CudaShardFakeBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* lib = std::getenv("TESSERA_FAKE_CUDA_LIBRARY");
    if (!lib || !fs::exists(lib)) GTEST_SKIP() << "TESSERA_FAKE_CUDA_LIBRARY does not name the fake CUDA backend";
    env_ = "TESSERA_CUDA_LIBRARY=" + quote(lib) + " ";
  }
  // stories260K's reference.json into ref_; false without it (the test fails, naming the file).
  bool load_reference() {
    if (!fs::exists(stories_ + "/reference.json")) return false;
    std::ifstream in(stories_ + "/reference.json");
    ref_ = nlohmann::json::parse(in);
    return true;
  }
  std::string env_;
  const std::string stories_ = testdata_dir() + "/stories260K";
  nlohmann::json ref_;
};

TEST_F(CudaShardFakeBackend, StoriesReferenceIdsThroughACudaShard) {
  if (!load_reference()) GTEST_FAIL() << test::missing_testdata(stories_ + "/reference.json");
  const std::string& stories = stories_;
  const nlohmann::json& ref = ref_;
  for (const auto& c : ref["cases"]) {
    const auto greedy = c["greedy_ids"].get<std::vector<int32_t>>();
    for (const std::string model : {"/hf", "/stories260K-f32.gguf"}) {
      const ProcessResult r =
          run(env_ + "TESSERA_LOG_LEVEL=info " + bin("tessera") + " generate --model " + quote(stories + model) +
              " --prompt-ids " + join_ids(c["prompt_ids"].get<std::vector<int32_t>>()) + " --max-tokens " +
              std::to_string(greedy.size()) + " --temperature 0 --ignore-eos --print-ids --tp 1 --device cuda");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(last_line(r.output), join_ids(greedy)) << model << " " << c["name"];
      // The hello named the device and the coordinator planned the KV pool from its memory.
      EXPECT_NE(r.output.find("cuda:0 (fake CPU backend"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("decode as CUDA graphs"), std::string::npos) << r.output;
    }
  }
}

// An fp16 KV cache on CUDA shards: the coordinator plans fp16 blocks (the shards' hellos carry
// it; a mismatch is refused), and the reference greedy ids come out at TP 1 and 2.
TEST_F(CudaShardFakeBackend, Fp16KvCacheGivesTheReferenceIds) {
  if (!load_reference()) GTEST_FAIL() << test::missing_testdata(stories_ + "/reference.json");
  const std::string& stories = stories_;
  const nlohmann::json& ref = ref_;
  const auto& c = ref["cases"].back();
  const auto greedy = c["greedy_ids"].get<std::vector<int32_t>>();
  for (const char* tp : {"1", "2"}) {
    const ProcessResult r =
        run(env_ + "TESSERA_LOG_LEVEL=info " + bin("tessera") + " generate --model " + quote(stories + "/hf") +
            " --prompt-ids " + join_ids(c["prompt_ids"].get<std::vector<int32_t>>()) + " --max-tokens " +
            std::to_string(greedy.size()) + " --temperature 0 --ignore-eos --print-ids --device cuda --kv-dtype fp16 --tp " +
            tp);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(last_line(r.output), join_ids(greedy)) << "TP " << tp;
    EXPECT_NE(r.output.find("tokens of fp16"), std::string::npos) << r.output;
  }
}

// Speculation on CUDA shards: the pieces with drafts (k + 1 rows of logits, verified on the
// host) beside graphed plain decode steps; the reference greedy ids at TP 1 and 2, and seeded
// sampling draws the same tokens with and without drafts.
TEST_F(CudaShardFakeBackend, SpeculationKeepsTheTokens) {
  if (!load_reference()) GTEST_FAIL() << test::missing_testdata(stories_ + "/reference.json");
  const std::string& stories = stories_;
  const nlohmann::json& ref = ref_;
  int kept = 0;
  for (const auto& c : ref["cases"]) {
    const auto greedy = c["greedy_ids"].get<std::vector<int32_t>>();
    for (const char* tp : {"1", "2"}) {
      const ProcessResult r = run(env_ + bin("tessera") + " generate --model " +
                                  quote(stories + "/stories260K-f32.gguf") + " --prompt-ids " +
                                  join_ids(c["prompt_ids"].get<std::vector<int32_t>>()) + " --max-tokens " +
                                  std::to_string(greedy.size()) +
                                  " --temperature 0 --ignore-eos --print-ids --speculation ngram --device cuda --tp " + tp);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(last_line(r.output), join_ids(greedy)) << "TP " << tp << " " << c["name"];
      if (const long long n = number_between(r.output, "drafts proposed, ", " kept"); n >= 0) kept += n;
    }
  }
  EXPECT_GT(kept, 0);
  const std::string sampled = " generate --model " + quote(stories + "/hf") +
                              " --prompt 'Once upon a time' --max-tokens 48 --temperature 0.9 --top-k 40 --seed 3"
                              " --ignore-eos --print-ids --tp 1 --device cuda --speculation ";
  const ProcessResult off = run(env_ + bin("tessera") + sampled + "off");
  const ProcessResult on = run(env_ + bin("tessera") + sampled + "ngram");
  ASSERT_EQ(off.exit_code, 0) << off.output;
  ASSERT_EQ(on.exit_code, 0) << on.output;
  EXPECT_EQ(last_line(on.output), last_line(off.output));
}

TEST_F(CudaShardFakeBackend, GraphedAndEagerDecodeGiveTheSameTokens) {
  const std::string model = testdata_dir() + "/stories260K/hf";
  TESSERA_REQUIRE_TESTDATA(model);
  // Greedy (the argmax taken on the device) and seeded sampling (on the device too).
  for (const std::string sampling : {"--temperature 0", "--temperature 0.9 --top-k 40 --seed 7"}) {
    const std::string args = " generate --model " + quote(model) + " --prompt 'Once upon a time' --max-tokens 40 " +
                             sampling + " --ignore-eos --print-ids --tp 1 --device cuda";
    const ProcessResult graphs = run(env_ + bin("tessera") + args);
    const ProcessResult eager = run(env_ + bin("tessera") + args + " --shard-arg=--no-cuda-graphs");
    ASSERT_EQ(graphs.exit_code, 0) << graphs.output;
    ASSERT_EQ(eager.exit_code, 0) << eager.output;
    EXPECT_EQ(last_line(graphs.output), last_line(eager.output)) << sampling;
  }
}

// TP 2 on CUDA shards (two processes under mpirun, NCCL through the fake's shared memory):
// row-parallel all-reduces, the vocabulary-parallel LM head, the greedy candidates merged
// across ranks, and graphs that hold the collectives.
TEST_F(CudaShardFakeBackend, TensorParallelCudaShards) {
  if (!load_reference()) GTEST_FAIL() << test::missing_testdata(stories_ + "/reference.json");
  const std::string& stories = stories_;
  const nlohmann::json& ref = ref_;
  const auto& c = ref["cases"].back();
  const auto greedy = c["greedy_ids"].get<std::vector<int32_t>>();
  const std::string base = " generate --model " + quote(stories + "/stories260K-f32.gguf") + " --prompt-ids " +
                           join_ids(c["prompt_ids"].get<std::vector<int32_t>>()) + " --max-tokens " +
                           std::to_string(greedy.size()) + " --ignore-eos --print-ids --tp 2 --device cuda";
  const ProcessResult r = run(env_ + bin("tessera") + base + " --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(last_line(r.output), join_ids(greedy));
  // Sampling reads the gathered logits: graphed and eager decode draw the same tokens.
  const std::string sampled = base + " --temperature 0.9 --top-p 0.9 --seed 11";
  const ProcessResult graphs = run(env_ + bin("tessera") + sampled);
  const ProcessResult eager = run(env_ + bin("tessera") + sampled + " --shard-arg=--no-cuda-graphs");
  ASSERT_EQ(graphs.exit_code, 0) << graphs.output;
  ASSERT_EQ(eager.exit_code, 0) << eager.output;
  EXPECT_EQ(last_line(graphs.output), last_line(eager.output));
}

// Sampling on the device (tessera_cuda_sample_f32) draws the tokens the host Sampler draws from
// the downloaded logits (--no-device-sampling), at TP 1 and at TP 2 (where every rank samples
// the unsharded logits), with penalties, top-k / top-p / min-p.
TEST_F(CudaShardFakeBackend, DeviceAndHostSamplingDrawTheSameTokens) {
  const std::string model = testdata_dir() + "/stories260K/stories260K-f32.gguf";
  TESSERA_REQUIRE_TESTDATA(model);
  const std::vector<std::string> samplings = {
      "--temperature 0.9 --top-k 40 --seed 7",
      "--temperature 1.1 --top-p 0.8 --min-p 0.02 --repetition-penalty 1.2 --seed 3",
      "--temperature 0.6 --repetition-penalty 1.6 --seed 12"};
  for (const int tp : {1, 2}) {
    for (const std::string& sampling : samplings) {
      const std::string args = " generate --model " + quote(model) +
                               " --prompt 'Lily and Tom went to the park. Lily saw a big dog' --max-tokens 48 " +
                               sampling + " --ignore-eos --print-ids --tp " + std::to_string(tp) + " --device cuda";
      const ProcessResult device = run(env_ + bin("tessera") + args);
      const ProcessResult host = run(env_ + bin("tessera") + args + " --shard-arg=--no-device-sampling");
      ASSERT_EQ(device.exit_code, 0) << device.output;
      ASSERT_EQ(host.exit_code, 0) << host.output;
      EXPECT_NE(device.output.find("sampling on the device"), std::string::npos) << device.output;
      EXPECT_EQ(last_line(device.output), last_line(host.output)) << "tp " << tp << ": " << sampling;
    }
  }
}

// The first n comma-separated ids of a --print-ids line.
std::string first_ids(const std::string& line, int n) {
  size_t at = 0;
  for (int i = 0; i < n && at != std::string::npos; ++i) at = line.find(',', at + 1);
  return line.substr(0, at);
}

// Sparse decode attention on CUDA shards (--sparse-attention on): a selection that covers every
// block keeps the reference ids; a real one (16-token blocks: the first, the last two and one
// more, so sparse from position 64 on) changes the ids, replays the same in graphs as eagerly at
// TP 1 and 2 (the ranks combine their scores), and follows the CPU backend's ids well past
// position 64. (Further on, the two backends' rounding may flip a near tie between two blocks'
// scores; the forward and kernel tests compare exactly.) Speculation off: its verify pieces
// attend densely, so which positions go sparse would follow its gate. `auto` stays dense on CUDA
// and says so.
TEST_F(CudaShardFakeBackend, SparseAttentionOnCudaShards) {
  if (!load_reference()) GTEST_FAIL() << test::missing_testdata(stories_ + "/reference.json");
  const auto& c = ref_["cases"].back();
  const auto greedy = c["greedy_ids"].get<std::vector<int32_t>>();
  const std::string covering = " generate --model " + quote(stories_ + "/hf") + " --prompt-ids " +
                               join_ids(c["prompt_ids"].get<std::vector<int32_t>>()) + " --max-tokens " +
                               std::to_string(greedy.size()) +
                               " --temperature 0 --ignore-eos --print-ids --tp 1 --device cuda --sparse-attention on "
                               "--sparse-threshold 1 --sparse-top-blocks 1000";
  ProcessResult r = run(env_ + "TESSERA_LOG_LEVEL=info " + bin("tessera") + covering);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(last_line(r.output), join_ids(greedy));
  EXPECT_NE(r.output.find("sparse attention: decodes of the global layers from 1 tokens"), std::string::npos)
      << r.output;

  const std::string sparse = " generate --model " + quote(stories_ + "/hf") +
                             " --prompt 'Once upon a time' --max-tokens 120 --temperature 0 --ignore-eos --print-ids "
                             "--speculation off --sparse-attention on --sparse-threshold 32 --sparse-top-blocks 1 --tp ";
  const ProcessResult cpu = run(env_ + bin("tessera") + sparse + "1 --device cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  for (const std::string tp : {"1", "2"}) {
    const ProcessResult graphed = run(env_ + bin("tessera") + sparse + tp + " --device cuda");
    const ProcessResult eager = run(env_ + bin("tessera") + sparse + tp + " --device cuda --shard-arg=--no-cuda-graphs");
    ASSERT_EQ(graphed.exit_code, 0) << graphed.output;
    ASSERT_EQ(eager.exit_code, 0) << eager.output;
    EXPECT_EQ(first_ids(last_line(graphed.output), 72), first_ids(last_line(cpu.output), 72)) << "TP " << tp;
    EXPECT_EQ(last_line(eager.output), last_line(graphed.output)) << "TP " << tp;
  }
  // The same run dense gives other ids: the selection mattered.
  const ProcessResult dense =
      run(env_ + bin("tessera") + " generate --model " + quote(stories_ + "/hf") +
          " --prompt 'Once upon a time' --max-tokens 120 --temperature 0 --ignore-eos --print-ids --speculation off "
          "--sparse-attention off --tp 1 --device cuda");
  ASSERT_EQ(dense.exit_code, 0) << dense.output;
  EXPECT_NE(last_line(dense.output), last_line(cpu.output));

  r = run(env_ + "TESSERA_LOG_LEVEL=info " + bin("tessera") + " generate --model " + quote(stories_ + "/hf") +
          " --prompt-ids 1,2,3 --max-tokens 4 --tp 1 --device cuda --sparse-attention auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sparse attention (auto): off on CUDA"), std::string::npos) << r.output;
}

TEST_F(CudaShardFakeBackend, RefusalsNameTheProblem) {
  const std::string model = testdata_dir() + "/stories260K/hf";
  TESSERA_REQUIRE_TESTDATA(model);
  // TP 2 needs NCCL: with the fake's NCCL switched off every rank fails, none hangs.
  ProcessResult r = run(env_ + "TESSERA_FAKE_NCCL=0 " + bin("tessera") + " generate --model " + quote(model) +
                        " --prompt-ids 1,2,3 --max-tokens 4 --tp 2 --device cuda --heartbeat-timeout-ms 5000");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("NCCL"), std::string::npos) << r.output;
  // A shard whose workspace is smaller than the coordinator's prompt pieces is refused at start.
  r = run(
      env_ + bin("tessera") + " generate --model " + quote(model) +
      " --prompt-ids 1,2,3 --max-tokens 4 --tp 1 --device cuda --prefill-chunk 64 --shard-arg=--max-step-tokens=32");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at most 32 tokens"), std::string::npos) << r.output;
  // The self-draft is the CPU backend's: a CUDA shard asked for one says so, and the run fails.
  r = run(env_ + bin("tessera") + " generate --model " + quote(model) +
          " --prompt-ids 1,2,3 --max-tokens 8 --tp 1 --device cuda --speculation draft --spec-draft-layers 2");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no self-draft"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tessera
