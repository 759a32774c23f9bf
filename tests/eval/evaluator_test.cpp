// `tessera eval` end to end in-process (eval/evaluator.h) on the real stories260K model
// (the reference test data; a test fails without it) with a small corpus written here: stories (what the
// model was trained on) and Python source (what it was not). Also the corpus loader
// (eval/corpus.h) and the evaluator's argument errors.
#include "eval/evaluator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/env.h"
#include "eval/corpus.h"
#include "model/importance.h"
#include "tests/model/loader_test_util.h"
#include "tokenizer/tokenizer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using loader_test::TempDir;
// The message `text` holds `part` (printed whole when it does not).
#define EXPECT_CONTAINS(text, part)                                                  \
  EXPECT_NE(std::string(text).find(part), std::string::npos)                         \
      << "expected \"" << (part) << "\" in:\n" << (text)

std::string stories_gguf() { return testdata_dir() + "/stories260K/stories260K-f32.gguf"; }

#define REQUIRE_STORIES() TESSERA_REQUIRE_TESTDATA(stories_gguf())

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(out.good()) << path;
  out << text;
}

void write_jsonl(const std::string& path, const std::vector<Json>& rows) {
  std::string s;
  for (const Json& r : rows) s += r.dump() + "\n";
  write_text(path, s);
}

// Stories in the model's own words: llama2.c's greedy continuations of reference.json's prompts,
// decoded, and two written in the same simple style.
std::vector<std::string> story_texts() {
  std::vector<std::string> out = {
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. One day, she "
      "saw a big red ball in the park. She ran to the ball and kicked it very high. Her friend Tom came to play "
      "with her. They played with the ball all day. When the sun went down, Lily and Tom went home. They were "
      "very happy and tired. Lily said, \"Thank you for playing with me, Tom!\" Tom smiled and said, \"You are "
      "my best friend.\"",
      "One day, a little boy named Ben went to the park with his mom. He saw a big tree with a bird in it. The "
      "bird was sad because it could not fly. Ben wanted to help the bird. He asked his mom, \"Can we help the "
      "bird?\" His mom said, \"Yes, we can.\" They took the bird home and gave it some food and water. The next "
      "day, the bird was happy and could fly again. Ben was very proud. The bird sang a song for Ben every day.",
  };
  std::ifstream in(testdata_dir() + "/stories260K/reference.json");
  if (!in) return out;
  const Json ref = Json::parse(in);
  auto tok = load_tokenizer_for_model(stories_gguf());
  if (!tok.is_ok()) return out;
  for (const Json& c : ref.at("cases")) {
    std::vector<int32_t> ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    for (int32_t id : c.at("greedy_ids").get<std::vector<int32_t>>()) ids.push_back(id);
    std::string text = (*tok)->decode(ids, /*skip_special=*/true);
    while (!text.empty() && text.front() == ' ') text.erase(text.begin());
    if (text.size() > 40) out.push_back(text);
  }
  return out;
}

constexpr const char* kPythonSource = R"PY(import heapq
from collections import defaultdict


def shortest_paths(graph, source):
    """Dijkstra's algorithm: the distance from source to every node of graph."""
    dist = defaultdict(lambda: float("inf"))
    dist[source] = 0
    queue = [(0, source)]
    while queue:
        d, node = heapq.heappop(queue)
        if d > dist[node]:
            continue
        for neighbour, weight in graph.get(node, []):
            nd = d + weight
            if nd < dist[neighbour]:
                dist[neighbour] = nd
                heapq.heappush(queue, (nd, neighbour))
    return dict(dist)


class LruCache:
    def __init__(self, capacity):
        self.capacity = capacity
        self.items = {}

    def get(self, key, default=None):
        if key not in self.items:
            return default
        value = self.items.pop(key)
        self.items[key] = value
        return value

    def put(self, key, value):
        self.items.pop(key, None)
        self.items[key] = value
        if len(self.items) > self.capacity:
            del self.items[next(iter(self.items))]
)PY";

// A corpus directory: "prose" (stories) and "code" (Python), optional calibration text and
// canaries.
struct CorpusOptions {
  bool calibration = false;
  bool canaries = false;
};

