#include "tune/step_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

namespace tessera {
namespace {

StepPlan plan_of(std::vector<std::pair<int64_t, int32_t>> pieces) {
  StepPlan p;
  uint64_t id = 1;
  for (auto [start, n] : pieces) {
    ScheduledSequence q;
    q.seq_id = id++;
    q.start_pos = start;
    q.num_tokens = n;
    q.sample = true;
    p.scheduled.push_back(q);
  }
  return p;
}

TEST(StepFeatures, CountsDecodePrefillContextPairsAndBlocks) {
  // A decode at position 99 (100 keys), a first prefill piece of 64 tokens, a second piece of 32.
  const StepFeatures f = step_features(plan_of({{99, 1}, {0, 64}, {64, 32}}), 16);
  EXPECT_EQ(f.tokens, 97);
  EXPECT_EQ(f.sequences, 3);
  EXPECT_EQ(f.decode_seqs, 1);
  EXPECT_EQ(f.prefill_tokens, 96);
  EXPECT_EQ(f.context_tokens, 100 + 64 + 96);
  EXPECT_EQ(f.attention_pairs, 100 + 64 * 65 / 2 + (32 * 64 + 32 * 33 / 2));
  EXPECT_EQ(f.blocks, 7 + 4 + 6);
  EXPECT_EQ(step_features(plan_of({{99, 1}}), 64).blocks, 2);
}

StepTimeModel truth() {
  StepTimeModel m;
  m.fixed_s = 2e-3;
  m.weight_floor_s = 8e-3;
  m.per_token_s = 0.5e-3;  // knee at 16 tokens
  m.per_sequence_s = 0.2e-3;
  m.per_context_token_s = 40e-9;
  m.per_attention_pair_s = 1e-9;
  m.per_block_s = 2e-6;
  return m;
}

std::vector<StepRecord> synthetic_steps(const StepTimeModel& m, double noise, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> batch(1, 32), ctx(16, 3000), prefill(0, 3), plen(16, 512), bs(0, 2);
  std::normal_distribution<double> eps(0.0, noise);
  std::vector<StepRecord> out;
  for (int i = 0; i < n; ++i) {
    const int64_t block = int64_t{16} << (2 * bs(rng));  // 16, 64, 256
    std::vector<std::pair<int64_t, int32_t>> pieces;
    for (int b = batch(rng); b > 0; --b) pieces.push_back({ctx(rng), 1});
    for (int k = prefill(rng); k > 0; --k) pieces.push_back({0, plen(rng)});
    StepRecord r;
    r.block_size = block;
    r.features = step_features(plan_of(pieces), block);
    r.run_s = m.predict_s(r.features) * (1.0 + eps(rng));
    out.push_back(r);
  }
  return out;
}

TEST(StepTimeModelFit, RecoversAKnownModelFromItsSteps) {
  const StepTimeModel t = truth();
  auto steps = synthetic_steps(t, 0.01, 600, 7);
  auto m = fit_step_model(steps, "toy", "cpu", 1);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_LT(m->median_abs_rel_error, 0.02);
  // Predictions on steps it did not see, of every kind, within a few percent.
  for (const StepRecord& r : synthetic_steps(t, 0.0, 200, 99))
    EXPECT_NEAR(m->predict_s(r.features), r.run_s, 0.05 * r.run_s);
  EXPECT_NEAR(m->per_token_s, t.per_token_s, 0.1 * t.per_token_s);
  EXPECT_NEAR(m->per_block_s, t.per_block_s, 0.5 * t.per_block_s);
  EXPECT_EQ(m->fitted_steps, 600);
  EXPECT_NE(m->source.find("16/64/256"), std::string::npos) << m->source;
}

TEST(StepTimeModelFit, DropsOutliersAndKeepsCoefficientsNonNegative) {
  auto steps = synthetic_steps(truth(), 0.01, 300, 3);
  for (int i = 0; i < 300; i += 50) steps[i].run_s *= 20;  // a preempted process
  auto m = fit_step_model(steps, "toy", "cpu", 1);
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->fitted_steps, 294);
  for (double c : {m->fixed_s, m->weight_floor_s, m->per_token_s, m->per_sequence_s, m->per_context_token_s,
                   m->per_attention_pair_s, m->per_block_s})
    EXPECT_GE(c, 0.0);
}

TEST(StepTimeModelFit, FindsTheCacheKneeOfLargeSteps) {
  StepTimeModel t = truth();
  t.per_token_over_knee_s = 0.2e-3;  // tokens past 512 in a step cost 40% more
  t.token_knee = 512;
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> batch(1, 16), ctx(16, 2000), pieces(0, 4), plen(64, 1024);
  std::normal_distribution<double> eps(0.0, 0.01);
  std::vector<StepRecord> steps;
  for (int i = 0; i < 800; ++i) {
    std::vector<std::pair<int64_t, int32_t>> p;
    for (int b = batch(rng); b > 0; --b) p.push_back({ctx(rng), 1});
    for (int k = pieces(rng); k > 0; --k) p.push_back({0, plen(rng)});
    StepRecord r;
    r.block_size = 16;
    r.start_s = 0.05 * i;
    r.features = step_features(plan_of(p), 16);
    r.run_s = t.predict_s(r.features) * (1.0 + eps(rng));
    steps.push_back(r);
  }
  auto m = fit_step_model(steps, "toy", "cpu", 1);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->token_knee, 512);
  EXPECT_NEAR(m->per_token_over_knee_s, t.per_token_over_knee_s, 0.2 * t.per_token_over_knee_s);
  StepFeatures big;
  big.tokens = 3000;
  big.sequences = 4;
  big.context_tokens = 3000;
  big.attention_pairs = 4 * 750 * 751 / 2;
  big.blocks = 4 * 47;
  EXPECT_NEAR(m->predict_s(big), t.predict_s(big), 0.05 * t.predict_s(big));
  // Without the knee in the truth, the fit finds none worth its term.
  auto plain = fit_step_model(synthetic_steps(truth(), 0.01, 600, 8), "toy", "cpu", 1);
  ASSERT_TRUE(plain.is_ok());
  EXPECT_LT(plain->per_token_over_knee_s, 0.05 * truth().per_token_s);
}

