// Speculative decoding through the real engine and the CPU forward pass on stories260K (a real
// tiny Llama with reference outputs from an independent implementation): drafts change how
// many tokens a step yields, never which tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "engine/engine.h"
#include "tests/default_model_file.h"
#include "local/local_model.h"
#include "tests/shard/stories_reference.h"
#include "tokenizer/tokenizer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::load_cases;
using test::RefCase;
using test::stories_dir;

SpeculationConfig forced(int32_t depth = 4) {
  SpeculationConfig c;
  c.mode = SpecMode::kNgram;
  c.max_depth = depth;
  return c;
}

// Class 0's counter over both proposers.
double metric(LocalModel& m, const char* name) {
  return m.metrics().value(name, "class=\"0\",proposer=\"ngram\"") +
         m.metrics().value(name, "class=\"0\",proposer=\"draft\"");
}

SpeculationConfig self_draft(int32_t layers, int32_t depth = 4) {
  SpeculationConfig c;
  c.mode = SpecMode::kDraft;
  c.max_depth = depth;
  c.draft_layers = layers;
  return c;
}

class SpeculationStoriesTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_TESTDATA(stories_dir() + "/reference.json");
  }
  std::string model_path() const { return stories_dir() + "/" + GetParam(); }
};

TEST_P(SpeculationStoriesTest, GreedyIdsWithDraftsAreTheReferenceIds) {
  auto model = LocalModel::load({.path = model_path(), .runtime = {.threads = 1}});
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  for (const int32_t depth : {1, 4, 8}) {
    for (const RefCase& c : load_cases()) {
      GenerateOptions go;
      go.max_tokens = static_cast<int64_t>(c.greedy.size());
      go.sampling.temperature = 0.0f;
      go.ignore_eos = true;
      go.speculation = forced(depth);
      auto out = generate(**model, c.prompt, go);
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      EXPECT_EQ(out->ids, c.greedy) << c.name << " depth " << depth;
      EXPECT_EQ((*model)->blocks().num_used(), 0) << "rejected drafts' blocks must all come back";
    }
  }
  // The drafts were real: many proposed, some kept, most rejected (a tiny model's stories
  // repeat themselves only now and then).
  const double proposed = metric(**model, "tessera_spec_proposed_tokens_total");
  const double kept = metric(**model, "tessera_spec_accepted_tokens_total");
  std::printf("%s: %.0f drafts proposed, %.0f kept\n", GetParam().c_str(), proposed, kept);
  EXPECT_GT(proposed, 100);
  EXPECT_GT(kept, 10);
  EXPECT_LT(kept, proposed);
}

TEST_P(SpeculationStoriesTest, SampledOutputsAreTheSameTokensWithAndWithoutDrafts) {
  // Every row of a verified piece is drawn exactly as plain decoding draws it (same sampler
  // state, same seeded uniform for that output position), so each seed gives the same tokens:
  // the output distribution is unchanged, not just close. Penalties and truncation included.
  auto model = LocalModel::load({.path = model_path(), .runtime = {.threads = 1}});
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const std::vector<RefCase> cases = load_cases();
  int differing = 0, runs = 0;
  for (int variant = 0; variant < 3; ++variant) {
    for (uint64_t seed = 0; seed < 12; ++seed) {
      const RefCase& c = cases[seed % cases.size()];
      GenerateOptions go;
      go.max_tokens = 48;
      go.ignore_eos = true;
      go.sampling.temperature = variant == 0 ? 1.0f : 0.8f;
      if (variant == 1) {
        go.sampling.top_k = 40;
        go.sampling.top_p = 0.9f;
      }
      if (variant == 2) {
        go.sampling.repetition_penalty = 1.3f;
        go.sampling.frequency_penalty = 0.5f;
        go.sampling.min_p = 0.05f;
      }
      go.sampling.seed = seed;
      go.sampling.has_seed = true;
      go.speculation.mode = SpecMode::kOff;
      auto plain = generate(**model, c.prompt, go);
      go.speculation = forced();
      auto spec = generate(**model, c.prompt, go);
      ASSERT_TRUE(plain.is_ok() && spec.is_ok());
      ++runs;
      differing += plain->ids != spec->ids;
      EXPECT_EQ(spec->ids, plain->ids) << "variant " << variant << " seed " << seed;
    }
  }
  EXPECT_EQ(differing, 0) << runs << " runs";
  EXPECT_GT(metric(**model, "tessera_spec_accepted_tokens_total"), 0);
  EXPECT_EQ((*model)->blocks().num_used(), 0);
}

