// `tessera eval`: the quality each precision of a model costs, per workload class
// (eval/evaluator.h), written to a JSON report keyed by the model file's hash (eval/report.h)
// that `tessera serve --quality-budget` and `tessera plan` read.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/default_model.h"
#include "eval/evaluator.h"
#include "eval/report.h"
#include "launch/commands.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

struct EvalArgs {
  EvalOptions options;
  std::string precisions = "file,q8_0,q4_0,q3_k,q2_k,tq2_0,q3_k+imatrix,q2_k+imatrix";
  std::string classes;
  std::string json;
  std::string table;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string piece;
  while (std::getline(ss, piece, ','))
    if (!piece.empty()) out.push_back(piece);
  return out;
}

// --corpus's default: $TESSERA_EVAL_CORPUS, else models/eval-corpus of the checkout the binary
// was built in (build/bin/../../models), else of the current directory.
std::string default_corpus_dir() {
  if (const char* env = std::getenv("TESSERA_EVAL_CORPUS"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path p = exe.parent_path().parent_path().parent_path() / "models" / "eval-corpus";
    if (fs::exists(p / "manifest.json")) return p.string();
  }
  return "models/eval-corpus";
}

int run_eval(EvalArgs& a) {
  EvalOptions& o = a.options;
  if (o.corpus_dir.empty()) o.corpus_dir = default_corpus_dir();
  if (Status st = resolve_model_flag(o.model_path); !st.is_ok()) return fail(st.to_string());
  o.precisions = split_list(a.precisions);
  o.classes = split_list(a.classes);
  if (o.precisions.empty()) return fail("--precisions: give at least one");
  o.progress = [](const std::string& line) { std::fprintf(stderr, "eval: %s\n", line.c_str()); };
  const std::string json = a.json.empty() ? default_eval_report_path(o.model_path) : a.json;
  auto result = run_quality_eval(o);
  if (!result.is_ok()) return fail(result.status().to_string());
  const ModelReport& r = *result;
  EvalReport report;
  if (auto old = load_eval_report(json); old.is_ok()) {
    report = std::move(old).value();
  } else if (old.status().code() != StatusCode::kNotFound) {
    return fail(old.status().to_string() + " (not overwritten; give another --json)");
  }
  // Precisions measured earlier against the same reference on the same corpus stay in the
  // report (a later run adds or replaces rows); another reference or corpus starts afresh.
  ModelReport merged = r;
  if (auto it = report.models.find(r.sha256); it != report.models.end() && it->second.reference == r.reference &&
                                               it->second.corpus_sha256 == r.corpus_sha256 &&
                                               it->second.classes == r.classes) {
    for (const PrecisionResult& old : it->second.precisions)
      if (merged.find(old.precision) == nullptr) merged.precisions.push_back(old);
  }
  report.models[r.sha256] = merged;
  if (Status st = save_eval_report(report, json); !st.is_ok()) return fail(st.to_string());
  const std::string table = format_eval_table(r);
  std::printf("%s\nreport: %s\n", table.c_str(), json.c_str());
  if (!a.table.empty()) {
    FILE* f = std::fopen(a.table.c_str(), "w");
    if (f == nullptr) return fail(a.table + ": cannot write the table");
    std::fputs(table.c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace

Runner add_eval_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  EvalOptions& o = a->options;
  add_model_flag(app, o.model_path, "Model to evaluate (.gguf file or Hugging Face directory)");
  app.add_option("--precisions", a->precisions,
                 fmt::format("Comma-separated precisions: 'file' (as stored), --quant names ({}), '+imatrix' for "
                             "calibrated, '@fp32' / '@bf16' for how float matmuls compute (default: auto), ':kv-fp16' / "
                             "':kv-int8' for the KV cache's elements (default fp32), e.g. file:kv-int8",
                             precision_quant_names()))
      ->capture_default_str();
  app.add_option("--reference", o.reference, "The precision the others are compared with")->capture_default_str();
  app.add_option("--classes", a->classes, "Comma-separated workload classes (default: all of the corpus: code, math, prose)");
  app.add_option("--corpus", o.corpus_dir,
                 "Corpus directory (scripts/eval_corpus.sh writes it; default $TESSERA_EVAL_CORPUS, else the "
                 "checkout's models/eval-corpus)");
  app.add_option("--json", a->json, "Report to write or update (default: <model>.eval.json)");
  app.add_option("--table", a->table, "Also write the printed table to this file");
  app.add_option("--tokens-per-class", o.tokens_per_class, "Teacher-forced positions per class")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--window", o.window, "Tokens per teacher-forced window")->check(CLI::Range(32, 1 << 20))->capture_default_str();
  app.add_option("--code-canaries", o.code_canaries, "HumanEval problems completed greedily (0: none)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--code-tokens", o.code_tokens, "Tokens per HumanEval completion")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--math-canaries", o.math_canaries, "Arithmetic problems (0: none)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--calibration-tokens", o.calibration_tokens, "Tokens of calibration text for '+imatrix'")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-byte-share", o.max_byte_share,
                 "Skip a class when more than this share of its tokens are byte fallbacks")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--max-ppl-share", o.max_ppl_share,
                 "Skip a class the reference predicts with a perplexity over this share of the vocabulary size")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--python", o.python, "Python 3 interpreter for the code canaries' sandbox")->capture_default_str();
  app.add_option("--canary-timeout", o.sandbox.timeout_s, "Seconds per canary program")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--save-imatrix", o.importance_out,
                 "Write the measured importance (for `--quant ... --imatrix FILE`) here");
  return [a] { return run_eval(*a); };
}

}  // namespace tessera::cli