TEST(StepTimeModelFit, KeepsMachineDriftOutOfTheStepJitter) {
  // Two servers' logs one after the other (the clock restarts); in each, a fast phase and a slow
  // one (x1.3) of 20 s apiece, and 2% step-to-step noise.
  std::mt19937_64 rng(11);
  std::normal_distribution<double> eps(0.0, 0.02);
  std::vector<StepRecord> steps;
  for (int run = 0; run < 2; ++run) {
    auto part = synthetic_steps(truth(), 0.0, 800, 20 + run);
    for (int i = 0; i < 800; ++i) {
      StepRecord r = part[i];
      r.start_s = 0.05 * i;
      r.run_s *= (r.start_s < 20 ? 1.0 : 1.3) * (1.0 + eps(rng));
      steps.push_back(r);
    }
  }
  auto m = fit_step_model(steps, "toy", "cpu", 1);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_EQ(m->drift_quantiles.size(), 3u);
  EXPECT_GT(m->drift_quantiles[2] / m->drift_quantiles[0], 1.2);  // the two phases
  // The jitter is the 2% noise (and the edges of the phases' windows), not the 30% between phases.
  EXPECT_LT(m->jitter(0.9) / m->jitter(0.1), 1.1);
  EXPECT_NEAR(m->jitter(0.5), 1.0, 0.03);
  // The store keeps both.
  auto back = step_model_from_json(step_model_to_json(*m), "m.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->drift_quantiles, m->drift_quantiles);
  EXPECT_EQ(back->token_knee, m->token_knee);
}

// One server per block size, the block-16 one on a slower phase of the machine (x1.2) and no
// block cost at all: the fit blames the blocks for the drift, the block term measured apart does
// not, and the others still fit.
TEST(StepTimeModelFit, ABlockTermMeasuredApartKeepsDriftBetweenRunsOutOfIt) {
  StepTimeModel t = truth();
  t.per_block_s = 0.0;
  std::vector<StepRecord> steps;
  for (const StepRecord& r : synthetic_steps(t, 0.01, 900, 31)) {
    StepRecord d = r;
    if (d.block_size == 16) d.run_s *= 1.2;
    steps.push_back(d);
  }
  auto fitted = fit_step_model(steps, "toy", "cpu", 1);
  ASSERT_TRUE(fitted.is_ok()) << fitted.status().to_string();
  EXPECT_GT(fitted->per_block_s, 1e-7) << "drift between the runs went into the block term";
  auto pinned = fit_step_model(steps, "toy", "cpu", 1, 0.0);
  ASSERT_TRUE(pinned.is_ok()) << pinned.status().to_string();
  EXPECT_EQ(pinned->per_block_s, 0.0);
  EXPECT_NE(pinned->source.find("per block 0.0 ns measured apart"), std::string::npos) << pinned->source;
  EXPECT_LT(pinned->median_abs_rel_error, 0.12);
  auto given = fit_step_model(steps, "toy", "cpu", 1, 3e-6);
  ASSERT_TRUE(given.is_ok());
  EXPECT_EQ(given->per_block_s, 3e-6);
  EXPECT_EQ(fit_step_model(steps, "toy", "cpu", 1, -1e-6).status().code(), StatusCode::kInvalidArgument);
}

TEST(StepTimeModelFit, RefusesTooFewOrUniformSteps) {
  auto few = synthetic_steps(truth(), 0.0, 5, 1);
  EXPECT_NE(fit_step_model(few, "m", "cpu", 1).status().message().find("at least 8"), std::string::npos);
  std::vector<StepRecord> same(20);
  for (StepRecord& r : same) {
    r.block_size = 16;
    r.features = step_features(plan_of({{10, 1}}), 16);
    r.run_s = 1e-3;
  }
  EXPECT_NE(fit_step_model(same, "m", "cpu", 1).status().message().find("same number of tokens"), std::string::npos);
}

TEST(StepLog, RoundTripsAndNamesTheBadLine) {
  StepRecord r;
  r.step_id = 5;
  r.run_s = 0.012;
  r.schedule_s = 1e-4;
  r.commit_s = 2e-4;
  r.block_size = 64;
  r.preemptions = 3;
  r.features = step_features(plan_of({{99, 1}, {0, 64}}), 64);
  const std::string text = step_record_json(r) + "\n" + step_record_json(r) + "\n";
  auto parsed = parse_step_log(text, "log.jsonl");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[1].features.attention_pairs, r.features.attention_pairs);
  EXPECT_EQ((*parsed)[1].preemptions, 3);
  EXPECT_NEAR((*parsed)[0].total_s(), r.total_s(), 1e-9);
  auto bad = parse_step_log(text + "{\"run_s\": 1}\n", "log.jsonl");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("log.jsonl:3"), std::string::npos) << bad.status().message();
}

