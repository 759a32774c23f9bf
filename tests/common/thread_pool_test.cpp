#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace tessera {
namespace {

TEST(ThreadPoolTest, CoversRangeOnce) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  for (int64_t n : {0, 1, 5, 64, 1001}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, 4, [&](int64_t b, int64_t e, int) {
      EXPECT_EQ(b % 4, 0);
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

TEST(ThreadPoolTest, ManyJobsInARow) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2});
  std::atomic<int64_t> sum{0};
  for (int j = 0; j < 2000; ++j)
    pool.parallel_for(10, 1, [&](int64_t b, int64_t e, int) { sum += e - b; });
  EXPECT_EQ(sum.load(), 20000);
}

}  // namespace
}  // namespace tessera
