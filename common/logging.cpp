#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <mutex>

#include "common/check.h"
#include "common/env.h"

namespace tessera {
namespace {

std::mutex g_prefix_mu;
std::string g_prefix = "[tessera]";  // guarded by g_prefix_mu

LogLevel parse_level(std::string_view s) {
  if (s == "debug") return LogLevel::kDebug;
  if (s == "warn" || s == "warning") return LogLevel::kWarn;
  if (s == "error") return LogLevel::kError;
  if (s == "off" || s == "none") return LogLevel::kOff;
  return LogLevel::kInfo;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(parse_level(env_string("TESSERA_LOG_LEVEL", "info")))};
  return level;
}

}  // namespace

void set_log_role(std::string_view role, int rank) {
  std::lock_guard<std::mutex> lock(g_prefix_mu);
  g_prefix = rank >= 0 ? fmt::format("[tessera {} {}]", role, rank) : fmt::format("[tessera {}]", role);
}

void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(level_storage().load(std::memory_order_relaxed)); }

void log_line(LogLevel level, std::string_view message) {
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::string prefix;
  {
    std::lock_guard<std::mutex> lock(g_prefix_mu);
    prefix = g_prefix;
  }
  std::string line = fmt::format("{} {} {:02}:{:02}:{:02}.{:03} {}\n", prefix,
                                 kLetters[static_cast<int>(level) & 3], tm.tm_hour, tm.tm_min,
                                 tm.tm_sec, ms, message);
  ssize_t unused = ::write(2, line.data(), line.size());
  (void)unused;
}

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::string text = fmt::format("CHECK failed at {}:{}: {}{}{}\n", file, line, cond,
                                 msg.empty() ? "" : ": ", msg);
  ssize_t unused = ::write(2, text.data(), text.size());
  (void)unused;
  std::abort();
}
}  // namespace detail

}  // namespace tessera
