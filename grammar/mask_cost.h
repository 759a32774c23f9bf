// What structured outputs cost on a vocabulary, measured: a schema's compile time and the time of
// each token mask along outputs walked through its grammar (seeded random allowed tokens, a
// stand-in for a model's choices, so every state an output passes through is timed). Used by
// `tessera plan --constrained` and tessera-bench-grammar (bench/results/structured-outputs.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "grammar/grammar.h"

namespace tessera {

// A schema of `properties` required properties of mixed kinds (string with maxLength 12, integer
// range, number, boolean, enum, array of at most 3 integers); `salt` makes a new schema of the
// same shape (a cache miss).
std::string mixed_schema(int properties, int salt = 0);

struct MaskCost {
  double compile_ms = 0;       // compile() of the spec (a cache miss unless compiled before)
  std::vector<double> mask_us; // one per mask filled, every walk
  int64_t restricting = 0;     // masks that allowed less than every token
};

// Compiles `spec` and walks `walks` outputs (at most `max_steps` tokens each) from `seed`, timing
// each fill_mask. A walk takes a stop token (one of `stop_ids`) as soon as the grammar is
// complete and allows one.
Result<MaskCost> measure_mask_cost(GrammarCompiler& compiler, const GrammarSpec& spec, int walks, uint64_t seed,
                                   const std::vector<int32_t>& stop_ids, int max_steps = 4000);

// The q-quantile (0..1) of `v` (nearest rank), 0 when empty.
double quantile(std::vector<double> v, double q);

}  // namespace tessera
