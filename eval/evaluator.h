// `tessera eval`: what each precision of a model costs in quality, per workload class
// (eval/report.h holds the result). For one model file and a list of precisions, against a
// reference precision:
//   * teacher-forced on each class's text (eval/corpus.h): every precision reads the same
//     windows of tokens and its next-token distribution at every position is compared with
//     the reference's: KL(reference || precision) (mean and p99), top-1 agreement, and its own
//     perplexity of the text;
//   * generation canaries: greedy HumanEval completions (parse rate, pass@1 in a sandbox,
//     eval/canary.h) and arithmetic with exact answers.
// All models are loaded at once and fed window by window in lockstep, so the reference's
// logits are computed once per position and never stored beyond one chunk.
//
// Precisions: "file" (the weights as stored), any --quant name (common/dtype.h's WeightQuant:
// "f32", "q8_0", "q4_0", "q3_k", "q2_k", "tq2_0", ...), and "<name>+imatrix" for the same
// quantized with an importance estimate measured by the reference model on the corpus's
// calibration text (disjoint from the evaluation text; model/importance.h); each optionally
// followed by "@fp32" / "@bf16" (how float matmuls compute) and ":kv-fp16" / ":kv-int8" (the KV
// cache's elements; fp32 by default), e.g. "file:kv-int8" against "file": what int8 KV costs.
//
// A class is skipped, and named in the report with the reason, when the model was not made for
// its text: more than max_byte_share of its tokens are byte fallbacks (the vocabulary cannot
// spell it), or the reference predicts it barely better than chance (perplexity over
// max_ppl_share of the vocabulary size). The best class by each measure is always kept: a
// model runs on the corpus it has.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "eval/canary.h"
#include "eval/report.h"

namespace tessera {

struct EvalOptions {
  std::string model_path;
  std::vector<std::string> precisions;
  std::string reference = "f32";
  std::vector<std::string> classes;  // empty: every class of the corpus
  std::string corpus_dir;
  int64_t tokens_per_class = 4096;   // predicted positions per class
  int64_t window = 512;              // tokens per teacher-forced window (BOS included)
  int64_t chunk = 64;                // positions per forward piece (bounds the logits' memory)
  int64_t code_canaries = 20;        // HumanEval problems (0: none)
  int64_t code_tokens = 128;         // greedy tokens per completion
  int64_t math_canaries = 40;        // arithmetic problems (0: none)
  int64_t calibration_tokens = 8192; // for the +imatrix precisions
  double max_byte_share = 0.10;
  double max_ppl_share = 0.05;       // skip a class the reference predicts with ppl over this share of the vocab
  int threads = 0;
  std::string python = "python3";    // runs the code canaries
  SandboxLimits sandbox;
  std::string importance_out;        // also write the measured importance there ("" : no)
  std::function<void(const std::string&)> progress;  // one line per step (may be empty)
};

// Errors: an unknown precision name, a corpus that is missing or malformed, a model that does
// not load in some precision (the message names it), a canary driver that cannot run.
Result<ModelReport> run_quality_eval(const EvalOptions& options);

// The --quant names a precision may start with (every mode that converts: "int8, int4, int4-sym,
// q2_k, ..., q6_k"), from common/dtype.h's table, for help texts and messages.
std::string precision_quant_names();

// The table printed by `tessera eval` (and written to the results files): one row per
// precision, per class KL mean / p99, top-1, perplexity, then the canaries.
std::string format_eval_table(const ModelReport& report);

}  // namespace tessera
