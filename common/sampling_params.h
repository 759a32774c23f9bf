// The per-request sampling parameters (what a request asks for; kernels/sampling.h says how a
// Sampler applies them) and their validation. In common/ so that the control protocol (comm/)
// and the API layer (server/) carry them without depending on the kernels.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/status.h"

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
  bool return_logprob = false;     // fill SampledToken::logprob even when n_logprobs == 0
  // Added to the logits (after the penalties, before everything else: logprobs are of the biased
  // distribution); ids ascending, unique; ids at or past the vocabulary are ignored.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// InvalidArgument naming the field and value for parameters sample() cannot honour:
// temperature < 0 or not finite, top_p outside (0, 1], min_p outside [0, 1],
// repetition_penalty <= 0 or not finite, non-finite presence/frequency, n_logprobs < 0,
// logit_bias with a negative id, ids not ascending and unique, or a bias outside [-100, 100].
// The API layer calls this; Sampler's constructor TESSERA_CHECKs it.
Status validate_sampling_params(const SamplingParams& params);

}  // namespace tessera
