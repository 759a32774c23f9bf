// JSON Schema `pattern`s compiled by xgrammar's regex-to-grammar expansion instead of its regex
// automaton.
//
// xgrammar 0.2.8's JSON Schema converter writes a string's pattern as a Regex("...",
// json_string=true) rule, compiled into one automaton. That automaton accepts strings the pattern
// does not match: with `^v[0-9]{1,2}(x[0-9]{1,2})?$` it takes "v202" (an optional group holding a
// bounded repetition after another one), so a constrained output could fail its schema
// (tests/grammar/grammar_test.cpp has the case). Its regex-to-EBNF expansion (Grammar::FromRegex,
// what guided_regex uses) gets it right. The automaton's json_string flag also keeps '"', '\\' and
// control characters out of the string; the expansion has no such flag, so only a pattern that
// cannot match any of those characters is rewritten (json_safe_pattern); the others keep the
// automaton.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace tessera {

// Whether every string `pattern` (a JSON Schema regex) matches is free of '"', '\\' and
// U+0000-U+001F: no '.', no negated class, no \D \S \W \s, no escape or range that reaches one of
// those characters. Conservative: false when unsure.
bool json_safe_pattern(std::string_view pattern);

// The text inside an EBNF string literal as xgrammar prints it (\\ \" \? \' \n \r \t \xHH
// \uHHHH unescaped); nullopt for an escape it does not know.
std::optional<std::string> unescape_ebnf_literal(std::string_view literal);

// `ebnf`: xgrammar's printed grammar. Every rule `name ::= Regex("P", json_string=true)` whose
// P is json_safe_pattern and for which `expand(P)` gives a printed grammar (root rule "root") is
// replaced by that grammar, its rules renamed `name_re`, `name_re_1`, ... Returns the new text,
// or nullopt when no rule was replaced.
std::optional<std::string> expand_pattern_regexes(
    const std::string& ebnf, const std::function<std::optional<std::string>(const std::string&)>& expand);

}  // namespace tessera
