// `tessera bench scale` as a user runs it: real shard processes at TP = 1 and 2 (mpirun) on a
// tiny synthetic model; checks the table's and the JSON's shape, not the numbers.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

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
  // (Parsed by hand: std::regex's headers warn at -O2 under the sanitizers.)
  auto number = [](std::string t, const char* suffix) {
    if (*suffix) {
      if (t.size() <= 1 || t.back() != *suffix) return false;
      t.pop_back();
    }
    if (!t.empty() && t[0] == '-') t.erase(0, 1);
    return !t.empty() && t.find_first_not_of("0123456789.") == std::string::npos;
  };
  auto row_tp = [&](const std::string& line) {  // the TP of a table row, -1 for another line
    std::istringstream in(line);
    std::vector<std::string> cols;
    for (std::string c; in >> c;) cols.push_back(c);
    if (cols.size() != 10 || cols[0].find_first_not_of("0123456789") != std::string::npos) return -1;
    for (size_t i = 1; i < 8; ++i)
      if (!number(cols[i], "")) return -1;
    if (!number(cols[8], "x") || !number(cols[9], "%")) return -1;
    return std::stoi(cols[0]);
  };
  std::vector<int> tps;
  bool header = false;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("decode tok/s") != std::string::npos && line.find("all-reduce ms") != std::string::npos) header = true;
    if (const int tp = row_tp(line); tp >= 0) tps.push_back(tp);
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
