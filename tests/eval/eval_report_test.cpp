// The quality report of `tessera eval` and the gate that reads it (eval/report.h): the budget
// flag's parser, the gate's accept / refuse messages, the report file's round trip and its load
// errors, the precision names a deployment serves, the model hash and the plan's bill.
#include "eval/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/sha256.h"
#include "tests/model/loader_test_util.h"

namespace tessera {
namespace {

using loader_test::TempDir;
// The message `text` holds `part` (printed whole when it does not).
#define EXPECT_CONTAINS(text, part)                                                  \
  EXPECT_NE(std::string(text).find(part), std::string::npos)                         \
      << "expected \"" << (part) << "\" in:\n" << (text)

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(out.good()) << path;
  out << text;
}

// ---- --quality-budget

TEST(QualityBudget, ParsesClassPieces) {
  auto b = parse_quality_budget("code=0.05,math=0.1,chat=0.02");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  ASSERT_EQ(b->max_kl.size(), 3u);
  EXPECT_DOUBLE_EQ(b->max_kl.at("code"), 0.05);
  EXPECT_DOUBLE_EQ(b->max_kl.at("math"), 0.1);
  EXPECT_DOUBLE_EQ(b->max_kl.at("chat"), 0.02);

  b = parse_quality_budget("prose=0");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_DOUBLE_EQ(b->max_kl.at("prose"), 0.0);

  b = parse_quality_budget("code=1e-3,");  // an empty piece (a trailing comma) is no piece
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_DOUBLE_EQ(b->max_kl.at("code"), 1e-3);

  b = parse_quality_budget("code=0.5,code=0.25");  // the last one wins
  ASSERT_TRUE(b.is_ok());
  EXPECT_DOUBLE_EQ(b->max_kl.at("code"), 0.25);
}

TEST(QualityBudget, BadPiecesAreNamed) {
  struct Case {
    const char* spec;
    const char* named;  // what the message must quote
  };
  const Case cases[] = {
      {"code", "'code'"},                      // no '='
      {"code=0.05,poetry=0.1", "'poetry=0.1'"},  // an unknown class
      {"=0.1", "'=0.1'"},                      // no class
      {"code=abc", "'abc'"},                   // not a number
      {"code=", "'code='"},                    // no number
      {"math=0.1x", "'0.1x'"},                 // trailing junk
      {"chat=-0.01", "'-0.01'"},               // negative
      {"code=nan", "'nan'"},                   // not a number either
      {"code=0.1;math=0.2", "'code=0.1;math=0.2'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    auto b = parse_quality_budget(c.spec);
    ASSERT_FALSE(b.is_ok());
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(b.status().message(), "--quality-budget");
    EXPECT_CONTAINS(b.status().message(), c.named);
  }
  for (const char* empty : {"", ",", ",,"}) {
    auto b = parse_quality_budget(empty);
    ASSERT_FALSE(b.is_ok()) << "'" << empty << "'";
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(b.status().message(), "no class=max_kl");
  }
}

TEST(QualityBudget, ChatIsMeasuredOnProse) {
  EXPECT_EQ(quality_class_for("chat"), "prose");
  EXPECT_EQ(quality_class_for("prose"), "prose");
  EXPECT_EQ(quality_class_for("code"), "code");
  EXPECT_EQ(quality_class_for("math"), "math");
}

TEST(QualityBudget, ServedPrecisionNames) {
  EXPECT_EQ(served_precision_name("", false), "file");
  EXPECT_EQ(served_precision_name("none", false), "file");
  EXPECT_EQ(served_precision_name("", true), "file") << "the file's weights are never calibrated";
  EXPECT_EQ(served_precision_name("none", true), "file");
  EXPECT_EQ(served_precision_name("q8_0", false), "q8_0");
  EXPECT_EQ(served_precision_name("f32", false), "f32");
  EXPECT_EQ(served_precision_name("q2_k", true), "q2_k+imatrix");
}

// ---- the report

// Two models; the first with a reference, a good and a lossy precision, one skipped class and
// canaries on one precision.
EvalReport sample_report() {
  EvalReport r;
  ModelReport m;
  m.model = "/models/a.gguf";
  m.sha256 = std::string(64, 'a');
  m.file_bytes = 123456789012;
  m.reference = "f32";
  m.corpus_sha256 = std::string(64, 'c');
  m.cpu = "Test CPU (avx2)";
  m.date = "2026-12-03 12:00 UTC";
  m.settings_json = R"({"sources":{"code":"stdlib"},"tokens_per_class":512,"window":64})";
  m.classes = {"code", "prose"};
  m.skipped_classes = {{"math", "no document long enough"}};
  PrecisionResult ref;
  ref.precision = "f32";
  ref.reference = true;
  ref.bits_per_weight = 32;
  ref.weight_bytes = 1 << 20;
  ref.formats = {{"F32", 35}};
  ref.classes = {{"code", {100, 7.5, 0.0, 0.0, 1.0}}, {"prose", {90, 3.25, 0.0, 0.0, 1.0}}};
  ref.code = CodeCanary{4, 1.0, 0.5};
  ref.math = MathCanary{8, 0.75};
  PrecisionResult q8;
  q8.precision = "q8_0";
  q8.bits_per_weight = 8.5;
  q8.weight_bytes = 300000;
  q8.formats = {{"Q8_0", 30}, {"F32", 5}};
  q8.classes = {{"code", {100, 7.6, 0.01, 0.04, 0.99}}, {"prose", {90, 3.3, 0.005, 0.02, 0.995}}};
  PrecisionResult q2;
  q2.precision = "q2_k+imatrix";
  q2.calibrated = true;
  q2.bits_per_weight = 2.625;
  q2.weight_bytes = 100000;
  q2.formats = {{"Q2_K", 20}, {"Q4_0", 15}};
  q2.classes = {{"code", {100, 9.0, 0.25, 1.5, 0.7}}, {"prose", {90, 4.0, 0.125, 0.75, 0.8}}};
  q2.code = CodeCanary{4, 0.75, 0.25};
  m.precisions = {ref, q8, q2};
  r.models[m.sha256] = m;

  ModelReport other;
  other.model = "/models/b";
  other.sha256 = std::string(64, 'b');
  other.reference = "file";
  other.classes = {"prose"};
  PrecisionResult f;
  f.precision = "file";
  f.reference = true;
  f.classes = {{"prose", {10, 2.0, 0.0, 0.0, 1.0}}};
  other.precisions = {f};
  r.models[other.sha256] = other;
  return r;
}

void expect_same(const PrecisionResult& a, const PrecisionResult& b) {
  SCOPED_TRACE(a.precision);
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.reference, b.reference);
  EXPECT_EQ(a.calibrated, b.calibrated);
  EXPECT_DOUBLE_EQ(a.bits_per_weight, b.bits_per_weight);
  EXPECT_EQ(a.weight_bytes, b.weight_bytes);
  EXPECT_EQ(a.formats, b.formats);
  ASSERT_EQ(a.classes.size(), b.classes.size());
  for (const auto& [name, c] : a.classes) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(b.classes.count(name));
    const ClassQuality& d = b.classes.at(name);
    EXPECT_EQ(c.tokens, d.tokens);
    EXPECT_DOUBLE_EQ(c.ppl, d.ppl);
    EXPECT_DOUBLE_EQ(c.kl_mean, d.kl_mean);
    EXPECT_DOUBLE_EQ(c.kl_p99, d.kl_p99);
    EXPECT_DOUBLE_EQ(c.top1, d.top1);
  }
  ASSERT_EQ(a.code.has_value(), b.code.has_value());
  if (a.code) {
    EXPECT_EQ(a.code->problems, b.code->problems);
    EXPECT_DOUBLE_EQ(a.code->parse_rate, b.code->parse_rate);
    EXPECT_DOUBLE_EQ(a.code->pass_at_1, b.code->pass_at_1);
  }
  ASSERT_EQ(a.math.has_value(), b.math.has_value());
  if (a.math) {
    EXPECT_EQ(a.math->problems, b.math->problems);
    EXPECT_DOUBLE_EQ(a.math->accuracy, b.math->accuracy);
  }
}

