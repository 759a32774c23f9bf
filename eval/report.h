// The quality report of `tessera eval` and the gate that reads it (`tessera serve
// --quality-budget`, `tessera plan`).
//
// One JSON file holds any number of models, keyed by the SHA-256 of the model file, so a
// report is only ever applied to the weights it measured:
//   {"format": "tessera-eval-1", "models": {"<sha256>": {"model": path, "file_bytes": n,
//     "reference": "f32", "corpus_sha256": ..., "cpu": ..., "date": ..., "settings": {...},
//     "classes": ["code", ...], "skipped_classes": {"math": "<why>"},
//     "precisions": [{"precision": "q2_k", "reference": false, "calibrated": false,
//       "bits_per_weight": 3.4, "weight_bytes": n, "formats": {"Q2_K": 36, "Q4_0": 90},
//       "classes": {"code": {"tokens": n, "ppl": x, "kl_mean": x, "kl_p99": x, "top1": x}},
//       "canaries": {"code": {"problems": n, "parse_rate": x, "pass_at_1": x},
//                    "math": {"problems": n, "accuracy": x}}}, ...]}}}
// KL is KL(reference || precision) in nats per token, teacher-forced on the class's text;
// top1 the share of positions whose argmax matches the reference's.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

struct ClassQuality {
  int64_t tokens = 0;  // predicted positions
  double ppl = 0;      // perplexity of the text under this precision
  double kl_mean = 0;  // nats per token
  double kl_p99 = 0;
  double top1 = 0;     // agreement with the reference's argmax, 0..1
};

struct CodeCanary {
  int64_t problems = 0;
  double parse_rate = 0;  // share of prompt + completion that parse as Python
  double pass_at_1 = 0;   // share that pass the problem's own tests (greedy, one sample)
};

struct MathCanary {
  int64_t problems = 0;
  double accuracy = 0;  // exact answers
};

struct PrecisionResult {
  std::string precision;  // "f32", "file", a --quant name, "+imatrix" for calibrated
  bool reference = false;
  bool calibrated = false;
  double bits_per_weight = 0;  // over the linear weights (q/k/v/o/gate/up/down)
  int64_t weight_bytes = 0;    // every weight as loaded (embedding, head and norms included)
  std::map<std::string, int64_t> formats;  // linear weights per stored format
  std::map<std::string, ClassQuality> classes;
  std::optional<CodeCanary> code;
  std::optional<MathCanary> math;
};

struct ModelReport {
  std::string model;  // the path it was run on
  std::string sha256;
  int64_t file_bytes = 0;
  std::string reference;
  std::string corpus_sha256;
  std::string cpu;
  std::string date;
  std::string settings_json;  // the run's knobs, as a JSON object
  std::vector<std::string> classes;
  std::map<std::string, std::string> skipped_classes;  // class -> why
  std::vector<PrecisionResult> precisions;

  const PrecisionResult* find(const std::string& precision) const;
};

struct EvalReport {
  std::map<std::string, ModelReport> models;  // by sha256
};

// NotFound when the file is missing; InvalidArgument naming the file and the field otherwise.
Result<EvalReport> load_eval_report(const std::string& path);
// Written whole (temporary file renamed over `path`).
Status save_eval_report(const EvalReport& report, const std::string& path);

// The quality cost beside the memory of each measured precision, for `tessera plan`: one row
// per precision (bits per linear weight, weight MiB, mean KL per class, canaries).
std::string format_quality_bill(const ModelReport& m, const std::string& report_path);

// The default report path of a model file: "<model>.eval.json".
std::string default_eval_report_path(const std::string& model_path);

// ---- the gate

// --quality-budget "code=0.05,math=0.05,chat=0.02": the most mean KL (nats per token, against
// the report's reference) a served precision may lose per workload class. "chat" is measured
// on the prose class. InvalidArgument naming the piece for anything else.
struct QualityBudget {
  std::map<std::string, double> max_kl;  // class -> nats per token
};
Result<QualityBudget> parse_quality_budget(const std::string& spec);
std::string quality_class_for(const std::string& budget_class);  // "chat" -> "prose"

// Hash of a model: the file's SHA-256, or for a directory (Hugging Face) the SHA-256 of its
// files' names and hashes in name order.
Result<std::string> model_sha256(const std::string& path);

// The precision name a deployment serves: "file" without --quant, else the --quant name, with
// "+imatrix" when calibrated (the names `tessera eval` reports).
std::string served_precision_name(const std::string& quant_name, bool calibrated);

// The gate of `tessera serve --quality-budget`: loads the report at report_path (NotFound
// saying to run `tessera eval`), hashes the model and checks the precision. Returns one line
// saying what passed, for the log.
Result<std::string> apply_quality_gate(const std::string& model_path, const std::string& precision,
                                       const QualityBudget& budget, const std::string& report_path);

// Ok when the report measured `precision` of the model with hash `sha256` and its mean KL is
// within budget for every class the budget names; else InvalidArgument naming the class,
// the measured KL, the budget and the report (and what to run when something is missing).
Status check_quality_budget(const EvalReport& report, const std::string& report_path, const std::string& sha256,
                            const std::string& precision, const QualityBudget& budget);

}  // namespace tessera