INSTANTIATE_TEST_SUITE_P(Formats, SpeculationStoriesTest,
                         ::testing::Values("hf", "stories260K-f32.gguf", "stories260K.ggml-org.gguf"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// Several requests in one engine, speculating and not, through continuous batching: every
// request's tokens and text are what it produces alone, a stop string is cut in the middle of
// a run of kept drafts, max_tokens holds when drafts would overshoot it, and no KV block is
// left used.
class SpeculationEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_TESTDATA(stories_dir() + "/reference.json");
    auto model = LocalModel::load({.path = stories_dir() + "/hf", .runtime = {.threads = 1}});
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    model_ = std::move(model).value();
    auto tok = load_tokenizer_for_model(stories_dir() + "/hf");
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    tokenizer_ = std::move(tok).value();
    declare_engine_metrics(metrics_);
  }

  struct Out {
    std::vector<int32_t> ids;
    std::string text, finish;
    std::vector<std::pair<int32_t, float>> logprobs;
    std::vector<std::vector<std::pair<int32_t, float>>> top;
    int events = 0;
  };

  // Runs `jobs` together in a fresh engine; their outputs in order.
  std::vector<Out> run(std::vector<Job> jobs, SpecMode server_mode) {
    EngineOptions eo;
    eo.scheduler.max_batch = 8;
    eo.scheduler.max_wait_ms = 0;
    eo.scheduler.speculation.mode = server_mode;
    eo.eos_ids = model_->config().eos_ids;
    eo.max_positions = model_->config().max_positions;
    eo.first_seq_id = next_id_;
    next_id_ += 1000;
    Engine engine(eo, model_->steps(), model_->blocks(), tokenizer_.get(), metrics_);
    std::vector<Out> outs(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      jobs[i].on_event = [&outs, i](const JobEvent& ev) {
        outs[i].ids.insert(outs[i].ids.end(), ev.tokens.begin(), ev.tokens.end());
        outs[i].text += ev.text;
        outs[i].logprobs.insert(outs[i].logprobs.end(), ev.token_logprobs.begin(), ev.token_logprobs.end());
        outs[i].top.insert(outs[i].top.end(), ev.top_logprobs.begin(), ev.top_logprobs.end());
        ++outs[i].events;
        if (ev.finish_reason) outs[i].finish = *ev.finish_reason;
      };
      EXPECT_TRUE(engine.submit(std::move(jobs[i])).is_ok());
    }
    engine.run_until_idle();
    spec_ = engine.speculation().class_stats(0);
    kept_total_ += spec_.accepted;
    return outs;
  }

  static Job job(const std::vector<int32_t>& prompt, int64_t max_tokens, std::optional<SpecMode> mode) {
    Job j;
    j.sequences.push_back({prompt, 0});
    j.sampling.temperature = 0.0f;
    j.max_tokens = max_tokens;
    j.ignore_eos = true;
    j.speculation = mode;
    return j;
  }

  std::unique_ptr<LocalModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  MetricsRegistry metrics_;
  uint64_t next_id_ = 1'000'000;
  SpeculationController::ClassStats spec_;
  int64_t kept_total_ = 0;  // drafts kept over every run()
};

TEST_F(SpeculationEngineTest, MixedBatchGivesEveryRequestItsOwnTokens) {
  const std::vector<RefCase> cases = load_cases();
  std::vector<Job> jobs;
  const SpecMode modes[] = {SpecMode::kNgram, SpecMode::kOff, SpecMode::kAuto};
  for (size_t i = 0; i < cases.size(); ++i) jobs.push_back(job(cases[i].prompt, 64, modes[i % 3]));
  jobs.push_back(job(cases[2].prompt, 7, SpecMode::kNgram));  // max_tokens cuts a run of drafts
  const std::vector<Out> outs = run(std::move(jobs), SpecMode::kNgram);
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(outs[i].ids, cases[i].greedy) << cases[i].name;
  ASSERT_EQ(outs.back().ids.size(), 7u);
  EXPECT_EQ(outs.back().ids, std::vector<int32_t>(cases[2].greedy.begin(), cases[2].greedy.begin() + 7));
  EXPECT_EQ(outs.back().finish, "length");
  EXPECT_GT(spec_.accepted, 0);
  EXPECT_EQ(model_->blocks().num_used(), 0);
}

