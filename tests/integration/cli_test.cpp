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

// `tessera grammar`: a schema compiled as a request's would be, texts checked against it (exit 1
// when one is refused, with where), the refused keywords listed; bad input named.
TEST_F(CliTest, GrammarChecksTextsAgainstASchema) {
  const fs::path schema = tmp_ / "schema.json", texts = tmp_ / "texts.jsonl";
  std::ofstream(schema) << R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
                              "required": ["n"], "additionalProperties": false})";
  std::ofstream(texts) << "\"{\\\"n\\\": 3}\"\n\"{\\\"n\\\": 30}\"\n\"{\\\"n\\\": \"\n";
  const std::string base = bin("tessera") + " grammar --model " + quote(stories_ + "/hf") + " --json-schema " +
                           quote(schema.string());
  ProcessResult r = run(base);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"compiled\":true"), std::string::npos) << r.output;
  r = run(base + " --instances " + quote(texts.string()));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  std::istringstream lines(r.output);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(lines, line);)
    if (line.starts_with("{")) out.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(out.size(), 4u) << r.output;
  EXPECT_TRUE(out[1]["accepted"].get<bool>()) << r.output;
  EXPECT_FALSE(out[2]["accepted"].get<bool>()) << r.output;
  EXPECT_EQ(out[2]["refused_at_byte"].get<int>(), 7) << r.output;  // after {"n": 3
  EXPECT_FALSE(out[3]["accepted"].get<bool>()) << r.output;          // a prefix: cannot end there
  r = run(bin("tessera") + " grammar --list-unsupported");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"keyword\":\"uniqueItems\""), std::string::npos) << r.output;
  std::ofstream(schema) << R"({"type": "array", "uniqueItems": true})";
  r = run(base);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("$.uniqueItems: 'uniqueItems' is not supported"), std::string::npos) << r.output;
  r = run(bin("tessera") + " grammar --model " + quote(stories_ + "/hf") + " --regex a --json-object");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("exactly one of"), std::string::npos) << r.output;
}

// `tessera plan --constrained N`: mask and compile times measured on the model's vocabulary
// beside the predicted step; a count past the batch and a schema it cannot compile are errors.
TEST_F(CliTest, PlanBillsConstrainedSequences) {
  const std::string base = bin("tessera") + " plan --model " + quote(stories_ + "/hf") + " --card cpu --batch 4";
  ProcessResult r = run(base + " --constrained 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  const nlohmann::json& so = j["structured_outputs"];
  EXPECT_EQ(so["constrained_sequences"], 2);
  EXPECT_EQ(so["vocabulary"], 512);
  EXPECT_GT(so["masks_timed"].get<int>(), 20);
  EXPECT_GE(so["mask_us_p99"].get<double>(), so["mask_us_p50"].get<double>());
  EXPECT_GE(so["predicted_step_with_masks_ms"].get<double>(), so["predicted_step_ms"].get<double>());
  r = run(base + " --constrained 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Structured outputs (2 of the batch's sequences constrained"), std::string::npos) << r.output;
  r = run(base + " --constrained 5");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--constrained 5: more than the decode batch"), std::string::npos) << r.output;
  const fs::path bad = tmp_ / "bad.json";
  std::ofstream(bad) << R"({"type": "array", "contains": {"type": "integer"}})";
  r = run(base + " --constrained 1 --schema " + quote(bad.string()));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("'contains' is not supported"), std::string::npos) << r.output;
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
