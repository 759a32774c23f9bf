#include "grammar/digit_runs.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

namespace tessera {
namespace {

// Replaces every `from` in `text` with `to`; whether any was.
bool replace_all(std::string& text, std::string_view from, std::string_view to) {
  bool any = false;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
    any = true;
  }
  return any;
}

// ` D{m, -1}` (D a rule of one digit) -> ` D{m, max(m, cap)}`, the cap one less after a `[1-9]`.
bool cap_repetitions(std::string& line, const std::string& d) {
  bool any = false;
  const std::string open = " " + d + "{";
  for (size_t at = line.find(open); at != std::string::npos; at = line.find(open, at + 1)) {
    const size_t m_at = at + open.size();
    const size_t comma = line.find(", -1}", m_at);
    if (comma == std::string::npos || comma == m_at || comma - m_at > 6) continue;
    int m = 0;
    bool digits = true;
    for (size_t i = m_at; i < comma; ++i) {
      digits = digits && line[i] >= '0' && line[i] <= '9';
      m = m * 10 + (line[i] - '0');
    }
    if (!digits) continue;
    const bool after_lead = at >= 5 && line.compare(at - 5, 5, "[1-9]") == 0;
    const int hi = std::max(m, after_lead ? kMaxDigitRun - 1 : kMaxDigitRun);
    line.replace(m_at, comma + 5 - m_at, fmt::format("{}, {}}}", m, hi));
    any = true;
  }
  return any;
}

}  // namespace

std::optional<std::string> cap_digit_runs(const std::string& ebnf) {
  constexpr std::string_view kDef = " ::= ";
  std::vector<std::string> lines;
  std::set<std::string> digit_rules;  // D ::= (([0-9]))
  {
    std::istringstream in(ebnf);
    for (std::string line; std::getline(in, line);) {
      const size_t def = line.find(kDef);
      if (def != std::string::npos && line.substr(def + kDef.size()) == "(([0-9]))")
        digit_rules.insert(line.substr(0, def));
      lines.push_back(std::move(line));
    }
  }
  bool changed = false;
  std::string out;
  for (std::string& line : lines) {
    const size_t def = line.find(kDef);
    if (def != std::string::npos) {
      const std::string name = line.substr(0, def);
      // R ::= (([0-9] R) | ([0-9])): one or more digits, recursively.
      if (line.substr(def + kDef.size()) == fmt::format("(([0-9] {}) | ([0-9]))", name)) {
        out += fmt::format("{} ::= (([0-9]{{1, {}}}))\n", name, kMaxDigitRun);
        changed = true;
        continue;
      }
      // After a leading [1-9], at most kMaxDigitRun - 1 more.
      changed |= replace_all(line, "[1-9] [0-9]*", fmt::format("[1-9] [0-9]{{0, {}}}", kMaxDigitRun - 1));
      for (const std::string& d : digit_rules) changed |= cap_repetitions(line, d);
    }
    out += line + "\n";
  }
  if (!changed) return std::nullopt;
  return out;
}

}  // namespace tessera
