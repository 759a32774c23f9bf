// One check macro for broken invariants (bugs, not bad input: bad input returns a Status).
// On failure it prints file, line, the condition and a formatted message, then aborts.
//
//   TESSERA_CHECK(n_heads % n_kv_heads == 0, "n_heads {} n_kv_heads {}", n_heads, n_kv_heads);
#pragma once

#include <fmt/format.h>

namespace tessera::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}

#define TESSERA_CHECK(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) [[unlikely]] {                                                               \
      ::tessera::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
    }                                                                                         \
  } while (0)
