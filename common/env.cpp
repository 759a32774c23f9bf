#include "common/env.h"

#include <cstdlib>

namespace tessera {

std::string env_string(std::string_view name, std::string_view fallback) {
  const char* v = std::getenv(std::string(name).c_str());
  return v ? std::string(v) : std::string(fallback);
}

int64_t env_int(std::string_view name, int64_t fallback) {
  const char* v = std::getenv(std::string(name).c_str());
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  return (end && *end == '\0') ? static_cast<int64_t>(x) : fallback;
}

bool env_flag(std::string_view name, bool fallback) {
  const char* v = std::getenv(std::string(name).c_str());
  if (!v || !*v) return fallback;
  std::string s(v);
  return !(s == "0" || s == "false" || s == "no" || s == "off");
}

std::string testdata_dir(std::string_view built_in) {
  const std::string dir = env_string("TESSERA_TESTDATA", "");
  return dir.empty() ? std::string(built_in) : dir;
}

}  // namespace tessera
