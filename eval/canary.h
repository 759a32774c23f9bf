// Generation canaries of `tessera eval`: the greedy completions of a precision are checked the
// way a user would notice a broken model. Code: does prompt + completion parse as Python, and
// does it pass the problem's own tests (HumanEval's check(entry_point)), run in a sandboxed
// Python subprocess per program (its own empty directory, an empty environment, isolated mode,
// limits on address space, CPU time and file size, a wall-clock timeout, and its own process
// group, killed when the program ends so nothing it started outlives it).
// Math: is the first line of the completion exactly the answer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

struct SandboxLimits {
  double timeout_s = 5;       // wall clock per program (CPU time limit the same, rounded up)
  int64_t memory_mb = 1024;   // address space
};

struct CodeProgram {
  std::string id;
  std::string source;  // prompt + completion: checked for parsing
  std::string test;    // appended for the run: the problem's test code and its call
};

struct CodeVerdict {
  bool parses = false;
  bool passed = false;
  std::string detail;  // the first error line, when it failed
};

// The completion cut where a model moves on past the function body: before the first line that
// starts at column 0 with something other than a blank (a new def, class, if, print, comment...).
std::string cut_code_completion(const std::string& completion);
// Whether the first line of `completion` (trimmed of spaces and a final '.') is `answer`.
bool math_answer_matches(const std::string& completion, const std::string& answer);

// Runs every program with `python` (a Python 3 interpreter, e.g. "python3"). Errors: the
// interpreter cannot be started or its driver's output is unreadable (naming the interpreter).
Result<std::vector<CodeVerdict>> run_code_programs(const std::vector<CodeProgram>& programs,
                                                  const std::string& python, const SandboxLimits& limits);

}  // namespace tessera
