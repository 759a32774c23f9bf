#include "tune/trace.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tessera {
namespace {

TraceSpec spec(std::string_view lengths, std::string_view arrivals, double rate, int64_t n) {
  TraceSpec s;
  s.lengths = *parse_length_mix(lengths);
  s.arrivals = *ArrivalSpec::parse(arrivals);
  s.rate = rate;
  s.num_requests = n;
  return s;
}

double gap_cv(const std::vector<SimRequest>& t, double* mean) {
  double m = 0, m2 = 0;
  const auto n = static_cast<double>(t.size() - 1);
  for (size_t i = 1; i < t.size(); ++i) m += t[i].arrival_s - t[i - 1].arrival_s;
  m /= n;
  for (size_t i = 1; i < t.size(); ++i) m2 += std::pow(t[i].arrival_s - t[i - 1].arrival_s - m, 2);
  *mean = m;
  return std::sqrt(m2 / n) / m;
}

TEST(Trace, ArrivalsHaveTheRateAndBurstinessAsked) {
  double mean = 0;
  auto poisson = generate_trace(spec("chat", "poisson", 4, 20000));
  ASSERT_TRUE(poisson.is_ok());
  EXPECT_NEAR(gap_cv(*poisson, &mean), 1.0, 0.05);
  EXPECT_NEAR(mean, 0.25, 0.01);
  auto bursty = generate_trace(spec("chat", "bursty:3", 4, 20000));
  EXPECT_NEAR(gap_cv(*bursty, &mean), 3.0, 0.4);
  EXPECT_NEAR(mean, 0.25, 0.02);
  auto fixed = generate_trace(spec("chat", "fixed", 4, 100));
  EXPECT_NEAR((*fixed)[99].arrival_s, 99 * 0.25, 1e-9);
}

TEST(Trace, LengthMixesHaveTheirMeans) {
  for (auto [name, prompt] : {std::pair{"chat", 160.0}, {"docs", 16000.0}, {"docs-2k", 2000.0}}) {
    auto t = generate_trace(spec(name, "poisson", 1, 4000));
    ASSERT_TRUE(t.is_ok());
    const TraceLengthStats s = trace_length_stats(*t);
    EXPECT_NEAR(s.mean_prompt, prompt, 0.1 * prompt) << name;
  }
  auto custom = parse_length_mix("lognormal:512,0.5/64");
  ASSERT_TRUE(custom.is_ok());
  EXPECT_EQ(custom->output.a, 64);
  EXPECT_NE(parse_length_mix("nonsense").status().message().find("nonsense"), std::string::npos);
  EXPECT_FALSE(parse_length_mix("lognormal:x/64").is_ok());
  EXPECT_FALSE(parse_length_mix("chat*0+docs").is_ok());
  EXPECT_NE(parse_length_mix("chat*0.9+nonsense*0.1").status().message().find("part 'nonsense*0.1'"), std::string::npos);
  EXPECT_FALSE(ArrivalSpec::parse("bursty:0.5").is_ok());
  EXPECT_FALSE(ArrivalSpec::parse("weekly").is_ok());
}

TEST(Trace, MixturesDrawTheirPartsByWeight) {
  auto mix = parse_length_mix("chat*0.8+docs-2k*0.2");
  ASSERT_TRUE(mix.is_ok()) << mix.status().message();
  ASSERT_EQ(mix->parts.size(), 2u);
  EXPECT_DOUBLE_EQ(mix->parts[1].weight, 0.2);
  TraceSpec s = spec("chat", "poisson", 1, 5000);
  s.lengths = *mix;
  auto t = generate_trace(s);
  ASSERT_TRUE(t.is_ok());
  // Chat prompts over 1200 tokens are rare (0.2%); 90% of docs-2k prompts are over it.
  int64_t docs = 0;
  for (const SimRequest& r : *t) docs += r.prompt_tokens >= 1200;
  EXPECT_NEAR(static_cast<double>(docs) / 5000.0, 0.2 * 0.9, 0.02);
  const TraceLengthStats st = trace_length_stats(*t);
  EXPECT_NEAR(st.mean_prompt, 0.8 * 160 + 0.2 * 2000, 60);
  // No weight is a weight of 1: the two parts in equal shares.
  auto even = parse_length_mix("chat+lognormal:1000,0.1/8");
  ASSERT_TRUE(even.is_ok());
  EXPECT_DOUBLE_EQ(even->parts[0].weight, 1.0);
}

TEST(Trace, IsDeterministicAndRoundTripsThroughJsonl) {
  TraceSpec s = spec("chat", "bursty", 3, 50);
  s.priority_classes = 2;
  auto a = generate_trace(s);
  auto b = generate_trace(s);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(sim_trace_jsonl(*a), sim_trace_jsonl(*b));
  s.seed = 2;
  EXPECT_NE(sim_trace_jsonl(*generate_trace(s)), sim_trace_jsonl(*a));
  auto back = parse_sim_trace(sim_trace_jsonl(*a), "t.jsonl");
  ASSERT_TRUE(back.is_ok());
  ASSERT_EQ(back->size(), a->size());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*back)[i].prompt_tokens, (*a)[i].prompt_tokens);
    EXPECT_EQ((*back)[i].priority, (*a)[i].priority);
    EXPECT_NEAR((*back)[i].arrival_s, (*a)[i].arrival_s, 1e-6);
  }
}

TEST(Trace, BadLinesAreNamed) {
  auto no_arrival = parse_sim_trace("{\"arrival_s\":0,\"prompt_tokens\":3,\"output_tokens\":2}\n"
                                    "{\"prompt_tokens\":3,\"output_tokens\":2}\n",
                                    "t.jsonl");
  ASSERT_FALSE(no_arrival.is_ok());
  EXPECT_NE(no_arrival.status().message().find("t.jsonl:2"), std::string::npos);
  EXPECT_NE(no_arrival.status().message().find("arrival_s"), std::string::npos);
  EXPECT_FALSE(parse_sim_trace("{\"arrival_s\":0,\"prompt_tokens\":0,\"output_tokens\":2}", "t").is_ok());
  EXPECT_FALSE(parse_sim_trace("{\"arrival_s\":0,\"prompt_tokens\":1,\"output_tokens\":2,\"priority\":99}", "t").is_ok());
  EXPECT_FALSE(parse_sim_trace("not json", "t").is_ok());
  EXPECT_FALSE(parse_sim_trace("", "t").is_ok());
  EXPECT_FALSE(generate_trace(spec("chat", "poisson", 0, 10)).is_ok());
  // Out-of-order arrivals are sorted.
  auto sorted = parse_sim_trace("{\"arrival_s\":2,\"prompt_tokens\":3,\"output_tokens\":2}\n"
                                "{\"arrival_s\":1,\"prompt_tokens\":4,\"output_tokens\":2}\n",
                                "t");
  ASSERT_TRUE(sorted.is_ok());
  EXPECT_EQ((*sorted)[0].prompt_tokens, 4);
}

}  // namespace
}  // namespace tessera