TEST(EvalReport, SaveLoadRoundTripKeepsEveryField) {
  TempDir dir;
  const std::string path = dir.file("r.eval.json");
  const EvalReport want = sample_report();
  ASSERT_TRUE(save_eval_report(want, path).is_ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp")) << "the temporary file is renamed over the report";
  auto got = load_eval_report(path);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  ASSERT_EQ(got->models.size(), want.models.size());
  for (const auto& [sha, w] : want.models) {
    SCOPED_TRACE(w.model);
    ASSERT_TRUE(got->models.count(sha));
    const ModelReport& g = got->models.at(sha);
    EXPECT_EQ(g.sha256, sha);
    EXPECT_EQ(g.model, w.model);
    EXPECT_EQ(g.file_bytes, w.file_bytes);
    EXPECT_EQ(g.reference, w.reference);
    EXPECT_EQ(g.corpus_sha256, w.corpus_sha256);
    EXPECT_EQ(g.cpu, w.cpu);
    EXPECT_EQ(g.date, w.date);
    const nlohmann::json ws = nlohmann::json::parse(w.settings_json.empty() ? "{}" : w.settings_json);
    EXPECT_EQ(nlohmann::json::parse(g.settings_json), ws);
    EXPECT_EQ(g.classes, w.classes);
    EXPECT_EQ(g.skipped_classes, w.skipped_classes);
    ASSERT_EQ(g.precisions.size(), w.precisions.size());
    for (size_t i = 0; i < w.precisions.size(); ++i) expect_same(w.precisions[i], g.precisions[i]);
    for (const PrecisionResult& p : w.precisions) {
      ASSERT_NE(g.find(p.precision), nullptr) << p.precision;
      EXPECT_EQ(g.find(p.precision)->precision, p.precision);
    }
    EXPECT_EQ(g.find("q4_0"), nullptr);
  }
  // Saved again over itself: the same file.
  ASSERT_TRUE(save_eval_report(*got, path).is_ok());
  auto again = load_eval_report(path);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->models.size(), 2u);
  // The file is what report.h documents.
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("format"), "tessera-eval-1");
  const nlohmann::json& p = j.at("models").at(std::string(64, 'a')).at("precisions").at(2);
  EXPECT_EQ(p.at("precision"), "q2_k+imatrix");
  EXPECT_EQ(p.at("calibrated"), true);
  EXPECT_DOUBLE_EQ(p.at("classes").at("code").at("kl_mean").get<double>(), 0.25);
  EXPECT_EQ(p.at("canaries").at("code").at("problems"), 4);
  EXPECT_FALSE(p.at("canaries").contains("math"));
}

