#include "tune/simulator.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

// 1 ms a step plus 0.1 ms a token: easy to follow by hand.
StepTimeModel simple_model() {
  StepTimeModel m;
  m.fixed_s = 1e-3;
  m.per_token_s = 1e-4;
  m.empty_step_s = 0;
  return m;
}

SimOptions options(double wait_ms = 0) {
  SimOptions o;
  o.scheduler.max_wait_ms = wait_ms;
  o.block_size = 16;
  o.num_blocks = 1000;
  o.cost = simple_model();
  return o;
}

TEST(Simulator, OneRequestTakesThePredictedSteps) {
  auto r = simulate({{0.0, 10, 3, 0}}, options());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->requests.size(), 1u);
  const RequestRecord& q = r->requests[0];
  ASSERT_TRUE(q.ok);
  EXPECT_NEAR(q.ttft_s, 2.0e-3, 1e-9);  // prefill: 1 ms + 10 x 0.1 ms
  ASSERT_EQ(q.itl_s.size(), 2u);        // two decode steps of 1.1 ms
  EXPECT_NEAR(q.itl_s[0], 1.1e-3, 1e-9);
  EXPECT_NEAR(q.itl_s[1], 1.1e-3, 1e-9);
  EXPECT_NEAR(q.e2e_s, 4.2e-3, 1e-9);
  EXPECT_EQ(q.output_tokens, 3);
  EXPECT_EQ(r->steps, 3);
  EXPECT_EQ(r->empty_steps, 1);  // the plan that tells the shards it finished
  EXPECT_EQ(r->summary.completed, 1);
}

TEST(Simulator, ALevelScalesEveryStep) {
  SimOptions o = options();
  o.level = 1.5;  // a machine phase 50% slower than the calibration
  auto r = simulate({{0.0, 10, 3, 0}}, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_NEAR(r->requests[0].ttft_s, 3.0e-3, 1e-9);
  EXPECT_NEAR(r->requests[0].itl_s[0], 1.65e-3, 1e-9);
  o.level = 0;
  EXPECT_NE(simulate({{0.0, 10, 3, 0}}, o).status().message().find("level"), std::string::npos);
  // step_level: the median of measured / predicted over a log's steps that computed tokens.
  std::vector<StepRecord> log(3);
  for (size_t i = 0; i < log.size(); ++i) {
    log[i].features.tokens = 10;
    log[i].features.sequences = 1;
    log[i].run_s = 2e-3 * (1.0 + 0.1 * static_cast<double>(i));  // 1.0, 1.1, 1.2 x the 2 ms predicted
  }
  auto level = step_level(simple_model(), log);
  ASSERT_TRUE(level.is_ok());
  EXPECT_NEAR(*level, 1.1, 1e-9);
  EXPECT_FALSE(step_level(simple_model(), {}).is_ok());
}

TEST(Simulator, MaxWaitGathersArrivalsIntoOnePrefill) {
  // The first request waits up to 5 ms for companions; the second joins it at 1 ms and starts a
  // burst: the wait runs to the burst gap (max(5, 50 / 5) = 10 ms) after it, 11 ms; one step of
  // 20 tokens (3 ms) starts then.
  auto r = simulate({{0.0, 10, 1, 0}, {1e-3, 10, 1, 0}}, options(5.0));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->steps, 1);
  // (Within 2 us: the wait now ends relative to the 1 ms arrival, a time the simulator's clock
  // rounds to its tick.)
  EXPECT_NEAR(r->requests[0].ttft_s, 14e-3, 2e-6);
  EXPECT_NEAR(r->requests[1].ttft_s, 13e-3, 2e-6);
  // Without the extension the step starts 5 ms after the first arrival.
  SimOptions capped = options(5.0);
  capped.scheduler.max_burst_wait_ms = 0;
  auto c = simulate({{0.0, 10, 1, 0}, {1e-3, 10, 1, 0}}, capped);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->steps, 1);
  EXPECT_NEAR(c->requests[0].ttft_s, 8e-3, 1e-9);
  EXPECT_NEAR(c->requests[1].ttft_s, 7e-3, 1e-9);
  // Without the wait: two prefills, each on arrival.
  auto none = simulate({{0.0, 10, 1, 0}, {1e-3, 10, 1, 0}}, options(0.0));
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(none->steps, 2);
  EXPECT_NEAR(none->requests[0].ttft_s, 2e-3, 1e-9);
  EXPECT_NEAR(none->requests[1].ttft_s, 3e-3, 1e-9);  // waits for the first step, then its own
}

TEST(Simulator, ASmallPoolPreemptsAndStillFinishesEverything) {
  SimOptions o = options();
  o.num_blocks = 16;  // 256 tokens; four requests of 100 tokens do not fit at once
  std::vector<SimRequest> trace;
  for (int i = 0; i < 4; ++i) trace.push_back({0.0, 40, 60, 0});
  auto r = simulate(trace, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->summary.completed, 4);
  EXPECT_GT(r->preemptions, 0);
  EXPECT_GT(r->peak_kv_usage, 0.8);
}

TEST(Simulator, ARequestLargerThanThePoolFailsAloneAndNamesWhy) {
  SimOptions o = options();
  o.num_blocks = 10;
  auto r = simulate({{0.0, 200, 10, 0}, {0.0, 20, 2, 0}}, o);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->rejected, 1);
  EXPECT_EQ(r->summary.failed, 1);
  EXPECT_EQ(r->summary.completed, 1);
  EXPECT_FALSE(r->requests[0].error.empty());
}

TEST(Simulator, IsDeterministicAndRefusesBadInput) {
  TraceSpec spec;
  spec.lengths = *parse_length_mix("chat");
  spec.rate = 50;
  spec.num_requests = 300;
  auto trace = generate_trace(spec);
  ASSERT_TRUE(trace.is_ok());
  SimOptions o = options(2.0);
  o.keep_requests = false;
  auto a = simulate(*trace, o);
  auto b = simulate(*trace, o);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->summary.ttft.p99, b->summary.ttft.p99);
  EXPECT_EQ(a->steps, b->steps);
  EXPECT_TRUE(a->requests.empty());
  EXPECT_GT(a->summary.itl.count, 0);  // gaps are summarized even when records are dropped
  o.num_blocks = 0;
  EXPECT_FALSE(simulate(*trace, o).is_ok());
  o.num_blocks = 100;
  o.block_size = 7;
  EXPECT_FALSE(simulate(*trace, o).is_ok());
  std::vector<SimRequest> unordered = {{1.0, 5, 5, 0}, {0.5, 5, 5, 0}};
  EXPECT_FALSE(simulate(unordered, options()).is_ok());
}

TEST(Simulator, HigherPriorityClassesWaitLessUnderOverload) {
  std::vector<SimRequest> trace;
  for (int i = 0; i < 200; ++i) trace.push_back({i * 1e-3, 200, 20, i % 2});
  SimOptions o = options();
  o.scheduler.max_batch = 4;
  o.scheduler.max_step_tokens = 256;
  o.scheduler.aging_ms = 1e6;
  auto r = simulate(trace, o);
  ASSERT_TRUE(r.is_ok());
  double ttft[2] = {0, 0};
  for (const RequestRecord& q : r->requests) ttft[q.index % 2] += q.ttft_s;
  EXPECT_LT(ttft[0], 0.7 * ttft[1]);
}

}  // namespace
}  // namespace tessera
