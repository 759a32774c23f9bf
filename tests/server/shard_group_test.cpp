// ShardGroup's start-up checks and liveness, with fake shards speaking the real protocol.
#include "server/shard_group.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "common/process.h"

namespace tessera {
namespace {

using std::chrono::milliseconds;

ShardHello hello(int rank, int world, const std::string& model = "m") {
  ShardHello h;
  h.rank = rank;
  h.world_size = world;
  h.tp_size = world;
  h.device = "cpu";
  h.memory_available_bytes = 1000 * 1024;
  h.kv_bytes_per_token = 64;
  h.model_fingerprint = model;
  return h;
}

struct FakeShard {
  std::unique_ptr<ControlClient> client;
  FakeShard(const std::string& endpoint, int rank) {
    client = std::move(ControlClient::connect(endpoint, shard_identity(rank))).value();
  }
};

Status start_with(const std::vector<ShardHello>& hellos, int world, ShardGroupOptions o = {}) {
  o.world_size = world;
  o.start_timeout = std::min(o.start_timeout, milliseconds(3000));
  auto g = ShardGroup::create(o);
  if (!g.is_ok()) return g.status();
  std::vector<FakeShard> shards;
  for (const ShardHello& h : hellos) {
    shards.emplace_back((*g)->endpoint(), h.rank);
    EXPECT_TRUE(shards.back().client->send(h).is_ok());
  }
  return (*g)->start();
}

TEST(ShardGroupTest, StartsAndPlansMemoryWithHeadroom) {
  ShardGroupOptions o;
  o.world_size = 2;
  o.block_size = 16;
  o.headroom = 0.10;
  auto g = ShardGroup::create(o);
  ASSERT_TRUE(g.is_ok());
  FakeShard a((*g)->endpoint(), 0), b((*g)->endpoint(), 1);
  ASSERT_TRUE(a.client->send(hello(0, 2)).is_ok());
  ShardHello hb = hello(1, 2);
  hb.memory_available_bytes = 500 * 1024;  // the smaller shard decides
  ASSERT_TRUE(b.client->send(hb).is_ok());
  ASSERT_TRUE((*g)->start().is_ok());
  // 500 KiB * 0.9 / (64 B/token * 16 tokens/block) = 450 blocks
  EXPECT_EQ((*g)->plan().num_blocks, 450);
  for (FakeShard* s : {&a, &b}) {
    auto m = s->client->receive(milliseconds(2000));
    ASSERT_TRUE(m.is_ok() && m->has_value());
    EXPECT_EQ(std::get<ConfigureMsg>(*(*m)->message).num_blocks, 450);
  }
}

// 18 layers of 4 bytes per token, 15 of them windowed (Gemma 3's 5:1), window 512; 64 MiB, no
// headroom, a window pool for 4 sequences of 256-token steps.
std::vector<ShardHello> gemma_like_hellos() {
  std::vector<ShardHello> hellos = {hello(0, 1)};
  hellos[0].kv_bytes_per_token = 72;
  hellos[0].kv_window = 512;
  hellos[0].kv_window_bytes_per_token = 60;
  hellos[0].memory_available_bytes = 64ull << 20;
  return hellos;
}
ShardGroupOptions window_pool_options() {
  ShardGroupOptions o;
  o.block_size = 16;
  o.headroom = 0.0;
  o.step_seqs = 4;
  o.step_tokens = 256;
  o.window_pool = true;
  return o;
}

TEST(ShardGroupTest, WindowPoolTakesTheWindowedLayersOutOfTheFullPool) {
  std::vector<ShardHello> hellos = gemma_like_hellos();
  ShardGroupOptions o = window_pool_options();
  auto p = plan_kv_memory(hellos, o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  const int64_t w = window_pool_blocks(512, 256, 16, 4);
  EXPECT_EQ(w, 4 * (32 + 1 + 2) + 16);
  EXPECT_EQ(p->num_window_blocks, w);
  EXPECT_EQ(p->window, 512);
  EXPECT_EQ(p->window_bytes_per_block, 60u * 16);
  EXPECT_EQ(p->kv_bytes_per_block, 12u * 16);
  EXPECT_EQ(p->num_blocks, static_cast<int64_t>(((64ull << 20) - w * 60 * 16) / (12 * 16)));
  EXPECT_LE(p->planned_kv_bytes, 64ull << 20);
  // About 5.9x the tokens of one pool (72 / 12, less the window pool).
  const int64_t one_pool = static_cast<int64_t>((64ull << 20) / (72 * 16));
  EXPECT_GT(p->num_blocks, 5 * one_pool);

  // No window pool when it is off, or when it would not pay.
  o.window_pool = false;
  EXPECT_EQ(plan_kv_memory(hellos, o)->num_window_blocks, 0);
  EXPECT_EQ(plan_kv_memory(hellos, o)->num_blocks, one_pool);
  o.window_pool = true;
  hellos[0].memory_available_bytes = w * 72 * 16;  // one pool holds as many blocks as the window pool alone
  EXPECT_EQ(plan_kv_memory(hellos, o)->num_window_blocks, 0);
  hellos[0].kv_window_bytes_per_token = 80;
  EXPECT_FALSE(plan_kv_memory(hellos, o).is_ok());
}

TEST(ShardGroupTest, KeySummariesAreBilledToTheMainPoolsBlocks) {
  // The 3 global layers' key summaries cost 96 bytes per block of the main pool.
  std::vector<ShardHello> hellos = gemma_like_hellos();
  ShardGroupOptions o = window_pool_options();
  const auto without = plan_kv_memory(hellos, o);
  hellos[0].kv_summary_bytes_per_block = 96;
  const auto with = plan_kv_memory(hellos, o);
  ASSERT_TRUE(without.is_ok() && with.is_ok());
  EXPECT_EQ(with->kv_bytes_per_block, 12u * 16 + 96);
  EXPECT_EQ(with->window_bytes_per_block, 60u * 16);
  EXPECT_EQ(with->num_window_blocks, without->num_window_blocks);
  EXPECT_LT(with->num_blocks, without->num_blocks);
  EXPECT_LE(with->planned_kv_bytes, 64ull << 20);
  o.window_pool = false;  // one pool: every block carries them
  EXPECT_EQ(plan_kv_memory(hellos, o)->kv_bytes_per_block, 72u * 16 + 96);
}

TEST(ShardGroupTest, WorldSizeMismatchNamesTheRank) {
  Status s = start_with({hello(0, 2), hello(1, 3)}, 2);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("shard rank 1 runs in a world of 3 ranks"), std::string::npos) << s.message();
}

TEST(ShardGroupTest, ModelMismatchNamesTheRankAndBothModels) {
  Status s = start_with({hello(0, 2, "llama hidden=64"), hello(1, 2, "llama hidden=128")}, 2);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("rank 1 serves model 'llama hidden=128', expected 'llama hidden=64'"), std::string::npos)
      << s.message();
}

// The coordinator plans in its KV dtype, so a shard storing another is refused, naming both;
// the configure message carries the dtype the plan used.
TEST(ShardGroupTest, KvDtypeMismatchIsRefusedAndTheConfigureCarriesTheDtype) {
  ShardGroupOptions o;
  o.kv_dtype = KvDtype::kF16;
  ShardHello h0 = hello(0, 2), h1 = hello(1, 2);
  h0.kv_dtype = KvDtype::kF16;  // rank 1 still says fp32
  Status s = start_with({h0, h1}, 2, o);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("shard rank 1 (cpu) stores its KV cache as fp32, but the coordinator plans fp16"),
            std::string::npos)
      << s.message();

