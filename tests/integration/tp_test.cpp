// Coordinator + tensor-parallel shards as real processes (shards under mpirun for TP > 1; the
// coordinator, here `tessera generate --tp N`, stays outside mpirun).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/env.h"
#include "tests/integration/process_util.h"
#include "tests/testdata.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using namespace tessera::testing;

class TpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("tessera_tp_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static std::string make_model(const std::string& type) {
    const fs::path out = dir_ / ("gqa4-" + type + ".gguf");
    if (!fs::exists(out)) {
      const ProcessResult r = run(bin("tessera-make-model") + " --preset gqa4 --format gguf --type " + type +
                                  " --out " + quote(out.string()));
      EXPECT_EQ(r.exit_code, 0) << r.output;
    }
    return out.string();
  }
  static std::string generate(const std::string& model, const std::string& extra) {
    const ProcessResult r = run(bin("tessera") + " generate --model " + quote(model) +
                                " --prompt 'Once upon a time' --max-tokens 64 --temperature 0 --ignore-eos --print-ids " +
                                extra);
    EXPECT_EQ(r.exit_code, 0) << extra << "\n" << r.output;
    return last_line(r.output);
  }
  static fs::path dir_;
};
fs::path TpTest::dir_;

TEST_F(TpTest, StoriesReferenceAtTp1AndTp2) {
  const std::string stories = testdata_dir() + "/stories260K";
  TESSERA_REQUIRE_TESTDATA(stories + "/reference.json");
  std::ifstream in(stories + "/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  for (const auto& c : ref["cases"]) {
    const auto greedy = c["greedy_ids"].get<std::vector<int32_t>>();
    for (const char* tp_name : {"1", "2"}) {
      const std::string tp = tp_name;
      const std::string model = stories + (tp == "1" ? "/hf" : "/stories260K-f32.gguf");
      const ProcessResult r = run(bin("tessera") + " generate --model " + quote(model) + " --prompt-ids " +
                                  join_ids(c["prompt_ids"].get<std::vector<int32_t>>()) + " --max-tokens " +
                                  std::to_string(greedy.size()) + " --temperature 0 --ignore-eos --print-ids --tp " + tp);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(last_line(r.output), join_ids(greedy)) << "TP " << tp << " " << c["name"];
    }
  }
}

// Speculation (n-gram drafts on every decode, verified by the shards) changes no token at TP 1
// or 2: each rank verifies the same rows of the same gathered logits and cuts its tables alike.
TEST_F(TpTest, SpeculationKeepsTheStoriesReferenceAtTp1AndTp2) {
  const std::string stories = testdata_dir() + "/stories260K";
  TESSERA_REQUIRE_TESTDATA(stories + "/reference.json");
  std::ifstream in(stories + "/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  // n-gram drafts, and the shards' self-draft through every layer (the verification reuses its
  // states) and through two with a head of 64 fixed ids (at TP 2 only rank 0 holds fixed rows:
  // the ranks' best candidates are gathered).
  for (const char* mode : {"ngram", "draft --spec-draft-layers 5", "draft --spec-draft-layers 2 --spec-draft-vocab 64"}) {
    int kept = 0;
    for (const auto& c : ref["cases"]) {
      const auto greedy = c["greedy_ids"].get<std::vector<int32_t>>();
      for (const char* tp : {"1", "2"}) {
        const ProcessResult r = run(bin("tessera") + " generate --model " + quote(stories + "/stories260K-f32.gguf") +
                                    " --prompt-ids " + join_ids(c["prompt_ids"].get<std::vector<int32_t>>()) +
                                    " --max-tokens " + std::to_string(greedy.size()) +
                                    " --temperature 0 --ignore-eos --print-ids --speculation " + mode + " --tp " + tp);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_EQ(last_line(r.output), join_ids(greedy)) << mode << " TP " << tp << " " << c["name"];
        if (const long long n = number_between(r.output, "drafts proposed, ", " kept"); n >= 0) kept += n;
      }
    }
    EXPECT_GT(kept, 0) << mode << ": drafts must have been kept";
  }
}

// The number of leading comma-separated ids two greedy runs share.
static size_t common_prefix_ids(const std::string& a, const std::string& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size() && i < b.size() && a[i] == b[i]; ++i) {
    if (a[i] == ',') ++n;
  }
  return a == b ? n + 1 : n;
}

TEST_F(TpTest, GqaModelSameTokensAtEveryTp) {
  // F32 and Q8_0 (32-element groups): all 64 tokens equal at every TP. Q4_0 is reported with a
  // weaker check: the row-parallel O/down projections sum their halves in another order at
  // TP = 2 (last-bit float differences), the next layer's int8 activation quantization can round
  // one value the other way, and a random model has near-tied top logits now and then.
  for (const std::string type : {"f32", "q8_0", "q4_0"}) {
    const std::string model = make_model(type);
    const std::string single = generate(model, "");
    EXPECT_EQ(std::count(single.begin(), single.end(), ','), 63) << single;
    EXPECT_EQ(generate(model, "--tp 1"), single) << type;
    for (const std::string tp : {"2", "4"}) {
      const std::string got = generate(model, "--tp " + tp);
      if (type != "q4_0") {
        EXPECT_EQ(got, single) << type << " TP " << tp;
      } else {
        const size_t same = common_prefix_ids(got, single);
        std::printf("q4_0 TP %s: %zu/64 leading tokens equal to TP 1\n", tp.c_str(), same);
        EXPECT_GE(same, 16u) << "TP " << tp << "\n" << got << "\n" << single;
      }
    }
  }
}

