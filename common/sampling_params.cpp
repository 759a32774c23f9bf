#include "common/sampling_params.h"

#include <cmath>
#include <string_view>

#include <fmt/format.h>

namespace tessera {

Status validate_sampling_params(const SamplingParams& p) {
  auto bad = [](std::string_view field, double value, std::string_view expected) {
    return Status::invalid_argument(
        fmt::format("sampling parameter {} is {}, expected {}", field, value, expected));
  };
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f)
    return bad("temperature", p.temperature, "a finite value >= 0");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p", p.top_p, "a value in (0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p", p.min_p, "a value in [0, 1]");
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0.0f)
    return bad("repetition_penalty", p.repetition_penalty, "a finite value > 0");
  if (!std::isfinite(p.presence_penalty))
    return bad("presence_penalty", p.presence_penalty, "a finite value");
  if (!std::isfinite(p.frequency_penalty))
    return bad("frequency_penalty", p.frequency_penalty, "a finite value");
  if (p.n_logprobs < 0) return bad("n_logprobs", p.n_logprobs, "a value >= 0");
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const auto& [id, bias] = p.logit_bias[i];
    if (id < 0 || (i > 0 && id <= p.logit_bias[i - 1].first))
      return bad("logit_bias id", id, "ids >= 0, ascending and unique");
    if (!(bias >= -100.0f && bias <= 100.0f)) return bad("logit_bias", bias, "a value in [-100, 100]");
  }
  return Status::ok();
}

}  // namespace tessera