TEST_F(SpeculationEngineTest, LogprobsAndEventsPerTokenWhenSeveralArriveInOneStep) {
  // Every token of a step with kept drafts gets its own event (streaming), its own logprob and
  // top logprobs, equal to those without drafts.
  const std::vector<RefCase> cases = load_cases();
  auto with_logprobs = [&](SpecMode mode) {
    Job j = job(cases[3].prompt, 64, mode);
    j.want_logprobs = true;
    j.sampling.return_logprob = true;
    j.sampling.n_logprobs = 3;
    return j;
  };
  const Out off = run({with_logprobs(SpecMode::kOff)}, SpecMode::kOff)[0];
  const Out on = run({with_logprobs(SpecMode::kNgram)}, SpecMode::kNgram)[0];
  EXPECT_GT(spec_.accepted, 0);
  EXPECT_EQ(on.ids, off.ids);
  ASSERT_EQ(on.logprobs.size(), on.ids.size());
  ASSERT_EQ(on.top.size(), on.ids.size());
  EXPECT_EQ(on.events, off.events);
  for (size_t i = 0; i < on.ids.size(); ++i) {
    EXPECT_EQ(on.logprobs[i].first, on.ids[i]);
    EXPECT_FLOAT_EQ(on.logprobs[i].second, off.logprobs[i].second) << "token " << i;
    ASSERT_EQ(on.top[i].size(), 3u);
    for (size_t t = 0; t < 3; ++t) {
      EXPECT_EQ(on.top[i][t].first, off.top[i][t].first) << "token " << i;
      EXPECT_FLOAT_EQ(on.top[i][t].second, off.top[i][t].second) << "token " << i;
    }
  }
}

TEST_F(SpeculationEngineTest, StopStringIsCutInTheMiddleOfKeptDrafts) {
  const std::vector<RefCase> cases = load_cases();
  const std::vector<int32_t>& prompt = cases.back().prompt;  // "Once upon a time"
  const Out plain = run({job(prompt, 64, SpecMode::kOff)}, SpecMode::kOff)[0];
  ASSERT_GT(plain.text.size(), 40u);
  // Stop strings at several places of the text: wherever a kept run of drafts crosses one, the
  // text ends right before it, as without drafts, and no token after it is reported.
  int checked = 0;
  for (size_t at = 10; at + 6 < plain.text.size() && checked < 6; at += plain.text.size() / 7) {
    const std::string stop = plain.text.substr(at, 4);
    if (stop.find_first_not_of(' ') == std::string::npos) continue;
    Job a = job(prompt, 64, SpecMode::kOff), b = job(prompt, 64, SpecMode::kNgram);
    a.stop = b.stop = {stop};
    const Out off = run({std::move(a)}, SpecMode::kOff)[0];
    const Out on = run({std::move(b)}, SpecMode::kNgram)[0];
    EXPECT_EQ(on.text, off.text) << "stop '" << stop << "'";
    EXPECT_EQ(on.finish, "stop");
    EXPECT_EQ(on.text, plain.text.substr(0, plain.text.find(stop)));
    EXPECT_EQ(on.ids, off.ids);
    ++checked;
  }
  EXPECT_GE(checked, 3);
  EXPECT_GT(kept_total_, 0) << "drafts must have been kept for the cut to be tested";
  EXPECT_EQ(model_->blocks().num_used(), 0);
}

// Generates from `prompt` without drafts and with `spec` (same seed): the ids must be equal and
// every block must come back. Returns the drafts proposed and kept in the speculative run.
std::pair<double, double> same_ids_with_drafts(LocalModel& model, const std::vector<int32_t>& prompt, int64_t max_tokens,
                                               float temperature, uint64_t seed, const SpeculationConfig& spec) {
  GenerateOptions go;
  go.max_tokens = max_tokens;
  go.ignore_eos = true;
  go.sampling.temperature = temperature;
  go.sampling.seed = seed;
  go.sampling.has_seed = true;
  go.speculation.mode = SpecMode::kOff;
  auto plain = generate(model, prompt, go);
  go.speculation = spec;
  const double kept_before = metric(model, "tessera_spec_accepted_tokens_total");
  const double proposed_before = metric(model, "tessera_spec_proposed_tokens_total");
  auto out = generate(model, prompt, go);
  EXPECT_TRUE(plain.is_ok() && out.is_ok());
  if (plain.is_ok() && out.is_ok()) {
    EXPECT_EQ(out->ids, plain->ids) << "temperature " << temperature;
  }
  EXPECT_EQ(model.blocks().num_used(), 0);
  return {metric(model, "tessera_spec_proposed_tokens_total") - proposed_before,
          metric(model, "tessera_spec_accepted_tokens_total") - kept_before};
}

