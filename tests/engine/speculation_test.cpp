// The speculation gate (engine/speculation.h): the n-gram proposer, the step cost model,
// and the switch driven through simulated steps whose acceptance and cost the test controls.
#include "engine/speculation.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

namespace tessera {
namespace {

TEST(NgramProposerTest, LongestRecentSuffixMatch) {
  NgramProposer p(3, 1);
  std::vector<int32_t> out;
  // "1 2 3" occurred at 0; its continuation is 4 9 1 2 ...
  p.propose(std::vector<int32_t>{1, 2, 3, 4, 9, 7, 1, 2, 3}, 3, out);
  EXPECT_EQ(out, (std::vector<int32_t>{4, 9, 7}));
  // The most recent occurrence wins: "5 6" at 0 (-> 1) and at 3 (-> 2).
  p.propose(std::vector<int32_t>{5, 6, 1, 5, 6, 2, 8, 5, 6}, 2, out);
  EXPECT_EQ(out, (std::vector<int32_t>{2, 8}));
  // A longer suffix beats a more recent shorter one: "3 4" at 0 -> 9; "4" alone at 5 -> 1.
  p.propose(std::vector<int32_t>{3, 4, 9, 0, 0, 4, 1, 3, 4}, 1, out);
  EXPECT_EQ(out, (std::vector<int32_t>{9}));
  // The proposal stops at the end of the list; no earlier occurrence, no proposal.
  p.propose(std::vector<int32_t>{7, 8, 7}, 5, out);
  EXPECT_EQ(out, (std::vector<int32_t>{8, 7}));
  p.propose(std::vector<int32_t>{1, 2, 3, 4}, 4, out);
  EXPECT_TRUE(out.empty());
  p.propose(std::vector<int32_t>{1}, 4, out);
  EXPECT_TRUE(out.empty());
  // ngram_min 2: a single repeated token is not enough.
  NgramProposer two(3, 2);
  two.propose(std::vector<int32_t>{4, 1, 2, 4}, 2, out);
  EXPECT_TRUE(out.empty());
}

TEST(StepCostModelTest, InterpolatesAndExtrapolatesTheSizesSeen) {
  StepCostModel m;
  EXPECT_FALSE(m.predict(1).has_value());
  m.observe(1, 0.010);
  EXPECT_DOUBLE_EQ(*m.predict(1), 0.010);
  EXPECT_FALSE(m.predict(3).has_value()) << "one size cannot say what more tokens cost";
  m.observe(5, 0.014);
  EXPECT_NEAR(*m.predict(3), 0.012, 1e-12);
  EXPECT_NEAR(*m.predict(9), 0.018, 1e-12);
  m.observe(5, 0.024);  // the mean moves
  EXPECT_NEAR(*m.predict(5), 0.019, 1e-12);
}

TEST(SpeculationMathTest, ExpectedTokensAndBreakEven) {
  EXPECT_DOUBLE_EQ(expected_tokens(0.5, 2), 1.75);
  EXPECT_DOUBLE_EQ(expected_tokens(0.0, 4), 1.0);
  EXPECT_DOUBLE_EQ(expected_tokens(1.0, 4), 5.0);
  const double a = break_even_acceptance(4, 1.3);
  EXPECT_NEAR(expected_tokens(a, 4), 1.3, 1e-9);
  EXPECT_EQ(break_even_acceptance(2, 3.5), 1.0) << "3 tokens at most can never pay for 3.5x the cost";
}

TEST(SpeculationConfigTest, ValidationNamesTheKnob) {
  SpeculationConfig c;
  EXPECT_TRUE(validate_speculation_config(c).is_ok());
  c.max_depth = 17;
  EXPECT_NE(validate_speculation_config(c).message().find("spec_depth = 17"), std::string::npos);
  c = {};
  c.ngram_min = 3;
  c.ngram_max = 2;
  EXPECT_NE(validate_speculation_config(c).message().find("spec_ngram_max"), std::string::npos);
  c = {};
  c.hysteresis = 0.7;
  EXPECT_NE(validate_speculation_config(c).message().find("spec_hysteresis"), std::string::npos);
  EXPECT_FALSE(parse_spec_mode("sometimes").is_ok());
  EXPECT_NE(parse_spec_mode("sometimes").status().message().find("off, auto, ngram, draft"), std::string::npos);
  EXPECT_EQ(*parse_spec_mode("ngram"), SpecMode::kNgram);
}

// The plan of one step of sequence 1 (its token list, the drafts the gate gave it), and a result
// in which each draft is kept with probability `accept` until the first rejection.
StepPlan one_piece_step(uint64_t step_id, const std::vector<int32_t>& tokens,
                        const std::vector<std::pair<uint64_t, std::vector<int32_t>>>& drafts) {
  StepPlan plan;
  plan.step_id = step_id;
  ScheduledSequence q;
  q.seq_id = 1;
  q.start_pos = static_cast<int64_t>(tokens.size()) - 1;
  q.sample = true;
  if (!drafts.empty()) q.draft_tokens = drafts[0].second;
  q.num_tokens = static_cast<int32_t>(1 + q.draft_tokens.size());
  plan.scheduled.push_back(q);
  return plan;
}

StepResult kept_with(const ScheduledSequence& q, double accept, std::mt19937& rng) {
  StepResult r;
  int64_t kept = 0;
  while (kept < static_cast<int64_t>(q.draft_tokens.size()) && std::uniform_real_distribution<>(0, 1)(rng) < accept)
    ++kept;
  for (int64_t t = 0; t <= kept; ++t) r.tokens.push_back({1, 0, 0.0f, {}});
  return r;
}

// One decoding sequence whose n-gram proposer always finds a continuation, on a simulated
// engine: a step of n tokens costs `cost(n)`; each draft is kept with probability `accept` (the
// first rejection ends the run). Returns the fraction of steps that carried drafts.
struct GateSim {
  SpeculationConfig config;
  SpeculationController gate;
  std::mt19937 rng{7};
  std::vector<int32_t> tokens;
  uint64_t step_id = 0;

