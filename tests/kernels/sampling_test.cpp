// Tests for kernels/sampling.h: greedy, truncation sets, penalties, RNG reproducibility,
// empirical frequencies against the softmax, logprobs, vocabulary sizes 1 .. 262144.
#include "kernels/sampling.h"

#include "common/thread_pool.h"
#include "kernels/cpu/vec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

namespace tessera {
namespace {

SamplingParams seeded(uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  p.has_seed = true;
  return p;
}

// One draw from a fresh sampler on a copy of the logits.
SampledToken sample_once(const SamplingParams& params, const std::vector<float>& logits) {
  Sampler sampler(params);
  std::vector<float> work = logits;
  return sampler.sample(work.data(), static_cast<int64_t>(work.size()));
}

// Deterministic pseudo-random logits in [-scale, scale).
std::vector<float> random_logits(int64_t vocab, uint64_t seed, float scale) {
  std::vector<float> v(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    v[i] = static_cast<float>((sampling_uniform(seed, static_cast<uint64_t>(i)) * 2.0 - 1.0) * scale);
  }
  return v;
}

std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> v;
  for (double x : p) v.push_back(static_cast<float>(std::log(x)));
  return v;
}

// Tokens drawn over many seeds: the support of the truncated distribution.
std::set<int32_t> support(SamplingParams params, const std::vector<float>& logits, int draws) {
  std::set<int32_t> seen;
  for (int s = 0; s < draws; ++s) {
    params.seed = static_cast<uint64_t>(s);
    params.has_seed = true;
    seen.insert(sample_once(params, logits).id);
  }
  return seen;
}

// Softmax of logits / temperature in double.
std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - m) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