// The real default model (Gemma 3 270M Q4_K_M, when present): code that copies its prompt keeps
// many drafts, and the tokens are the ones decoding without drafts gives, greedy and sampled.
TEST(SpeculationGemmaTest, SameTokensOnTheDefaultModelWithManyDraftsKept) {
  const std::string path = testing::default_model_file();
  if (path.empty()) GTEST_SKIP() << "no default model file";
  auto model = LocalModel::load({.path = path, .runtime = {.threads = 1}});
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto tok = load_tokenizer_for_model(path);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const std::string code =
      "def dedent(text):\n    lines = text.split('\\n')\n    margin = None\n    for line in lines:\n"
      "        stripped = line.lstrip()\n        if not stripped:\n            continue\n"
      "        indent = len(line) - len(stripped)\n        margin = indent if margin is None else min(margin, indent)\n"
      "    return '\\n'.join(line[margin or 0:] for line in lines)\n";
  const std::vector<int32_t> prompt = (*tok)->encode(
      "Here is a Python function:\n\n```python\n" + code + "```\n\nThe same function, renamed to `undent`:\n\n"
      "```python\ndef undent(",
      /*add_special=*/true);
  for (const float temperature : {0.0f, 1.0f}) {
    const auto [proposed, kept] = same_ids_with_drafts(**model, prompt, 64, temperature, 11, forced());
    std::printf("temperature %.0f: %.0f drafts proposed, %.0f kept\n", temperature, proposed, kept);
    if (temperature == 0.0f) {
      EXPECT_GT(kept, 0.25 * proposed) << "the copy should keep many drafts";
    }
  }
}

// The self-draft on the real default model: through all 18 layers with the head of the
// tokenizer's 16384 most frequent pieces plus the context's, on a free-running story (no text
// to copy), greedy and sampled: the tokens of plain decoding, most drafts kept greedily.
TEST(SpeculationGemmaTest, SelfDraftKeepsTheTokensOnTheDefaultModel) {
  const std::string path = testing::default_model_file();
  if (path.empty()) GTEST_SKIP() << "no default model file";
  auto tok = load_tokenizer_for_model(path);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  LocalModelOptions mo{.path = path, .runtime = {.threads = 1}};
  mo.draft = SelfDraftConfig{18, 16384, (*tok)->frequent_ids(16384)};
  auto model = LocalModel::load(mo);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const std::vector<int32_t> prompt =
      (*tok)->encode("Once upon a time, in a small village by the sea, there lived an old fisherman who", true);
  // The head's fixed rows (single characters, whitespace runs, then by score) cover text better
  // than the first ids would (Gemma 3's single characters sit above id 236000, "\n" is an
  // added token).
  {
    const std::vector<int32_t> text = (*tok)->encode(
        "The old fisherman looked at the sea and smiled. def add(a, b):\n    return a + b\n", false);
    const std::vector<int32_t> freq = (*tok)->frequent_ids(16384);
    const std::set<int32_t> top(freq.begin(), freq.end());
    int by_score = 0, by_id = 0;
    for (int32_t id : text) {
      by_score += top.count(id) > 0;
      by_id += id < 16384;
    }
    std::printf("%zu tokens: %d among the 16384 most frequent by score, %d below id 16384\n", text.size(), by_score,
                by_id);
    EXPECT_GT(by_score, by_id);
    EXPECT_GE(by_score, static_cast<int>(0.9 * static_cast<double>(text.size())));
  }
  for (const float temperature : {0.0f, 1.0f}) {
    const auto [proposed, kept] = same_ids_with_drafts(**model, prompt, 48, temperature, 5, self_draft(18));
    std::printf("self-draft, temperature %.0f: %.0f drafts proposed, %.0f kept\n", temperature, proposed, kept);
    if (temperature == 0.0f) {
      EXPECT_GT(kept, 0.7 * proposed);
    }
  }
}

