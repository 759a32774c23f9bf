// Request traces for the simulator and the real engine alike: generated (arrivals x length mix)
// or read from JSONL, one request a line:
//   {"arrival_s": 0.25, "prompt_tokens": 512, "output_tokens": 128, "priority": 0}
// (`tessera bench serve --trace` reads the same file; priority is optional).
//
// Arrivals: poisson (exponential gaps, mean 1/rate), bursty (gamma gaps with a coefficient of
// variation > 1: clumps of arrivals and long quiet spells at the same mean rate; "bursty:3" is
// CV 3, "bursty" CV 2) and fixed (gaps of exactly 1/rate).
// Length mixes (prompt / output, log-normal, clamped): "chat" (prompts ~200 tokens, outputs ~100:
// a short-chat service), "docs" (prompts ~16k tokens, outputs ~250: long documents), "docs-2k"
// (prompts ~2k: long documents at a length a CPU prefills in seconds), or
// "PROMPT/OUTPUT" with loadgen/load_generator.h's distributions ("lognormal:512,0.5/64"), or a
// mixture of those by weight, "MIX*W+MIX*W" ("chat*0.9+docs-2k*0.1": a chat service where one
// request in ten brings a 2k-token document); each request draws its component by weight.
//
// Thread-safety: values.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "loadgen/load_generator.h"
#include "common/status.h"

namespace tessera {

struct SimRequest {
  double arrival_s = 0;
  int64_t prompt_tokens = 1;
  int64_t output_tokens = 1;
  int32_t priority = 0;
};

struct LengthMixPart {
  double weight = 1;  // > 0; the parts' weights need not sum to 1
  LengthDistribution prompt;
  LengthDistribution output;
};
struct LengthMix {
  std::string name;
  LengthDistribution prompt;  // one component: its lengths; a mixture: its first part's
  LengthDistribution output;
  std::vector<LengthMixPart> parts;  // a mixture's components (empty: prompt and output alone)
};
// "chat", "docs", "docs-2k", "PROMPT/OUTPUT" or "MIX*W+MIX*W"; InvalidArgument naming the spec
// (and the part) otherwise.
Result<LengthMix> parse_length_mix(std::string_view spec);

struct ArrivalSpec {
  enum class Kind { kPoisson, kBursty, kFixed };
  Kind kind = Kind::kPoisson;
  double cv = 1.0;  // bursty: coefficient of variation of the gaps
  // "poisson", "bursty", "bursty:CV" (CV > 1), "fixed".
  static Result<ArrivalSpec> parse(std::string_view spec);
  std::string to_string() const;
};

struct TraceSpec {
  LengthMix lengths;
  ArrivalSpec arrivals;
  double rate = 1.0;            // requests per second, > 0
  int64_t num_requests = 1000;  // >= 1
  uint64_t seed = 1;
  int32_t priority_classes = 1; // priorities uniform in [0, classes)
};
// Deterministic in the spec (and seed).
Result<std::vector<SimRequest>> generate_trace(const TraceSpec& spec);

// JSONL as at the top (arrival_s required here); source names the text in errors.
Result<std::vector<SimRequest>> parse_sim_trace(std::string_view jsonl, std::string_view source);
Result<std::vector<SimRequest>> load_sim_trace(const std::string& path);
std::string sim_trace_jsonl(const std::vector<SimRequest>& trace);
Status save_sim_trace(const std::string& path, const std::vector<SimRequest>& trace);

// The trace's lengths as a distribution for the planner (prompt + output of each request).
struct TraceLengthStats {
  double mean_prompt = 0, mean_output = 0, mean_total = 0;
  int64_t max_total = 0;
  double offered_rate = 0;  // requests / s over the trace's span
};
TraceLengthStats trace_length_stats(const std::vector<SimRequest>& trace);

}  // namespace tessera