TEST(SamplingRng, MatchesReferenceValues) {
  // From an independent Python implementation of the documented generator.
  EXPECT_EQ(sampling_random_bits(0, 0), 0x1094db8bb4b47185ULL);
  EXPECT_EQ(sampling_random_bits(0, 1), 0x2752a8383df44629ULL);
  EXPECT_EQ(sampling_random_bits(42, 0), 0xeeaea3a5b322b528ULL);
  EXPECT_EQ(sampling_random_bits(42, 7), 0x07bfe5379b3d1c56ULL);
  EXPECT_EQ(sampling_random_bits(~0ULL, 123456789), 0xc9d248557ef3a07fULL);
  for (uint64_t c = 0; c < 1000; ++c) {
    const double u = sampling_uniform(7, c);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

TEST(SamplingGreedy, ArgmaxWithTiesToLowestId) {
  SamplingParams p = seeded(1);
  p.temperature = 0.0f;
  EXPECT_EQ(sample_once(p, {0.1f, 3.0f, -2.0f, 3.0f, 1.0f}).id, 1);
  EXPECT_EQ(sample_once(p, {5.0f, 5.0f}).id, 0);
  EXPECT_EQ(sample_once(p, {-1.0f, -0.5f, -0.5f}).id, 1);
  EXPECT_EQ(sample_once(p, {7.0f}).id, 0);
  // Greedy does not depend on the seed.
  for (uint64_t s = 0; s < 20; ++s) {
    p.seed = s;
    EXPECT_EQ(sample_once(p, {0.0f, 0.0f, 2.0f, 2.0f}).id, 2);
  }
}

TEST(SamplingGreedy, NonFiniteLogits) {
  SamplingParams p = seeded(1);
  p.temperature = 0.0f;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(sample_once(p, {nan, 1.0f, 2.0f}).id, 2);
  EXPECT_EQ(sample_once(p, {1.0f, inf, 2.0f, inf}).id, 1);
  EXPECT_EQ(sample_once(p, {-inf, -inf, -inf}).id, 0);
  EXPECT_EQ(sample_once(p, {nan, nan}).id, 0);
  // Sampling: +inf takes all the mass; NaN and -inf none; all masked is uniform.
  for (uint64_t s = 0; s < 50; ++s) {
    SamplingParams q = seeded(s);
    EXPECT_EQ(sample_once(q, {nan, 3.0f, inf, -inf}).id, 2);
    const int32_t id = sample_once(q, {nan, 3.0f, -inf, 2.0f}).id;
    EXPECT_TRUE(id == 1 || id == 3) << id;
  }
  std::set<int32_t> all_masked = support(seeded(0), {-inf, -inf, -inf}, 200);
  EXPECT_EQ(all_masked, (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplingTemperature, TinyTemperatureIsGreedy) {
  const std::vector<float> logits = random_logits(512, 3, 4.0f);
  SamplingParams greedy = seeded(0);
  greedy.temperature = 0.0f;
  const int32_t argmax = sample_once(greedy, logits).id;
  for (uint64_t s = 0; s < 100; ++s) {
    SamplingParams p = seeded(s);
    p.temperature = 1e-5f;
    EXPECT_EQ(sample_once(p, logits).id, argmax);
  }
  // Exactly tied maxima at a tiny temperature split between the tied ids only.
  EXPECT_EQ(support([] { auto p = seeded(0); p.temperature = 1e-6f; return p; }(),
                    {1.0f, 4.0f, 0.0f, 4.0f, 3.99f}, 200),
            (std::set<int32_t>{1, 3}));
}

TEST(SamplingTopK, TopKOneEqualsGreedy) {
  for (uint64_t t = 0; t < 5; ++t) {
    const std::vector<float> logits = random_logits(1000, 100 + t, 3.0f);
    SamplingParams greedy = seeded(0);
    greedy.temperature = 0.0f;
    const int32_t argmax = sample_once(greedy, logits).id;
    for (uint64_t s = 0; s < 20; ++s) {
      SamplingParams p = seeded(s);
      p.top_k = 1;
      p.temperature = 1.5f;
      EXPECT_EQ(sample_once(p, logits).id, argmax);
    }
  }
}

TEST(SamplingTopK, KeepsTheKLargestWithTiesToLowerIds) {
  SamplingParams p = seeded(0);
  p.top_k = 3;
  // Ids 1, 3, 5 tie at 2.0 after the best (id 4): top-3 is {4, 1, 3}.
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, 3.0f, 2.0f};
  EXPECT_EQ(support(p, logits, 400), (std::set<int32_t>{1, 3, 4}));
  p.top_k = 100;  // larger than the vocabulary: off
  EXPECT_EQ(support(p, logits, 1000).size(), logits.size());
  p.top_k = 70;  // the nth_element path (k above the small-selection window)
  std::vector<float> big = random_logits(300, 8, 2.0f);
  std::vector<int32_t> order(big.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return big[a] > big[b]; });
  const std::set<int32_t> allowed(order.begin(), order.begin() + 70);
  for (int32_t id : support(p, big, 300)) EXPECT_TRUE(allowed.contains(id)) << id;
}

TEST(SamplingTopP, HandMadeSets) {
  // Ids deliberately not in probability order.
  const std::vector<float> logits = log_probs({0.15, 0.5, 0.05, 0.3});
  SamplingParams p = seeded(0);
  p.top_p = 0.75f;  // 0.5 + 0.3 = 0.8 >= 0.75
  EXPECT_EQ(support(p, logits, 300), (std::set<int32_t>{1, 3}));
  p.top_p = 0.85f;  // needs 0.15 too
  EXPECT_EQ(support(p, logits, 300), (std::set<int32_t>{0, 1, 3}));
  p.top_p = 0.4f;  // the first token alone suffices
  EXPECT_EQ(support(p, logits, 100), (std::set<int32_t>{1}));
  p.top_p = 1e-6f;  // keeps at least one
  EXPECT_EQ(support(p, logits, 100), (std::set<int32_t>{1}));
  p.top_p = 0.97f;
  EXPECT_EQ(support(p, logits, 2000), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(SamplingTopP, RenormalisesOverTopK) {
  // p = {0.3, 0.3, 0.2, 0.2}: top-k 2 leaves {0.5, 0.5}, so top-p 0.5 keeps only id 0; over
  // the whole vocabulary top-p 0.5 would need two tokens.
  const std::vector<float> logits = {1.0f, 1.0f, 0.5f, 0.5f};
  SamplingParams p = seeded(0);
  p.top_p = 0.5f;
  p.top_k = 2;
  EXPECT_EQ(support(p, logits, 200), (std::set<int32_t>{0}));
  p.top_k = 0;
  EXPECT_EQ(support(p, logits, 200), (std::set<int32_t>{0, 1}));
}

// The nucleus computed here in double equals a top-k set of the same size, and then both
// paths order candidates the same way, so every seed must give the same token. Large flat
// vocabularies make the incremental partial sort grow several times.
TEST(SamplingTopP, EqualsTopKOfTheNucleusSize) {
  for (const auto& [vocab, top_p, temperature] :
       std::vector<std::tuple<int64_t, float, float>>{{64, 0.9f, 1.0f}, {4096, 0.9f, 1.0f},
                                                      {4096, 0.3f, 0.5f}, {20000, 0.95f, 2.0f}}) {
    const std::vector<float> logits = random_logits(vocab, static_cast<uint64_t>(vocab), 2.0f);
    const std::vector<double> prob = softmax(logits, temperature);
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
    int32_t nucleus = 0;
    double cumulative = 0.0;
    while (cumulative < top_p) cumulative += prob[order[nucleus++]];
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " top_p " << top_p << " nucleus " << nucleus);
    for (uint64_t s = 0; s < 100; ++s) {
      SamplingParams a = seeded(s);
      a.temperature = temperature;
      a.top_p = top_p;
      SamplingParams b = a;
      b.top_p = 1.0f;
      b.top_k = nucleus;
      ASSERT_EQ(sample_once(a, logits).id, sample_once(b, logits).id) << "seed " << s;
    }
  }
}

TEST(SamplingMinP, HandMadeSetsAfterTemperature) {
  const std::vector<float> logits = log_probs({0.06, 0.4, 0.2, 0.3, 0.04});
  SamplingParams p = seeded(0);
  p.min_p = 0.2f;  // keeps p >= 0.08
  EXPECT_EQ(support(p, logits, 500), (std::set<int32_t>{1, 2, 3}));
  p.min_p = 1.0f;  // only the maximum
  EXPECT_EQ(support(p, logits, 100), (std::set<int32_t>{1}));
  // Temperature 2 flattens the ratios to sqrt(p / p_max): 0.06 -> 0.387, 0.04 -> 0.316.
  p.min_p = 0.35f;
  p.temperature = 2.0f;
  EXPECT_EQ(support(p, logits, 1000), (std::set<int32_t>{0, 1, 2, 3}));
  // With top-k: the intersection of both.
  p.top_k = 2;
  EXPECT_EQ(support(p, logits, 300), (std::set<int32_t>{1, 3}));
}

TEST(SamplingMinP, TopPMassIsNotRenormalisedByMinP) {
  // min-p 0.3 drops id 3 (0.1 < 0.12). top-p 0.75 over the top-k (here: whole) mass needs
  // 0.4 + 0.3 + 0.2; renormalised over min-p's 0.9 it would stop at 0.7 / 0.9 = 0.78.
  const std::vector<float> logits = log_probs({0.4, 0.3, 0.2, 0.1});
  SamplingParams p = seeded(0);
  p.min_p = 0.3f;
  p.top_p = 0.75f;
  EXPECT_EQ(support(p, logits, 500), (std::set<int32_t>{0, 1, 2}));
  p.top_p = 0.65f;
  EXPECT_EQ(support(p, logits, 500), (std::set<int32_t>{0, 1}));
  p.top_p = 0.99f;
  EXPECT_EQ(support(p, logits, 500), (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplingPenalties, RepetitionOverPromptAndOutputOnce) {
  SamplingParams p = seeded(0);
  p.repetition_penalty = 2.0f;
  Sampler sampler(p);
  const std::vector<int32_t> prompt = {0, 0, 5, 99};  // 99 is outside the vocabulary
  sampler.add_prompt_tokens(prompt);
  sampler.accept(1);
  sampler.accept(1);
  sampler.accept(0);
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f, -0.5f, 0.0f};
  sampler.apply_penalties(logits.data(), static_cast<int64_t>(logits.size()));
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.0f, 1.0f, 0.5f, -0.5f, 0.0f}));
}

TEST(SamplingPenalties, PresenceAndFrequencyOverOutputOnly) {
  SamplingParams p = seeded(0);
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler sampler(p);
  const std::vector<int32_t> prompt = {2, 2, 2};
  sampler.add_prompt_tokens(prompt);
  for (int32_t id : {1, 1, 3}) sampler.accept(id);
  EXPECT_EQ(sampler.num_output_tokens(), 3);
  std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f};
  sampler.apply_penalties(logits.data(), 4);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, 0.0f, 1.0f, 0.25f}));
}