TEST_F(SpeculationEngineTest, DraftModeIsRefusedWithAClearError) {
  EngineOptions eo;
  eo.first_seq_id = 5'000'000;
  Engine engine(eo, model_->steps(), model_->blocks(), tokenizer_.get(), metrics_);
  auto r = engine.submit(job({1, 2}, 4, SpecMode::kDraft));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--spec-draft-layers"), std::string::npos) << r.status().message();
}

// The self-draft (shard/self_draft.h) through every layer (its states are the target's: the
// verification reuses them) and through the first layers only (a separate verification pass):
// greedy ids are the reference ids at every depth, sampled ids are those of plain decoding, and
// every block comes back. stories260K has 5 layers and a 512-token vocabulary.
TEST_P(SpeculationStoriesTest, SelfDraftKeepsTheReferenceIds) {
  for (const int32_t layers : {5, 2}) {
    for (const int32_t vocab : {0, 64, 100000}) {
      LocalModelOptions mo{.path = model_path(), .runtime = {.threads = 1}};
      mo.draft = SelfDraftConfig{layers, vocab, {}};
      auto model = LocalModel::load(mo);
      ASSERT_TRUE(model.is_ok()) << model.status().to_string();
      for (const int32_t depth : {1, 4, 8}) {
        for (const RefCase& c : load_cases()) {
          GenerateOptions go;
          go.max_tokens = static_cast<int64_t>(c.greedy.size());
          go.sampling.temperature = 0.0f;
          go.ignore_eos = true;
          go.speculation = self_draft(layers, depth);
          auto out = generate(**model, c.prompt, go);
          ASSERT_TRUE(out.is_ok()) << out.status().to_string();
          EXPECT_EQ(out->ids, c.greedy) << c.name << " layers " << layers << " vocab " << vocab << " depth " << depth;
          EXPECT_EQ((*model)->blocks().num_used(), 0);
        }
      }
      const std::vector<RefCase> cases = load_cases();
      for (uint64_t seed = 0; seed < 6; ++seed) {
        const RefCase& c = cases[seed % cases.size()];
        GenerateOptions go;
        go.max_tokens = 40;
        go.ignore_eos = true;
        go.sampling.temperature = 1.0f;
        go.sampling.top_p = seed % 2 ? 0.9f : 1.0f;
        go.sampling.seed = seed;
        go.sampling.has_seed = true;
        go.speculation.mode = SpecMode::kOff;
        auto plain = generate(**model, c.prompt, go);
        go.speculation = self_draft(layers);
        auto spec = generate(**model, c.prompt, go);
        ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
        ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
        EXPECT_EQ(spec->ids, plain->ids) << "layers " << layers << " seed " << seed;
      }
      const double proposed = metric(**model, "tessera_spec_proposed_tokens_total");
      const double kept = metric(**model, "tessera_spec_accepted_tokens_total");
      std::printf("%s self-draft layers %d vocab %d: %.0f drafts proposed, %.0f kept\n", GetParam().c_str(), layers,
                  vocab, proposed, kept);
      EXPECT_GT(proposed, 100);
      EXPECT_GT(kept, 0);
      if (layers == 5 && vocab > 512) {
        EXPECT_GT(kept, 0.5 * proposed) << "the whole model with its whole head";
      }
    }
  }
}

