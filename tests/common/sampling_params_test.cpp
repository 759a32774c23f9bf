// Tests for common/sampling_params.h: validate_sampling_params names the field it rejects.
#include "common/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace tessera {
namespace {

TEST(SamplingParamsValidation, RejectsBadValuesNamingTheField) {
  EXPECT_TRUE(validate_sampling_params(SamplingParams{}).is_ok());
  auto message_for = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    const Status s = validate_sampling_params(p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    return s.message();
  };
  EXPECT_NE(message_for([](SamplingParams& p) { p.temperature = -1.0f; }).find("temperature"), std::string::npos);
  EXPECT_NE(message_for([](SamplingParams& p) { p.temperature = NAN; }).find("temperature"), std::string::npos);
  EXPECT_NE(message_for([](SamplingParams& p) { p.top_p = 0.0f; }).find("top_p"), std::string::npos);
  EXPECT_NE(message_for([](SamplingParams& p) { p.top_p = 1.5f; }).find("top_p"), std::string::npos);
  EXPECT_NE(message_for([](SamplingParams& p) { p.min_p = -0.1f; }).find("min_p"), std::string::npos);
  EXPECT_NE(message_for([](SamplingParams& p) { p.repetition_penalty = 0.0f; }).find("repetition_penalty"), std::string::npos);
  EXPECT_NE(message_for([](SamplingParams& p) { p.presence_penalty = INFINITY; }).find("presence_penalty"), std::string::npos);
  EXPECT_NE(message_for([](SamplingParams& p) { p.n_logprobs = -2; }).find("n_logprobs"), std::string::npos);
  EXPECT_NE(message_for([](SamplingParams& p) { p.logit_bias = {{3, 101.0f}}; }).find("logit_bias"), std::string::npos);
  EXPECT_NE(message_for([](SamplingParams& p) { p.logit_bias = {{3, NAN}}; }).find("logit_bias"), std::string::npos);
  EXPECT_NE(message_for([](SamplingParams& p) {
              p.logit_bias = {{4, 1.0f}, {3, 1.0f}};
            }).find("ascending"),
            std::string::npos);
  EXPECT_NE(message_for([](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }).find("logit_bias"), std::string::npos);
}

}  // namespace
}  // namespace tessera
