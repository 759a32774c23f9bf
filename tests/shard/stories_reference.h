// The stories260K reference cases (stories260K/reference.json in the reference test data,
// tests/data/README.md; written by an independent implementation): prompt ids, greedy ids and the
// last position's logits. Shared by the CPU and the CUDA forward-pass tests.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "common/env.h"
#include "tests/testdata.h"

namespace tessera::test {

struct RefCase {
  std::string name;
  std::vector<int32_t> prompt, greedy;
  std::vector<float> logits;
};

inline std::string stories_dir() { return testdata_dir() + "/stories260K"; }

inline std::vector<RefCase> load_cases() {
  std::ifstream in(stories_dir() + "/reference.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<RefCase> cases;
  for (const auto& c : j["cases"]) {
    cases.push_back({c["name"].get<std::string>(), c["prompt_ids"].get<std::vector<int32_t>>(),
                     c["greedy_ids"].get<std::vector<int32_t>>(), c["last_logits"].get<std::vector<float>>()});
  }
  return cases;
}

}  // namespace tessera::test