// The output distribution, measured: at temperature 1.5, over 4000 seeds, the second and third
// tokens after a prompt (the first comes from the prefill step; the next step verifies a
// self-draft: the model's own argmax, which a draw at 1.5 often rejects) follow its softmax: a
// chi-square test against the probabilities from plain forward passes, the second token given
// the most frequent first, the third given the most frequent first two. A verification that
// kept a draft it should have rejected, or resampled wrongly after a rejection, would shift mass
// toward the drafts. The seeds are fixed: the test is deterministic.
TEST(SpeculationDistributionTest, SampledTokensFollowTheModelsDistribution) {
  TESSERA_REQUIRE_TESTDATA(stories_dir() + "/reference.json");
  LocalModelOptions mo{.path = stories_dir() + "/hf", .runtime = {.threads = 1}};
  mo.draft = SelfDraftConfig{5, 100000, {}};
  auto model = LocalModel::load(mo);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  constexpr float kTemperature = 1.5f;
  // A story's first words (the reference's own prompt and greedy start).
  const RefCase c0 = load_cases()[0];
  std::vector<int32_t> prompt = c0.prompt;
  prompt.insert(prompt.end(), c0.greedy.begin(), c0.greedy.begin() + 4);
  auto probs_after = [&](const std::vector<int32_t>& ids) {
    GenerateOptions go;
    go.max_tokens = 0;
    auto out = generate(**model, ids, go);
    EXPECT_TRUE(out.is_ok());
    std::vector<double> p(out->prompt_last_logits.begin(), out->prompt_last_logits.end());
    const double mx = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& v : p) sum += v = std::exp((v - mx) / kTemperature);
    for (double& v : p) v /= sum;
    return p;
  };
  constexpr int kSeeds = 4000;
  std::vector<std::vector<int32_t>> outs;
  for (int seed = 0; seed < kSeeds; ++seed) {
    GenerateOptions go;
    go.max_tokens = 3;
    go.ignore_eos = true;
    go.sampling.temperature = kTemperature;
    go.sampling.seed = static_cast<uint64_t>(seed);
    go.sampling.has_seed = true;
    go.speculation = self_draft(5, 2);
    auto out = generate(**model, prompt, go);
    ASSERT_TRUE(out.is_ok() && out->ids.size() == 3);
    outs.push_back(out->ids);
  }
  const double proposed = metric(**model, "tessera_spec_proposed_tokens_total");
  const double kept = metric(**model, "tessera_spec_accepted_tokens_total");
  std::printf("%.0f drafts proposed, %.0f kept\n", proposed, kept);
  EXPECT_GE(proposed, kSeeds);
  EXPECT_GT(kept, 0.05 * proposed);
  EXPECT_LT(kept, 0.95 * proposed) << "the drafts must be wrong often for the test to mean something";
  // Pearson's chi-square over bins with an expected count of at least 5 (the rest pooled).
  auto chi_square_ok = [](const std::map<int32_t, int>& seen, const std::vector<double>& p, int n, const char* what) {
    double chi = 0, pooled_p = 0;
    int pooled_n = 0, bins = 0;
    for (size_t id = 0; id < p.size(); ++id) {
      auto it = seen.find(static_cast<int32_t>(id));
      const int got = it == seen.end() ? 0 : it->second;
      const double want = p[id] * n;
      if (want < 5) {
        pooled_p += p[id];
        pooled_n += got;
        continue;
      }
      chi += (got - want) * (got - want) / want;
      ++bins;
    }
    if (pooled_p * n >= 5) {
      chi += (pooled_n - pooled_p * n) * (pooled_n - pooled_p * n) / (pooled_p * n);
      ++bins;
    }
    const int dof = bins - 1;
    // The 0.9999 quantile of chi-square(dof), Wilson-Hilferty: a true distribution fails this
    // one time in 10^4 (and the seeds are fixed); a shifted one by tens of standard deviations.
    const double z = 3.719;
    const double h = 2.0 / (9.0 * std::max(1, dof));
    const double limit = dof * std::pow(1 - h + z * std::sqrt(h), 3);
    std::printf("%s: chi-square %.1f over %d degrees of freedom (limit %.1f), %d samples\n", what, chi, dof, limit, n);
    EXPECT_GE(dof, 3) << what;
    EXPECT_LT(chi, limit) << what;
  };
  // The most frequent prefix of `len` tokens, and the counts of the token after it.
  auto after_top = [&](size_t len, std::vector<int32_t>& prefix) {
    std::map<std::vector<int32_t>, int> prefixes;
    for (const auto& o : outs) ++prefixes[std::vector<int32_t>(o.begin(), o.begin() + static_cast<long>(len))];
    prefix = std::max_element(prefixes.begin(), prefixes.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
    std::map<int32_t, int> next;
    int n = 0;
    for (const auto& o : outs)
      if (std::equal(prefix.begin(), prefix.end(), o.begin())) {
        ++next[o[len]];
        ++n;
      }
    return std::make_pair(next, n);
  };
  std::vector<int32_t> prefix;
  {
    auto [next, n] = after_top(1, prefix);
    std::vector<int32_t> ctx = prompt;
    ctx.insert(ctx.end(), prefix.begin(), prefix.end());
    chi_square_ok(next, probs_after(ctx), n, "second token (verified row 0) given the most frequent first");
  }
  {
    auto [next, n] = after_top(2, prefix);
    std::vector<int32_t> ctx = prompt;
    ctx.insert(ctx.end(), prefix.begin(), prefix.end());
    chi_square_ok(next, probs_after(ctx), n, "third token given the most frequent first two");
  }
}

}  // namespace
}  // namespace tessera
