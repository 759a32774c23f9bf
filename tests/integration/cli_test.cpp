// `tessera generate` and `tessera tokenize` as processes: the reference greedy ids of
// stories260K through the CLI, and clear errors with a non-zero exit for bad input.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/env.h"
#include "tests/default_model_file.h"
#include "tests/integration/process_util.h"
#include "tests/testdata.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

using namespace tessera::testing;

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    stories_ = testdata_dir() + "/stories260K";
    TESSERA_REQUIRE_TESTDATA(stories_ + "/reference.json");
    tmp_ = fs::temp_directory_path() / ("tessera_cli_test_" + std::to_string(::getpid()));
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!tmp_.empty()) fs::remove_all(tmp_, ec);
  }
  std::string stories_;
  fs::path tmp_;
};

TEST_F(CliTest, GenerateGivesReferenceGreedyIds) {
  std::ifstream in(stories_ + "/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  for (const std::string& model : {stories_ + "/hf", stories_ + "/stories260K-f32.gguf"}) {
    for (const auto& c : ref["cases"]) {
      const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
      const auto greedy = c["greedy_ids"].get<std::vector<int32_t>>();
      const ProcessResult r = run(bin("tessera") + " generate --model " + quote(model) + " --prompt-ids " +
                                  join_ids(prompt) + " --max-tokens " + std::to_string(greedy.size()) +
                                  " --temperature 0 --ignore-eos --print-ids");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(last_line(r.output), join_ids(greedy)) << model << " " << c["name"];
    }
  }
}

TEST_F(CliTest, GenerateFromTextStreamsTheReferenceStory) {
  const ProcessResult r = run(bin("tessera") + " generate --model " + quote(stories_ + "/hf") +
                              " --prompt 'Once upon a time' --max-tokens 20 --temperature 0 --print-ids");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("there was a little girl named Lily"), std::string::npos) << r.output;
}

TEST_F(CliTest, SeededSamplingIsRepeatable) {
  const std::string cmd = bin("tessera") + " generate --model " + quote(stories_ + "/hf") +
                          " --prompt-ids 1 --max-tokens 24 --temperature 1.0 --top-p 0.9 --top-k 40 --seed 11 --print-ids";
  const ProcessResult a = run(cmd), b = run(cmd);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
}

TEST_F(CliTest, TokenizeJsonl) {
  const fs::path input = tmp_ / "in.jsonl";
  std::ofstream(input) << "\"Once upon a time\"\n\"Hello world\"\n";
  const ProcessResult r = run(bin("tessera") + " tokenize --jsonl --model " + quote(stories_ + "/hf") + " < " +
                              quote(input.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "[1,403,407,261,378]\n[1,346,306,414,263,304,341]\n");
  const ProcessResult g = run("printf 'Once upon a time' | " + bin("tessera") + " tokenize --no-special --model " +
                              quote(stories_ + "/stories260K-f32.gguf"));
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_EQ(g.output, "[403,407,261,378]\n");
}

// Each bad input exits non-zero with a message naming the problem, and never crashes.
TEST_F(CliTest, BadInputsGiveClearErrors) {
  // Truncated GGUF.
  const fs::path truncated = tmp_ / "truncated.gguf";
  fs::copy_file(stories_ + "/stories260K-f32.gguf", truncated);
  fs::resize_file(truncated, 300000);
  // Unknown architecture, wrong shape, missing tokenizer: edited copies of the HF directory.
  const fs::path unknown_arch = tmp_ / "unknown_arch";
  fs::copy(stories_ + "/hf", unknown_arch);
  {
    std::ifstream in(unknown_arch / "config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    cfg["architectures"] = {"FancyNewForCausalLM"};
    cfg["model_type"] = "fancy";
    std::ofstream(unknown_arch / "config.json") << cfg.dump();
  }
  const fs::path wrong_shape = tmp_ / "wrong_shape";
  fs::copy(stories_ + "/hf", wrong_shape);
  {
    std::ifstream in(wrong_shape / "config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    cfg["intermediate_size"] = 160;
    std::ofstream(wrong_shape / "config.json") << cfg.dump();
  }
  const fs::path no_tokenizer = tmp_ / "no_tokenizer";
  fs::copy(stories_ + "/hf", no_tokenizer);
  fs::remove(no_tokenizer / "tokenizer.json");

  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"--model /nonexistent/model.gguf --prompt-ids 1", "/nonexistent/model.gguf"},
      {"--model " + quote(truncated.string()) + " --prompt-ids 1", "truncated.gguf"},
      {"--model " + quote(unknown_arch.string()) + " --prompt-ids 1", "FancyNewForCausalLM"},
      {"--model " + quote(wrong_shape.string()) + " --prompt-ids 1", "[172, 64]"},
      {"--model " + quote(no_tokenizer.string()) + " --prompt hello", "tokenizer"},
      {"--model " + quote(stories_ + "/hf") + " --prompt-ids 1,512", "512"},
      {"--model " + quote(stories_ + "/hf") + " --prompt-ids 1,x", "'x'"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = run(bin("tessera") + " generate --max-tokens 4 " + c.args);
    EXPECT_NE(r.exit_code, 0) << c.args << "\n" << r.output;
    EXPECT_LT(r.exit_code, 128) << "crashed: " << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find("error"), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
  }
  const ProcessResult t = run("echo hi | " + bin("tessera") + " tokenize --model " + quote(no_tokenizer.string()));
  EXPECT_NE(t.exit_code, 0) << t.output;
  EXPECT_LT(t.exit_code, 128) << t.output;
}

// No --model: the default model. A $TESSERA_MODEL that names nothing is an error that says so
// (these need no test data); with the real Gemma 3 file present, generate runs from it.
TEST(DefaultModelCli, MissingTesseraModelIsAClearError) {
  for (const char* command : {" generate --prompt hi --max-tokens 1", " plan", " tokenize"}) {
    const ProcessResult r = run("TESSERA_MODEL=/nonexistent/model.gguf " + bin("tessera") + command + " </dev/null");
    EXPECT_NE(r.exit_code, 0) << command << ": " << r.output;
    EXPECT_NE(r.output.find("TESSERA_MODEL names /nonexistent/model.gguf"), std::string::npos) << command << ": " << r.output;
  }
}

TEST(DefaultModelCli, GenerateWithoutModelUsesTheDefault) {
  const std::string model = default_model_file();
  if (model.empty()) GTEST_SKIP() << "default model absent (scripts/default_model.sh fetches it)";
  const ProcessResult r = run("TESSERA_MODEL=" + quote(model) + " " + bin("tessera") +
                              " generate --prompt 'The capital of France is' --max-tokens 8 --temperature 0 --print-ids");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(last_line(r.output).empty()) << r.output;
}

}  // namespace
}  // namespace tessera
