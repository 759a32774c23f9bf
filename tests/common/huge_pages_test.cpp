#include "common/huge_pages.h"

#include <cstdint>
#include <numeric>

#include <gtest/gtest.h>

namespace tessera {
namespace {

// Large buffers start on a 2 MiB boundary (the condition for THP to back them), small ones come
// from operator new; both hold what is written and go back without error (ASan checks the frees).
TEST(HugePages, LargeBuffersAreAlignedAndUsable) {
  for (size_t n : {size_t{100}, kHugePageMinBytes - 1, kHugePageMinBytes, size_t{5} << 20, (size_t{6} << 20) + 12345}) {
    WeightBytes b(n);
    ASSERT_EQ(b.size(), n);
    if (n >= kHugePageMinBytes && huge_pages_enabled()) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kHugePageBytes, 0u) << n;
    }
    EXPECT_EQ(b.front(), 0);
    EXPECT_EQ(b.back(), 0);
    std::iota(b.begin(), b.end(), uint8_t{0});
    EXPECT_EQ(b[n - 1], static_cast<uint8_t>(n - 1)) << n;
    WeightBytes moved = std::move(b);
    EXPECT_EQ(moved[n / 2], static_cast<uint8_t>(n / 2));
  }
}

}  // namespace
}  // namespace tessera