TEST(SamplingPenalties, RepetitionThenFrequency) {
  SamplingParams p = seeded(0);
  p.repetition_penalty = 4.0f;
  p.frequency_penalty = 1.0f;
  Sampler sampler(p);
  sampler.accept(0);
  sampler.accept(1);
  std::vector<float> logits = {8.0f, -1.0f};
  sampler.apply_penalties(logits.data(), 2);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -5.0f}));  // 8 / 4 - 1, -1 * 4 - 1
}

TEST(SamplingPenalties, FlipTheGreedyChoice) {
  SamplingParams p = seeded(0);
  p.temperature = 0.0f;
  p.repetition_penalty = 1.5f;
  Sampler sampler(p);
  const std::vector<float> logits = {1.0f, 0.9f, 0.1f};
  std::vector<float> work = logits;
  EXPECT_EQ(sampler.sample(work.data(), 3).id, 0);
  work = logits;
  EXPECT_EQ(sampler.sample(work.data(), 3).id, 1);  // 1 / 1.5 < 0.9
  work = logits;
  EXPECT_EQ(sampler.sample(work.data(), 3).id, 0);  // 0.667 vs 0.6
  EXPECT_FLOAT_EQ(work[0], 1.0f / 1.5f);             // sample() leaves the penalised logits
  EXPECT_FLOAT_EQ(work[1], 0.9f / 1.5f);

  SamplingParams q = seeded(0);
  q.temperature = 0.0f;
  q.presence_penalty = 0.05f;
  q.frequency_penalty = 0.1f;
  Sampler counted(q);
  std::vector<int32_t> got;
  for (int i = 0; i < 5; ++i) {
    work = {1.0f, 0.88f};
    got.push_back(counted.sample(work.data(), 2).id);
  }
  // Token 0 after n uses: 1 - 0.05 - 0.1 n = 0.85, 0.75, 0.65; token 1 after one use: 0.73.
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 0, 0, 1}));
}

