// `tessera bench scale`'s report arithmetic (launch/bench_scale.h): speedup and efficiency
// against the first TP degree, the table, and the --tp-list parser's errors.
#include "launch/bench_scale.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace tessera {
namespace {

TEST(ScaleReport, ScalingArithmeticAndTpList) {
  std::vector<ScalePoint> p(3);
  p[0].tp = 1;
  p[0].decode_tokens_per_s = 100;
  p[1].tp = 2;
  p[1].decode_tokens_per_s = 150;
  p[2].tp = 4;
  p[2].decode_tokens_per_s = 200;
  compute_scaling(p);
  EXPECT_DOUBLE_EQ(p[0].speedup, 1);
  EXPECT_DOUBLE_EQ(p[1].speedup, 1.5);
  EXPECT_DOUBLE_EQ(p[1].efficiency, 0.75);
  EXPECT_DOUBLE_EQ(p[2].efficiency, 0.5);
  const std::string t = format_scale_table(p, true);
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 5);
  auto l = parse_tp_list("1,2,4");
  ASSERT_TRUE(l.is_ok());
  EXPECT_EQ(*l, (std::vector<int>{1, 2, 4}));
  for (const char* bad : {"", "0", "1,,2", "1,1", "x", "2,"}) EXPECT_FALSE(parse_tp_list(bad).is_ok()) << bad;
}

}  // namespace
}  // namespace tessera
