// Device discovery and the per-thread last-error buffer of the C API.
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace {
thread_local char g_last_error[512] = "";
}

extern "C" int tessera_cuda_device_count() {
  int n = 0;
  // Without a driver this returns cudaErrorInsufficientDriver (35) and leaves n unchanged.
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    std::snprintf(g_last_error, sizeof(g_last_error), "cudaGetDeviceCount: %s (%d)",
                  cudaGetErrorString(err), static_cast<int>(err));
    cudaGetLastError();
    return 0;
  }
  return n;
}

extern "C" const char* tessera_cuda_last_error() { return g_last_error; }

namespace tessera::cuda {
int record_error(const char* what, cudaError_t err) {
  std::snprintf(g_last_error, sizeof(g_last_error), "%s: %s (%d)", what, cudaGetErrorString(err),
                static_cast<int>(err));
  return static_cast<int>(err);
}

int record_message(const char* message) {
  std::snprintf(g_last_error, sizeof(g_last_error), "%s", message);
  return -1;
}
}  // namespace tessera::cuda
