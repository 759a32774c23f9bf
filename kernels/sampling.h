// Token sampling on CPU: greedy, temperature, top-k, top-p, min-p, repetition / presence /
// frequency penalties, per-request seed, top-n logprobs.
//
// Order: penalties on the logits -> logprobs for the reply (log-softmax of the penalised
// logits, before temperature and truncation) -> temperature == 0: argmax (ties: lowest id)
// -> else divide by temperature, top-k, top-p, min-p, then draw from the renormalised
// distribution with the sequence's RNG. Same seed and same logits give the same token on any
// machine (the RNG is a fixed counter-based generator, not std::mt19937 distributions).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tessera {

struct SamplingParams {
  float temperature = 1.0f;        // 0: greedy
  int32_t top_k = 0;               // 0 or < 0: off
  float top_p = 1.0f;              // 1: off
  float min_p = 0.0f;              // 0: off
  float repetition_penalty = 1.0f; // 1: off; over prompt and output tokens
  float presence_penalty = 0.0f;   // over output tokens
  float frequency_penalty = 0.0f;  // over output tokens
  uint64_t seed = 0;
  bool has_seed = false;           // false: seed from a random source at construction
  int32_t n_logprobs = 0;          // top-n logprobs to return (0: none)
};

struct SampledToken {
  int32_t id = -1;
  float logprob = 0.0f;                               // of the chosen token
  std::vector<std::pair<int32_t, float>> top_logprobs; // n_logprobs best, descending
};

// Per-sequence sampling state: the RNG and the token counts the penalties need.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  const SamplingParams& params() const { return params_; }
  // Tokens of the prompt (count for the repetition penalty only).
  void add_prompt_tokens(std::span<const int32_t> ids);
  // Samples from logits[0, vocab); `logits` is used as scratch and modified.
  SampledToken sample(float* logits, int64_t vocab);
  // Records an output token (sample() calls this for the token it returns).
  void accept(int32_t id);

 private:
  double next_uniform();  // [0, 1)

  SamplingParams params_;
  uint64_t rng_state_ = 0;
  std::unordered_map<int32_t, int32_t> prompt_counts_;
  std::unordered_map<int32_t, int32_t> output_counts_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace tessera