TEST(StepModelStore, ReplacesTheEntryForACardAndTpAndKeepsOthers) {
  const std::string path = (std::filesystem::temp_directory_path() / "tessera_step_store_test.json").string();
  std::filesystem::remove(path);
  StepTimeModel a = truth();
  a.model = "m";
  a.card = "cpu";
  a.tp = 1;
  StepTimeModel b = a;
  b.tp = 2;
  b.fixed_s = 5e-3;
  ASSERT_TRUE(save_step_model(path, a).is_ok());
  ASSERT_TRUE(save_step_model(path, b).is_ok());
  a.fixed_s = 3e-3;
  ASSERT_TRUE(save_step_model(path, a).is_ok());
  auto all = load_step_models(path);
  ASSERT_TRUE(all.is_ok());
  ASSERT_EQ(all->size(), 2u);
  ASSERT_NE(find_step_model(*all, "cpu", 1), nullptr);
  EXPECT_DOUBLE_EQ(find_step_model(*all, "cpu", 1)->fixed_s, 3e-3);
  EXPECT_DOUBLE_EQ(find_step_model(*all, "cpu", 2)->fixed_s, 5e-3);
  EXPECT_EQ(find_step_model(*all, "A100-80GB", 1), nullptr);
  auto neg = step_model_from_json(R"({"model":"m","card":"cpu","tp":1,"fixed_s":-1,"weight_floor_s":0,"per_token_s":0,
    "per_sequence_s":0,"per_context_token_s":0,"per_attention_pair_s":0,"per_block_s":0})", "x.json");
  ASSERT_FALSE(neg.is_ok());
  EXPECT_NE(neg.status().message().find("fixed_s"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(StepModelPrior, FollowsThePlannersRoofline) {
  auto shape = model_preset("llama-2-70b");
  ASSERT_TRUE(shape.is_ok());
  PlanInput in;
  in.model = *shape;
  in.model_name = "llama-2-70b";
  in.weights = *precision_preset("INT4");
  in.embeddings = *precision_preset("F16");
  in.card = *card_preset("A100-80GB");
  in.kv_dtype = KvDtype::kF16;
  in.context_length = 4096;
  auto plan1 = make_plan(in);
  ASSERT_TRUE(plan1.is_ok()) << plan1.status().to_string();
  const StepTimeModel p1 = prior_step_model(*plan1);
  // A decode step of one sequence reads the weights once: about weights / (0.8 * bandwidth).
  EXPECT_NEAR(p1.weight_floor_s, static_cast<double>(plan1->time.weight_bytes_read) / (0.8 * in.card.memory_bandwidth),
              1e-9);
  EXPECT_GT(p1.per_token_s, 0);
  EXPECT_GT(p1.per_context_token_s, 0);
  // Past the knee a prefill is compute-bound: 2 * params / (0.6 * peak) per token.
  StepFeatures big;
  big.tokens = 4096;
  big.sequences = 1;
  EXPECT_GT(p1.predict_s(big), 4096 * p1.per_token_s);
  in.tp = 2;
  auto plan2 = make_plan(in);
  ASSERT_TRUE(plan2.is_ok());
  const StepTimeModel p2 = prior_step_model(*plan2);
  EXPECT_LT(p2.weight_floor_s, p1.weight_floor_s);
  EXPECT_GT(p2.fixed_s, p1.fixed_s);  // the all-reduces' hop latencies
}

}  // namespace
}  // namespace tessera