TEST(SamplingLogitBias, AddedAfterThePenaltiesAndSeenByLogprobs) {
  SamplingParams p = seeded(0);
  p.temperature = 0.0f;
  p.frequency_penalty = 1.0f;
  p.n_logprobs = 2;
  p.logit_bias = {{1, 0.5f}, {2, -100.0f}, {7, 100.0f}};  // 7 is past this vocabulary: ignored
  Sampler sampler(p);
  sampler.accept(1);
  std::vector<float> logits = {1.0f, 1.2f, 3.0f};
  const SampledToken t = sampler.sample(logits.data(), 3);
  EXPECT_EQ(logits[0], 1.0f);
  EXPECT_FLOAT_EQ(logits[1], 1.2f - 1.0f + 0.5f);
  EXPECT_EQ(logits[2], 3.0f - 100.0f);
  EXPECT_EQ(t.id, 0);
  ASSERT_EQ(t.top_logprobs.size(), 2u);
  EXPECT_EQ(t.top_logprobs[0].first, 0);
  EXPECT_EQ(t.top_logprobs[1].first, 1);
  // +100 makes a token all but certain at any temperature; -100 all but removes it.
  SamplingParams hot = seeded(5);
  hot.temperature = 1.5f;
  hot.logit_bias = {{3, 100.0f}};
  Sampler forced(hot);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> l = {2.0f, 1.0f, 0.5f, -1.0f};
    EXPECT_EQ(forced.sample(l.data(), 4).id, 3);
  }
  hot.logit_bias = {{0, -100.0f}};
  Sampler banned(hot);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> l = {5.0f, 1.0f, 0.5f, -1.0f};
    EXPECT_NE(banned.sample(l.data(), 4).id, 0);
  }
}

