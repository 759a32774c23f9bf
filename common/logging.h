// Logging with a role/rank prefix: "[tessera shard 1] I 12:00:01.123 loaded 47 tensors".
// Levels below the threshold cost one integer compare. The threshold comes from
// TESSERA_LOG_LEVEL (debug|info|warn|error), read once through common/env.h.
// Thread-safe: each line is written with one write(2) call to stderr.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace tessera {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// Sets the prefix for every later line of this process, e.g. set_log_role("shard", 1).
// rank < 0 means no rank.
void set_log_role(std::string_view role, int rank = -1);
void set_log_level(LogLevel level);
LogLevel log_level();
void log_line(LogLevel level, std::string_view message);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < log_level()) return;
  log_line(level, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tessera

#define TESSERA_LOG_DEBUG(...) ::tessera::log(::tessera::LogLevel::kDebug, __VA_ARGS__)
#define TESSERA_LOG_INFO(...) ::tessera::log(::tessera::LogLevel::kInfo, __VA_ARGS__)
#define TESSERA_LOG_WARN(...) ::tessera::log(::tessera::LogLevel::kWarn, __VA_ARGS__)
#define TESSERA_LOG_ERROR(...) ::tessera::log(::tessera::LogLevel::kError, __VA_ARGS__)