  o.world_size = 1;
  auto g = ShardGroup::create(o);
  ASSERT_TRUE(g.is_ok());
  FakeShard a((*g)->endpoint(), 0);
  ShardHello h = hello(0, 1);
  h.kv_dtype = KvDtype::kF16;
  ASSERT_TRUE(a.client->send(h).is_ok());
  ASSERT_TRUE((*g)->start().is_ok());
  auto m = a.client->receive(milliseconds(2000));
  ASSERT_TRUE(m.is_ok() && m->has_value());
  EXPECT_EQ(std::get<ConfigureMsg>(*(*m)->message).kv_dtype, KvDtype::kF16);
}

TEST(ShardGroupTest, RankClaimMismatch) {
  ShardHello h = hello(0, 2);
  h.rank = 1;  // connects as shard-0 but says rank 1
  ShardGroupOptions o;
  o.world_size = 2;
  o.start_timeout = milliseconds(3000);
  auto g = ShardGroup::create(o);
  ASSERT_TRUE(g.is_ok());
  FakeShard a((*g)->endpoint(), 0);
  ASSERT_TRUE(a.client->send(h).is_ok());
  Status s = (*g)->start();
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("shard-0 says it is rank 1"), std::string::npos) << s.message();
}

TEST(ShardGroupTest, MissingRankTimesOut) {
  ShardGroupOptions o;
  o.start_timeout = milliseconds(300);
  Status s = start_with({hello(0, 2)}, 2, o);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("rank(s) 1 did not connect"), std::string::npos) << s.message();
}

TEST(ShardGroupTest, NoRoomForKvIsAnError) {
  ShardHello h = hello(0, 1);
  h.memory_available_bytes = 100;
  Status s = start_with({h}, 1);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
}

