#include "common/status.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

Result<int> parse_positive(int x) {
  if (x <= 0) return Status::invalid_argument("x must be positive, got " + std::to_string(x));
  return x;
}

Result<int> doubled(int x) {
  TESSERA_ASSIGN_OR_RETURN(int v, parse_positive(x));
  return 2 * v;
}

Status check_both(int a, int b) {
  TESSERA_RETURN_IF_ERROR(parse_positive(a).status());
  TESSERA_RETURN_IF_ERROR(parse_positive(b).status().with_context("field b"));
  return Status::ok();
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::ok().is_ok());
  Status s = Status::not_found("model.gguf: no tensor 'x'");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.to_string(), "not found: model.gguf: no tensor 'x'");
}

TEST(StatusTest, ResultPropagates) {
  EXPECT_EQ(*doubled(4), 8);
  auto r = doubled(-1);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("-1"), std::string::npos);
}

TEST(StatusTest, ContextPrefixes) {
  Status s = check_both(1, 0);
  EXPECT_EQ(s.message(), "field b: x must be positive, got 0");
  EXPECT_TRUE(check_both(1, 2).is_ok());
}

}  // namespace
}  // namespace tessera
