// The loader's failure paths run everywhere; the device probe only where a library is built.
#include <gtest/gtest.h>

#include "kernels/cuda/cuda_loader.h"

namespace tessera {
namespace {

TEST(CudaLoader, MissingLibraryNamesThePath) {
  Result<CudaApi> api = open_cuda_api("/nonexistent/dir/libtessera_cuda.so");
  ASSERT_FALSE(api.is_ok());
  EXPECT_EQ(api.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(api.status().message().find("/nonexistent/dir/libtessera_cuda.so"), std::string::npos)
      << api.status().message();
}

TEST(CudaLoader, DeviceCountNeverFails) {
  Result<const CudaApi*> api = load_cuda_api();
  if (!api.is_ok()) GTEST_SKIP() << "no CUDA device: " << api.status().message();
  const int n = (*api)->device_count();
  EXPECT_GE(n, 0);
  if (n == 0) {
    EXPECT_STRNE((*api)->last_error(), "") << "a zero count must come with a reason";
  }
}

}  // namespace
}  // namespace tessera