void write_corpus(const std::string& dir, const CorpusOptions& o = {}) {
  fs::create_directories(dir);
  std::vector<Json> prose, code;
  const std::vector<std::string> stories = story_texts();
  for (size_t i = 0; i < stories.size(); ++i)
    prose.push_back({{"source", "story/" + std::to_string(i)}, {"text", stories[i]}});
  code.push_back({{"source", "dijkstra.py"}, {"text", kPythonSource}});
  write_jsonl(dir + "/prose.jsonl", prose);
  write_jsonl(dir + "/code.jsonl", code);
  Json manifest = {{"format", "tessera-eval-corpus-1"},
                   {"sha256", "0123456789abcdef-test-corpus"},
                   {"classes", {{"prose", "prose.jsonl"}, {"code", "code.jsonl"}}},
                   {"sources", {{"prose", "stories260K reference.json"}, {"code", "written by the test"}}}};
  if (o.calibration) {
    std::vector<Json> cal;
    for (size_t i = 0; i < stories.size(); ++i)
      cal.push_back({{"source", "cal/" + std::to_string(i)}, {"text", stories[stories.size() - 1 - i]}});
    write_jsonl(dir + "/calibration.jsonl", cal);
    manifest["calibration"] = "calibration.jsonl";
  }
  if (o.canaries) {
    write_jsonl(dir + "/canary_code.jsonl",
                {{{"id", "t/0"},
                  {"prompt", "def add(a, b):\n    \"\"\"The sum of a and b.\"\"\"\n"},
                  {"test", "def check(candidate):\n    assert candidate(2, 3) == 5\n"},
                  {"entry_point", "add"}}});
    write_jsonl(dir + "/canary_math.jsonl",
                {{{"id", "m/0"}, {"prompt", "Q: What is 1 + 1?\nA: 2\nQ: What is 2 + 2?\nA:"}, {"answer", "4"}},
                 {{"id", "m/1"}, {"prompt", "Q: What is 3 + 4?\nA:"}, {"answer", "7"}}});
    manifest["canaries"] = {{"code", "canary_code.jsonl"}, {"math", "canary_math.jsonl"}};
  }
  write_text(dir + "/manifest.json", manifest.dump(1));
}

EvalOptions small_options(const std::string& corpus) {
  EvalOptions o;
  o.model_path = stories_gguf();
  o.corpus_dir = corpus;
  o.tokens_per_class = 192;
  o.window = 64;
  o.chunk = 24;  // not a divisor of the window: the last piece is short
  o.code_canaries = 0;
  o.math_canaries = 0;
  o.threads = 2;
  return o;
}

const ClassQuality& cls(const PrecisionResult& p, const std::string& name) {
  static const ClassQuality kNone;
  auto it = p.classes.find(name);
  EXPECT_NE(it, p.classes.end()) << p.precision << " has no class " << name;
  return it == p.classes.end() ? kNone : it->second;
}

TEST(EvalCorpus, LoadsTheManifestTheClassesAndTheCanaries) {
  REQUIRE_STORIES();  // the stories come from the test data
  TempDir dir;
  write_corpus(dir.file("c"), {.calibration = true, .canaries = true});
  auto c = load_eval_corpus(dir.file("c"));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->dir, dir.file("c"));
  EXPECT_EQ(c->sha256, "0123456789abcdef-test-corpus");
  ASSERT_EQ(c->classes.size(), 2u);
  EXPECT_GE(c->classes.at("prose").size(), 3u);
  ASSERT_EQ(c->classes.at("code").size(), 1u);
  EXPECT_EQ(c->classes.at("code")[0].source, "dijkstra.py");
  EXPECT_EQ(c->classes.at("code")[0].text, kPythonSource);
  EXPECT_EQ(c->sources.at("code"), "written by the test");
  EXPECT_EQ(c->calibration.size(), c->classes.at("prose").size());
  ASSERT_EQ(c->code_canaries.size(), 1u);
  EXPECT_EQ(c->code_canaries[0].entry_point, "add");
  ASSERT_EQ(c->math_canaries.size(), 2u);
  EXPECT_EQ(c->math_canaries[1].answer, "7");
}

