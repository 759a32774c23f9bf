// The real default model (Gemma 3 270M, Q4_K_M GGUF) for tests that need it: $TESSERA_DEFAULT_MODEL
// (scripts/test.sh sets it after scripts/default_model.sh), else <source>/models/<file>. Empty
// when neither exists; such tests GTEST_SKIP.
#pragma once

#include <filesystem>
#include <string>

#include "common/env.h"

namespace tessera::testing {

inline std::string default_model_file() {
  std::string p = env_string("TESSERA_DEFAULT_MODEL", "");
  if (p.empty()) p = std::string(TESSERA_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf";
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) ? p : std::string();
}

}  // namespace tessera::testing
