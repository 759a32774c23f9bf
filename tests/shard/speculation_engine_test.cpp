// Speculative decoding through the real engine and the CPU forward pass on stories260K (a real
// tiny Llama with reference outputs from an independent implementation): drafts change how
// many tokens a step yields, never which tokens.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "coordinator/engine.h"
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

double metric(LocalModel& m, const char* name) { return m.metrics().value(name, "class=\"0\""); }

class SpeculationStoriesTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!fs::exists(stories_dir() + "/reference.json")) GTEST_SKIP() << "no test data at " << stories_dir();
  }
  std::string model_path() const { return stories_dir() + "/" + GetParam(); }
};

TEST_P(SpeculationStoriesTest, GreedyIdsWithDraftsAreTheReferenceIds) {
  auto model = LocalModel::load({.path = model_path(), .threads = 1});
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
  auto model = LocalModel::load({.path = model_path(), .threads = 1});
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
    if (!fs::exists(stories_dir() + "/reference.json")) GTEST_SKIP() << "no test data at " << stories_dir();
    auto model = LocalModel::load({.path = stories_dir() + "/hf", .threads = 1});
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

// The real default model (Gemma 3 270M Q4_K_M, when present): code that copies its prompt keeps
// many drafts, and the tokens are the ones decoding without drafts gives, greedy and sampled.
TEST(SpeculationGemmaTest, SameTokensOnTheDefaultModelWithManyDraftsKept) {
  const std::string path = testing::default_model_file();
  if (path.empty()) GTEST_SKIP() << "no default model file";
  auto model = LocalModel::load({.path = path, .threads = 1});
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
    GenerateOptions go;
    go.max_tokens = 64;
    go.ignore_eos = true;
    go.sampling.temperature = temperature;
    go.sampling.seed = 11;
    go.sampling.has_seed = true;
    go.speculation.mode = SpecMode::kOff;
    auto plain = generate(**model, prompt, go);
    go.speculation = forced();
    const double kept_before = metric(**model, "tessera_spec_accepted_tokens_total");
    const double proposed_before = metric(**model, "tessera_spec_proposed_tokens_total");
    auto spec = generate(**model, prompt, go);
    ASSERT_TRUE(plain.is_ok() && spec.is_ok());
    EXPECT_EQ(spec->ids, plain->ids) << "temperature " << temperature;
    const double kept = metric(**model, "tessera_spec_accepted_tokens_total") - kept_before;
    const double proposed = metric(**model, "tessera_spec_proposed_tokens_total") - proposed_before;
    std::printf("temperature %.0f: %.0f drafts proposed, %.0f kept\n", temperature, proposed, kept);
    if (temperature == 0.0f) {
      EXPECT_GT(kept, 0.25 * proposed) << "the copy should keep many drafts";
    }
    EXPECT_EQ((*model)->blocks().num_used(), 0);
  }
}

TEST_F(SpeculationEngineTest, DraftModeIsRefusedWithAClearError) {
  EngineOptions eo;
  eo.first_seq_id = 5'000'000;
  Engine engine(eo, model_->steps(), model_->blocks(), tokenizer_.get(), metrics_);
  auto r = engine.submit(job({1, 2}, 4, SpecMode::kDraft));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("draft model"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace tessera
