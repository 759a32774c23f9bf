// `tessera bench scale` as a user runs it: real shard processes at TP = 1 and 2 (mpirun) on a
// tiny synthetic model; checks the table's and the JSON's shape, not the numbers.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "tests/integration/process_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using namespace tessera::testing;

TEST(BenchScale, Tp1And2TableAndJson) {
  const fs::path dir = fs::temp_directory_path() / ("tessera_bench_scale_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string json = (dir / "scale.json").string();
  const std::string md = (dir / "scale.md").string();
  const ProcessResult r = run(bin("tessera") + " bench scale --preset tiny --type f32 --model-cache " +
                              quote(dir.string()) + " --tp 1,2 --batch 4 --prompt-tokens 8 --decode-steps 12 " +
                              "--warmup-steps 2 --no-plots --json " + quote(json) + " --md " + quote(md));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The table: a header and one row per TP degree, each with 10 columns.
  const std::regex row(R"(^\s*(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+-?[\d.]+\s+[\d.]+\s+-?[\d.]+\s+[\d.]+\s+[\d.]+x\s+\d+%\s*$)");
  std::vector<int> tps;
  bool header = false;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("decode tok/s") != std::string::npos && line.find("all-reduce ms") != std::string::npos) header = true;
    std::smatch m;
    if (std::regex_match(line, m, row)) tps.push_back(std::stoi(m[1]));
  }
  EXPECT_TRUE(header) << r.output;
  EXPECT_EQ(tps, (std::vector<int>{1, 2})) << r.output;

  std::ifstream in(json);
  ASSERT_TRUE(in) << json;
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["kind"], "scale");
  ASSERT_EQ(j["points"].size(), 2u);
  for (const auto& p : j["points"]) {
    EXPECT_GT(p["decode_tokens_per_s"].get<double>(), 0);
    EXPECT_GT(p["step_ms"]["p50"].get<double>(), 0);
    EXPECT_GE(p["allreduce_ms"].get<double>(), 0);
    // The breakdown adds up to the mean step (by construction, up to rounding).
    const double sum = p["compute_ms"].get<double>() + p["allreduce_ms"].get<double>() + p["host_ms"].get<double>();
    EXPECT_NEAR(sum, p["step_ms"]["mean"].get<double>(), 1e-6 + 1e-9 * sum);
  }
  EXPECT_EQ(j["points"][0]["tp"], 1);
  EXPECT_DOUBLE_EQ(j["points"][0]["speedup"].get<double>(), 1.0);
  EXPECT_EQ(j["points"][1]["tp"], 2);
  // TP 1 does no collectives.
  EXPECT_EQ(j["points"][0]["allreduce_ms"].get<double>(), 0.0);

  std::ifstream mdin(md);
  const std::string text((std::istreambuf_iterator<char>(mdin)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("| TP |"), std::string::npos) << text;
  EXPECT_NE(text.find("- machine: "), std::string::npos);
  EXPECT_NE(text.find("- command: `"), std::string::npos);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(BenchScale, BadTpListIsAnError) {
  const ProcessResult r = run(bin("tessera") + " bench scale --tp 1,x --no-plots");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not a TP degree"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tessera
