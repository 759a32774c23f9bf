#include "comm/control_codec.h"

#include <gtest/gtest.h>

#include <random>

namespace tessera {
namespace {

StepPlan sample_plan() {
  StepPlan p;
  p.step_id = 42;
  SamplingParams s;
  s.temperature = 0.7f;
  s.top_k = 40;
  s.seed = 1234567890123ull;
  s.has_seed = true;
  s.n_logprobs = 3;
  s.logit_bias = {{2, -100.0f}, {31999, 2.5f}};
  p.new_sequences.push_back({7, {1, 2, 3, 500}, s});
  p.scheduled.push_back({7, 0, 4, true, {0, 1}, false});
  p.scheduled.push_back({9, 17, 1, true, {}, true});
  p.scheduled.back().banned_tokens = {2, 31999};
  p.scheduled.back().token_mask = {0xffffffffu, 0x5u, 0u};
  p.scheduled.back().draft_tokens = {11, 12};
  p.scheduled.back().forced_drafts = true;
  p.scheduled.front().mask_follows = true;
  p.finished = {3, 4};
  p.block_copies = {{5, 6}};
  return p;
}

TEST(ControlCodecTest, StepPlanRoundTrips) {
  const std::string bytes = encode_message(sample_plan());
  auto decoded = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  const auto& p = std::get<StepPlan>(*decoded);
  EXPECT_EQ(p.step_id, 42u);
  ASSERT_EQ(p.new_sequences.size(), 1u);
  EXPECT_EQ(p.new_sequences[0].prompt_ids, (std::vector<int32_t>{1, 2, 3, 500}));
  EXPECT_FLOAT_EQ(p.new_sequences[0].sampling.temperature, 0.7f);
  EXPECT_EQ(p.new_sequences[0].sampling.seed, 1234567890123ull);
  EXPECT_TRUE(p.new_sequences[0].sampling.has_seed);
  EXPECT_EQ(p.new_sequences[0].sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{2, -100.0f}, {31999, 2.5f}}));
  ASSERT_EQ(p.scheduled.size(), 2u);
  EXPECT_EQ(p.scheduled[0].append_blocks, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(p.scheduled[1].start_pos, 17);
  EXPECT_TRUE(p.scheduled[1].reset_blocks);
  EXPECT_TRUE(p.scheduled[0].banned_tokens.empty());
  EXPECT_EQ(p.scheduled[1].banned_tokens, (std::vector<int32_t>{2, 31999}));
  EXPECT_TRUE(p.scheduled[0].token_mask.empty());
  EXPECT_EQ(p.scheduled[1].token_mask, (std::vector<uint32_t>{0xffffffffu, 0x5u, 0u}));
  EXPECT_FALSE(p.scheduled[0].forced_drafts);
  EXPECT_TRUE(p.scheduled[1].forced_drafts);
  EXPECT_TRUE(p.scheduled[0].mask_follows);
  EXPECT_FALSE(p.scheduled[1].mask_follows);
  EXPECT_EQ(p.scheduled[1].draft_tokens, (std::vector<int32_t>{11, 12}));
  EXPECT_EQ(p.finished, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(p.block_copies[0].dst, 6);
}

TEST(ControlCodecTest, StepMasksRoundTrip) {
  const StepMasks m{77, {{7, {0xffffffffu, 0x80000001u}}, {9, {}}}};
  const std::string bytes = encode_message(m);
  auto d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  const auto& got = std::get<StepMasks>(*d);
  EXPECT_EQ(got.step_id, 77u);
  ASSERT_EQ(got.masks.size(), 2u);
  EXPECT_EQ(got.masks[0].seq_id, 7u);
  EXPECT_EQ(got.masks[0].token_mask, (std::vector<uint32_t>{0xffffffffu, 0x80000001u}));
  EXPECT_EQ(got.masks[1].seq_id, 9u);
  EXPECT_TRUE(got.masks[1].token_mask.empty());
}

TEST(ControlCodecTest, OtherMessagesRoundTrip) {
  ShardHello h;
  h.rank = 1;
  h.world_size = 2;
  h.device = "cpu";
  h.memory_available_bytes = 1ull << 40;
  h.model_fingerprint = "abc";
  StepResult r;
  r.step_id = 9;
  r.tokens.push_back({7, 13, -0.5f, {{13, -0.5f}, {2, -1.5f}}});
  r.error = "boom";
  for (const ControlMessage& m : std::vector<ControlMessage>{h, r, ConfigureMsg{100, 32}, Heartbeat{-1, 5},
                                                             ShutdownMsg{"bye"}, AbortMsg{{1, 2}}, RefusedMsg{"no"}}) {
    const std::string bytes = encode_message(m);
    auto d = decode_message(bytes.data(), bytes.size());
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    EXPECT_EQ(d->index(), m.index());
  }
  const std::string bytes = encode_message(r);
  auto d = decode_message(bytes.data(), bytes.size());
  const auto& rr = std::get<StepResult>(*d);
  EXPECT_EQ(rr.tokens[0].top_logprobs[1], (std::pair<int32_t, float>{2, -1.5f}));
  EXPECT_EQ(rr.error, "boom");
}

TEST(ControlCodecTest, KvDtypeTravelsInHelloAndConfigure) {
  ShardHello h;
  h.kv_dtype = KvDtype::kF16;
  std::string bytes = encode_message(h);
  auto d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(std::get<ShardHello>(*d).kv_dtype, KvDtype::kF16);
  bytes = encode_message(ConfigureMsg{100, 32, KvDtype::kFp8});
  d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(std::get<ConfigureMsg>(*d).kv_dtype, KvDtype::kFp8);
  bytes = encode_message(ConfigureMsg{100, 32, KvDtype::kInt8});
  d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(std::get<ConfigureMsg>(*d).kv_dtype, KvDtype::kInt8);
  EXPECT_EQ(std::get<ConfigureMsg>(*d).block_size, 32);
  // A peer that sends no dtype (an older build) means fp32.
  EXPECT_EQ(ConfigureMsg{}.kv_dtype, KvDtype::kF32);
}

// The window pool's fields (common/kv_config.h): the hello's window and its bytes per token,
// the configure message's window pool, each piece's window-table entries (-1: released) and
// the plan's window copies; absent ones decode as 0 / empty (no window pool).
TEST(ControlCodecTest, WindowPoolFieldsRoundTrip) {
  ShardHello h;
  h.kv_window = 512;
  h.kv_window_bytes_per_token = 61440;
  std::string bytes = encode_message(h);
  auto d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(std::get<ShardHello>(*d).kv_window, 512);
  EXPECT_EQ(std::get<ShardHello>(*d).kv_window_bytes_per_token, 61440u);

  bytes = encode_message(ConfigureMsg{100, 32, KvDtype::kF16, 77});
  d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(std::get<ConfigureMsg>(*d).num_window_blocks, 77);
  EXPECT_EQ(std::get<ConfigureMsg>(*d).num_blocks, 100);
  EXPECT_EQ(std::get<ConfigureMsg>(*d).draft_layers, 0);
  EXPECT_TRUE(std::get<ConfigureMsg>(*d).draft_ids.empty());

  // The self-draft's configuration, and a step result's draft time.
  ConfigureMsg cfg{100, 32, KvDtype::kF16, 0};
  cfg.draft_layers = 18;
  cfg.draft_vocab = 3;
  cfg.draft_ids = {236769, 5, 2147483647};
  bytes = encode_message(cfg);
  d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(std::get<ConfigureMsg>(*d).draft_layers, 18);
  EXPECT_EQ(std::get<ConfigureMsg>(*d).draft_vocab, 3);
  EXPECT_EQ(std::get<ConfigureMsg>(*d).draft_ids, cfg.draft_ids);
  StepResult res;
  res.step_id = 4;
  res.draft_micros = 1234567;
  bytes = encode_message(res);
  d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(std::get<StepResult>(*d).draft_micros, 1234567u);
  EXPECT_EQ(std::get<StepResult>(*d).sparse_threshold_tokens, 0);
  // Sparse attention's figures: the hello's summary bytes, a step's threshold and counts.
  h.kv_summary_bytes_per_block = 6144;
  bytes = encode_message(h);
  d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(std::get<ShardHello>(*d).kv_summary_bytes_per_block, 6144u);
  res.sparse_threshold_tokens = 8192;
  res.sparse_decodes = 96;
  res.dense_global_decodes = 7;
  bytes = encode_message(res);
  d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(std::get<StepResult>(*d).sparse_threshold_tokens, 8192);
  EXPECT_EQ(std::get<StepResult>(*d).sparse_decodes, 96u);
  EXPECT_EQ(std::get<StepResult>(*d).dense_global_decodes, 7u);

  StepPlan p = sample_plan();
  p.scheduled[0].append_window_blocks = {-1, 12};
  p.window_block_copies = {{3, 8}, {0, 2147483647}};
  bytes = encode_message(p);
  d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  const auto& q = std::get<StepPlan>(*d);
  ASSERT_EQ(q.scheduled.size(), 2u);
  EXPECT_EQ(q.scheduled[0].append_window_blocks, (std::vector<int32_t>{-1, 12}));
  EXPECT_TRUE(q.scheduled[1].append_window_blocks.empty());
  EXPECT_TRUE(q.scheduled[0].draft_tokens.empty());
  ASSERT_EQ(q.window_block_copies.size(), 2u);
  EXPECT_EQ(q.window_block_copies[0].src, 3);
  EXPECT_EQ(q.window_block_copies[0].dst, 8);
  EXPECT_EQ(q.window_block_copies[1].dst, 2147483647);
  ASSERT_EQ(q.block_copies.size(), 1u);  // the main pool's copies stay apart
  EXPECT_EQ(q.block_copies[0].src, 5);

  // Without a window pool nothing is sent and nothing comes back.
  bytes = encode_message(sample_plan());
  d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok());
  EXPECT_TRUE(std::get<StepPlan>(*d).window_block_copies.empty());
  bytes = encode_message(ShardHello{});
  d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(std::get<ShardHello>(*d).kv_window, 0);
  EXPECT_EQ(std::get<ShardHello>(*d).kv_window_bytes_per_token, 0u);
  bytes = encode_message(ConfigureMsg{100, 32});
  d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(std::get<ConfigureMsg>(*d).num_window_blocks, 0);
}

TEST(ControlCodecTest, DraftTokensRoundTrip) {
  StepPlan p = sample_plan();
  p.scheduled[1].draft_tokens = {7, 0, 262143, 7};
  const std::string bytes = encode_message(p);
  auto d = decode_message(bytes.data(), bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  const auto& q = std::get<StepPlan>(*d);
  EXPECT_TRUE(q.scheduled[0].draft_tokens.empty());
  EXPECT_EQ(q.scheduled[1].draft_tokens, (std::vector<int32_t>{7, 0, 262143, 7}));
}

TEST(ControlCodecTest, UnalignedBytesAreRead) {
  const std::string bytes = encode_message(sample_plan());
  std::string shifted = "x" + bytes;  // data() + 1 is not 8-byte aligned
  auto d = decode_message(shifted.data() + 1, bytes.size());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
}

TEST(ControlCodecTest, VersionMismatchIsRefusedClearly) {
  const std::string bytes = encode_message(Heartbeat{0, 0}, kProtocolVersion + 1);
  auto d = decode_message(bytes.data(), bytes.size());
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("protocol version"), std::string::npos);
}

TEST(ControlCodecTest, GarbageNeverCrashes) {
  std::mt19937_64 rng(7);
  const std::string good = encode_message(sample_plan());
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) bytes.resize((rng() % (bytes.size() / 8)) * 8);
    auto d = decode_message(bytes.data(), bytes.size());
    (void)d;  // either an error or some message; never a crash
  }
  auto empty = decode_message("", 0);
  EXPECT_FALSE(empty.is_ok());
  std::string odd(13, '\0');
  EXPECT_FALSE(decode_message(odd.data(), odd.size()).is_ok());
}

}  // namespace
}  // namespace tessera
