#include "tune/tuner.h"

#include <gtest/gtest.h>

#include "engine/scheduler_config.h"
#include "tune/block_size.h"

namespace tessera {
namespace {

// A GPU-like step: a weights floor of 20 ms up to 64 tokens, then 0.3 ms a token.
StepTimeModel gpu_like() {
  StepTimeModel m;
  m.fixed_s = 1e-3;
  m.weight_floor_s = 20e-3;
  m.per_token_s = 0.3e-3;
  m.per_sequence_s = 20e-6;
  m.per_context_token_s = 50e-9;
  m.per_block_s = 100e-9;
  return m;
}

TuneOptions quick_options(const SloSpec& slo) {
  TuneOptions o;
  o.kv_bytes = int64_t{1} << 30;
  o.kv_bytes_per_token = 1 << 14;  // 65536 tokens
  o.cost = gpu_like();
  o.slo = slo;
  o.max_batch = {8, 32};
  o.max_step_tokens = {512, 2048};
  o.max_wait_ms = {0, 50};
  o.block_sizes = {16, 64};
  o.prefill_chunk = {256, 512};
  o.threads = 2;
  return o;
}

std::vector<SimRequest> chat_trace(double rate, int64_t n, uint64_t seed) {
  TraceSpec s;
  s.lengths = *parse_length_mix("chat");
  s.rate = rate;
  s.num_requests = n;
  s.seed = seed;
  return *generate_trace(s);
}

TEST(Tuner, RecommendsTheBestGoodputThatMeetsTheSlo) {
  const SloSpec slo = *SloSpec::parse("ttft=500ms,itl=200ms");
  auto r = run_tune(chat_trace(8, 400, 1), quick_options(slo));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_GT(r->candidates.size(), 10u);
  EXPECT_EQ(r->builtin.size(), 2u);
  const TuneCandidate& best = r->candidates[r->recommended];
  EXPECT_TRUE(r->meets_slo);
  EXPECT_TRUE(best.meets_slo);
  EXPECT_TRUE(meets_p99_slo(best.result.summary, slo));
  // With the default margin, within 85% of the targets.
  EXPECT_LE(best.result.summary.ttft.p99, 0.85 * *slo.ttft_s);
  EXPECT_LE(best.result.summary.itl.p99, 0.85 * *slo.itl_s);
  for (const TuneCandidate& c : r->candidates) {
    if (c.meets_slo) {
      EXPECT_LE(c.result.summary.goodput, best.result.summary.goodput * 1.01) << c.label;
    }
  }
  // No candidate on the front is dominated.
  for (const TuneCandidate& a : r->candidates) {
    if (!a.pareto) continue;
    for (const TuneCandidate& b : r->candidates)
      EXPECT_FALSE(b.result.summary.output_token_throughput > a.result.summary.output_token_throughput &&
                   b.result.summary.ttft.p99 < a.result.summary.ttft.p99)
          << a.label << " dominated by " << b.label;
  }
  const std::string table = format_tune_table(*r, slo, true);
  EXPECT_NE(table.find("recommended"), std::string::npos);
  EXPECT_NE(table.find("offline"), std::string::npos);
}

TEST(Tuner, TheSloMarginIsRequiredOfTheSimulatedP99s) {
  RunSummary s;
  s.completed = 10;
  s.ttft.p99 = 0.45;
  s.itl.p99 = 0.05;
  const SloSpec slo = *SloSpec::parse("ttft=500ms,itl=100ms");
  EXPECT_TRUE(meets_p99_slo(s, slo));
  EXPECT_FALSE(meets_p99_slo(s, slo, 0.15));  // 450 ms > 425 ms
  EXPECT_TRUE(meets_p99_slo(s, slo, 0.05));
  TuneOptions o = quick_options(slo);
  o.slo_margin = 1.0;
  EXPECT_NE(run_tune(chat_trace(8, 50, 1), o).status().message().find("slo-margin"), std::string::npos);
}

TEST(Tuner, TheProfileRoundTripsThroughTheSchedulerConfig) {
  TuneCandidate c;
  c.scheduler.max_batch = 16;
  c.scheduler.max_step_tokens = 1024;
  c.scheduler.max_wait_ms = 5;
  c.scheduler.prefill_chunk = 256;
  c.scheduler.aging_ms = 2000;
  c.block_size = 64;
  const std::string json = tuned_profile_json(c, "made by a test");
  SchedulerConfig back;
  ASSERT_TRUE(apply_scheduler_json(back, json, "profile.json").is_ok()) << json;
  EXPECT_EQ(back.max_batch, 16);
  EXPECT_EQ(back.max_step_tokens, 1024);
  EXPECT_DOUBLE_EQ(back.max_wait_ms, 5);
  EXPECT_EQ(back.prefill_chunk, 256);
  EXPECT_DOUBLE_EQ(back.aging_ms, 2000);
  EXPECT_EQ(back.block_size, 64);
  EXPECT_TRUE(validate_scheduler_config(back).is_ok());
  back.block_size = 8;
  EXPECT_NE(validate_scheduler_config(back).message().find("block_size"), std::string::npos);
  // A misspelt knob is still an error; "comment" is not.
  EXPECT_FALSE(apply_scheduler_json(back, R"({"max_bach": 3})", "f").is_ok());
}

TEST(Tuner, ReportsWhenNothingMeetsTheSlo) {
  const SloSpec slo = *SloSpec::parse("ttft=1ms");
  auto r = run_tune(chat_trace(8, 100, 2), quick_options(slo));
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE(r->meets_slo);
  EXPECT_FALSE(run_tune({}, quick_options(slo)).is_ok());
  EXPECT_FALSE(run_tune(chat_trace(8, 10, 2), quick_options(SloSpec{})).is_ok());
}

TEST(BlockSizeAuto, PicksASmallerBlockForChatThanForDocuments) {
  TraceSpec s;
  s.num_requests = 2000;
  s.lengths = *parse_length_mix("chat");
  auto chat = choose_block_size(*generate_trace(s), gpu_like(), 32);
  s.lengths = *parse_length_mix("docs");
  auto docs = choose_block_size(*generate_trace(s), gpu_like(), 32);
  ASSERT_TRUE(chat.is_ok() && docs.is_ok());
  EXPECT_LT(chat->block_size, docs->block_size) << format_block_size_choice(*chat, false)
                                                << format_block_size_choice(*docs, false);
  EXPECT_NE(chat->reason.find("block size"), std::string::npos);
  // Fragmentation falls with the block for long documents and rises for chat.
  EXPECT_LT(chat->rows.front().fragmentation, chat->rows.back().fragmentation);
  EXPECT_LT(docs->rows.back().fragmentation, 0.05);
}

TEST(BlockSizeAuto, FragmentationIsExactForFixedLengths) {
  StepTimeModel free_blocks = gpu_like();
  free_blocks.per_block_s = 0;
  // 100 tokens: 7 blocks of 16 (12 unused of 112), 2 of 64 (28 of 128).
  auto c = choose_block_size({{0, 90, 10, 0}}, free_blocks, 8, {16, 64});
  ASSERT_TRUE(c.is_ok());
  EXPECT_NEAR(c->rows[0].fragmentation, 12.0 / 112, 1e-12);
  EXPECT_NEAR(c->rows[1].fragmentation, 28.0 / 128, 1e-12);
  EXPECT_EQ(c->block_size, 16);  // blocks cost nothing here: the least waste wins
  EXPECT_FALSE(choose_block_size({}, free_blocks, 8).is_ok());
  EXPECT_FALSE(choose_block_size({{0, 90, 10, 0}}, free_blocks, 8, {7}).is_ok());
}

}  // namespace
}  // namespace tessera
