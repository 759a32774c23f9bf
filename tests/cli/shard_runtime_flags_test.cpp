// The shard-runtime flags (common/shard_options.h's table, registered by cli/flags.h): what
// each --sparse-attention combination leaves in the config, and every option surviving the trip
// a launcher makes it take: struct -> shard_runtime_argv -> a shard's command line -> struct.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/flags.h"

namespace tessera {
namespace {

// Parses `args` as tessera-shard would.
ShardRuntimeOptions parse_shard(std::vector<std::string> args) {
  CLI::App app;
  ShardRuntimeOptions o;
  cli::add_shard_runtime_flags(app, o, cli::ShardFlagsFor::kShard);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  app.parse(args);
  return o;
}

SparseAttentionConfig parse(std::vector<std::string> args) { return parse_shard(std::move(args)).sparse; }

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

// Every row's value is the same after struct -> argv -> parse, and a struct at the shard's
// defaults needs no argv at all.
TEST(ShardRuntimeFlags, EveryOptionSurvivesTheShardsCommandLine) {
  EXPECT_TRUE(shard_runtime_argv(shard_command_line_defaults()).empty());
  ShardRuntimeOptions o;
  o.device = "cpu";
  o.threads = 3;
  o.quant = WeightQuant::kQ4_K;
  o.quant_lm_head = true;
  o.imatrix = "/data/m.imatrix";
  o.kv_dtype = KvDtype::kInt8;
  o.matmul_precision = MatmulPrecision::kFp32;
  o.sparse.enabled = true;
  o.sparse.threshold_tokens = 2048;
  o.sparse.select.top_blocks = 64;
  o.max_step_tokens = 512;
  o.max_step_seqs = 8;
  o.cuda_graphs = false;
  o.device_sampling = false;
  o.collective_timeout_ms = 0;
  const std::vector<std::string> argv = shard_runtime_argv(o);
  const ShardRuntimeOptions back = parse_shard(argv);
  EXPECT_EQ(shard_runtime_argv(back), argv);
  EXPECT_EQ(back.device, "cpu");
  EXPECT_EQ(back.threads, 3);
  EXPECT_EQ(back.quant, WeightQuant::kQ4_K);
  EXPECT_TRUE(back.quant_lm_head);
  EXPECT_EQ(back.imatrix, "/data/m.imatrix");
  EXPECT_EQ(back.kv_dtype, KvDtype::kInt8);
  EXPECT_EQ(back.matmul_precision, MatmulPrecision::kFp32);
  EXPECT_TRUE(back.sparse.enabled);
  EXPECT_FALSE(back.sparse.measure);
  EXPECT_EQ(back.sparse.threshold_tokens, 2048);
  EXPECT_EQ(back.sparse.select.top_blocks, 64);
  EXPECT_EQ(back.max_step_tokens, 512);
  EXPECT_EQ(back.max_step_seqs, 8);
  EXPECT_FALSE(back.cuda_graphs);
  EXPECT_FALSE(back.device_sampling);
  EXPECT_EQ(back.collective_timeout_ms, 0);
  EXPECT_TRUE(validate_shard_runtime_options(back).is_ok());
  // Bad values name the flag.
  try {
    parse_shard({"--kv-dtype", "fp64"});
    ADD_FAILURE() << "fp64 accepted";
  } catch (const CLI::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-dtype"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_shard({"--threads", "-2"}), CLI::ValidationError);
  EXPECT_THROW(parse_shard({"--device", "tpu"}), CLI::ValidationError);
  o.device = "tpu";
  EXPECT_FALSE(validate_shard_runtime_options(o).is_ok());
}

// A launcher takes every row but the derived workspace limits; a coordinator that starts no
// shards takes only what it plans with.
TEST(ShardRuntimeFlags, WhoTakesWhichFlags) {
  auto flags_of = [](cli::ShardFlagsFor who) {
    CLI::App app;
    ShardRuntimeOptions o;
    cli::add_shard_runtime_flags(app, o, who);
    std::vector<std::string> names;
    for (const CLI::Option* opt : app.get_options()) names.push_back(opt->get_name());
    return names;
  };
  auto has = [](const std::vector<std::string>& v, const std::string& name) {
    return std::find(v.begin(), v.end(), name) != v.end();
  };
  const auto shard = flags_of(cli::ShardFlagsFor::kShard);
  const auto launcher = flags_of(cli::ShardFlagsFor::kLauncher);
  const auto coordinator = flags_of(cli::ShardFlagsFor::kCoordinator);
  EXPECT_TRUE(has(shard, "--max-step-tokens"));
  EXPECT_FALSE(has(launcher, "--max-step-tokens"));
  EXPECT_TRUE(has(launcher, "--quant"));
  EXPECT_TRUE(has(coordinator, "--kv-dtype"));
  EXPECT_FALSE(has(coordinator, "--quant"));
}

}  // namespace
}  // namespace tessera
