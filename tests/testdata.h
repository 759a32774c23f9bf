// The project's reference test data (tests/data/README.md): stories260K and four real tokenizers.
// The build unpacks tests/data/*.tar.xz into <build>/testdata, which common/env.h's testdata_dir()
// returns unless $TESSERA_TESTDATA names another copy. The data is part of the repository, so a
// missing file is a test failure, never a skip.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/env.h"

namespace tessera::test {

// The failure message for a missing test-data file: names the file and where the folder comes from.
inline std::string missing_testdata(const std::string& path) {
  const std::string env = env_string("TESSERA_TESTDATA", "");
  const std::string from =
      env.empty() ? "the build unpacks it from tests/data/*.tar.xz: target tessera_testdata" : "$TESSERA_TESTDATA=" + env;
  return "missing test data: " + path + " (" + from + ")";
}

}  // namespace tessera::test

// Fails the current test, naming `path`, when it does not exist. A fatal failure: it returns from
// the enclosing function, so use it in a TEST body or SetUp(); elsewhere
// ADD_FAILURE() << tessera::test::missing_testdata(path).
#define TESSERA_REQUIRE_TESTDATA(path)                                                  \
  if (const std::string tessera_testdata_path_ = (path);                                \
      std::filesystem::exists(tessera_testdata_path_)) {                                \
  } else                                                                                \
    GTEST_FAIL() << ::tessera::test::missing_testdata(tessera_testdata_path_)
