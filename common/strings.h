// Small text helpers shared across modules.
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace tessera {

// `s` with ASCII letters lower-cased (names given on command lines: dtypes, cards, precisions).
inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace tessera