TEST(EvalReport, LoadErrorsNameTheFile) {
  TempDir dir;
  const std::string missing = dir.file("missing.json");
  auto r = load_eval_report(missing);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(r.status().message(), missing);

  struct Case {
    const char* name;
    const char* text;
    const char* says;
  };
  const Case cases[] = {
      {"not-json.json", "{\"format\": \"tessera-eval-1\", \"models\": {", "not a quality report"},
      {"garbage.json", "this is no JSON", "not a quality report"},
      {"other-format.json", R"({"format": "tessera-importance-1", "models": {}})", "'format'"},
      {"no-format.json", R"({"models": {}})", "'format'"},
      {"array.json", R"([1, 2, 3])", "'format'"},
      {"no-models.json", R"({"format": "tessera-eval-1"})", "not a quality report"},
      {"no-precisions.json", R"({"format": "tessera-eval-1", "models": {"abc": {"model": "m"}}})",
       "not a quality report"},
      {"bad-class.json",
       R"({"format": "tessera-eval-1", "models": {"abc": {"precisions": [{"precision": "q8_0",
           "classes": {"code": {"tokens": 1, "ppl": "high"}}}]}}})",
       "not a quality report"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(c.name);
    write_text(path, c.text);
    auto e = load_eval_report(path);
    ASSERT_FALSE(e.is_ok());
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(e.status().message(), path);
    EXPECT_CONTAINS(e.status().message(), c.says);
  }
  // An empty report is a report.
  write_text(dir.file("empty.json"), R"({"format": "tessera-eval-1", "models": {}})");
  auto empty = load_eval_report(dir.file("empty.json"));
  ASSERT_TRUE(empty.is_ok()) << empty.status().to_string();
  EXPECT_TRUE(empty->models.empty());
}

TEST(EvalReport, SaveIntoAMissingDirectoryFails) {
  TempDir dir;
  const Status s = save_eval_report(sample_report(), dir.file("no/such/dir/r.json"));
  EXPECT_FALSE(s.is_ok());
  EXPECT_CONTAINS(s.message(), "no/such/dir");
}