TEST(SamplingRng, SameSeedSameSequenceDifferentSeedsDiffer) {
  const std::vector<float> logits = random_logits(512, 11, 1.0f);
  auto run = [&](SamplingParams p) {
    p.top_p = 0.95f;
    Sampler sampler(p);
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) {
      std::vector<float> work = logits;
      ids.push_back(sampler.sample(work.data(), 512).id);
    }
    return ids;
  };
  EXPECT_EQ(run(seeded(77)), run(seeded(77)));
  EXPECT_NE(run(seeded(77)), run(seeded(78)));
  // Unseeded samplers get different random seeds and report them for replay.
  Sampler a{SamplingParams{}}, b{SamplingParams{}};
  EXPECT_NE(a.seed(), b.seed());
  EXPECT_EQ(run(seeded(a.seed())), run(seeded(a.seed())));
}

// Reference sequences from an independent Python implementation of the documented algorithm
// (weights exp((l - max) / T) as float, sums in double, u = bits >> 11 * 2^-53, first
// cumulative > u * kept): pins the draw on every platform.
TEST(SamplingRng, GoldenSequences) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f, 0.25f, 1.5f};
  auto run = [&](SamplingParams p) {
    Sampler sampler(p);
    std::vector<int32_t> ids;
    for (int i = 0; i < 16; ++i) {
      std::vector<float> work = logits;
      ids.push_back(sampler.sample(work.data(), 8).id);
    }
    return ids;
  };
  SamplingParams plain = seeded(1234);
  plain.temperature = 0.8f;
  EXPECT_EQ(run(plain), (std::vector<int32_t>{2, 4, 0, 7, 7, 2, 7, 3, 4, 2, 1, 1, 6, 1, 7, 4}));
  SamplingParams truncated = seeded(99);
  truncated.temperature = 1.3f;
  truncated.top_k = 5;
  truncated.top_p = 0.9f;
  EXPECT_EQ(run(truncated), (std::vector<int32_t>{7, 1, 7, 0, 4, 4, 0, 1, 0, 4, 4, 4, 7, 1, 0, 1}));
}

// Pearson chi-square of 20000 seeded draws against the expected probabilities. The bound is
// far in the tail (df <= 7: P(chi2 > 35) < 1e-5); the draws are deterministic, so no flakes.
void expect_frequencies(SamplingParams params, const std::vector<float>& logits,
                        const std::vector<double>& expected) {
  constexpr int kDraws = 20000;
  Sampler sampler(params);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < kDraws; ++i) {
    std::vector<float> work = logits;
    ++counts[sampler.sample(work.data(), static_cast<int64_t>(work.size())).id];
  }
  double chi2 = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (expected[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i;
      continue;
    }
    const double e = expected[i] * kDraws;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
    EXPECT_NEAR(counts[i] / double(kDraws), expected[i], 0.02) << "token " << i;
  }
  EXPECT_LT(chi2, 35.0);
}

