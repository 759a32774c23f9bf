// --sparse-attention auto|on|off with --sparse-threshold and --sparse-top-blocks
// (cli/flags.h): what each combination leaves in the SparseAttentionConfig.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/flags.h"

namespace tessera {
namespace {

SparseAttentionConfig parse(std::vector<std::string> args) {
  CLI::App app;
  SparseAttentionConfig c;
  cli::add_sparse_attention_flags(app, c);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  app.parse(args);
  return c;
}

TEST(SparseAttentionFlags, AutoByDefaultOnOffAndAThresholdThatMeansOn) {
  SparseAttentionConfig c = parse({});
  EXPECT_TRUE(c.measure);
  EXPECT_FALSE(c.enabled);
  EXPECT_EQ(c.select.top_blocks, SparseSelectOptions{}.top_blocks);

  c = parse({"--sparse-attention", "off"});
  EXPECT_FALSE(c.measure);
  EXPECT_FALSE(c.enabled);

  c = parse({"--sparse-attention", "on", "--sparse-top-blocks", "40"});
  EXPECT_FALSE(c.measure);
  EXPECT_TRUE(c.enabled);
  EXPECT_EQ(c.threshold_tokens, SparseAttentionConfig{}.threshold_tokens);
  EXPECT_EQ(c.select.top_blocks, 40);

  // A threshold with auto (given or by default) replaces the measurement, in either order.
  for (const auto& args : {std::vector<std::string>{"--sparse-threshold", "4096"},
                           std::vector<std::string>{"--sparse-threshold", "4096", "--sparse-attention", "auto"},
                           std::vector<std::string>{"--sparse-attention", "auto", "--sparse-threshold", "4096"}}) {
    c = parse(args);
    EXPECT_FALSE(c.measure) << args.size();
    EXPECT_TRUE(c.enabled) << args.size();
    EXPECT_EQ(c.threshold_tokens, 4096);
  }
  c = parse({"--sparse-threshold", "4096", "--sparse-attention", "off"});
  EXPECT_FALSE(c.enabled);
  EXPECT_FALSE(c.measure);

  EXPECT_THROW(parse({"--sparse-attention", "sometimes"}), CLI::ValidationError);
  EXPECT_THROW(parse({"--sparse-threshold", "0"}), CLI::ValidationError);
}

}  // namespace
}  // namespace tessera