TEST(EvalReport, DefaultPathSitsBesideTheModel) {
  EXPECT_EQ(default_eval_report_path("models/x.gguf"), "models/x.gguf.eval.json");
  EXPECT_EQ(default_eval_report_path("models/hf-dir/"), "models/hf-dir.eval.json");
  EXPECT_EQ(default_eval_report_path("models/hf-dir//"), "models/hf-dir.eval.json");
}

// ---- the gate

class QualityGate : public ::testing::Test {
 protected:
  const EvalReport report_ = sample_report();
  const std::string sha_ = std::string(64, 'a');
  const std::string path_ = "/reports/r.eval.json";

  Status check(const std::string& precision, const std::string& budget) {
    auto b = parse_quality_budget(budget);
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    return check_quality_budget(report_, path_, sha_, precision, *b);
  }
};

TEST_F(QualityGate, AcceptsWithinBudget) {
  EXPECT_TRUE(check("q8_0", "code=0.05").is_ok());
  EXPECT_TRUE(check("q8_0", "code=0.05,chat=0.01").is_ok());
  EXPECT_TRUE(check("q8_0", "prose=0.005").is_ok()) << "a KL equal to the budget is within it";
  EXPECT_TRUE(check("f32", "code=0,prose=0").is_ok()) << "the reference loses nothing";
  EXPECT_TRUE(check("q2_k+imatrix", "code=0.3,chat=0.2").is_ok());
}

TEST_F(QualityGate, RefusesOverBudgetNamingPrecisionClassKlAndBudget) {
  Status s = check("q2_k+imatrix", "code=0.05");
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "'q2_k+imatrix'");
  EXPECT_CONTAINS(s.message(), "0.2500");       // the measured mean KL
  EXPECT_CONTAINS(s.message(), "on code");
  EXPECT_CONTAINS(s.message(), "code=0.05");    // the budget
  EXPECT_CONTAINS(s.message(), path_);
  EXPECT_CONTAINS(s.message(), "pass@1 25.0%");  // the class's canary

  // chat is budgeted on the prose measurement; the message says both.
  s = check("q8_0", "code=0.05,chat=0.001");
  ASSERT_FALSE(s.is_ok());
  EXPECT_CONTAINS(s.message(), "'q8_0'");
  EXPECT_CONTAINS(s.message(), "0.0050");
  EXPECT_CONTAINS(s.message(), "on prose");
  EXPECT_CONTAINS(s.message(), "chat=0.001");
  EXPECT_CONTAINS(s.message(), "no canary");

  // One class over is enough, whichever it is.
  EXPECT_FALSE(check("q2_k+imatrix", "code=1,prose=0.1").is_ok());
  EXPECT_FALSE(check("q8_0", "code=0.009").is_ok());
}

TEST_F(QualityGate, RefusesAnotherModelFile) {
  auto b = parse_quality_budget("code=1");
  ASSERT_TRUE(b.is_ok());
  const std::string other = "0123456789abcdef" + std::string(48, '0');
  const Status s = check_quality_budget(report_, path_, other, "q8_0", *b);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "no measurement of this model file");
  EXPECT_CONTAINS(s.message(), "0123456789ab");
  EXPECT_CONTAINS(s.message(), "tessera eval");
  EXPECT_CONTAINS(s.message(), path_);
}

TEST_F(QualityGate, RefusesAnUnmeasuredPrecision) {
  for (const char* precision : {"q4_0", "file", "q2_k"}) {
    SCOPED_TRACE(precision);
    const Status s = check(precision, "code=1");
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(s.message(), std::string("not precision '") + precision + "'");
    EXPECT_CONTAINS(s.message(), std::string("tessera eval --model /models/a.gguf --precisions ") + precision);
  }
}

TEST_F(QualityGate, RefusesASkippedClassSayingWhy) {
  Status s = check("q8_0", "math=1");
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "class 'math' was not measured for precision 'q8_0'");
  EXPECT_CONTAINS(s.message(), "skipped: no document long enough");
  // A class neither measured nor skipped: refused, without a reason.
  ModelReport& m = const_cast<EvalReport&>(report_).models.at(sha_);
  m.skipped_classes.clear();
  s = check("q8_0", "code=1,math=1");
  ASSERT_FALSE(s.is_ok());
  EXPECT_CONTAINS(s.message(), "class 'math' was not measured");
  EXPECT_EQ(std::string(s.message()).find("skipped"), std::string::npos);
}