  explicit GateSim(SpeculationConfig c) : config(c), gate(c, 2) {
    for (int i = 0; i < 64; ++i) tokens.push_back(i % 8);  // a cycle: every suffix recurs
  }

  double run(int steps, double accept, const std::function<double(int64_t)>& cost, SpecMode mode = SpecMode::kAuto,
             std::vector<bool>* on_trace = nullptr) {
    int with = 0;
    for (int i = 0; i < steps; ++i) {
      SpeculationController::Candidate c{1, 0, mode, tokens, 100};
      std::vector<std::pair<uint64_t, std::vector<int32_t>>> drafts;
      gate.plan(std::span<const SpeculationController::Candidate>(&c, 1), 1, drafts);
      const StepPlan plan = one_piece_step(++step_id, tokens, drafts);
      const ScheduledSequence& q = plan.scheduled[0];
      gate.on_step(plan, kept_with(q, accept, rng), cost(q.num_tokens));
      with += !q.draft_tokens.empty();
      if (on_trace) on_trace->push_back(gate.class_stats(0).on);
    }
    return static_cast<double>(with) / steps;
  }
};

double cheap(int64_t n) { return 0.010 + 0.0005 * static_cast<double>(n); }   // memory-bound decode
double costly(int64_t n) { return 0.010 * static_cast<double>(n); }            // every token a full step

TEST(SpeculationGateTest, OnWhileDraftsPayOffBelowBreakEvenBackOnWhenTheyRecover) {
  GateSim sim({});
  // High acceptance, cheap drafts: on, and nearly every step carries drafts.
  EXPECT_GT(sim.run(200, 0.9, cheap), 0.9);
  EXPECT_TRUE(sim.gate.class_stats(0).on);
  EXPECT_GT(sim.gate.class_stats(0).acceptance, 0.8);
  EXPECT_EQ(sim.gate.class_stats(0).depth, 4);
  EXPECT_GT(sim.gate.time_saved_seconds(), 0.0);
  const int64_t switches = sim.gate.class_stats(0).switches;
  // Acceptance collapses: off within about a hundred steps (drafts cost 5% each here: the slowest case to tell), then drafts only while probing.
  std::vector<bool> trace;
  sim.run(120, 0.02, cheap, SpecMode::kAuto, &trace);
  EXPECT_FALSE(sim.gate.class_stats(0).on);
  EXPECT_GT(sim.gate.class_stats(0).switches, switches);
  const double probing = sim.run(640, 0.02, cheap);
  EXPECT_GT(probing, 0.0) << "an off class is re-probed";
  EXPECT_LT(probing, 0.2) << "but only now and then";
  EXPECT_FALSE(sim.gate.class_stats(0).on);
  // Acceptance recovers: a probe sees it and the class goes on again.
  trace.clear();
  sim.run(300, 0.9, cheap, SpecMode::kAuto, &trace);
  EXPECT_TRUE(sim.gate.class_stats(0).on);
  int first_on = -1;
  for (size_t i = 0; i < trace.size(); ++i)
    if (trace[i]) {
      first_on = static_cast<int>(i);
      break;
    }
  EXPECT_GE(first_on, 0);
  EXPECT_LE(first_on, 64 + 4 * 4 + 2) << "back on within one probe interval and probe";
}

TEST(SpeculationGateTest, CostlyVerificationStaysOffEvenAtModerateAcceptance) {
  // Each extra token costs a whole step: 4 drafts at acceptance 0.6 yield 2.3 tokens for 5x
  // the time. The gate measures that and stops; "ngram" mode speculates regardless.
  GateSim sim({});
  sim.run(100, 0.6, costly);
  EXPECT_FALSE(sim.gate.class_stats(0).on);
  EXPECT_LT(sim.run(200, 0.6, costly), 0.2);
  EXPECT_LT(sim.gate.class_stats(0).predicted_gain, 1.0);
  EXPECT_GT(sim.run(50, 0.6, costly, SpecMode::kNgram), 0.95);
}

TEST(SpeculationGateTest, DepthFollowsAcceptance) {
  // Moderate acceptance with a marginal cost per token: fewer drafts than the maximum pay best.
  GateSim sim({});
  sim.run(300, 0.45, [](int64_t n) { return 0.010 + 0.002 * static_cast<double>(n); });
  const auto& s = sim.gate.class_stats(0);
  if (s.on) {
    EXPECT_GE(s.depth, 1);
    EXPECT_LT(s.depth, 4);
  }
  GateSim high({});
  high.run(200, 0.95, [](int64_t n) { return 0.010 + 0.002 * static_cast<double>(n); });
  EXPECT_TRUE(high.gate.class_stats(0).on);
  EXPECT_EQ(high.gate.class_stats(0).depth, 4);
}

// The shards' self-draft as a proposer: one decoding sequence whose n-gram lookup never finds a
// continuation (all tokens distinct), on a simulated engine where a step costs `step` plus
// `round` per self-draft round. Returns the fraction of steps that carried self-drafts.
double self_draft_run(SpeculationController& gate, int steps, double accept, double round, SpecMode mode,
                      std::vector<int32_t>& tokens, uint64_t& step_id) {
  std::mt19937 rng{11};
  int with = 0;
  for (int i = 0; i < steps; ++i) {
    SpeculationController::Candidate c{1, 0, mode, tokens, 100};
    std::vector<std::pair<uint64_t, std::vector<int32_t>>> drafts;
    gate.plan(std::span<const SpeculationController::Candidate>(&c, 1), 1, drafts);
    const StepPlan plan = one_piece_step(++step_id, tokens, drafts);
    const ScheduledSequence& q = plan.scheduled[0];
    const auto k = static_cast<int64_t>(q.draft_tokens.size());
    const bool self = k > 0 && q.draft_tokens[0] == kShardDraftToken;
    for (int32_t d : q.draft_tokens) EXPECT_EQ(d == kShardDraftToken, self) << "all shard drafts or none";
    const StepResult r = kept_with(q, accept, rng);
    for (size_t t = 0; t < r.tokens.size(); ++t) tokens.push_back(static_cast<int32_t>(tokens.size()) + 1000);  // new
    gate.on_step(plan, r, 0.010 + (self ? round * static_cast<double>(k) : 0.0005 * static_cast<double>(k)));
    with += self;
  }
  return static_cast<double>(with) / steps;
}

TEST(SpeculationGateTest, SelfDraftsWhereTheLookupFindsNothingGatedOnTheirOwnCost) {
  SpeculationConfig c;
  c.draft_layers = 18;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 32; ++i) tokens.push_back(i);
  uint64_t step = 0;
  {
    // Cheap rounds (a fifth of a step), high acceptance: auto takes the self-draft and keeps it on.
    SpeculationController gate(c, 1);
    EXPECT_GT(self_draft_run(gate, 300, 0.9, 0.002, SpecMode::kAuto, tokens, step), 0.9);
    EXPECT_TRUE(gate.class_stats(0, Proposal::kDraft).on);
    EXPECT_GT(gate.class_stats(0, Proposal::kDraft).predicted_gain, 1.5);
    EXPECT_GT(gate.draft_cost().sizes(), 0u);
    EXPECT_EQ(gate.class_stats(0, Proposal::kNgram).proposed, 0) << "the lookup never found anything";
  }
  {
    // Rounds dearer than a step: no acceptance pays for them; the gate switches the self-draft
    // off and only its probes carry drafts.
    SpeculationController gate(c, 1);
    EXPECT_LT(self_draft_run(gate, 600, 0.9, 0.012, SpecMode::kAuto, tokens, step), 0.15);
    EXPECT_FALSE(gate.class_stats(0, Proposal::kDraft).on);
    EXPECT_LT(gate.class_stats(0, Proposal::kDraft).predicted_gain, 1.0);
    // "draft" requests carry them anyway (no gate).
    EXPECT_GT(self_draft_run(gate, 50, 0.9, 0.012, SpecMode::kDraft, tokens, step), 0.9);
  }
  {
    // Without a self-draft in the shards, nothing but n-gram drafts.
    SpeculationController gate(SpeculationConfig{}, 1);
    EXPECT_EQ(self_draft_run(gate, 100, 0.9, 0.002, SpecMode::kAuto, tokens, step), 0.0);
    EXPECT_EQ(self_draft_run(gate, 20, 0.9, 0.002, SpecMode::kDraft, tokens, step), 0.0);
  }
}

}  // namespace
}  // namespace tessera