TEST(EvalCorpus, ErrorsSayWhatToRunAndWhere) {
  TempDir dir;
  auto missing = load_eval_corpus(dir.file("none"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(missing.status().message(), "scripts/eval_corpus.sh");
  EXPECT_CONTAINS(missing.status().message(), dir.file("none"));

  const std::string d = dir.file("bad");
  fs::create_directories(d);
  write_text(d + "/manifest.json", R"({"format": "tessera-eval-corpus-0", "classes": {}})");
  auto wrong = load_eval_corpus(d);
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(wrong.status().message(), d + "/manifest.json");
  EXPECT_CONTAINS(wrong.status().message(), "'format'");

  write_text(d + "/manifest.json", "{");
  auto broken = load_eval_corpus(d);
  ASSERT_FALSE(broken.is_ok());
  EXPECT_CONTAINS(broken.status().message(), d + "/manifest.json");

  // A malformed line is named by file and line number.
  write_text(d + "/manifest.json", R"({"format": "tessera-eval-corpus-1", "classes": {"prose": "p.jsonl"}})");
  write_text(d + "/p.jsonl", "{\"source\": \"a\", \"text\": \"fine\"}\n\n{\"source\": \"b\", \"text\": \n");
  auto line = load_eval_corpus(d);
  ASSERT_FALSE(line.is_ok());
  EXPECT_EQ(line.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(line.status().message(), d + "/p.jsonl:3");

  // A document without its text.
  write_text(d + "/p.jsonl", "{\"source\": \"a\"}\n");
  auto field = load_eval_corpus(d);
  ASSERT_FALSE(field.is_ok());
  EXPECT_CONTAINS(field.status().message(), d + "/p.jsonl:1");

  // A class file that is not there.
  write_text(d + "/manifest.json", R"({"format": "tessera-eval-corpus-1", "classes": {"prose": "gone.jsonl"}})");
  auto gone = load_eval_corpus(d);
  ASSERT_FALSE(gone.is_ok());
  EXPECT_CONTAINS(gone.status().message(), "gone.jsonl");
}

TEST(QualityEval, ArgumentErrors) {
  REQUIRE_STORIES();
  TempDir dir;
  write_corpus(dir.file("c"));
  EvalOptions o = small_options(dir.file("c"));

  o.precisions = {"q8_0", "q9_9"};
  auto r = run_quality_eval(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(r.status().message(), "'q9_9'");

  for (const char* bad : {"file+imatrix", "f32+imatrix", "int8+imatrix", "+imatrix", ""}) {
    SCOPED_TRACE(bad);
    o.precisions = {bad};
    r = run_quality_eval(o);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(r.status().message(), std::string("'") + bad + "'");
  }

  o.precisions = {"q8_0"};
  o.reference = "q4_0+imatrix";
  r = run_quality_eval(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  o.reference = "f32";

  o.window = 16;
  r = run_quality_eval(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(r.status().message(), "window 16");
  o.window = 64;

  // Calibrated precisions need the corpus's calibration text.
  o.precisions = {"q4_0+imatrix"};
  r = run_quality_eval(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(r.status().message(), "calibration");

  o.precisions = {"q8_0"};
  o.corpus_dir = dir.file("no-corpus-here");
  r = run_quality_eval(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(r.status().message(), "scripts/eval_corpus.sh");

  o.corpus_dir = dir.file("c");
  o.model_path = dir.file("no-model.gguf");
  r = run_quality_eval(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_CONTAINS(r.status().message(), "no-model.gguf");
}

TEST(QualityEval, Stories260KPerPrecision) {
  REQUIRE_STORIES();
  TempDir dir;
  write_corpus(dir.file("c"));
  EvalOptions o = small_options(dir.file("c"));
  o.precisions = {"file", "q8_0", "q4_0", "f32"};  // f32, the reference, listed too: one row
  std::vector<std::string> progress;
  o.progress = [&](const std::string& s) { progress.push_back(s); };
  auto r = run_quality_eval(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  std::printf("%s\n", format_eval_table(*r).c_str());

  // What was run on.
  auto sha = model_sha256(stories_gguf());
  ASSERT_TRUE(sha.is_ok());
  EXPECT_EQ(r->sha256, *sha);
  EXPECT_EQ(r->model, stories_gguf());
  EXPECT_EQ(r->file_bytes, static_cast<int64_t>(fs::file_size(stories_gguf())));
  EXPECT_EQ(r->reference, "f32");
  EXPECT_EQ(r->corpus_sha256, "0123456789abcdef-test-corpus");
  EXPECT_FALSE(r->cpu.empty());
  EXPECT_FALSE(r->date.empty());
  const Json settings = Json::parse(r->settings_json);
  EXPECT_EQ(settings.at("tokens_per_class"), 192);
  EXPECT_EQ(settings.at("window"), 64);
  EXPECT_FALSE(progress.empty());

  // Classes: the stories are kept (what the model was trained on); every class is either
  // measured or skipped with a reason.
  ASSERT_FALSE(r->classes.empty());
  EXPECT_NE(std::find(r->classes.begin(), r->classes.end(), "prose"), r->classes.end())
      << "stories260K reads stories";
  EXPECT_EQ(r->classes.size() + r->skipped_classes.size(), 2u);
  for (const auto& [c, why] : r->skipped_classes) {
    EXPECT_EQ(std::find(r->classes.begin(), r->classes.end(), c), r->classes.end());
    EXPECT_FALSE(why.empty()) << c;
  }

  // Rows: the reference first, then the others in the order given, once each.
  ASSERT_EQ(r->precisions.size(), 4u);
  EXPECT_EQ(r->precisions[0].precision, "f32");
  EXPECT_EQ(r->precisions[1].precision, "file");
  EXPECT_EQ(r->precisions[2].precision, "q8_0");
  EXPECT_EQ(r->precisions[3].precision, "q4_0");
  const PrecisionResult& ref = r->precisions[0];
  const PrecisionResult& file = *r->find("file");
  const PrecisionResult& q8 = *r->find("q8_0");
  const PrecisionResult& q4 = *r->find("q4_0");
  EXPECT_TRUE(ref.reference);
  for (const PrecisionResult* p : {&file, &q8, &q4}) {
    EXPECT_FALSE(p->reference) << p->precision;
    EXPECT_FALSE(p->calibrated) << p->precision;
  }

  for (const PrecisionResult& p : r->precisions) {
    SCOPED_TRACE(p.precision);
    EXPECT_EQ(p.classes.size(), r->classes.size()) << "a row per measured class, none for a skipped one";
    EXPECT_FALSE(p.code.has_value());
    EXPECT_FALSE(p.math.has_value());
    for (const auto& [name, q] : p.classes) {
      SCOPED_TRACE(name);
      EXPECT_EQ(q.tokens, cls(ref, name).tokens);
      EXPECT_GT(q.tokens, 0);
      EXPECT_LE(q.tokens, o.tokens_per_class);
      EXPECT_GE(q.kl_mean, 0.0);
      EXPECT_GE(q.kl_p99, 0.0);
      EXPECT_TRUE(std::isfinite(q.kl_mean) && std::isfinite(q.kl_p99));
      EXPECT_GE(q.top1, 0.0);
      EXPECT_LE(q.top1, 1.0);
      EXPECT_GT(q.ppl, 1.0);
      EXPECT_LT(q.ppl, 512.0 * 4) << "stories260K has 512 tokens";
    }
  }
  for (const std::string& c : r->classes) {
    SCOPED_TRACE(c);
    // The reference against itself.
    EXPECT_EQ(cls(ref, c).kl_mean, 0.0);
    EXPECT_EQ(cls(ref, c).kl_p99, 0.0);
    EXPECT_EQ(cls(ref, c).top1, 1.0);
    // The file is F32: the same weights as the reference, the same numbers.
    EXPECT_EQ(cls(file, c).ppl, cls(ref, c).ppl);
    EXPECT_EQ(cls(file, c).top1, 1.0);
    EXPECT_LE(cls(file, c).kl_mean, 1e-6);
    EXPECT_LE(cls(file, c).kl_p99, 1e-6);
    // Fewer bits lose more.
    EXPECT_GT(cls(q8, c).kl_mean, 0.0);
    EXPECT_LT(cls(q8, c).kl_mean, cls(q4, c).kl_mean);
    EXPECT_GE(cls(q8, c).top1, cls(q4, c).top1);
    EXPECT_GT(cls(q8, c).top1, 0.9);
    EXPECT_LT(cls(q8, c).kl_mean, 0.05);
  }

  // Sizes: the stored formats per linear weight, bits and bytes in the order of the precisions.
  EXPECT_DOUBLE_EQ(ref.bits_per_weight, 32.0);
  EXPECT_DOUBLE_EQ(file.bits_per_weight, 32.0);
  EXPECT_EQ(file.weight_bytes, ref.weight_bytes);
  EXPECT_GT(q8.formats.count("Q8_0"), 0u);
  EXPECT_GT(q4.formats.count("Q4_0"), 0u);
  EXPECT_EQ(ref.formats.size(), 1u);
  EXPECT_GT(ref.formats.at("F32"), 0);
  int64_t q8_total = 0, ref_total = ref.formats.at("F32");
  for (const auto& [f, n] : q8.formats) q8_total += n;
  EXPECT_EQ(q8_total, ref_total) << "every linear weight counted once";
  EXPECT_LT(q8.bits_per_weight, ref.bits_per_weight);
  EXPECT_LT(q4.bits_per_weight, q8.bits_per_weight);
  EXPECT_LT(q8.weight_bytes, ref.weight_bytes);
  EXPECT_LT(q4.weight_bytes, q8.weight_bytes);

  // The report saves and loads with the gate's view of it.
  EvalReport er;
  er.models[r->sha256] = *r;
  ASSERT_TRUE(save_eval_report(er, dir.file("r.json")).is_ok());
  const std::string c = r->classes[0];
  const double between = (cls(q8, c).kl_mean + cls(q4, c).kl_mean) / 2;
  auto budget = parse_quality_budget(c + "=" + std::to_string(between));
  ASSERT_TRUE(budget.is_ok());
  auto ok = apply_quality_gate(stories_gguf(), "q8_0", *budget, dir.file("r.json"));
  EXPECT_TRUE(ok.is_ok()) << ok.status().to_string();
  auto refused = apply_quality_gate(stories_gguf(), "q4_0", *budget, dir.file("r.json"));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_CONTAINS(refused.status().message(), "'q4_0'");
}

TEST(QualityEval, SameRunSameNumbers) {
  REQUIRE_STORIES();
  TempDir dir;
  write_corpus(dir.file("c"));
  EvalOptions o = small_options(dir.file("c"));
  o.precisions = {"q4_0"};
  o.classes = {"prose"};
  auto a = run_quality_eval(o);
  o.threads = 1;
  o.chunk = 64;  // other pieces and threads: the same positions, the same teacher forcing
  auto b = run_quality_eval(o);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  ASSERT_EQ(a->classes, std::vector<std::string>{"prose"});
  ASSERT_EQ(b->classes, std::vector<std::string>{"prose"});
  const ClassQuality& qa = cls(*a->find("q4_0"), "prose");
  const ClassQuality& qb = cls(*b->find("q4_0"), "prose");
  EXPECT_EQ(qa.tokens, qb.tokens);
  EXPECT_NEAR(qa.kl_mean, qb.kl_mean, 1e-3 * qa.kl_mean + 1e-6);
  EXPECT_NEAR(qa.ppl, qb.ppl, 1e-3 * qa.ppl);
  EXPECT_NEAR(qa.top1, qb.top1, 2.0 / qa.tokens);
}

TEST(QualityEval, UnknownClassesAreSkippedAndTheThresholdsApply) {
  REQUIRE_STORIES();
  TempDir dir;
  write_corpus(dir.file("c"));
  EvalOptions o = small_options(dir.file("c"));
  o.precisions = {"q8_0"};
  o.classes = {"prose", "math"};  // math is not in this corpus
  auto r = run_quality_eval(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->classes, std::vector<std::string>{"prose"});
  ASSERT_TRUE(r->skipped_classes.count("math"));
  EXPECT_CONTAINS(r->skipped_classes.at("math"), "not in the corpus");

  // Thresholds of 0 skip everything but the best class by each measure.
  o.classes = {};
  o.max_byte_share = 0;
  o.max_ppl_share = 0;
  r = run_quality_eval(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->classes.size(), 1u) << "a model always runs on the corpus it has";
  EXPECT_EQ(r->skipped_classes.size(), 1u);

  // Thresholds that nothing exceeds keep both (stories260K's perplexity of Python is over the
  // vocabulary size: worse than a uniform guess).
  o.max_byte_share = 1;
  o.max_ppl_share = 100;
  r = run_quality_eval(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->classes.size(), 2u);
  EXPECT_TRUE(r->skipped_classes.empty());
  // stories260K reads stories much better than Python.
  const PrecisionResult& ref = r->precisions[0];
  EXPECT_LT(cls(ref, "prose").ppl, cls(ref, "code").ppl);
}

TEST(QualityEval, CalibratedPrecisionAndImportanceFile) {
  REQUIRE_STORIES();
  TempDir dir;
  write_corpus(dir.file("c"), {.calibration = true});
  EvalOptions o = small_options(dir.file("c"));
  o.precisions = {"q4_0", "q4_0+imatrix"};
  o.classes = {"prose"};
  o.calibration_tokens = 256;
  o.importance_out = dir.file("imatrix.json");
  auto r = run_quality_eval(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  std::printf("%s\n", format_eval_table(*r).c_str());
  ASSERT_EQ(r->precisions.size(), 3u);
  const PrecisionResult* cal = r->find("q4_0+imatrix");
  ASSERT_NE(cal, nullptr);
  EXPECT_TRUE(cal->calibrated);
  EXPECT_FALSE(r->find("q4_0")->calibrated);
  EXPECT_EQ(cal->formats, r->find("q4_0")->formats);
  EXPECT_GT(cls(*cal, "prose").kl_mean, 0.0);
  EXPECT_LE(cls(*cal, "prose").top1, 1.0);

  // The importance it measured: every linear weight of the 5 layers, one value per input column
  // (stories260K: hidden 64, FFN 172), for `--quant ... --imatrix`.
  auto m = load_importance(dir.file("imatrix.json"));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->model_sha256, r->sha256);
  EXPECT_GT(m->tokens, 0);
  // calibration_tokens counts predicted positions; the importance counts every token that passed
  // through the weights, the BOS of each window included.
  EXPECT_LE(m->tokens, 256 + 256 / (64 - 1) + 1);
  EXPECT_EQ(m->columns.size(), 5u * 7u);
  ASSERT_TRUE(m->columns.count("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(m->columns.at("model.layers.0.self_attn.q_proj.weight").size(), 64u);
  EXPECT_EQ(m->columns.at("model.layers.4.mlp.up_proj.weight").size(), 64u);
  ASSERT_TRUE(m->columns.count("model.layers.4.mlp.down_proj.weight"));
  EXPECT_EQ(m->columns.at("model.layers.4.mlp.down_proj.weight").size(), 172u);
  for (const auto& [name, v] : m->columns) {
    double sum = 0;
    for (float x : v) {
      EXPECT_GE(x, 0.0f) << name;
      sum += x;
    }
    EXPECT_GT(sum, 0.0) << name << ": activations pass through every weight";
  }
}

TEST(QualityEval, CanariesRunOnTheKeptClasses) {
  REQUIRE_STORIES();
  if (std::system("python3 -c 'import resource' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no python3: the code canaries need one";
  TempDir dir;
  write_corpus(dir.file("c"), {.canaries = true});
  EvalOptions o = small_options(dir.file("c"));
  o.precisions = {"q8_0"};
  o.max_byte_share = 1;
  o.max_ppl_share = 100;  // keep "code" so its canaries run
  o.code_canaries = 5;  // more than the corpus has: all of them
  o.code_tokens = 16;
  o.math_canaries = 2;
  o.sandbox.timeout_s = 5;
  auto r = run_quality_eval(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->precisions.size(), 2u);
  for (const PrecisionResult& p : r->precisions) {
    SCOPED_TRACE(p.precision);
    ASSERT_TRUE(p.code.has_value());
    EXPECT_EQ(p.code->problems, 1);
    EXPECT_GE(p.code->parse_rate, 0.0);
    EXPECT_LE(p.code->parse_rate, 1.0);
    EXPECT_LE(p.code->pass_at_1, p.code->parse_rate) << "what does not parse does not pass";
    // No math class in this corpus: no arithmetic canaries.
    EXPECT_FALSE(p.math.has_value());
  }
  EXPECT_EQ(Json::parse(r->settings_json).at("math_canaries"), 0);
}

}  // namespace
}  // namespace tessera