TEST(ShardGroupTest, SilentShardIsDeclaredDead) {
  ShardGroupOptions o;
  o.world_size = 1;
  o.heartbeat_timeout = milliseconds(300);
  auto g = ShardGroup::create(o);
  ASSERT_TRUE(g.is_ok());
  FakeShard a((*g)->endpoint(), 0);
  ASSERT_TRUE(a.client->send(hello(0, 1)).is_ok());
  ASSERT_TRUE((*g)->start().is_ok());
  auto r = (*g)->run_step(StepPlan{});  // the fake never answers
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("shard rank 0 stopped responding"), std::string::npos) << r.status().message();
  EXPECT_FALSE((*g)->healthy());
  EXPECT_FALSE((*g)->run_step(StepPlan{}).is_ok());
}

// A one-rank group whose fake shard says it runs on this host as process `pid`.
void start_local_rank(ShardGroupOptions o, int32_t pid, std::unique_ptr<ShardGroup>& g,
                      std::unique_ptr<FakeShard>& shard) {
  o.world_size = 1;
  auto created = ShardGroup::create(o);
  ASSERT_TRUE(created.is_ok());
  g = std::move(created).value();
  shard = std::make_unique<FakeShard>(g->endpoint(), 0);
  ShardHello h = hello(0, 1);
  h.hostname = this_hostname();
  h.pid = pid;
  ASSERT_TRUE(shard->client->send(h).is_ok());
  ASSERT_TRUE(g->start().is_ok());
}

// A shard on this host that goes quiet while its process lives (a loaded host; here the test
// process itself stands for it) is slow, not dead: a step answered after the heartbeat timeout
// succeeds, and only dead_timeout of silence declares it dead.
TEST(ShardGroupTest, SilentLocalShardWhoseProcessLivesIsWaitedFor) {
  ShardGroupOptions o;
  o.world_size = 1;
  o.heartbeat_timeout = milliseconds(300);
  o.dead_timeout = milliseconds(2000);
  std::unique_ptr<ShardGroup> g;
  std::unique_ptr<FakeShard> shard_socket;
  ASSERT_NO_FATAL_FAILURE(start_local_rank(o, static_cast<int32_t>(::getpid()), g, shard_socket));
  FakeShard& a = *shard_socket;
  std::thread shard([&] {
    auto m = a.client->receive(milliseconds(3000));
    while (m.is_ok() && m->has_value() && !std::get_if<StepPlan>(&*(*m)->message)) m = a.client->receive(milliseconds(3000));
    if (!m.is_ok() || !m->has_value()) return;
    std::this_thread::sleep_for(milliseconds(800));  // silent past the heartbeat timeout
    StepResult r;
    r.step_id = std::get<StepPlan>(*(*m)->message).step_id;
    (void)a.client->send(r);
  });
  auto r = g->run_step(StepPlan{});
  shard.join();
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(g->healthy());
  auto silent = g->run_step(StepPlan{});  // never answered
  ASSERT_FALSE(silent.is_ok());
  EXPECT_NE(silent.status().message().find("stopped responding"), std::string::npos) << silent.status().message();
  EXPECT_NE(silent.status().message().find("its process alive"), std::string::npos) << silent.status().message();
}

// A shard on this host whose process is gone is dead at once, long before the heartbeat timeout.
TEST(ShardGroupTest, LocalShardWhoseProcessIsGoneFailsAtOnce) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // reaped: the pid names no process now
  ShardGroupOptions o;
  o.world_size = 1;
  o.heartbeat_timeout = milliseconds(60000);
  std::unique_ptr<ShardGroup> g;
  std::unique_ptr<FakeShard> shard_socket;
  ASSERT_NO_FATAL_FAILURE(start_local_rank(o, static_cast<int32_t>(child), g, shard_socket));
  auto r = g->run_step(StepPlan{});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find(fmt::format("shard rank 0 (pid {}) has exited", child)), std::string::npos)
      << r.status().message();
  EXPECT_FALSE(process_alive(child));
  EXPECT_TRUE(process_alive(static_cast<int>(::getpid())));
}

