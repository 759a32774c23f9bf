// The one place that reads environment variables. Every knob Tessera takes from the
// environment goes through these functions so that `grep env_` finds them all.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {

std::string env_string(std::string_view name, std::string_view fallback);
int64_t env_int(std::string_view name, int64_t fallback);
bool env_flag(std::string_view name, bool fallback);

// Directory of the project's reference test data (tests/data/README.md): $TESSERA_TESTDATA when
// set and not empty, else `built_in`.
std::string testdata_dir(std::string_view built_in);

#ifdef TESSERA_TESTDATA_DIR
// In code compiled under tests/ (tests/CMakeLists.txt defines TESSERA_TESTDATA_DIR): the copy the
// build unpacks from tests/data/*.tar.xz, <build>/testdata, unless $TESSERA_TESTDATA names another.
inline std::string testdata_dir() { return testdata_dir(TESSERA_TESTDATA_DIR); }
#endif

}  // namespace tessera
