#include <gtest/gtest.h>

#include <thread>

#include "comm/device_comm.h"

namespace tessera {
namespace {

TEST(LocalCommTest, SingleRankIsIdentity) {
  auto c = make_single_rank_comm();
  float x[3] = {1, 2, 3};
  ASSERT_TRUE(c->all_reduce_sum(x, 3).is_ok());
  EXPECT_EQ(x[2], 3.0f);
  float out[3];
  ASSERT_TRUE(c->all_gather(x, out, sizeof(x)).is_ok());
  EXPECT_EQ(out[1], 2.0f);
}

TEST(LocalCommTest, InProcessCollectives) {
  for (int n : {1, 2, 3, 4}) {
    auto comms = make_in_process_comms(n);
    std::vector<std::vector<float>> reduced(static_cast<size_t>(n));
    std::vector<std::vector<int32_t>> gathered(static_cast<size_t>(n));
    std::vector<int64_t> bcast(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        DeviceComm& c = *comms[static_cast<size_t>(r)];
        for (int rep = 0; rep < 50; ++rep) {  // repeated, to shake out barrier races
          std::vector<float> v = {static_cast<float>(r), 1.0f, static_cast<float>(r * r)};
          ASSERT_TRUE(c.all_reduce_sum(v.data(), 3).is_ok());
          reduced[static_cast<size_t>(r)] = v;
          const int32_t mine[2] = {r, 10 * r};
          std::vector<int32_t> all(static_cast<size_t>(2 * n));
          ASSERT_TRUE(c.all_gather(mine, all.data(), sizeof(mine)).is_ok());
          gathered[static_cast<size_t>(r)] = all;
          int64_t b = r == n - 1 ? 777 : -1;
          ASSERT_TRUE(c.broadcast(&b, sizeof(b), n - 1).is_ok());
          bcast[static_cast<size_t>(r)] = b;
          ASSERT_TRUE(c.barrier().is_ok());
        }
      });
    }
    for (auto& t : threads) t.join();
    float s = 0, sq = 0;
    for (int r = 0; r < n; ++r) s += static_cast<float>(r), sq += static_cast<float>(r * r);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(reduced[static_cast<size_t>(r)], (std::vector<float>{s, static_cast<float>(n), sq}));
      for (int q = 0; q < n; ++q) EXPECT_EQ(gathered[static_cast<size_t>(r)][static_cast<size_t>(2 * q + 1)], 10 * q);
      EXPECT_EQ(bcast[static_cast<size_t>(r)], 777);
    }
  }
}

}  // namespace
}  // namespace tessera
