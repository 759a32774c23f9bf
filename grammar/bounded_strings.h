// Length-bounded JSON strings (minLength / maxLength) in a form whose token masks are cheap.
//
// xgrammar's JSON Schema converter writes a bounded string as `"\"" CHARS{m, n} "\""`. For small
// n (up to about 24) its compiled repetition leaves most of a 262k vocabulary's tokens to be
// checked one by one at every position inside the string: a mask costs milliseconds (12 ms for
// maxLength 12 on Gemma 3's vocabulary, bench/results/structured-outputs.md). Written instead as
// a chain of rules, one per count of characters still allowed (r) and still required (q),
//     S ::= "\"" L(n, m)
//     L(r, 0) ::= "\"" | CHARS L(r - 1, 0)      L(r, q) ::= CHARS L(r - 1, q - 1)      L(0, 0) ::= "\""
// every token's fate in every state is decided when the grammar is compiled, and a mask costs
// tens of microseconds. The states depend only on the characters, r and q, so all bounded
// strings of a schema share them (each state costs compile time: a pass over the vocabulary).
#pragma once

#include <optional>
#include <string>

namespace tessera {

// Bounded repetitions of up to this many characters are rewritten; longer ones xgrammar already
// compiles into cheap masks (and each rule costs compile time).
inline constexpr int kMaxUnrolledStringLength = 31;

// `ebnf`: xgrammar's printed grammar (Grammar::ToString). Returns it with every bounded string
// rule of the shape above (max n <= kMaxUnrolledStringLength) rewritten as a chain, and the
// characters of every bounded string (any n) made valid JSON: xgrammar 0.2.8 gives them the
// class [^"\\\r\n], which lets raw control characters through; here they are [^\0-\x1f"\\], the
// characters a JSON string holds unescaped (escapes would make the masks slow, see the .cpp).
// nullopt when there is no bounded string.
std::optional<std::string> unroll_bounded_strings(const std::string& ebnf);

}  // namespace tessera
