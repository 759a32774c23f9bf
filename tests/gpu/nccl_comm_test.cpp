// NcclComm (comm/nccl_comm.h) on real devices: 1 rank always, 2 ranks (threads, one device
// each, bootstrapped over InProcessComm) when the machine has 2 devices. Results are checked
// against sums and copies computed here on the host.
#include "comm/nccl_comm.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace tessera {
namespace {

using gpu_test::gaussian;

// Skip reason, or empty when NCCL collectives can run on `devices` devices.
std::string nccl_skip_reason(int devices) {
  Result<const CudaApi*> api = load_cuda_api_with_device();
  if (!api.is_ok()) return api.status().message();
  if (!(*api)->nccl_available()) return "libtessera_cuda was built without NCCL";
  if ((*api)->device_count() < devices)
    return "needs " + std::to_string(devices) + " CUDA devices, have " + std::to_string((*api)->device_count());
  return "";
}

struct RankResult {
  std::vector<float> reduced;
  std::vector<float> gathered;
  std::vector<uint8_t> broadcast;
  Status status;
};

// What one rank does: every collective once, results copied back to the host.
RankResult run_rank(DeviceComm& bootstrap, int64_t count, int root) {
  RankResult out;
  const int rank = bootstrap.rank(), size = bootstrap.size();
  Result<std::unique_ptr<NcclComm>> made = NcclComm::create(bootstrap, NcclCommOptions{.device = rank});
  if (!made.is_ok()) {
    out.status = made.status();
    return out;
  }
  NcclComm& comm = **made;
  const CudaApi& api = **load_cuda_api();
  auto fail = [&](int rc, const char* what) {
    out.status = api.check(rc, what);
    return !out.status.is_ok();
  };
  EXPECT_EQ(comm.rank(), rank);
  EXPECT_EQ(comm.size(), size);
  EXPECT_EQ(comm.name(), "nccl");

  const std::vector<float> mine = gaussian(count, 100 + static_cast<uint32_t>(rank));
  std::vector<uint8_t> bytes(static_cast<size_t>(count) * 3 + 1);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + static_cast<size_t>(rank) * 31);
  void *d_data = nullptr, *d_gather = nullptr, *d_bytes = nullptr;
  const int64_t fbytes = count * 4;
  if (fail(api.device_malloc(&d_data, fbytes), "malloc") || fail(api.device_malloc(&d_gather, fbytes * size), "malloc") ||
      fail(api.device_malloc(&d_bytes, static_cast<int64_t>(bytes.size())), "malloc"))
    return out;
  if (fail(api.device_memcpy(d_data, mine.data(), fbytes), "memcpy") ||
      fail(api.device_memcpy(d_bytes, bytes.data(), static_cast<int64_t>(bytes.size())), "memcpy"))
    return out;

  out.status = comm.all_gather(d_data, d_gather, fbytes);  // before the in-place reduce
  if (out.status.is_ok()) out.status = comm.all_reduce_sum(static_cast<float*>(d_data), count);
  if (out.status.is_ok()) out.status = comm.broadcast(d_bytes, static_cast<int64_t>(bytes.size()), root);
  if (out.status.is_ok()) out.status = comm.barrier();
  if (out.status.is_ok()) out.status = comm.synchronize();
  if (!out.status.is_ok()) return out;

  out.reduced.resize(static_cast<size_t>(count));
  out.gathered.resize(static_cast<size_t>(count * size));
  out.broadcast.resize(bytes.size());
  if (fail(api.device_memcpy(out.reduced.data(), d_data, fbytes), "memcpy") ||
      fail(api.device_memcpy(out.gathered.data(), d_gather, fbytes * size), "memcpy") ||
      fail(api.device_memcpy(out.broadcast.data(), d_bytes, static_cast<int64_t>(bytes.size())), "memcpy"))
    return out;
  api.device_free(d_data);
  api.device_free(d_gather);
  api.device_free(d_bytes);
  return out;
}

