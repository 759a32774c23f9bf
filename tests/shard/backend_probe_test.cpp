// The shard's backend choice (shard/backend_probe.h) on this machine.
#include "shard/backend_probe.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

namespace tessera {
namespace {

TEST(BackendProbe, CpuRequestedLoadsNothing) {
  bool ok = false;
  const BackendChoice c = choose_backend("cpu", &ok);
  EXPECT_TRUE(ok);
  EXPECT_EQ(c.kind, DeviceKind::kCpu);
  EXPECT_EQ(c.cuda_devices, 0);
}

TEST(BackendProbe, AutoWithoutTheDriverSkipsTheCudaLibrary) {
  std::error_code ec;
  if (std::filesystem::exists("/proc/driver/nvidia/version", ec) || std::filesystem::exists("/dev/nvidiactl", ec) ||
      std::getenv("TESSERA_CUDA_LIBRARY") != nullptr)
    GTEST_SKIP() << "an NVIDIA driver (or a chosen backend library) is present";
  bool ok = false;
  const BackendChoice c = choose_backend("auto", &ok);
  EXPECT_TRUE(ok);
  EXPECT_EQ(c.kind, DeviceKind::kCpu);
  EXPECT_NE(c.reason.find("no NVIDIA driver"), std::string::npos) << c.reason;
  // "cuda" still tries the library and fails with its reason.
  const BackendChoice cuda = choose_backend("cuda", &ok);
  EXPECT_FALSE(ok);
  EXPECT_FALSE(cuda.reason.empty());
}

}  // namespace
}  // namespace tessera
