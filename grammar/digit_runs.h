// Runs of digits with no bound, capped: a JSON number's integer part, fraction and exponent, an
// integer with only a minimum, a time's fractional seconds.
//
// xgrammar's grammar lets such a run go on for ever, and a small model that starts one often
// does not stop: at temperature 1 Gemma 3 270M wrote 400 tokens of digits into one integer and
// the output ended cut (finish_reason "length", not JSON). A run here has at most kMaxDigitRun
// digits (19: every int64, and more fraction digits than a double holds), so every number ends.
// What it refuses, a number with a longer run (an integer past 19 digits), is listed in
// docs/structured_outputs.md.
#pragma once

#include <optional>
#include <string>

namespace tessera {

inline constexpr int kMaxDigitRun = 19;

// `ebnf`: xgrammar's printed grammar. Returns it with every unbounded run of digits bounded
// (`[1-9] [0-9]*` -> `[1-9] [0-9]{0, 18}`, `D{1, -1}` -> `D{1, 19}` for a rule D ::= [0-9]
// (`D{1, 18}` after a `[1-9]`), a rule R ::= [0-9] R | [0-9] -> [0-9]{1, 19}), or nullopt when there is none.
std::optional<std::string> cap_digit_runs(const std::string& ebnf);

}  // namespace tessera
