// C entry points of the CUDA backend library (libtessera_cuda.so), resolved with dlsym by the
// shard. Every function returns 0 on success or a CUDA error code; the message of the last
// error is available from tessera_cuda_last_error().
#pragma once

#include <stdint.h>

extern "C" {
// Number of usable CUDA devices (0 when there is no driver or no device; never fails).
int tessera_cuda_device_count();
const char* tessera_cuda_last_error();
// y = x / sqrt(mean(x^2) + eps) * w for n rows of dim fp32 values; device pointers; stream may be 0.
int tessera_cuda_rms_norm_f32(const float* x, const float* w, float* y, int64_t n, int64_t dim,
                              float eps, void* stream);
}