// The silence allowed scales with the gaps measured between a rank's messages, within
// [floor, cap], and a long gap is forgotten by halves.
TEST(SilenceBudgetTest, ScalesToTheLongestRecentGapAndForgetsIt) {
  using Clock = SilenceBudget::Clock;
  const Clock::time_point t0 = Clock::now();
  SilenceBudget b(milliseconds(2000), milliseconds(30000), milliseconds(60000), t0);
  Clock::time_point t = t0;
  auto hear_every = [&](milliseconds gap, int times) {
    for (int i = 0; i < times; ++i) b.heard(t += gap);
  };
  hear_every(milliseconds(250), 40);  // heartbeats on time: 4 x 250 ms is under the floor
  EXPECT_EQ(b.timeout(t), milliseconds(2000));
  EXPECT_EQ(b.last_heard(), t);
  hear_every(milliseconds(1500), 1);  // one stall of a loaded host
  EXPECT_EQ(b.longest_gap(t), milliseconds(1500));
  EXPECT_EQ(b.timeout(t), milliseconds(6000));
  hear_every(milliseconds(250), 240);  // a minute on time: the stall counts half
  EXPECT_NEAR(static_cast<double>(b.longest_gap(t).count()), 750.0, 2.0);
  EXPECT_NEAR(static_cast<double>(b.timeout(t).count()), 3000.0, 8.0);
  hear_every(milliseconds(250), 480);  // two more: the floor again
  EXPECT_EQ(b.timeout(t), milliseconds(2000));
  hear_every(milliseconds(20000), 1);  // a huge gap: at most the cap
  EXPECT_EQ(b.timeout(t), milliseconds(30000));
}

// A rank on another host whose messages come farther apart than the heartbeat timeout's floor
// allows for (a loaded host) is given a longer silence, scaled to its gaps: a step it answers
// after 800 ms succeeds with a 300 ms floor, and a step it never answers fails after about
// 4 x its gap, long before dead_timeout.
TEST(ShardGroupTest, RemoteShardWhoseMessagesComeFarApartGetsALongerTimeout) {
  ShardGroupOptions o;
  o.world_size = 1;
  o.heartbeat_timeout = milliseconds(300);
  o.dead_timeout = milliseconds(20000);
  auto created = ShardGroup::create(o);
  ASSERT_TRUE(created.is_ok());
  ShardGroup& g = **created;
  FakeShard a(g.endpoint(), 0);
  ASSERT_TRUE(a.client->send(hello(0, 1)).is_ok());  // no hostname: another host
  ASSERT_TRUE(g.start().is_ok());
  for (int i = 0; i < 4; ++i) {  // messages 280 ms apart: the allowed silence grows to ~1.1 s
    std::this_thread::sleep_for(milliseconds(280));
    ASSERT_TRUE(a.client->send(Heartbeat{0, 0}).is_ok());
    std::this_thread::sleep_for(milliseconds(20));
    ASSERT_TRUE(g.keep_alive().is_ok());
  }
  std::thread shard([&] {
    auto m = a.client->receive(milliseconds(3000));
    while (m.is_ok() && m->has_value() && !std::get_if<StepPlan>(&*(*m)->message)) m = a.client->receive(milliseconds(3000));
    if (!m.is_ok() || !m->has_value()) return;
    std::this_thread::sleep_for(milliseconds(800));  // silent past the 300 ms floor
    StepResult r;
    r.step_id = std::get<StepPlan>(*(*m)->message).step_id;
    (void)a.client->send(r);
  });
  auto r = g.run_step(StepPlan{});
  shard.join();
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const auto start = std::chrono::steady_clock::now();
  auto silent = g.run_step(StepPlan{});  // never answered
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(silent.is_ok());
  EXPECT_NE(silent.status().message().find("stopped responding"), std::string::npos) << silent.status().message();
  EXPECT_LT(waited, milliseconds(15000));  // scaled to the gaps, not waited out to dead_timeout
}

TEST(ShardGroupTest, StepRoundTripWithAnsweringShard) {
  ShardGroupOptions o;
  o.world_size = 1;
  auto g = ShardGroup::create(o);
  ASSERT_TRUE(g.is_ok());
  FakeShard a((*g)->endpoint(), 0);
  ASSERT_TRUE(a.client->send(hello(0, 1)).is_ok());
  ASSERT_TRUE((*g)->start().is_ok());
  std::thread shard([&] {
    for (int i = 0; i < 2;) {
      auto m = a.client->receive(milliseconds(3000));
      if (!m.is_ok() || !m->has_value()) return;
      if (auto* p = std::get_if<StepPlan>(&*(*m)->message)) {
        StepResult r;
        r.step_id = p->step_id;
        r.tokens.push_back({7, static_cast<int32_t>(p->step_id), 0.0f, {}});
        (void)a.client->send(r);
        ++i;
      }
    }
  });
  for (uint64_t step = 1; step <= 2; ++step) {
    auto r = (*g)->run_step(StepPlan{});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->step_id, step);
    EXPECT_EQ(r->tokens[0].token, static_cast<int32_t>(step));
  }
  shard.join();
}

}  // namespace
}  // namespace tessera
