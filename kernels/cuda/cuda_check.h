// Error recording shared by the CUDA backend's translation units (not part of the C API).
// Every CUDA call is checked: a failure stores "<what>: <message> (<code>)" in the calling
// thread's last-error buffer (tessera_cuda_last_error) and its code is returned to the caller.
#pragma once

#include <cuda_runtime.h>

namespace tessera::cuda {

// Records the error and returns its code (non-zero). Defined in device_probe.cu.
int record_error(const char* what, cudaError_t err);
// Records a plain message and returns -1 (bad arguments, missing features).
int record_message(const char* message);

// Reads the last launch error; 0 when the launch was accepted.
inline int check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : record_error(kernel, err);
}

}  // namespace tessera::cuda

// Returns the recorded error code from the enclosing function when a CUDA call fails.
#define TESSERA_CUDA_RETURN_IF_ERROR(call)                                       \
  do {                                                                           \
    const cudaError_t tessera_cuda_err_ = (call);                                \
    if (tessera_cuda_err_ != cudaSuccess)                                        \
      return ::tessera::cuda::record_error(#call, tessera_cuda_err_);            \
  } while (0)