TEST_F(TpTest, SeededSamplingIsTheSameAtEveryTp) {
  const std::string model = make_model("f32");
  const std::string args = "--temperature 0.9 --top-k 50 --seed 5";
  const ProcessResult a = run(bin("tessera") + " generate --model " + quote(model) +
                              " --prompt-ids 1,40,50 --max-tokens 32 --print-ids --ignore-eos " + args);
  const ProcessResult b = run(bin("tessera") + " generate --model " + quote(model) +
                              " --prompt-ids 1,40,50 --max-tokens 32 --print-ids --ignore-eos --tp 2 " + args);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(last_line(a.output), last_line(b.output));
}

TEST_F(TpTest, KilledShardFailsTheRequestQuicklyAndLeavesNothing) {
  const std::string model = make_model("f32");
  const std::string marker = "--debug-step-delay-ms=40";
  int shard_pid = -1;
  auto t_kill = std::chrono::steady_clock::now();
  const ProcessResult r = run(
      bin("tessera") + " generate --model " + quote(model) +
          " --prompt-ids 1 --max-tokens 900 --temperature 0 --ignore-eos --tp 2 --shard-arg=" + marker,
      [&](const std::string& line) {
        const size_t ready = line.find("shard rank 1 ready: ");
        const long long pid = ready == std::string::npos ? -1 : number_between(line.substr(ready), "(pid ", ")");
        if (shard_pid < 0 && pid > 0) {
          shard_pid = static_cast<int>(pid);
          std::this_thread::sleep_for(std::chrono::milliseconds(500));  // mid-generation
          t_kill = std::chrono::steady_clock::now();
          ::kill(shard_pid, SIGKILL);
        }
      });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_kill).count();
  ASSERT_GT(shard_pid, 0) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("shard rank 1"), std::string::npos) << r.output;
  EXPECT_LT(seconds, 5.0) << r.output;
  EXPECT_TRUE(wait_until([&] { return count_live_processes(marker) == 0; }, std::chrono::milliseconds(3000)))
      << "shard processes left behind";
}

TEST_F(TpTest, VersionMismatchedShardIsRefused) {
  const std::string model = make_model("f32");
  const ProcessResult r = run(bin("tessera") + " generate --model " + quote(model) +
                              " --prompt-ids 1 --max-tokens 4 --tp 1 --shard-arg=--protocol-version=7");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("protocol version 7, expected 2"), std::string::npos) << r.output;
}

TEST_F(TpTest, ShardsExitWhenTheCoordinatorDies) {
  const std::string model = make_model("f32");
  const std::string marker = "--debug-step-delay-ms=41";
  const std::string cmd = bin("tessera") + " generate --model " + quote(model) +
                          " --prompt-ids 1 --max-tokens 900 --temperature 0 --ignore-eos --tp 2 --shard-arg=" + marker;
  // Start the coordinator in the background, kill it once its shards run.
  const ProcessResult started = run("(" + cmd + " > /dev/null 2>&1 & echo $!)");
  const int coordinator = std::atoi(started.output.c_str());
  ASSERT_GT(coordinator, 0);
  ASSERT_TRUE(wait_until([&] { return count_live_processes(marker) >= 2; }, std::chrono::milliseconds(20000)));
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ::kill(coordinator, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(wait_until([&] { return count_live_processes(marker) == 0; }, std::chrono::milliseconds(10000)));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 8.0);
  // Its control socket is in the abstract namespace: no file left behind.
  EXPECT_FALSE(std::filesystem::exists("/tmp/tessera-" + std::to_string(coordinator) + ".ctl"));
}

TEST_F(TpTest, CtrlCOnServeStopsEveryProcess) {
  const std::string model = make_model("f32");
  const std::string marker = "--debug-step-delay-ms=1";
  // setsid: the server leads its own group, as a shell's foreground job would.
  const ProcessResult started = run("(setsid " + bin("tessera") + " serve --model " + quote(model) +
                                    " --port 0 --tp 2 --shard-arg=" + marker + " > /dev/null 2>&1 & echo $!)");
  const int server = std::atoi(started.output.c_str());
  ASSERT_GT(server, 0);
  ASSERT_TRUE(wait_until([&] { return count_live_processes(marker) >= 3; }, std::chrono::milliseconds(30000)))
      << "mpirun and two shards did not start";
  ::kill(server, SIGINT);
  EXPECT_TRUE(wait_until([&] { return count_live_processes(marker) == 0 && ::kill(server, 0) != 0; },
                         std::chrono::milliseconds(10000)))
      << "processes left after Ctrl-C";
}

}  // namespace
}  // namespace tessera
