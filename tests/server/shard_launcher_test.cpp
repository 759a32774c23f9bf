// The shard command lines build_shard_command makes: one tessera-shard, or mpirun with the
// hosts, the launch agent and the extra mpirun arguments before the shard's argv.
#include "server/shard_launcher.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace tessera {
namespace {

ShardLaunchSpec spec_for(int tp) {
  ShardLaunchSpec s;
  s.shard_binary = "/opt/tessera/bin/tessera-shard";
  s.model_path = "/models/m";
  s.coordinator_endpoint = "tcp://head:7070";
  s.tp = tp;
  s.runtime.device = "cpu";
  return s;
}

// Index of the first `needle` in `argv` (as a run of consecutive words); -1 when absent.
ptrdiff_t find_words(const std::vector<std::string>& argv, const std::vector<std::string>& needle) {
  auto it = std::search(argv.begin(), argv.end(), needle.begin(), needle.end());
  return it == argv.end() ? -1 : it - argv.begin();
}

TEST(BuildShardCommand, OneShardWithoutMpirunIgnoresMpirunOptions) {
  ShardLaunchSpec s = spec_for(1);
  s.launch_agent = "ssh -p 2222";
  s.extra_mpirun_args = {"--mca", "btl", "tcp,self"};
  const std::vector<std::string> argv = build_shard_command(s);
  ASSERT_FALSE(argv.empty());
  EXPECT_EQ(argv[0], s.shard_binary);
  EXPECT_EQ(find_words(argv, {"plm_rsh_agent"}), -1);
  EXPECT_EQ(find_words(argv, {"btl"}), -1);
}

TEST(BuildShardCommand, SparseAttentionModeReachesTheShards) {
  ShardLaunchSpec s = spec_for(2);
  EXPECT_GE(find_words(build_shard_command(s), {"--sparse-attention", "off"}), 0);  // the struct's default
  s.runtime.sparse.measure = true;  // auto: the shard's default, with the budget
  s.runtime.sparse.select.top_blocks = 48;
  EXPECT_EQ(find_words(build_shard_command(s), {"--sparse-attention"}), -1);
  EXPECT_GE(find_words(build_shard_command(s), {"--sparse-top-blocks", "48"}), 0);
  s.runtime.sparse.measure = false;
  s.runtime.sparse.enabled = true;
  s.runtime.sparse.threshold_tokens = 4096;
  s.runtime.sparse.select.top_blocks = 32;
  const std::vector<std::string> argv = build_shard_command(s);
  EXPECT_GE(find_words(argv, {"--sparse-attention", "on", "--sparse-threshold", "4096", "--sparse-top-blocks", "32"}),
            0);
}

TEST(BuildShardCommand, HostsLaunchAgentAndMpirunArgsComeBeforeTheShard) {
  ShardLaunchSpec s = spec_for(2);
  s.hosts = {"hostA:1", "hostB:1"};
  s.launch_agent = "/repo/tests/integration/netns_agent.sh hostA=ns1,hostB=ns2";
  s.extra_mpirun_args = {"--mca", "oob_tcp_if_include", "10.0.0.0/24", "--mca", "btl_tcp_if_include", "10.0.0.0/24"};
  const std::vector<std::string> argv = build_shard_command(s);
  ASSERT_GE(argv.size(), 3u);
  EXPECT_EQ(argv[0], "mpirun");
  EXPECT_EQ(find_words(argv, {"-np", "2"}), 1);
  const ptrdiff_t hosts = find_words(argv, {"--host", "hostA:1,hostB:1"});
  const ptrdiff_t agent = find_words(argv, {"--mca", "plm_rsh_agent", s.launch_agent});
  const ptrdiff_t extra = find_words(argv, s.extra_mpirun_args);
  const ptrdiff_t shard = find_words(argv, {s.shard_binary, "--model", s.model_path});
  ASSERT_GT(hosts, 0);
  ASSERT_GT(agent, hosts);
  ASSERT_GT(extra, agent);
  ASSERT_EQ(shard, extra + static_cast<ptrdiff_t>(s.extra_mpirun_args.size()));
  EXPECT_GT(find_words(argv, {"--coordinator", "tcp://head:7070"}), shard);
  // The agent stays one word on the printed line (--dry-run, the log).
  EXPECT_NE(format_command(argv).find("plm_rsh_agent '/repo/tests/integration/netns_agent.sh hostA=ns1,hostB=ns2'"),
            std::string::npos)
      << format_command(argv);
}

TEST(BuildShardCommand, NoLaunchAgentLeavesOpenMpisDefault) {
  ShardLaunchSpec s = spec_for(2);
  s.hosts = {"a", "b"};
  EXPECT_EQ(find_words(build_shard_command(s), {"plm_rsh_agent"}), -1);
}

TEST(FormatCommand, QuotesWordsTheShellWouldSplit) {
  EXPECT_EQ(format_command({"mpirun", "--mca", "plm_rsh_agent", "agent a=b", "it's"}),
            "mpirun --mca plm_rsh_agent 'agent a=b' 'it'\\''s'");
}

}  // namespace
}  // namespace tessera