TEST(SamplingDistribution, FrequenciesMatchSoftmax) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f, 0.25f, 1.5f};
  SamplingParams p = seeded(2024);
  expect_frequencies(p, logits, softmax(logits, 1.0));
  p.temperature = 0.6f;
  expect_frequencies(p, logits, softmax(logits, 0.6));
  p.temperature = 2.5f;
  expect_frequencies(p, logits, softmax(logits, 2.5));
  // top-k 3 renormalises over ids 4, 7, 0.
  p.temperature = 1.0f;
  p.top_k = 3;
  std::vector<double> full = softmax(logits, 1.0), truncated(logits.size(), 0.0);
  const double kept = full[4] + full[7] + full[0];
  for (int id : {4, 7, 0}) truncated[id] = full[id] / kept;
  expect_frequencies(p, logits, truncated);
}

TEST(SamplingLogprobs, NormalisedSortedAndBeforeTemperature) {
  std::vector<float> logits = random_logits(512, 5, 3.0f);
  logits[10] = logits[20] = logits[30] = 4.0f;  // a three-way tie at the top
  SamplingParams p = seeded(3);
  p.n_logprobs = 512;
  p.temperature = 0.3f;  // must not change the reported logprobs
  p.top_k = 4;
  const SampledToken t = sample_once(p, logits);
  ASSERT_EQ(t.top_logprobs.size(), 512u);
  double sum = 0.0;
  for (const auto& [id, lp] : t.top_logprobs) sum += std::exp(static_cast<double>(lp));
  EXPECT_NEAR(sum, 1.0, 1e-5);
  EXPECT_EQ(t.top_logprobs[0].first, 10);
  EXPECT_EQ(t.top_logprobs[1].first, 20);
  EXPECT_EQ(t.top_logprobs[2].first, 30);
  for (size_t j = 1; j < t.top_logprobs.size(); ++j) {
    const auto& [prev_id, prev] = t.top_logprobs[j - 1];
    const auto& [id, lp] = t.top_logprobs[j];
    EXPECT_TRUE(prev > lp || (prev == lp && prev_id < id)) << j;
  }
  const std::vector<double> prob = softmax(logits, 1.0);
  for (const auto& [id, lp] : t.top_logprobs) EXPECT_NEAR(lp, std::log(prob[id]), 1e-5);
  const auto chosen = std::find_if(t.top_logprobs.begin(), t.top_logprobs.end(),
                                   [&](const auto& e) { return e.first == t.id; });
  ASSERT_NE(chosen, t.top_logprobs.end());
  EXPECT_EQ(chosen->second, t.logprob);

  SamplingParams few = p;
  few.n_logprobs = 3;
  few.temperature = 0.0f;
  const SampledToken g = sample_once(few, logits);
  EXPECT_EQ(g.id, 10);
  ASSERT_EQ(g.top_logprobs.size(), 3u);
  EXPECT_EQ(g.top_logprobs[0], t.top_logprobs[0]);
  EXPECT_EQ(g.top_logprobs[2], t.top_logprobs[2]);
  EXPECT_FLOAT_EQ(g.logprob, static_cast<float>(std::log(prob[10])));
}

TEST(SamplingLogprobs, OnlyWhenAskedAndOfPenalisedLogits) {
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = {0.25, 0.75}
  SamplingParams p = seeded(0);
  p.temperature = 0.0f;
  SampledToken t = sample_once(p, logits);
  EXPECT_EQ(t.logprob, 0.0f);
  EXPECT_TRUE(t.top_logprobs.empty());
  p.return_logprob = true;
  t = sample_once(p, logits);
  EXPECT_EQ(t.id, 1);
  EXPECT_NEAR(t.logprob, std::log(0.75), 1e-6);
  EXPECT_TRUE(t.top_logprobs.empty());
  // Frequency penalty of log 3 on token 1 makes both equal: logprob log 0.5.
  p.frequency_penalty = std::log(3.0f);
  Sampler sampler(p);
  sampler.accept(1);
  std::vector<float> work = logits;
  t = sampler.sample(work.data(), 2);
  EXPECT_EQ(t.id, 0);
  EXPECT_NEAR(t.logprob, std::log(0.5), 1e-6);
}