void check_results(const std::vector<RankResult>& results, int64_t count, int root) {
  const int size = static_cast<int>(results.size());
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < size; ++r) inputs.push_back(gaussian(count, 100 + static_cast<uint32_t>(r)));
  std::vector<uint8_t> root_bytes(static_cast<size_t>(count) * 3 + 1);
  for (size_t i = 0; i < root_bytes.size(); ++i)
    root_bytes[i] = static_cast<uint8_t>(i * 7 + static_cast<size_t>(root) * 31);
  for (int r = 0; r < size; ++r) {
    const RankResult& res = results[static_cast<size_t>(r)];
    ASSERT_TRUE(res.status.is_ok()) << "rank " << r << ": " << res.status.to_string();
    for (int64_t i = 0; i < count; ++i) {
      // Up to 2 ranks the sum has one addition, so it is exact in any order.
      float sum = 0.0f;
      for (int q = 0; q < size; ++q) sum += inputs[static_cast<size_t>(q)][static_cast<size_t>(i)];
      ASSERT_EQ(res.reduced[static_cast<size_t>(i)], sum) << "rank " << r << " element " << i;
      for (int q = 0; q < size; ++q)
        ASSERT_EQ(res.gathered[static_cast<size_t>(q * count + i)], inputs[static_cast<size_t>(q)][static_cast<size_t>(i)])
            << "rank " << r << " gathered block " << q << " element " << i;
    }
    EXPECT_EQ(res.broadcast, root_bytes) << "rank " << r;
    // Every rank holds bitwise the same sum.
    EXPECT_EQ(std::memcmp(res.reduced.data(), results[0].reduced.data(), static_cast<size_t>(count) * 4), 0);
  }
}

TEST(NcclComm, OneRankCollectives) {
  const std::string skip = nccl_skip_reason(1);
  if (!skip.empty()) GTEST_SKIP() << skip;
  for (int64_t count : {1, 7, 1000, 65537}) {
    std::unique_ptr<DeviceComm> bootstrap = make_single_rank_comm();
    std::vector<RankResult> results{run_rank(*bootstrap, count, 0)};
    check_results(results, count, 0);
  }
}

TEST(NcclComm, TwoRanksOnTwoDevices) {
  const std::string skip = nccl_skip_reason(2);
  if (!skip.empty()) GTEST_SKIP() << skip;
  for (int64_t count : {1, 1000, 65537}) {
    std::vector<std::unique_ptr<DeviceComm>> boots = make_in_process_comms(2);
    std::vector<RankResult> results(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] { results[static_cast<size_t>(r)] = run_rank(*boots[static_cast<size_t>(r)], count, 1); });
    for (auto& t : threads) t.join();
    check_results(results, count, 1);
  }
}

// Runs on machines without a usable device or NCCL (the CPU CI): creation fails on every rank
// with a message naming the rank, and no rank waits forever for the others.
TEST(NcclComm, CreateWithoutDeviceFailsOnEveryRank) {
  if (nccl_skip_reason(1).empty()) GTEST_SKIP() << "NCCL is usable here; this test is for machines without it";
  std::vector<std::unique_ptr<DeviceComm>> boots = make_in_process_comms(2);
  std::vector<Status> statuses(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Result<std::unique_ptr<NcclComm>> comm = NcclComm::create(*boots[static_cast<size_t>(r)], {});
      statuses[static_cast<size_t>(r)] = comm.status();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    const Status& s = statuses[static_cast<size_t>(r)];
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
    EXPECT_NE(s.message().find("nccl rank " + std::to_string(r) + "/2"), std::string::npos) << s.message();
    // Every rank shares this process, so every rank has the local reason itself.
    EXPECT_TRUE(s.message().find("no CUDA device") != std::string::npos ||
                s.message().find("without NCCL") != std::string::npos)
        << s.message();
  }
}

TEST(NcclComm, BadBroadcastRootIsAnError) {
  const std::string skip = nccl_skip_reason(1);
  if (!skip.empty()) GTEST_SKIP() << skip;
  std::unique_ptr<DeviceComm> bootstrap = make_single_rank_comm();
  Result<std::unique_ptr<NcclComm>> comm = NcclComm::create(*bootstrap, {});
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  const Status s = (*comm)->broadcast(nullptr, 4, 3);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("root 3"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tessera
