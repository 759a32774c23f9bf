// The corpora of `tessera eval`: a directory written by tools/eval_corpus.py
// (scripts/eval_corpus.sh) from text installed on the machine: manifest.json, one JSONL file of
// documents ({"source", "text"}) per workload class, the calibration text and the canaries.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

struct CorpusDoc {
  std::string source;
  std::string text;
};

struct CodeProblem {  // HumanEval
  std::string id, prompt, test, entry_point;
};

struct MathProblem {
  std::string id, prompt, answer;
};

struct EvalCorpus {
  std::string dir;
  std::string sha256;
  std::map<std::string, std::vector<CorpusDoc>> classes;  // "code", "math", "prose"
  std::map<std::string, std::string> sources;             // class -> where the text came from
  std::vector<CorpusDoc> calibration;
  std::vector<CodeProblem> code_canaries;
  std::vector<MathProblem> math_canaries;
};

// NotFound (saying to run scripts/eval_corpus.sh) when dir has no manifest.json;
// InvalidArgument naming the file and line for a malformed one.
Result<EvalCorpus> load_eval_corpus(const std::string& dir);

}  // namespace tessera
