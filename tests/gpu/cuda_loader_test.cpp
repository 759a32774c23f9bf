// The loader's failure paths run everywhere; the device probe only where a library is built.
// Every entry point of cuda_api.h's list must be in the fake backend and in the library this
// tree built (the two libraries are named by the build: TESSERA_FAKE_CUDA_LIBRARY and, with
// nvcc, TESSERA_BUILT_CUDA_LIBRARY). Where the programs run away from their build folder
// (bench/gpu_check.sh --prebuilt), the environment variables of the same names say where the
// two libraries are now.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_loader.h"

namespace tessera {
namespace {

// The symbols of the entry points whose CudaApi field is null.
std::vector<std::string> null_fields(const CudaApi& api) {
  std::vector<std::string> missing;
#define TESSERA_CHECK_FIELD(ret, symbol, field, params, ...) \
  if (api.field == nullptr) missing.push_back(#symbol);
  TESSERA_CUDA_ENTRY_POINTS(TESSERA_CHECK_FIELD, TESSERA_CHECK_FIELD)
#undef TESSERA_CHECK_FIELD
  return missing;
}

// The environment's `name` where set, else the path the build compiled in.
std::string library_path(const char* name, const char* built) {
  const char* env = std::getenv(name);
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(built);
}

TEST(CudaLoader, MissingLibraryNamesThePath) {
  Result<CudaApi> api = open_cuda_api("/nonexistent/dir/libtessera_cuda.so");
  ASSERT_FALSE(api.is_ok());
  EXPECT_EQ(api.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(api.status().message().find("/nonexistent/dir/libtessera_cuda.so"), std::string::npos)
      << api.status().message();
}

TEST(CudaLoader, FakeBackendHasEveryEntryPoint) {
  Result<CudaApi> api = open_cuda_api(library_path("TESSERA_FAKE_CUDA_LIBRARY", TESSERA_FAKE_CUDA_LIBRARY));
  ASSERT_TRUE(api.is_ok()) << api.status().message();
  EXPECT_EQ(null_fields(*api), std::vector<std::string>{});
}

TEST(CudaLoader, BuiltLibraryHasEveryEntryPoint) {
#ifndef TESSERA_BUILT_CUDA_LIBRARY
  GTEST_SKIP() << "this build has no CUDA library (no nvcc)";
#else
  const std::string path = library_path("TESSERA_BUILT_CUDA_LIBRARY", TESSERA_BUILT_CUDA_LIBRARY);
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is a dependency of this test binary";
  Result<CudaApi> api = open_cuda_api(path);
  // Not loadable at all (no CUDA runtime on this machine) says nothing about its symbols.
  if (!api.is_ok() && api.status().message().find("not loadable") != std::string::npos)
    GTEST_SKIP() << api.status().message();
  ASSERT_TRUE(api.is_ok()) << api.status().message();
  EXPECT_EQ(null_fields(*api), std::vector<std::string>{});
#endif
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
