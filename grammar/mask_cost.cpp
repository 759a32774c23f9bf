#include "grammar/mask_cost.h"

#include <algorithm>
#include <chrono>
#include <random>

#include <fmt/format.h>

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

}  // namespace

std::string mixed_schema(int properties, int salt) {
  std::string props;
  std::string required;
  for (int i = 0; i < properties; ++i) {
    std::string kind;
    switch (i % 6) {
      case 0: kind = R"({"type": "string", "maxLength": 12})"; break;
      case 1: kind = R"({"type": "integer", "minimum": 0, "maximum": 100000})"; break;
      case 2: kind = R"({"type": "number"})"; break;
      case 3: kind = R"({"type": "boolean"})"; break;
      case 4: kind = R"({"enum": ["alpha", "beta", "gamma", "delta"]})"; break;
      default: kind = R"({"type": "array", "items": {"type": "integer"}, "maxItems": 3})"; break;
    }
    const std::string name = fmt::format("field_{}_{}", i, salt);
    props += fmt::format("{}\"{}\": {}", i ? ", " : "", name, kind);
    required += fmt::format("{}\"{}\"", i ? ", " : "", name);
  }
  return fmt::format(R"({{"type": "object", "properties": {{{}}}, "required": [{}], "additionalProperties": false}})",
                     props, required);
}

Result<MaskCost> measure_mask_cost(GrammarCompiler& compiler, const GrammarSpec& spec, int walks, uint64_t seed,
                                   const std::vector<int32_t>& stop_ids, int max_steps) {
  MaskCost cost;
  const auto tc = Clock::now();
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> g, compiler.compile(spec));
  cost.compile_ms = us_since(tc) / 1000;
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> mask(static_cast<size_t>(g->mask_words()));
  std::vector<int32_t> allowed;
  const auto allows = [&](int32_t id) {
    return id >= 0 && id < g->vocab() && ((mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u);
  };
  for (int w = 0; w < walks; ++w) {
    auto m = g->matcher();
    for (int step = 0; step < max_steps && !m->terminated(); ++step) {
      const auto tm = Clock::now();
      const bool restricts = m->fill_mask(mask);
      cost.mask_us.push_back(us_since(tm));
      cost.restricting += restricts ? 1 : 0;
      allowed.clear();
      for (size_t i = 0; i < mask.size(); ++i)
        for (uint32_t bits = mask[i]; bits; bits &= bits - 1)
          allowed.push_back(static_cast<int32_t>(i * 32 + static_cast<size_t>(__builtin_ctz(bits))));
      if (allowed.empty()) break;
      int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      for (int32_t e : stop_ids)
        if (m->completed() && allows(e)) pick = e;
      if (!m->accept(pick)) break;
    }
  }
  return cost;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace tessera