class SamplingVocab : public ::testing::TestWithParam<int64_t> {};

TEST_P(SamplingVocab, AllModesReturnValidIds) {
  const int64_t vocab = GetParam();
  std::vector<float> logits = random_logits(vocab, 9, 5.0f);
  const int64_t planted = vocab / 3;
  logits[planted] = 6.0f;  // a unique maximum
  SamplingParams greedy = seeded(0);
  greedy.temperature = 0.0f;
  EXPECT_EQ(sample_once(greedy, logits).id, planted);
  SamplingParams k1 = seeded(4);
  k1.top_k = 1;
  EXPECT_EQ(sample_once(k1, logits).id, planted);
  std::vector<SamplingParams> modes(5, seeded(5));
  modes[1].top_k = 40;
  modes[2].top_p = 0.9f;
  modes[3].min_p = 0.05f;
  modes[4].top_k = 1000;
  modes[4].top_p = 0.8f;
  modes[4].min_p = 0.01f;
  modes[4].n_logprobs = 5;
  modes[4].repetition_penalty = 1.2f;
  for (const SamplingParams& mode : modes) {
    const SampledToken t = sample_once(mode, logits);
    EXPECT_GE(t.id, 0);
    EXPECT_LT(t.id, vocab);
  }
  const SampledToken t = sample_once(modes[4], logits);
  ASSERT_EQ(t.top_logprobs.size(), static_cast<size_t>(std::min<int64_t>(5, vocab)));
  EXPECT_EQ(t.top_logprobs[0].first, planted);
  EXPECT_LE(t.logprob, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Sizes, SamplingVocab, ::testing::Values(1, 2, 512, 262144));

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The AVX-512 weight pass gives the scalar loop's bits and a pool the single thread's: the same
// draws over a 262k vocabulary (Gemma 3's) for many seeds, with top-p and without truncation.
TEST(SamplingIsa, VectorWeightsDrawTheScalarTokens) {
  const int64_t vocab = 262144;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& x : logits) x = normal(rng);
  logits[17] = -std::numeric_limits<float>::infinity();
  logits[18] = -3000.0f;  // below e^-700 after the temperature: weight 0
  const cpu::Isa best = cpu::active_isa();
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});  // any thread count: the same blocks
  for (float top_p : {1.0f, 0.95f}) {
    for (uint64_t seed = 0; seed < 200; ++seed) {
      SamplingParams p;
      p.temperature = 0.8f;
      p.top_p = top_p;
      p.seed = seed;
      p.has_seed = true;
      std::vector<int32_t> ids;
      for (cpu::Isa isa : {best, cpu::Isa::kScalar}) {
        cpu::set_max_isa(isa);
        for (ThreadPool* on : {static_cast<ThreadPool*>(nullptr), &pool}) {
          Sampler s(p);
          std::vector<float> work = logits;
          ids.push_back(s.sample(work.data(), vocab, on).id);
        }
      }
      cpu::set_max_isa(best);
      for (size_t k = 1; k < ids.size(); ++k) EXPECT_EQ(ids[0], ids[k]) << "seed " << seed << " top_p " << top_p << " " << k;
    }
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The vector argmax (all logits finite) picks the first maximum as the scalar pass does, in the
// body and in the tail, with or without non-finite values.
TEST(SamplingIsa, GreedyFirstMaximumOnEveryIsa) {
  const cpu::Isa best = cpu::active_isa();
  for (int64_t vocab : {1, 15, 16, 17, 1000, 4099}) {
    for (int64_t at : {int64_t{0}, vocab / 3, vocab - 1}) {
      for (bool with_nan : {false, true}) {
        std::vector<float> logits(static_cast<size_t>(vocab));
        for (int64_t i = 0; i < vocab; ++i) logits[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 101) * 0.01f;
        logits[static_cast<size_t>(at)] = 5.0f;
        if (vocab > at + 2) logits[static_cast<size_t>(vocab - 1)] = 5.0f;  // a later tie
        if (with_nan && vocab > 2) logits[1] = std::numeric_limits<float>::quiet_NaN();
        std::vector<int32_t> ids;
        for (cpu::Isa isa : {best, cpu::Isa::kScalar}) {
          cpu::set_max_isa(isa);
          SamplingParams p;
          p.temperature = 0.0f;
          Sampler s(p);
          std::vector<float> work = logits;
          ids.push_back(s.sample(work.data(), vocab).id);
        }
        cpu::set_max_isa(best);
        const int32_t want = with_nan && at == 1 && vocab > 2 ? static_cast<int32_t>(vocab - 1) : static_cast<int32_t>(at);
        EXPECT_EQ(ids[0], want) << vocab << " " << at << " " << with_nan;
        EXPECT_EQ(ids[1], want) << vocab << " " << at << " " << with_nan;
      }
    }
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Top-p without min-p gathers the nucleus from the heaviest weight buckets; with a min-p too
// small to matter the general path (every candidate, partition, cut) runs instead: both draw
// the same tokens, with and without a pool.
TEST(SamplingTopP, NucleusFromBucketsEqualsTheGeneralPath) {
  const int64_t vocab = 100000;
  std::mt19937 rng(11);
  for (float spread : {0.5f, 3.0f, 12.0f, 40.0f}) {
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (float& x : logits) x = normal(rng);
    ThreadPool pool(ThreadPoolOptions{.num_threads = 2});
    for (float top_p : {0.5f, 0.9f, 0.999f}) {
      for (uint64_t seed = 0; seed < 40; ++seed) {
        SamplingParams fast;
        fast.temperature = 0.9f;
        fast.top_p = top_p;
        fast.seed = seed;
        fast.has_seed = true;
        SamplingParams general = fast;
        general.min_p = 1e-30f;  // removes nothing that could be in the nucleus
        std::vector<int32_t> ids;
        for (const SamplingParams* p : {&fast, &general})
          for (ThreadPool* on : {static_cast<ThreadPool*>(nullptr), &pool}) {
            Sampler s(*p);
            std::vector<float> work = logits;
            ids.push_back(s.sample(work.data(), vocab, on).id);
          }
        for (size_t k = 1; k < ids.size(); ++k)
          EXPECT_EQ(ids[0], ids[k]) << "spread " << spread << " top_p " << top_p << " seed " << seed << " " << k;
      }
    }
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Structured outputs: a token mask leaves only the allowed ids, also past the last full word,
// and a sampler then draws only among them whatever the temperature.
TEST(TokenMask, DisallowedLogitsBecomeMinusInfinity) {
  std::vector<float> logits(70, 1.0f);
  logits[5] = 9.0f;  // the favourite, not allowed
  std::vector<uint32_t> mask = {0xffffffffu, 0u, 0u};
  mask[0] &= ~(1u << 5);
  mask[2] = 1u << 3;  // token 67
  apply_token_mask(mask, logits);
  for (int i = 0; i < 70; ++i) {
    const bool allowed = (i < 32 && i != 5) || i == 67;
    EXPECT_EQ(std::isinf(logits[static_cast<size_t>(i)]), !allowed) << i;
  }
  SamplingParams p;
  p.temperature = 1.5f;
  p.seed = 7;
  p.has_seed = true;
  Sampler s(p);
  std::vector<float> only(70, 0.0f);
  std::vector<uint32_t> one = {0u, 0u, 1u << 3};
  for (int k = 0; k < 20; ++k) {
    std::vector<float> row = only;
    apply_token_mask(one, row);
    EXPECT_EQ(s.sample(row.data(), 70, nullptr).id, 67);
  }
  // A short mask leaves out every id past it.
  std::vector<float> wide(40, 0.0f);
  apply_token_mask(std::vector<uint32_t>{0xffffffffu}, wide);
  EXPECT_TRUE(std::isinf(wide[32]) && std::isinf(wide[39]) && !std::isinf(wide[31]));
}

}  // namespace
}  // namespace tessera
