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

// Directory of the shared test data: $TESSERA_TESTDATA, else "<source>/../shared/testdata".
std::string testdata_dir();

}  // namespace tessera