TEST(QualityGateFile, AppliesTheReportOfTheModelFile) {
  TempDir dir;
  const std::string model = dir.file("model.gguf");
  write_text(model, "not really a model, but it has a hash");
  auto sha = model_sha256(model);
  ASSERT_TRUE(sha.is_ok()) << sha.status().to_string();
  EXPECT_EQ(*sha, sha256_hex("not really a model, but it has a hash"));
  auto budget = parse_quality_budget("code=0.05,chat=0.01");
  ASSERT_TRUE(budget.is_ok());

  // No report: NotFound, saying what to run.
  const std::string report_path = dir.file("model.gguf.eval.json");
  auto r = apply_quality_gate(model, "q8_0", *budget, report_path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(r.status().message(), "tessera eval --model " + model + " --precisions q8_0 --json " + report_path);

  // A report of this file.
  EvalReport rep = sample_report();
  ModelReport m = rep.models.at(std::string(64, 'a'));
  m.sha256 = *sha;
  m.model = model;
  rep.models.emplace(*sha, m);
  ASSERT_TRUE(save_eval_report(rep, report_path).is_ok());
  r = apply_quality_gate(model, "q8_0", *budget, report_path);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_CONTAINS(*r, "quality gate: precision 'q8_0' within budget");
  EXPECT_CONTAINS(*r, "code KL 0.0100 <= 0.05");
  EXPECT_CONTAINS(*r, "chat KL 0.0050 <= 0.01");

  r = apply_quality_gate(model, "q2_k+imatrix", *budget, report_path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(r.status().message(), "'q2_k+imatrix'");

  // The file changes: the report no longer applies.
  write_text(model, "other weights");
  r = apply_quality_gate(model, "q8_0", *budget, report_path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_CONTAINS(r.status().message(), "no measurement of this model file");

  // A report that is not one: its own error, not NotFound.
  write_text(report_path, "{");
  r = apply_quality_gate(model, "q8_0", *budget, report_path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(r.status().message(), report_path);
}

TEST(ModelSha256, DirectoryHashesItsFilesInNameOrder) {
  TempDir dir;
  const std::string d = dir.file("hf");
  std::filesystem::create_directory(d);
  write_text(d + "/b.safetensors", "weights");
  write_text(d + "/a.json", "{}");
  std::filesystem::create_directory(d + "/sub");  // not a file: not hashed
  write_text(d + "/sub/c", "ignored");
  auto h = model_sha256(d);
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  const std::string want =
      sha256_hex("a.json " + sha256_hex("{}") + "\nb.safetensors " + sha256_hex("weights") + "\n");
  EXPECT_EQ(*h, want);
  EXPECT_EQ(h->size(), 64u);
  write_text(d + "/b.safetensors", "weightz");
  auto h2 = model_sha256(d);
  ASSERT_TRUE(h2.is_ok());
  EXPECT_NE(*h2, *h);
  EXPECT_FALSE(model_sha256(dir.file("nothing")).is_ok());
}

TEST(QualityBill, OneRowPerPrecisionAndTheSkippedClasses) {
  const EvalReport r = sample_report();
  const std::string bill = format_quality_bill(r.models.at(std::string(64, 'a')), "/reports/r.eval.json");
  EXPECT_CONTAINS(bill, "Quality by precision (/reports/r.eval.json; measured 2026-12-03 12:00 UTC against f32");
  EXPECT_CONTAINS(bill, "code KL");
  EXPECT_CONTAINS(bill, "prose KL");
  EXPECT_CONTAINS(bill, "f32*");
  EXPECT_CONTAINS(bill, "q8_0 ");
  EXPECT_CONTAINS(bill, "q2_k+imatrix");
  EXPECT_CONTAINS(bill, "0.2500");
  EXPECT_CONTAINS(bill, "0.1250");
  EXPECT_CONTAINS(bill, "50%");   // the reference's HumanEval pass@1
  EXPECT_CONTAINS(bill, "75%");   // its arithmetic accuracy
  EXPECT_CONTAINS(bill, "(class math not measured: no document long enough)");
  // Three precision rows.
  size_t rows = 0;
  for (const char* p : {"  f32*", "  q8_0", "  q2_k+imatrix"}) rows += bill.find(p) != std::string::npos;
  EXPECT_EQ(rows, 3u);
}

}  // namespace
}  // namespace tessera
